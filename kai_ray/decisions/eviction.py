"""The eviction steps reclaim and preempt share: make room for one waiting job.

1. `waiting.waiting_jobs`: groups whose minimum is still missing and that
   nothing placed this cycle, as candidates in their leaf queues;
2. `running_units`: the victim units of running, preemptible groups of this
   scheduler that the action accepts, untouched this cycle and not protected
   by a min-runtime (units are cut once per cycle, `victims.victim_units`);
3. `evict_to_fit`: victims are chosen greedily (`victims.select_victims`;
   inside one domain for a gang with a required topology level, `_in_one_domain`),
   evicted in the transaction, and the job placed with `place_gang`; if it
   does not fit, everything rolls back and more room is asked for (`SLACK`);
   once it fits, victims on nodes the job did not use are given back, then
   every other victim the fit does not need (most disruptive first), the fit
   checked again each time. Every set of victims must also admit the job
   (`admission_refusal`: limits counted with what the victims free in each
   queue on their paths), so a victim the job's queue limits need is kept
   even when its node was not used;
4. `record`: the evictions and the job's status into the plan;
5. `release_terminating`, before any action: pods being deleted give their
   room back in the transaction (pipelining), and are never victims again;
6. `Refusals`: an attempt that changed nothing is kept by everything it read
   (the transaction's and the ledger's versions, and the job as placement,
   admission and the victim search read it), so an equal job later in the
   same run is answered without a second search; `attempt_in_turn` searches
   each kind of waiting job once before taking any, and ends the run when no
   kind finds room.
Choosing victims is a pure function (`victims.py`); issuing the evictions is
this module's. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.admission import (
    Freed,
    FreedWhenRead,
    freed_in_queues,
    is_preemptible,
    refusal,
)
from kai_ray.decisions.alike import alike_keys, with_kinds
from kai_ray.decisions.booking import book
from kai_ray.decisions.context import CycleContext, admitted
from kai_ray.decisions.fairness import quota_of
from kai_ray.decisions.kept import PER_GROUP, kept_per_group
from kai_ray.decisions.ordering import (
    Candidate,
    WaitingJobs,
    group_priority,
    take_next,
)
from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.placement.domains import Scope, resolve
from kai_ray.decisions.placement.filters import static_mask
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES, KeptAcrossCycles, same_values
from kai_ray.decisions.plan import Evict
from kai_ray.decisions.runtime import Protection, started_at
from kai_ray.decisions.totals import Tally, kept_members, kept_tally
from kai_ray.decisions.transaction import Matrix, MemoKey, Transaction, held_vector
from kai_ray.decisions.victims import (
    Budget,
    FoundOptions,
    KeptOptions,
    Need,
    PodVector,
    Released,
    Vector,
    VictimUnit,
    pods_fitting,
    select_victims,
    unit_order,
    victim_units,
)
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.values.arrays import add_rows
from kai_ray.values.resources import EPSILON, GPU, NO_RESOURCES, Resources

#: Selections tried before giving up on a job: the need, then with this much more room each.
SLACK = (0.0, 1.0, 3.0)
#: Per group: its victim units (they depend on the snapshot alone).
VICTIM_UNITS = MemoKey[list[VictimUnit]]("victim units")


def job_need(tx: Transaction, group: PodGroupState) -> Need | None:
    """The group's missing minimum as copies of its largest pod, on nodes all may use."""
    pods = group.missing
    if not pods:
        return None
    vectors = np.array([held_vector(tx.snapshot, pod) for pod in pods])
    allowed = np.logical_and.reduce([static_mask(tx, pod) for pod in pods])
    return Need(vectors.max(axis=0), len(pods), allowed, tx.snapshot.column(GPU))


#: Whether the job may be admitted once these victims are gone (`admission_refusal`).
Admits = Callable[[Sequence[VictimUnit]], bool]


def evict_to_fit(
    ctx: CycleContext,
    group: PodGroupState,
    units: Sequence[VictimUnit],
    new_budget: Callable[[], Budget],
    admits: Admits,
) -> list[VictimUnit] | None:
    """The victims whose eviction lets the group's minimum fit and `admits` it,
    evicted and the group placed in the transaction (for the caller's step to
    commit); None, with nothing changed, if none do."""
    tx, need = ctx.transaction, job_need(ctx.transaction, group)
    if need is None or not units:
        return None
    if no_domain_could_hold(ctx, group, units, new_budget):
        return None
    need = _in_one_domain(tx, group, need)
    most = _most(tx, need)
    for slack in SLACK:
        wanted = dataclasses.replace(need, count=need.count + int(slack * need.count))
        chosen = select_victims(
            tx.free,
            wanted,
            units,
            _vector(tx),
            _node_of(tx),
            new_budget(),
            _released(tx),
            _kept_options(tx),
            most,
            tx.memo.get(FOUND_OPTIONS, tx.version, dict),
            new_budget,
        )
        if chosen is None:
            break
        if not chosen and admits(chosen) and _try_fit(ctx, group, chosen):
            return chosen  # it fits as things are: nobody is evicted
        victims = whole_gangs(chosen, units)
        kept = chosen and new_budget().take(victims) and _fit_and_trim(ctx, group, victims, admits)
        if kept:
            return kept
    # Room may be free already and only a limit in the way (victims free room in
    # their queues): then every victim the budget allows is tried.
    everything = whole_gangs(_everything(units, new_budget()), units)
    return _fit_and_trim(ctx, group, everything, admits) if new_budget().take(everything) else None


def _in_one_domain(tx: Transaction, group: PodGroupState, need: Need) -> Need:
    """The need of a gang with a required topology level gathered in one of its
    domains (`Need.domains`, on the nodes that are in one): room freed across
    domains would not let it fit. Any other need as it is."""
    constraint = group.spec.topologyConstraint
    if constraint is None or constraint.requiredLevel is None:
        return need
    domains = gang_domains(tx, group)
    if domains is None:
        return need
    return dataclasses.replace(need, allowed=need.allowed & (domains >= 0), domains=domains)


def no_domain_could_hold(
    ctx: CycleContext,
    group: PodGroupState,
    units: Sequence[VictimUnit],
    new_budget: Callable[[], Budget],
) -> bool:
    """A gang that no domain its members must share (`gang_domains`: one of its
    required topology level, else the whole cluster) could hold even were every
    victim the budget allows on its own gone, or could hold in total with each
    victim queue giving up no more than one take allows: then no set of victims
    can let it fit, and the search (cluster-wide, then with more slack, then with
    everything) is not made.

    Exact: every set the search tries is taken by a fresh budget, which (as
    `refuses_every` relies on) refuses no set whose every member it would not take
    alone, and which takes from each queue no more than `Budget.most_taken`; so
    the free room any try gives is at most this one (`domain_could_hold`,
    `domain_could_hold_in_total`). A gang with subgroups (their own constraints)
    is never cut."""
    tx = ctx.transaction
    domains = gang_domains(tx, group)
    if domains is None:
        return False
    budget = new_budget()
    # The units the budget takes alone and their pods: shared by the budgets that
    # answer alike (every job of a reclaiming queue meets the same ones).
    alone, pods = budget.shared(units, lambda: _taken_alone(tx, units, budget))
    if not domain_holds(tx, group, domains, freed_room(tx.free, pods)):
        return True
    if not domain_could_hold_in_total(tx, group, domains, alone, pods, budget):
        return True
    constraint = group.spec.topologyConstraint
    if constraint is None or constraint.requiredLevel is None:
        return False  # the cluster is its one domain: nodes enough to free, mostly
    return not domain_could_be_freed(tx, group, domains, alone, pods, budget)


