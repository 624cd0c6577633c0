"""The reclaim action: a queue below its fair share takes resources back across queues.

1. every group whose minimum is still missing after allocate is a candidate,
   taken in queue order (`ordering.take_next`, as allocate does);
2. admission may refuse it (namespace, limit, non-preemptible over quota);
3. its victims are running, preemptible gangs of other leaf queues not
   protected by `reclaimMinRuntime`, cut into units (`victims.victim_units`);
4. each victim queue is judged against the reclaimer where their paths in the
   tree diverge: every queue on either path strictly below the lowest common
   ancestor is compared (`FairShareBudget`):
   - reclaimer side: with the job added it stays within its fair share, in
     every resource the job asks for;
   - victim side: in every contested resource the job asks for (the queues
     together request more of it than the cluster has), a queue over its
     fair share may lose only what it holds above it, and one at or below its
     share loses nothing. A queue at or below quota is then never reclaimed
     from, since a contested resource's fair share is at least the quota (or
     the whole request). Resources nobody lacks may go: they come straight back.
   The full fair share is restored between siblings, not only the quota.
5. `evict_to_fit`: victims are chosen greedily (`victims.select_victims`),
   evicted in the transaction, and the job placed with `place_gang`; if it
   does not fit, everything rolls back and more room is asked for; once it
   fits, victims on nodes the job did not use are given back and the fit
   checked again. The job is placed as `booking.placeable` shows it, and the
   whole step booked on the queues by `booking.book` (undone when the job's
   GPUs would pass a per-GPU-type limit). The evictions and the job's binds
   go into the same plan.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kai_ray.decisions.admission import is_preemptible, refusal
from kai_ray.decisions.allocate import missing_minimum
from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.ordering import (
    EPSILON,
    Candidate,
    QueueLedger,
    WaitingJobs,
    group_priority,
    take_next,
)
from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.placement.filters import static_mask
from kai_ray.decisions.plan import Evict, GroupStatus
from kai_ray.decisions.runtime import Protection, RuntimeField, started_at
from kai_ray.decisions.transaction import Transaction, held_vector
from kai_ray.decisions.victims import (
    Budget,
    Need,
    PodVector,
    VictimUnit,
    select_victims,
    victim_units,
)
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState, total_requests
from kai_ray.values.resources import GPU, Resources, add_into

if TYPE_CHECKING:
    from kai_ray.decisions.cycle import CycleContext

#: Selections tried before giving up on a job: the need, then with this much more room each.
SLACK = (0.0, 1.0, 3.0)


# ------------------------------------------------------------- fairness rules


def lowest_common_ancestor(ledger: QueueLedger, a: str, b: str) -> str | None:
    """The nearest queue both leaves sit under; None when their roots differ."""
    above_a = set(ledger.path(a))
    return next((name for name in ledger.path(b) if name in above_a), None)


def below(ledger: QueueLedger, leaf: str, ancestor: str | None) -> tuple[str, ...]:
    """The leaf's path up to, not including, `ancestor` (the whole path when None)."""
    path = ledger.path(leaf)
    return path if ancestor is None else path[: path.index(ancestor)]


def contested_resources(groups: Mapping[str, PodGroupState], capacity: Resources) -> set[str]:
    """Resources the live pods of all queues, bound or pending, ask more of than there is."""
    # Each group's total is summed first, then added: the order the floats always had.
    asked: dict[str, float] = {}
    for group in groups.values():
        add_into(asked, group.live_requests)
    summed = Resources.from_canonical(asked)  # drops zeros, as the vector sum did
    return {r for r, amount in summed.items() if amount > capacity[r] + EPSILON}