def _taken_alone(
    tx: Transaction, units: Sequence[VictimUnit], budget: Budget
) -> tuple[list[VictimUnit], UnitPods]:
    """The units `budget` takes alone (it took nothing yet), in order, and their pods
    laid out (`UnitPods`), each unit numbered by its place among them. The budget is
    asked once per kind of unit (`_unit_kinds`)."""
    kinds, of_unit = _unit_kinds(tx, units)
    takes = np.array([budget.takes_alone(unit) for unit in kinds], dtype=bool)
    taken = takes[of_unit] if kinds else np.zeros(0, dtype=bool)
    return list(itertools.compress(units, taken.tolist())), unit_pods(tx, units).of_units(taken)


@dataclass(frozen=True, eq=False)
class UnitPods:
    """The pods of a list of victim units laid out for counting, in the list's order
    (unit after unit, each unit's pods in its order): each pod's unit (its index in
    the list), its node's row and what it holds there (`held_vector`)."""

    unit: npt.NDArray[np.int64]
    node: npt.NDArray[np.int64]
    held: Matrix

    def of_units(self, taken: npt.NDArray[np.bool_]) -> UnitPods:
        """The pods of the units `taken` (one flag per unit), in order, each unit
        numbered by its place among those taken."""
        chosen = taken[self.unit]
        numbers = np.cumsum(taken, dtype=np.int64) - 1
        return UnitPods(numbers[self.unit[chosen]], self.node[chosen], self.held[chosen])


#: Per list of units: their pods laid out (`unit_pods`).
UNIT_PODS = MemoKey[UnitPods]("victim units' pods laid out")


def unit_pods(tx: Transaction, units: Sequence[VictimUnit]) -> UnitPods:
    """The units' pods laid out (`UnitPods`), once per cycle for a list every job's
    search shares, so that a count reads arrays, not pods. A list `running_units`
    gave is cut from the untouched units' layout, itself joined from what each
    group's layout keeps from cycle to cycle (`Untouched.laid_out`)."""
    if not isinstance(units, list):
        return lay_out(tx, units)
    source = tx.memo.find(UNITS_FROM, id(units))
    if source is not None and source[0] is units:
        _, untouched, flags = source
        build = lambda: untouched.laid_out(tx).of_units(flags)  # noqa: E731
        return tx.memo.of_object(UNIT_PODS, units, None, build)
    return tx.memo.of_object(UNIT_PODS, units, None, lambda: lay_out(tx, units))


def lay_out(tx: Transaction, units: Sequence[VictimUnit]) -> UnitPods:
    """The units' pods laid out, pod by pod (`UnitPods`)."""
    snapshot, index = tx.snapshot, tx.snapshot.node_index
    found = [(n, index[p.node or ""], p) for n, unit in enumerate(units) for p in unit.pods]
    held = np.zeros((len(found), tx.free.shape[1]))
    for row, (_, _, pod) in enumerate(found):
        held[row] = held_vector(snapshot, pod)
    return UnitPods(
        np.array([n for n, _, _ in found], dtype=np.int64),
        np.array([node for _, node, _ in found], dtype=np.int64),
        held,
    )


#: A group's victim units' pods laid out, with how many pods each unit has.
GroupPods = tuple[UnitPods, npt.NDArray[np.int64]]
#: By group key: the group's state and its victim pods laid out from it.
GroupLayouts = dict[str, tuple[PodGroupState, GroupPods]]
#: The groups' layouts for one layout of nodes and resource columns, kept from cycle to
#: cycle with the groups (`KeptPerGroup.flat`).
GROUP_PODS = MemoKey[GroupPods]("a group's victim pods laid out")


def freed_room(free: Matrix, pods: UnitPods) -> Matrix:
    """`free` with what `pods` hold added on their nodes, pod after pod in order (the
    very sums a walk over the pods makes: `np.add.at` adds unbuffered, in order)."""
    room = free.copy()
    add_rows(room, pods.node, pods.held)
    return room


#: Per list of units: one unit of each (leaf queue, requests) among them, and each
#: unit's index among those.
UNIT_KINDS = MemoKey[tuple[list[VictimUnit], npt.NDArray[np.int64]]]("victim units by kind")


def _unit_kinds(
    tx: Transaction, units: Sequence[VictimUnit]
) -> tuple[list[VictimUnit], npt.NDArray[np.int64]]:
    """The units alike in all `Budget.takes_alone` reads (their leaf queue and their
    requests) once each, and the index of each unit's kind: a budget is asked once
    per kind, not once per unit (every job's search meets the same units)."""

    def build() -> tuple[list[VictimUnit], npt.NDArray[np.int64]]:
        index: dict[tuple[str, Resources], int] = {}
        kinds: list[VictimUnit] = []
        of_unit: list[int] = []
        for unit in units:
            key = (unit.queue, unit.requests)
            found = index.get(key)
            if found is None:
                found = index[key] = len(kinds)
                kinds.append(unit)
            of_unit.append(found)
        return kinds, np.array(of_unit, dtype=np.int64)

    return tx.memo.of_object(UNIT_KINDS, units, None, build)


#: Each node's domain (an index; -1: in none) for the members of one gang.
NodeDomains = npt.NDArray[np.int64]


def gang_domains(tx: Transaction, group: PodGroupState) -> NodeDomains | None:
    """The domains one of which must hold all the gang's members: those of its
    required topology level, or, without one, a single domain of every node. None
    (not judged) for a gang with subgroups, which carry their own constraints, or
    whose constraint names no topology or level."""
    if group.spec.subGroups:
        return None
    constraint = group.spec.topologyConstraint
    if constraint is None or constraint.requiredLevel is None:
        return np.zeros(tx.free.shape[0], dtype=np.int64)
    scope = resolve(tx, constraint, constraint.topology)
    if not isinstance(scope, Scope) or scope.fallback_to_all:
        return None
    return scope.tree.levels[scope.levels[-1]].node_domain


def domain_could_hold(
    tx: Transaction, group: PodGroupState, domains: NodeDomains, freed: Iterable[PodState]
) -> bool:
    """Whether some domain of `domains` (`gang_domains`) could hold the gang's missing
    members were the `freed` pods gone: its nodes, each with the room left plus
    what the freed pods there hold, count at least as many pods of the smallest
    request among the pending ones, on nodes some of them may use. Placement puts
    the missing members on nodes of one domain, each where it passes its own
    filters and fits, so no placement with at most that room freed succeeds when
    this is false."""
    free = tx.free.copy()
    index = tx.snapshot.node_index
    for pod in freed:
        free[index[pod.node or ""]] += held_vector(tx.snapshot, pod)
    return domain_holds(tx, group, domains, free)


def domain_holds(tx: Transaction, group: PodGroupState, domains: NodeDomains, room: Matrix) -> bool:
    """`domain_could_hold` on each node's room (`room`) given: whether its nodes, in
    some domain, count at least as many pods of the smallest pending request as
    the gang misses, on nodes some of them may use."""
    smallest, allowed = _least_pending(tx, group)
    fits = np.where(allowed, pods_fitting(room, smallest), 0)
    inside = domains >= 0
    per_domain = np.bincount(domains[inside], weights=fits[inside])
    return bool(per_domain.max(initial=0) >= len(group.missing))


#: Per group: what its pending pods ask (`held_vector` rows), each resource's column
#: sorted, and the nodes some of them may use (their static filters).
PENDING_ASKS = MemoKey[tuple[Matrix, npt.NDArray[np.bool_]]]("pending pods' asks sorted")


def _pending_asks(tx: Transaction, group: PodGroupState) -> tuple[Matrix, npt.NDArray[np.bool_]]:
    """What the group's pending pods ask, each resource's column sorted (the first
    row is the least any asks, resource by resource), and the nodes some of them
    may use; once per cycle for each group (they read the group and the cycle's
    static filters)."""

    def build() -> tuple[Matrix, npt.NDArray[np.bool_]]:
        pending = group.pending
        asks = np.sort(np.array([held_vector(tx.snapshot, pod) for pod in pending]), axis=0)
        return asks, np.logical_or.reduce([static_mask(tx, pod) for pod in pending])

    return tx.memo.of_object(PENDING_ASKS, group, None, build)


def _least_pending(tx: Transaction, group: PodGroupState) -> tuple[Vector, npt.NDArray[np.bool_]]:
    """The least any pending pod of the group asks, resource by resource, and the
    nodes some of them may use (their static filters)."""
    asks, allowed = _pending_asks(tx, group)
    return asks[0], allowed


def domain_could_hold_in_total(
    tx: Transaction,
    group: PodGroupState,
    domains: NodeDomains,
    units: Sequence[VictimUnit],
    pods: UnitPods,
    budget: Budget,
) -> bool:
    """Whether some domain of `domains` has, in every resource, the room the missing
    members ask for added up: the room left on its nodes, plus what `units` free
    there (their pods laid out: `pods`), each victim leaf queue's share of it no
    more than the budget lets one take free of that queue's units
    (`Budget.most_taken`). The members asked for are the cheapest ones the
    pending pods could complete the minimum with, resource by resource.

    Exact: every victim set the search tries is accepted by one take of a fresh
    budget, so each queue gives up no more than its bound; the members placed in
    one domain then fit its room added up (negative room counted as none, which
    only adds)."""
    snapshot = tx.snapshot
    inside = domains >= 0
    if not inside.any():
        return False
    room = np.zeros((int(domains[inside].max()) + 1, tx.free.shape[1]))
    add_rows(room, domains[inside], np.maximum(tx.free[inside], 0.0))
    # Each leaf's freed room is added in the order its units come (the same sums).
    leaves: dict[str, int] = {}
    leaf_of_unit = np.array([leaves.setdefault(u.queue, len(leaves)) for u in units], np.int64)
    leaf_of_pod = leaf_of_unit[pods.unit]
    domain_of_pod = domains[pods.node]
    counted = domain_of_pod >= 0
    for leaf, code in leaves.items():
        mine = counted & (leaf_of_pod == code)
        freed = np.zeros_like(room)
        add_rows(freed, domain_of_pod[mine], pods.held[mine])
        cap = np.full(room.shape[1], np.inf)
        for resource, most in budget.most_taken(leaf).items():
            if resource in snapshot.resource_names:
                cap[snapshot.column(resource)] = most
        room += np.minimum(freed, cap)
    # the least any `len(missing)` of the pending pods ask for together, per resource
    asks, _ = _pending_asks(tx, group)
    need = asks[: len(group.missing)].sum(axis=0)
    return bool(np.any(np.all(room >= need - EPSILON, axis=1)))


def domain_could_be_freed(
    tx: Transaction,
    group: PodGroupState,
    domains: NodeDomains,
    alone: Sequence[VictimUnit],
    pods: UnitPods,
    budget: Budget,
) -> bool:
    """`nodes_could_be_freed` on the cluster's figures: the gang's missing members
    as the least of its pending pods asks (`domain_could_hold`'s count), on nodes
    some of them may use; the units each victim leaf queue may give at all
    (`alone`, their pods laid out: `pods`), within what one take of the budget
    lets it give (`Budget.most_taken`)."""
    least, allowed = _least_pending(tx, group)
    free = np.maximum(tx.free, 0.0)
    if _takes_as_is(free, least, len(group.missing), domains, allowed):
        return True  # no unit need go: the units are not read
    bounds: dict[str, dict[str, float]] = {}
    for leaf in {unit.queue for unit in alone}:
        bounds[leaf] = dict(budget.most_taken(leaf))
    units = [
        FreedUnit(unit.queue, tuple(unit.requests[r] for r in bounds[unit.queue])) for unit in alone
    ]
    caps = {leaf: tuple(most.values()) for leaf, most in bounds.items()}
    count = len(group.missing)
    return nodes_could_be_freed(free, least, count, domains, allowed, units, pods, caps)


@dataclass(frozen=True)
class FreedUnit:
    """A victim unit as `nodes_could_be_freed` reads it: its leaf queue, and what it
    asks of each resource its queue's cap bounds (in the cap's order)."""

    queue: str
    cost: tuple[float, ...]


#: Sets of units `nodes_could_be_freed` tries before it answers that they could be.
_UNIT_SETS = 1024


class _TooMany(Exception):
    """`nodes_could_be_freed` tried `_UNIT_SETS` sets."""


def nodes_could_be_freed(
    free: Matrix,
    least: Vector,
    count: int,
    domains: NodeDomains,
    allowed: npt.NDArray[np.bool_],
    units: Sequence[FreedUnit],
    pods: UnitPods,
    caps: Mapping[str, Sequence[float]],
) -> bool:
    """Whether some domain (`domains`: each node's, -1: in none) has `count` nodes,
    each allowed and able to take one item asking `least` once the units it needs
    are gone, where those units, taken together, cost each queue no more than its
    cap (`caps`, per resource bounded; a unit's `cost`; `pods`: the units' pods,
    numbered as in `units`). A node needs a unit when,
    every other unit's pods there gone (`free` is each node's room now), it still
    cannot take one item. Judged only when no node could take two items with
    every unit gone (else True), and True also once `_UNIT_SETS` sets of units
    were tried.

    A necessary condition for placing `count` items, each asking at least `least`,
    inside one domain, each on a node where it fits, once some set of units
    within the caps is gone: no node takes two, so the items need `count` nodes
    of one domain; each of those needs its needed units gone (less room freed
    is never more room); so the set holds all their units and costs each queue
    at least what they do together. Where this is false, no victim set a search
    tries (each within one take of a fresh budget) lets the gang fit: a
    rack-held gang whose racks each need victims of one queue beyond what it
    may give."""
    room = freed_room(free, pods)
    usable = allowed & (domains >= 0)
    fits = np.where(usable, pods_fitting(room, least), 0)
    if fits.max(initial=0) > 1:
        return True
    if _takes_as_is(free, least, count, domains, allowed):
        return True
    needed = _needed_units(pods, fits > 0, room, least)
    try:
        for domain in np.unique(domains[fits > 0]).tolist():
            nodes = np.flatnonzero((domains == domain) & (fits > 0)).tolist()
            if len(nodes) < count:
                continue
            needs = Counter(frozenset(needed.get(node, ())) for node in nodes)
            if _could_free(needs, count, units, caps):
                return True
    except _TooMany:
        return True
    return False