class FairShareBudget(Budget):
    """Reclaim's rules (module docstring, step 4) for one reclaimer and one job."""

    def __init__(
        self, ledger: QueueLedger, contested: Iterable[str], leaf: str, job: Resources
    ) -> None:
        self.ledger, self.leaf = ledger, leaf
        self.asked = [r for r, amount in job.items() if amount > EPSILON]
        self.contested = [r for r in self.asked if r in set(contested)]
        self.job = job
        #: Per queue, the contested amounts taken so far (nothing else is judged).
        self.taken: dict[str, dict[str, float]] = {}
        self._below: dict[str, tuple[str, ...]] = {}

    def reclaimer_within_share(self) -> bool:
        """With the job added, the reclaimer's leaf stays within its fair share. Every
        victim's test includes the leaf, so without this none can be taken from."""
        held, share = self.ledger.held(self.leaf), self._share(self.leaf)
        return all(held[r] + self.job[r] <= share[r] + EPSILON for r in self.asked)

    def reclaimer_may_take_from(self, victim_leaf: str) -> bool:
        """With the job added, the reclaimer's side stays within its fair share."""
        if victim_leaf == self.leaf:
            return False
        lca = lowest_common_ancestor(self.ledger, self.leaf, victim_leaf)
        return all(
            self.ledger.held(q)[r] + self.job[r] <= self._share(q)[r] + EPSILON
            for q in below(self.ledger, self.leaf, lca)
            for r in self.asked
        )

    def take(self, units: Sequence[VictimUnit]) -> bool:
        if not self.contested:
            return True  # nothing is judged: every unit may go
        taking: dict[str, dict[str, float]] = {}
        for unit in units:
            for q in self._victim_side(unit.queue):
                amounts = taking.setdefault(q, {})
                for r in self.contested:
                    amounts[r] = amounts.get(r, 0.0) + unit.requests[r]
        if not all(self._may_lose(q, amounts) for q, amounts in taking.items()):
            return False
        for q, amounts in taking.items():
            taken = self.taken.setdefault(q, {})
            for r, amount in amounts.items():
                taken[r] = taken.get(r, 0.0) + amount
        return True

    def _victim_side(self, victim_leaf: str) -> tuple[str, ...]:
        """The victim's queues judged against this reclaimer (below their common ancestor)."""
        if victim_leaf not in self._below:
            lca = lowest_common_ancestor(self.ledger, self.leaf, victim_leaf)
            self._below[victim_leaf] = below(self.ledger, victim_leaf, lca)
        return self._below[victim_leaf]

    def _may_lose(self, queue: str, amounts: Mapping[str, float]) -> bool:
        held, share = self.ledger.held(queue), self._share(queue)
        taken = self.taken.get(queue, {})
        return all(
            amounts[r] <= EPSILON
            or (
                held[r] > share[r] + EPSILON
                and (held[r] - taken.get(r, 0.0)) - amounts[r] >= share[r] - EPSILON
            )
            for r in self.contested
        )

    def _share(self, queue: str) -> Resources:
        return self.ledger.fair_share.get(queue, Resources())


# ------------------------------------------------- simulate and roll back


def job_need(tx: Transaction, group: PodGroupState) -> Need | None:
    """The group's missing minimum as copies of its largest pod, on nodes all may use."""
    pods = missing_minimum(group)
    if not pods:
        return None
    vectors = np.array([held_vector(tx.snapshot, pod) for pod in pods])
    allowed = np.logical_and.reduce([static_mask(tx, pod) for pod in pods])
    return Need(vectors.max(axis=0), len(pods), allowed, tx.snapshot.column(GPU))


def evict_to_fit(
    ctx: CycleContext,
    group: PodGroupState,
    units: Sequence[VictimUnit],
    new_budget: Callable[[], Budget],
) -> list[VictimUnit] | None:
    """The victims whose eviction lets the group's minimum fit, evicted and the group
    placed (both committed in the transaction); None, with nothing changed, if none do."""
    tx, need = ctx.transaction, job_need(ctx.transaction, group)
    if need is None or not units:
        return None
    for slack in SLACK:
        wanted = dataclasses.replace(need, count=need.count + int(slack * need.count))
        chosen = select_victims(tx.free, wanted, units, _vector(tx), _node_of(tx), new_budget())
        if chosen is None:
            break
        victims = whole_gangs(chosen, units)
        if chosen and new_budget().take(victims) and (kept := _fit_and_trim(ctx, group, victims)):
            return kept
    everything = whole_gangs(_everything(units, new_budget()), units)
    return _fit_and_trim(ctx, group, everything) if new_budget().take(everything) else None


def whole_gangs(chosen: Sequence[VictimUnit], units: Sequence[VictimUnit]) -> list[VictimUnit]:
    """`chosen`, plus every extra of a gang whose core is chosen (no gang is left broken)."""
    cores = {u.group.key for u in chosen if not u.extra}
    picked = {id(u) for u in chosen}
    return [*chosen, *(u for u in units if u.group.key in cores and id(u) not in picked)]


def _everything(units: Sequence[VictimUnit], budget: Budget) -> list[VictimUnit]:
    return [unit for unit in units if budget.take([unit])]


def _fit_and_trim(
    ctx: CycleContext, group: PodGroupState, victims: list[VictimUnit]
) -> list[VictimUnit] | None:
    tx = ctx.transaction
    mark = tx.checkpoint()
    if not victims or not _try_fit(ctx, group, victims):
        return None
    used = {p.node for p in tx.placements[mark:] if not p.removal}
    node_of = _node_of(tx)
    needed = [u for u in victims if any(node_of(p) in used for p in u.pods)]
    needed = whole_gangs(needed, victims)
    if len(needed) == len(victims):
        return victims
    tx.revert(mark)
    if _try_fit(ctx, group, needed):
        return needed
    _try_fit(ctx, group, victims)  # the same steps as before: it fits again
    return victims