def _takes_as_is(
    free: Matrix, least: Vector, count: int, domains: NodeDomains, allowed: npt.NDArray[np.bool_]
) -> bool:
    """Whether some domain has `count` allowed nodes that take an item asking `least`
    as they are (no unit need go)."""
    as_is = allowed & (domains >= 0) & (pods_fitting(free, least) > 0)
    return bool(np.bincount(domains[as_is], minlength=1).max() >= count)


def _needed_units(
    pods: UnitPods, near: npt.NDArray[np.bool_], room: Matrix, least: Vector
) -> dict[int, list[int]]:
    """Per node of `near` (a flag per node), the units it needs: those without which
    (every other unit's pods there gone, `room`) it cannot take one item asking
    `least`. What a unit holds on a node is summed pod by pod in order."""
    on_near = near[pods.node]
    node, unit = pods.node[on_near], pods.unit[on_near]
    if not len(node):
        return {}
    # Each (node, unit) pair as one number, its pods' holdings summed in order.
    width = int(unit.max()) + 1
    pairs, which = np.unique(node * width + unit, return_inverse=True)
    held = np.zeros((len(pairs), room.shape[1]))
    add_rows(held, which.reshape(-1), pods.held[on_near])
    without = pods_fitting(room[pairs // width] - held, least) == 0
    needed: dict[int, list[int]] = {}
    for pair in pairs[without].tolist():
        needed.setdefault(pair // width, []).append(pair % width)
    return needed


def _could_free(
    needs: Counter[frozenset[int]],
    count: int,
    units: Sequence[FreedUnit],
    caps: Mapping[str, Sequence[float]],
) -> bool:
    """Whether some union of the nodes' needed sets (`needs`: how many nodes need
    each set) costs each queue no more than its cap while the nodes whose set it
    holds number `count` or more. Searched set by set, a set adding nothing new
    skipped (its nodes are counted already), a union over a cap not grown."""
    sets = sorted(needs, key=sorted)
    # The units of the sets from each position on: a union grown from there holds
    # no more than those and the chosen ones, so it counts no more nodes than
    # the sets inside that.
    later = [frozenset[int]()] * (len(sets) + 1)
    for position in range(len(sets) - 1, -1, -1):
        later[position] = later[position + 1] | sets[position]

    def counted(union: frozenset[int]) -> int:
        return sum(many for needed, many in needs.items() if needed <= union)

    tried = 0

    def grow(start: int, chosen: frozenset[int], spent: dict[str, list[float]]) -> bool:
        nonlocal tried
        tried += 1
        if tried > _UNIT_SETS:
            raise _TooMany
        if counted(chosen) >= count:
            return True
        if counted(chosen | later[start]) < count:
            return False  # no union grown from here makes up the count
        for position in range(start, len(sets)):
            added = sets[position] - chosen
            if not added:
                continue
            grown = {queue: list(amounts) for queue, amounts in spent.items()}
            for number in added:
                unit = units[number]
                amounts = grown.setdefault(unit.queue, [0.0] * len(unit.cost))
                for i, cost in enumerate(unit.cost):
                    amounts[i] += cost
            if any(
                amount > cap
                for queue, amounts in grown.items()
                for amount, cap in zip(amounts, caps.get(queue, ()), strict=False)
            ):
                continue
            if grow(position + 1, chosen | added, grown):
                return True
        return False

    return grow(0, frozenset(), {})


def whole_gangs(chosen: Sequence[VictimUnit], units: Sequence[VictimUnit]) -> list[VictimUnit]:
    """`chosen`, plus every extra of a gang whose core is chosen (no gang is left broken)."""
    cores = {u.group.key for u in chosen if not u.extra}
    picked = {id(u) for u in chosen}
    return [*chosen, *(u for u in units if u.group.key in cores and id(u) not in picked)]


def _everything(units: Sequence[VictimUnit], budget: Budget) -> list[VictimUnit]:
    if budget.refuses_every(units):
        return []  # each `take` below would be refused
    return budget.take_each(units)


def _fit_and_trim(
    ctx: CycleContext, group: PodGroupState, victims: list[VictimUnit], admits: Admits
) -> list[VictimUnit] | None:
    tx = ctx.transaction
    mark = tx.checkpoint()
    if not victims or not admits(victims) or not _try_fit(ctx, group, victims):
        return None
    used = {p.node for p in tx.placements[mark:] if not p.removal}
    node_of = _node_of(tx)
    needed = [u for u in victims if any(node_of(p) in used for p in u.pods)]
    needed = whole_gangs(needed, victims)
    if len(needed) < len(victims) and admits(needed):
        tx.rollback(mark)
        if not _try_fit(ctx, group, needed):
            needed = victims
            if not _try_fit(ctx, group, victims):
                raise RuntimeError(f"{group.key}: a fit that held failed again on the same state")
    else:
        needed = victims
    return _give_back(ctx, group, needed, admits, mark)


def _give_back(
    ctx: CycleContext, group: PodGroupState, victims: list[VictimUnit], admits: Admits, mark: int
) -> list[VictimUnit]:
    """Every victim the fit does not need, on the nodes the job uses too, given back:
    the most disruptive first (whole gangs, more GPUs, higher priority, older), each
    kept out when the job still fits and is admitted without it. The transaction
    holds the fit of the victims returned (it holds the fit of `victims` on entry)."""
    kept, holds = list(victims), True
    if len(kept) < 2:
        return kept
    spare = [u for u in victims if _room_left_for(ctx.transaction, u)]
    for unit in sorted(spare, key=unit_order, reverse=True):
        if unit.extra and any(not u.extra and u.group.key == unit.group.key for u in kept):
            continue  # an extra goes with its core: no gang is left broken
        trial = [u for u in kept if u is not unit]
        if not trial or not admits(trial):
            continue
        ctx.transaction.rollback(mark)
        holds = _try_fit(ctx, group, trial)
        if holds:
            kept = trial
    if not holds and not _try_fit(ctx, group, kept):
        raise RuntimeError(f"{group.key}: a fit that held failed again on the same state")
    return kept


def _room_left_for(tx: Transaction, unit: VictimUnit) -> bool:
    """Whether, with the job placed, each node the unit holds still has free what the
    unit holds there: a victim the placement used up cannot be given back, so only
    the others are tried (each try places the whole job again)."""
    index, held = tx.snapshot.node_index, dict[int, Vector]()
    for pod in unit.pods:
        node = index[pod.node or ""]
        held[node] = held.get(node, 0.0) + held_vector(tx.snapshot, pod)
    return all(bool(np.all(tx.free[node] >= amount - EPSILON)) for node, amount in held.items())


def _try_fit(ctx: CycleContext, group: PodGroupState, victims: Sequence[VictimUnit]) -> bool:
    tx = ctx.transaction
    if not could_fit_without(tx, group, victims):
        return False  # placing it would fail: no domain could hold it, counted
    mark = tx.checkpoint()
    for unit in victims:
        for pod in unit.pods:
            tx.evict(pod, unit.group.key)
    if place_gang(tx, group, ctx.config).admitted:
        return True
    tx.rollback(mark)
    return False


def could_fit_without(tx: Transaction, group: PodGroupState, victims: Sequence[VictimUnit]) -> bool:
    """False when no domain the gang's members must share (`gang_domains`) could hold
    its missing members were the victims' pods gone (`domain_could_hold`): then placing
    it after evicting them fails, and the evictions and the placement are not tried.

    Exact: an eviction gives back what `domain_could_hold` counts the pod freeing
    (`held_vector`), and placement puts the missing members on nodes of one domain,
    each where it passes its own filters and fits, so it succeeds only where the
    count holds. What the skipped attempt would have left behind is only what
    caches keep of transaction versions it alone would have reached (versions are
    never reused), and nodes whose rows moved and moved back (`changed_nodes`),
    which only makes caches kept per node look again. A gang with subgroups, or
    whose required level does not resolve to domains (`gang_domains` gives None),
    is always tried. Most failing victim searches meet this: the greedy choice
    frees room spread over racks a rack-bound gang cannot use together."""
    domains = gang_domains(tx, group)
    if domains is None:
        return True
    free = tx.free.copy()
    for unit in victims:  # pod after pod, in order, as `domain_could_hold` adds them
        laid = tx.memo.of_object(UNIT_LAID_OUT, unit, None, lambda: lay_out(tx, [unit]))  # noqa: B023
        add_rows(free, laid.node, laid.held)
    return domain_holds(tx, group, domains, free)


#: Per victim unit: its pods laid out (`lay_out`); a unit is met in many victim sets.
UNIT_LAID_OUT = MemoKey[UnitPods]("a victim unit's pods laid out")


#: Per transaction version: the victim options found (`victims.FoundOptions`).
FOUND_OPTIONS = MemoKey[FoundOptions]("victim options found")


def _most(tx: Transaction, need: Need) -> int:
    """How many pods of the need any node it may use could hold with nothing on it."""
    fits = pods_fitting(tx.snapshot.allocatable, need.vector)
    return int(np.where(need.allowed, fits, 0).max(initial=0))


def _vector(tx: Transaction) -> PodVector:
    return lambda pod: held_vector(tx.snapshot, pod)


#: Per cycle: what each victim unit gives back on its nodes (`victims.Released`).
RELEASED = MemoKey[Released]("released by victim units")


def _released(tx: Transaction) -> Released:
    width = tx.free.shape[1]
    return tx.memo.get(RELEASED, None, lambda: Released(_vector(tx), _node_of(tx), width))


#: The caller's victim options kept from cycle to cycle (`victims.KeptOptions`; absent
#: when it keeps nothing across cycles).
VICTIM_OPTIONS = MemoKey[KeptOptions]("victim options per node")


def _kept_options(tx: Transaction) -> KeptOptions | None:
    """The kept options, following this snapshot's layout of nodes and resources
    (what `_vector` and `_node_of` read besides the pods)."""
    kept = tx.memo.find(VICTIM_OPTIONS, None)
    if kept is None:
        return None
    return kept.follow((tx.snapshot.node_names, tx.snapshot.resource_names))


def _node_of(tx: Transaction) -> Callable[[PodState], int]:
    index = tx.snapshot.node_index
    return lambda pod: index[pod.node or ""]


#: Per cycle, or kept: the groups holding a bound pod that is being deleted.
RELEASING = MemoKey[Tally[bool]]("groups holding a pod being deleted")


def _holds_releasing(group: PodGroupState) -> bool | None:
    return True if any(pod.releasing for pod in group.bound) else None


def release_terminating(ctx: CycleContext) -> list[PodState]:
    """Pipelining: every bound pod of this scheduler's groups that is being deleted
    (`PodState.releasing`: an eviction's grace period) is taken out in the
    transaction, and booked off its queue, before any action runs. What it holds
    counts as free for placement, so a waiting gang is placed onto it (its binds
    wait for the pod to go: the binder's room check), and it is never a victim
    again: no second eviction for the same room. Returns the pods taken out. Most
    cycles have none: a tally kept over the groups says so without a walk."""
    memo, groups = ctx.transaction.memo, ctx.snapshot.pod_groups
    if not kept_tally(memo, RELEASING, groups, _holds_releasing):
        return []
    releasing = [
        (pod, group)
        for group in ctx.snapshot.pod_groups.values()
        for pod in group.bound
        if pod.releasing
    ]
    if not releasing:
        return []
    with ctx.transaction.attempt() as step:
        for pod, group in releasing:
            ctx.transaction.evict(pod, group.key)
        refused = book(ctx, step)
    if refused is not None:
        raise RuntimeError(f"taking back releasing pods was refused: {refused}")
    return [pod for pod, _ in releasing]


class Refusals:
    """The jobs one run of an evicting action tried and made no room for, kept by
    everything the attempt reads (the state, and the job's kind: `refusal_kinds`),
    with the wake-up it asked for.

    With a deep backlog most jobs wait behind others of the same shape in the
    same queue; while nothing is placed or booked, such a job meets the same
    transaction, ledger, victims, budget and admission as the first, so it is
    refused the same way, and asks for the same wake-up. An attempt is kept
    only when it left the transaction and the ledger at their versions and
    evicted nobody. A wake-up is kept only when the attempt moved the plan's
    (one asked for no earlier than the plan's is a no-op now and later, since
    `wake_at` only comes earlier)."""

    def __init__(self) -> None:
        #: Per state (the transaction's and the ledger's versions), per kind of job.
        self._known: dict[tuple[int, int], dict[Hashable, float | None]] = {}

    def _at(self, ctx: CycleContext) -> dict[Hashable, float | None]:
        """The refusals kept at the state as it is."""
        return self._known.setdefault((ctx.transaction.version, ctx.ledger.version), {})

    def attempt(self, ctx: CycleContext, candidate: Candidate, attempt: Attempt) -> bool:
        """`attempt(candidate, False)`, unless an equal job was refused at the same
        state; whether it changed the state (it made room and was booked)."""
        kind, known = refusal_kinds(ctx)(candidate), self._at(ctx)
        if kind is not None and kind in known:
            wake = known[kind]
            if wake is not None:
                ctx.plan.wake_no_later_than(wake)
            return False
        before = _state(ctx)
        wake_at = ctx.plan.wake_at
        attempt(candidate, False)
        if _state(ctx) != before:
            return True
        if kind is not None:
            known[kind] = ctx.plan.wake_at if ctx.plan.wake_at != wake_at else None
        return False

    def judge(
        self, ctx: CycleContext, jobs: Iterable[Candidate], attempt: Attempt
    ) -> list[float | None] | None:
        """Each kind of job among `jobs` searched once, speculatively, at the state as
        it is (`attempt(candidate, True)`: nothing booked, the transaction as it was):
        the wake-ups the jobs would ask for when no search found room (one per kind),
        else None (stopping at the first that did). A kind that found none is kept,
        with the very wake-up it asked for, so that its jobs' turns are answered by it."""
        judged: set[Hashable] = set()
        wakes: list[float | None] = []
        plan = ctx.plan
        # The state does not move while the jobs are judged (a search that moved it
        # raises): the refusals kept at it are read once for the walk, and the jobs'
        # kinds many at once (`alike.with_kinds`: those `refusal_kinds` gives).
        known = self._at(ctx)
        for candidate, kind in with_kinds(ctx, jobs):
            if kind is not None:
                if kind in judged:
                    continue
                judged.add(kind)
                if kind in known:
                    wakes.append(known[kind])
                    continue
            before, wake_at = _state(ctx), plan.wake_at
            plan.wake_at = None
            try:
                found = attempt(candidate, True)
            finally:
                asked, plan.wake_at = plan.wake_at, wake_at
            if _state(ctx) != before:
                changed = f"a speculative search for {candidate.group.key} changed the state"
                raise RuntimeError(changed)
            if found:
                return None
            if kind is not None:
                known[kind] = asked
            wakes.append(asked)
        return wakes


#: An evicting action's attempt for one job. Speculative (True): only the search,
#: which says whether it found room, the transaction left as it was and nothing
#: booked or recorded; else the whole attempt (the return value is not read).
Attempt = Callable[[Candidate, bool], bool]


def _state(ctx: CycleContext) -> tuple[int, int, int]:
    return (ctx.transaction.version, ctx.ledger.version, len(ctx.plan.evictions))


#: The leaf queues whose jobs an evicting action's attempt may find room for at the
#: state as it is (None: any); a job of another queue is refused at the attempt's first
#: test, changing nothing and asking for no wake-up.
Hopeful = Callable[[CycleContext], Collection[str] | None]


def _any_queue(ctx: CycleContext) -> None:
    return None


def attempt_in_turn(
    ctx: CycleContext, waiting: WaitingJobs, attempt: Attempt, hopeful: Hopeful = _any_queue
) -> None:
    """Every waiting job in its turn (`ordering.take_next`), through `Refusals`.

    While the state does not change, a job's attempt that finds no room changes
    nothing but the wake-up it asks for, and wake-ups combine whatever their
    order (the earliest wins). So the kinds of job still waiting (`refusal_kinds`;
    a job without one is a kind of its own) are first each searched once,
    speculatively (`Refusals.judge`). When none finds room, the run is over:
    every job's turn would meet its kind's refusal, so only the wake-ups are
    asked, and the jobs are neither ordered nor taken one by one (a deep
    backlog judged at the cost of its kinds). Only the jobs of the queues
    `hopeful` names at the state as it is are judged: the others' attempts would
    change nothing and ask for no wake-up. Otherwise the jobs are taken in
    turn, each kind judged answered by its refusal, up to the first attempt that
    changes the state; the kinds still waiting are then judged again."""
    refusals = Refusals()
    while not waiting.empty():
        wakes = refusals.judge(ctx, waiting.remaining(hopeful(ctx)), attempt)
        if wakes is not None:
            for wake in wakes:
                if wake is not None:
                    ctx.plan.wake_no_later_than(wake)
            return
        while (candidate := take_next(ctx.ledger, waiting)) is not None:
            if refusals.attempt(ctx, candidate, attempt):
                break


def refusal_kinds(ctx: CycleContext) -> Callable[[Candidate], Hashable | None]:
    """What an evicting action's attempt reads of a job, besides the state (the
    transaction's version names its free room, placements and evictions; the
    ledger's, what the queues hold): its queue, namespace, priority and
    preemptibility (admission, the victims' queues and priorities), its request
    (the budget), and what placement reads of it (`equivalence.signature`, which
    also gives `job_need`'s pods and their node filters): the gang's
    `alike.alike_key` (the candidates here ask for their gang's missing minimum
    at its priority, `candidate_for`). None for a job placement has no signature
    for. For the many jobs of one walk, the cycle's kept keys read once."""
    key_of = alike_keys(ctx)
    return lambda candidate: key_of(candidate.group)


def running_units(
    ctx: CycleContext,
    may_take: Callable[[str], bool],
    protection: Protection,
    below: int | None = None,
) -> list[VictimUnit]:
    """Units of running preemptible groups of this scheduler, in the snapshot's order,
    whose leaf queue `may_take` accepts (and whose priority is under `below`, when
    given), untouched so far this cycle and not protected by a min-runtime (each
    protected one noted on `protection`, as `Protection.protects` does). Only the
    groups that may give victims are looked at (`victim_groups`), so a waiting job
    costs what its possible victims number, not what the cluster runs; which of
    them are untouched and protected is worked out once per state for every
    search made meanwhile (`_untouched_units`)."""
    groups = victim_groups(ctx)
    accepted = frozenset(
        queue
        for queue in groups.lowest
        if (below is None or groups.lowest[queue] < below) and may_take(queue)
    )
    untouched = _untouched_units(ctx, protection, below)

    # Every job of a queue accepts the same queues: the list is made once per list.
    def build() -> tuple[list[VictimUnit], float | None]:
        units, earliest, flags = untouched.accepted(accepted)
        ctx.transaction.memo.keep(UNITS_FROM, id(units), (units, untouched, flags))
        return units, earliest

    units, earliest = ctx.transaction.memo.of_object(RUNNING, untouched, accepted, build)
    if earliest is not None:
        before = protection.earliest_end
        protection.earliest_end = earliest if before is None else min(before, earliest)
    return units


@dataclass(frozen=True, eq=False)
class Untouched:
    """The untouched units of the groups that may give victims, in the snapshot's
    order, with each one's leaf queue (as an index into `queues`) and the end of the
    min-runtime that protects it now (NaN: none does); and per group, in order, the
    group, its priority, how many units it has and which of them are untouched
    (None: all), for laying their pods out (`laid_out`)."""

    queues: list[str]
    units: list[VictimUnit]
    queue_of: npt.NDArray[np.int64]
    ends: npt.NDArray[np.float64]
    parts: list[tuple[PodGroupState, int, int, list[int] | None]]
    #: The pods' layout for a layout of nodes and resource columns, shared by the
    #: lists of the very same units from cycle to cycle (`_Listed`): (node names,
    #: resource names, layout), or empty.
    layouts: list[tuple[object, object, UnitPods]] = dataclasses.field(default_factory=list)

    def accepted(
        self, accepted: frozenset[str]
    ) -> tuple[list[VictimUnit], float | None, npt.NDArray[np.bool_]]:
        """The units of the accepted queues no min-runtime protects, in order, the
        earliest end of the protections met among those queues' units, and which of
        the units those are (a flag per unit)."""
        codes = [index for index, queue in enumerate(self.queues) if queue in accepted]
        taken = np.isin(self.queue_of, codes)
        protected = ~np.isnan(self.ends)
        flags = taken & ~protected
        units = list(itertools.compress(self.units, flags.tolist()))
        ends = self.ends[taken & protected]
        return units, float(ends.min()) if ends.size else None, flags

    def laid_out(self, tx: Transaction) -> UnitPods:
        """The units' pods laid out, joined from each group's kept layout: its nodes
        and holdings in order, and each unit's number from how many pods each has
        (a group lays its units out one after the other). Kept with the units while
        they are listed again as they were (`_Listed`) and the nodes and resource
        columns are the same."""
        snapshot = tx.snapshot
        facts = (snapshot.node_names, snapshot.resource_names)
        for names, columns, laid in self.layouts:
            if same_values((names, columns), facts):
                return laid

        def build() -> UnitPods:
            nodes: list[npt.NDArray[np.int64]] = []
            held: list[Matrix] = []
            sizes: list[npt.NDArray[np.int64]] = []
            kept_laid = _kept_group_pods(tx)
            for group, priority, count, kept in self.parts:
                found = kept_laid.get(group.key)
                if found is None or found[0] is not group:
                    found = (group, _lay_out_group(tx, group, priority))
                    kept_laid[group.key] = found
                laid, per_unit = found[1]
                if kept is None:
                    nodes.append(laid.node)
                    held.append(laid.held)
                    sizes.append(per_unit)
                    continue
                flags = np.zeros(count, dtype=bool)
                flags[kept] = True
                chosen = flags[laid.unit]
                nodes.append(laid.node[chosen])
                held.append(laid.held[chosen])
                sizes.append(per_unit[kept])
            if not nodes:
                return lay_out(tx, [])
            per_unit = np.concatenate(sizes)
            return UnitPods(
                np.repeat(np.arange(len(per_unit), dtype=np.int64), per_unit),
                np.concatenate(nodes),
                np.concatenate(held),
            )

        laid = tx.memo.of_object(UNTOUCHED_PODS, self, None, build)
        self.layouts[:] = [(*facts, laid)]
        return laid


def _kept_group_pods(tx: Transaction) -> GroupLayouts:
    """The groups' layouts kept from cycle to cycle for the snapshot's nodes and
    resource columns (compared by identity, then by value: the rows a layout names
    are the nodes' order); a table for this cycle alone when nothing is kept across
    cycles."""
    snapshot = tx.snapshot
    per_group = tx.memo.find(PER_GROUP, None)
    if per_group is None:
        return tx.memo.get(GROUP_PODS_NOW, None, GroupLayouts)
    return per_group.flat(GROUP_PODS, (snapshot.node_names, snapshot.resource_names))


def _lay_out_group(tx: Transaction, group: PodGroupState, priority: int) -> GroupPods:
    """The pods of the group's victim units (`_units_of`) laid out, with how many pods
    each unit has."""
    units = _units_of(tx, group, priority)
    return lay_out(tx, units), np.array([len(unit.pods) for unit in units], dtype=np.int64)


#: Per list of untouched units: their pods laid out (`Untouched.laid_out`).
UNTOUCHED_PODS = MemoKey[UnitPods]("untouched victim pods laid out")
#: The groups' layouts for this cycle alone, when nothing is kept across cycles.
GROUP_PODS_NOW = MemoKey[GroupLayouts]("groups' victim pods laid out this cycle")
#: Per id of a list `running_units` gave: the list, the untouched units it was cut
#: from and which of them it holds (`unit_pods` cuts its layout from theirs).
UNITS_FROM = MemoKey[tuple[list[VictimUnit], Untouched, npt.NDArray[np.bool_]]]("units cut from")


#: Per (list of untouched units, queues accepted): the accepted queues' unprotected
#: units, in its order (shared: read only), and the earliest end of their protections.
RUNNING = MemoKey[tuple[list[VictimUnit], float | None]]("running units accepted")


#: Per (pods evicted in the transaction, min-runtime field and time, priority bound):
#: the untouched units of the groups that may give victims (`_untouched_units`).
UNTOUCHED = MemoKey[Untouched]("untouched victim units")


def _untouched_units(ctx: CycleContext, protection: Protection, below: int | None) -> Untouched:
    """Every untouched unit, in the snapshot's order, of the groups that may give
    victims (of a priority under `below`, when given), with its group's leaf queue
    and the end of the min-runtime that protects it now. What it reads besides the
    groups (kept per cycle) is the pods the transaction evicted, the queue tree and
    the protection's field and time.

    Before any eviction (a cycle's first search, most of them), the list is the
    one of the last cycle when the groups that may give victims are the very same
    objects, with the same priorities, in the same order, and their queues' min-runtimes are
    the same (`_Listed`, kept across cycles): only which units are protected is
    read again, against the time. A backlog's cycles mostly place nothing, and
    the running groups stay as they were."""
    tx = ctx.transaction

    def build() -> Untouched:
        groups = victim_groups(ctx)
        entries = groups.in_order
        if below is not None:
            chosen = {queue for queue, lowest in groups.lowest.items() if lowest < below}
            entries = [e for e in groups.in_order if e[0].queue in chosen and e[1] < below]
        if tx.removed or tx.memo.find(PER_GROUP, None) is None:
            return _Listed.of(tx, entries, protection).at(protection.now)
        across = tx.memo.get(ACROSS_CYCLES, None, KeptAcrossCycles)
        slot = (UNTOUCHED, protection.which, below)
        listed = across.find(slot, ())
        if not isinstance(listed, _Listed) or not listed.holds_for(entries, protection):
            listed = _Listed.of(tx, entries, protection)
            across.keep(slot, (), listed)
        return listed.at(protection.now)

    # The transaction is read for the pods it evicted alone: placements made meanwhile
    # (allocate's, most of a cycle's) leave the list as it was.
    removed = frozenset(tx.removed)
    key = (removed, id(protection.tree), protection.which, protection.now, below)
    return tx.memo.get(UNTOUCHED, key, build)


@dataclass(frozen=True, eq=False)
class _Listed:
    """The untouched units of some groups that may give victims (`entries`: each
    group and its priority, in order) as `Untouched` lists them, but with the end of
    each unit's min-runtime protection whether it protects now or not (`raw`; NaN:
    none), and the min-runtime of each queue met, which those ends were worked out
    from."""

    entries: Sequence[tuple[PodGroupState, int]]
    minimums: dict[str, float]
    raw: Untouched

    @classmethod
    def of(
        cls, tx: Transaction, entries: Sequence[tuple[PodGroupState, int]], protection: Protection
    ) -> _Listed:
        """The units of `entries` left untouched by the transaction's evictions."""
        queues: dict[str, int] = {}
        units: list[VictimUnit] = []
        queue_of: list[int] = []
        ends: list[float] = []
        parts: list[tuple[PodGroupState, int, int, list[int] | None]] = []
        removed = tx.removed
        for group, priority in entries:
            found, found_ends = _units_and_ends(tx, group, priority, protection)
            kept: list[int] | None = None
            if removed:
                kept = [i for i, u in enumerate(found) if all(p.key not in removed for p in u.pods)]
            parts.append((group, priority, len(found), kept))
            if kept is not None:
                found, found_ends = [found[i] for i in kept], [found_ends[i] for i in kept]
            units += found
            ends += found_ends
            queue_of += [queues.setdefault(group.queue, len(queues))] * len(found)
        minimums = {queue: protection.minimum_of(queue) for queue in queues}
        raw = Untouched(
            list(queues),
            units,
            np.array(queue_of, dtype=np.int64),
            np.array(ends, dtype=np.float64),
            parts,
        )
        return cls(entries, minimums, raw)

    def holds_for(
        self, entries: Sequence[tuple[PodGroupState, int]], protection: Protection
    ) -> bool:
        """Listing `entries` untouched, under `protection`'s field and queues, gives
        these units: the very same group objects and priorities in the same order
        (a group's units and their ends are derived from it alone, and kept with it:
        `_units_and_ends`), and the same min-runtime for each queue."""
        mine = self.entries
        return (
            len(mine) == len(entries)
            and all(a[0] is b[0] and a[1] == b[1] for a, b in zip(mine, entries, strict=True))
            and all(protection.minimum_of(q) == m for q, m in self.minimums.items())
        )

    def at(self, now: float) -> Untouched:
        """The list as of `now`: an end still to come protects (NaN, none, compares
        False). The lists of every time share their units and their pods' layout."""
        ends = self.raw.ends
        return dataclasses.replace(self.raw, ends=np.where(ends > now, ends, np.nan))


#: Per group: its victim units (`_units_of`) with when a min-runtime protection of
#: each ends (`Protection.ends_at`; NaN: none), for one min-runtime field and the
#: group's queue's minimum, kept from cycle to cycle with the group.
UNITS_AND_ENDS = MemoKey[tuple[list[VictimUnit], list[float]]]("victim units and ends")


def _units_and_ends(
    tx: Transaction, group: PodGroupState, priority: int, protection: Protection
) -> tuple[list[VictimUnit], list[float]]:
    """The group's victim units and the end of each one's protection (read only)."""

    def build() -> tuple[list[VictimUnit], list[float]]:
        units = _units_of(tx, group, priority)
        ends = [protection.ends_at(unit) for unit in units]
        return units, [np.nan if end is None else end for end in ends]

    minimum = protection.minimum_of(group.queue)
    return kept_per_group(tx.memo, UNITS_AND_ENDS, (protection.which, minimum), group, build)


@dataclass(frozen=True)
class VictimGroups:
    """The groups that may give victims, in the snapshot's order, each with its
    priority; and each of their leaf queues' lowest priority."""

    in_order: list[tuple[PodGroupState, int]]
    lowest: dict[str, int]


#: Per cycle: the groups that may give victims (they depend on the snapshot alone).
VICTIM_GROUPS = MemoKey[VictimGroups]("victim groups")


def victim_groups(ctx: CycleContext) -> VictimGroups:
    """Running preemptible groups of this scheduler, seen whole, with victim units,
    listed once per cycle in the snapshot's order, with each leaf queue's lowest
    priority. The groups that may give victims at all are followed from cycle to
    cycle (a tally's members, `totals.kept_members`): the walk is over them, not
    over every group."""
    scheduler, tx = ctx.config.schedulerName, ctx.transaction

    def build() -> VictimGroups:
        groups = ctx.snapshot.pod_groups
        givers = kept_members(tx.memo, GIVERS, groups, _giver)
        found = VictimGroups([], {})
        # The givers in the snapshot's order: the keys filtered (in C), not every
        # group looked at in turn.
        for key in filter(givers.__contains__, groups):
            owner, priority = givers[key]
            if owner != scheduler:
                continue
            group = groups[key]
            found.in_order.append((group, priority))
            lowest = found.lowest.get(group.queue, priority)
            found.lowest[group.queue] = min(lowest, priority)
        return found

    return tx.memo.get(VICTIM_GROUPS, scheduler, build)


#: Per group: the scheduler it may give victims to and its priority (`_giver`),
#: followed from cycle to cycle (`totals.kept_members`).
GIVERS = MemoKey[Tally[tuple[str, int]]]("groups that may give victims")


def _giver(group: PodGroupState) -> tuple[str, int] | None:
    """The scheduler whose evicting actions may take victims from the group, and the
    group's priority: preemptible, every live pod that one scheduler's, seen whole,
    with victim units; else None. Reads the group alone."""
    priority = group_priority(group)
    if not is_preemptible(group, priority):
        return None
    schedulers = {pod.scheduler for pod in group.live_pods()}
    if len(schedulers) != 1:
        return None  # none live (no unit), or another scheduler's pods are not ours to evict
    if not group.seen_whole:
        return None  # a member on a node the snapshot does not know cannot be judged
    if not victim_units(group, priority, started_at(group)):
        return None
    return schedulers.pop(), priority


def _units_of(tx: Transaction, group: PodGroupState, priority: int) -> list[VictimUnit]:
    """The group's victim units, cut once per cycle (they depend on the group alone:
    `priority` is its `group_priority`), and kept from cycle to cycle while the
    group's state is the very same object (`totals.KeptPerGroup`, when kept)."""

    def build() -> list[VictimUnit]:
        cut = lambda: victim_units(group, priority, started_at(group))  # noqa: E731
        return kept_per_group(tx.memo, VICTIM_UNITS, None, group, cut)

    return tx.memo.get(VICTIM_UNITS, group.key, build)


def admission_refusal(
    ctx: CycleContext, candidate: Candidate, victims: Iterable[VictimUnit]
) -> str | None:
    """Why the job may not be admitted even once `victims` are gone (what they hold
    is given back in each queue on their paths: `admission.freed_in_queues`)."""
    group = candidate.group
    preemptible = is_preemptible(group, candidate.priority)
    return refusal(ctx.ledger, group, candidate.request, preemptible, _freed(ctx, victims))


#: Per list of victims: what it frees in each queue (`admission.freed_in_queues`,
#: which reads the queue tree and the victims alone).
FREED = MemoKey[Freed]("freed by victims")


def _freed(ctx: CycleContext, victims: Iterable[VictimUnit]) -> Freed:
    if not isinstance(victims, list):
        return freed_in_queues(ctx.ledger, ((u.queue, u.requests) for u in victims))
    # Every job of a queue is judged with the same list of possible victims first;
    # each queue's amounts are added up only if read (most queues bound nothing).
    build = lambda: FreedWhenRead(ctx.ledger, victims)  # noqa: E731
    return ctx.transaction.memo.of_object(FREED, victims, None, build)


def record(
    ctx: CycleContext, candidate: Candidate, victims: Sequence[VictimUnit], reason: str
) -> None:
    """Evictions into the plan (the queues' holdings were moved by `booking.book`),
    each naming the queue the room was made for."""
    group = candidate.group
    for unit in victims:
        kept = standing(ctx, unit) if unit.queue != group.queue else ""
        ctx.plan.evictions.extend(
            Evict(p.key, unit.group.key, reason, for_queue=group.queue, standing=kept)
            for p in unit.pods
        )
    ctx.plan.statuses.state(admitted(group))
    names = ", ".join(u.label() for u in victims) or "nobody (it fits as things are)"
    ctx.log.info("%s: %s makes room by evicting %s", reason, group.key, names)


def standing(ctx: CycleContext, unit: VictimUnit) -> str:
    """What the victim's leaf queue keeps, once the step is booked, of the GPUs and of
    each resource with a quota that the unit holds, beside the quota and the fair
    share (`Evict.standing`)."""
    ledger, queue = ctx.ledger, unit.queue
    held, share = ledger.held(queue), ledger.fair_share.get(queue, NO_RESOURCES)
    shown = [GPU] if unit.gpus > EPSILON else []
    shown += [
        r
        for r, amount in unit.requests.items()
        if r != GPU and amount > EPSILON and quota_of(ledger.tree, queue, r) > EPSILON
    ]
    parts = [
        f"{r} {held[r]:g} (quota {quota_of(ledger.tree, queue, r):g}, fair share {share[r]:g})"
        for r in shown
    ]
    return f"{queue} keeps {', '.join(parts)}" if parts else ""


def ask_to_wake(ctx: CycleContext, protection: Protection) -> None:
    if protection.earliest_end is not None:
        ctx.plan.wake_no_later_than(protection.earliest_end)