def _try_fit(ctx: CycleContext, group: PodGroupState, victims: Sequence[VictimUnit]) -> bool:
    tx = ctx.transaction
    mark = tx.checkpoint()
    for unit in victims:
        for pod in unit.pods:
            tx.evict(pod, unit.group.key)
    if place_gang(tx, group, ctx.config).admitted:
        return True
    tx.revert(mark)
    return False


def _vector(tx: Transaction) -> PodVector:
    return lambda pod: held_vector(tx.snapshot, pod)


def _node_of(tx: Transaction) -> Callable[[PodState], int]:
    index = tx.snapshot.node_index
    return lambda pod: index[pod.node or ""]


# ------------------------------------------------------- shared action steps


def waiting_candidates(ctx: CycleContext) -> WaitingJobs:
    """Groups whose minimum is still missing and that nothing placed this cycle."""
    waiting = WaitingJobs()
    for group in ctx.snapshot.pod_groups.values():
        missing = missing_minimum(group)
        if missing and not any(p.key in ctx.transaction.placed for p in missing):
            waiting.add(Candidate(group, total_requests(missing), group_priority(group)))
    return waiting


def running_units(
    ctx: CycleContext, keep: Callable[[PodGroupState, int], bool], protection: Protection
) -> list[VictimUnit]:
    """Units of running preemptible groups of this scheduler that `keep` accepts,
    untouched so far this cycle and not protected by a min-runtime."""
    units: list[VictimUnit] = []
    for group in ctx.snapshot.pod_groups.values():
        priority = group_priority(group)
        if not is_preemptible(group, priority) or not keep(group, priority):
            continue
        if any(p.scheduler != ctx.config.schedulerName for p in group.live_pods()):
            continue  # another scheduler's pods are not ours to evict
        if not group.seen_whole:
            continue  # a member on a node the snapshot does not know cannot be judged
        for unit in _units_of(ctx.transaction, group, priority):
            untouched = not any(p.key in ctx.transaction.removed for p in unit.pods)
            if untouched and not protection.protects(unit):
                units.append(unit)
    return units


def _units_of(tx: Transaction, group: PodGroupState, priority: int) -> list[VictimUnit]:
    """The group's victim units, cut once per cycle (they depend on the snapshot alone)."""
    key = ("victim-units", group.key)
    if key not in tx.memo:
        tx.memo[key] = victim_units(group, priority, started_at(group))
    units: list[VictimUnit] = tx.memo[key]
    return units


def record(
    ctx: CycleContext, candidate: Candidate, victims: Sequence[VictimUnit], reason: str
) -> None:
    """Evictions into the plan (the queues' holdings were moved by `booking.book`)."""
    group = candidate.group
    for unit in victims:
        ctx.plan.evictions.extend(Evict(p.key, unit.group.key, reason) for p in unit.pods)
    ctx.plan.statuses[:] = [s for s in ctx.plan.statuses if s.group != group.key]
    ctx.plan.statuses.append(GroupStatus(group.key, True))
    names = ", ".join(u.label() for u in victims)
    ctx.log.info("%s: %s makes room by evicting %s", reason, group.key, names)


def ask_to_wake(ctx: CycleContext, protection: Protection) -> None:
    if protection.earliest_end is not None:
        ctx.plan.wake_no_later_than(protection.earliest_end)


# ------------------------------------------------------------------- action


class ReclaimAction:
    name = "reclaim"
    which: RuntimeField = "reclaimMinRuntime"

    def run(self, ctx: CycleContext) -> None:
        waiting = waiting_candidates(ctx)
        if waiting.empty():
            return  # no job to reclaim for: skip summing every live pod
        contested = contested_resources(ctx.snapshot.pod_groups, ctx.capacity)
        while (candidate := take_next(ctx.ledger, waiting)) is not None:
            self.attempt(ctx, candidate, contested)

    def attempt(self, ctx: CycleContext, candidate: Candidate, contested: set[str]) -> None:
        group = candidate.group
        if refusal(ctx.ledger, group, candidate.request, is_preemptible(group, candidate.priority)):
            return
        budget = FairShareBudget(ctx.ledger, contested, group.queue, candidate.request)
        if not budget.reclaimer_within_share():
            return  # no queue may be reclaimed from (and no runtime protection was met)
        protection = Protection(ctx.snapshot.queues, self.which, ctx.now)
        may_take = functools.cache(budget.reclaimer_may_take_from)
        units = running_units(ctx, lambda g, _: may_take(g.queue), protection)
        new_budget = lambda: FairShareBudget(ctx.ledger, contested, group.queue, candidate.request)  # noqa: E731
        mark = ctx.transaction.checkpoint()
        victims = evict_to_fit(ctx, placeable(ctx, group), units, new_budget)
        if victims is None:
            ask_to_wake(ctx, protection)
        elif book(ctx, mark) is None:
            record(ctx, candidate, victims, self.name)
