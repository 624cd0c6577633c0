"""Victim selection: which running work to evict so that one waiting job fits.

Pure functions over values; issuing the evictions is the actions' business.
1. `victim_units` cuts running groups into units: each elastic member above
   the group's minimum is a unit of its own (newest first), the rest of the
   group (its minimum core) is one unit; victims are whole gangs otherwise.
2. `unit_order`: elastic extras before any whole gang; then fewest GPUs, then
   lowest priority, then the newest (creation time), then the name: among
   equals the most recently created work goes first (`newest_first`), the one
   tie-break between jobs of reclaim, preempt and consolidation.
3. `select_victims` is vectorised and greedy across nodes: it counts how many
   of the job's pods fit on each allowed node now, then, per node, the least
   disruptive set of that node's units that makes the most pods fit there
   (`least_disruption`: fewest whole gangs, then fewest units, then fewest
   GPUs given back, then the lowest priority, then the newest; every subset
   of up to `SUBSET_UNITS` units is weighed at once, past that the shortest
   prefix in unit order); nodes are then taken least disruptive first per pod
   gained until enough pods fit. A `Budget` may refuse units (reclaim's
   fairness rules); a node whose units it refuses is skipped whole. For a job
   whose pods must share a domain (a required topology level: `Need.domains`)
   the nodes are taken in the same order, each counted in its own domain
   against a budget of that domain's, and the first domain where enough pods
   fit gives the victims: room freed across domains would not let it fit.
The count is an estimate (the job's pods are taken as `count` copies of their
largest request; devices and topology levels other than the required one are
ignored): the caller verifies every selection with `place_gang` inside the
transaction, and asks for more room when it does not hold. Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState, total_requests
from kai_ray.values.clock import unix_seconds
from kai_ray.values.resources import EPSILON, GPU, Resources

Matrix = npt.NDArray[np.float64]
Vector = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
T = TypeVar("T")
#: A vector per pod: what the pod holds on its node (`transaction.held_vector`).
PodVector = Callable[[PodState], Vector]
#: The row of the node a bound pod is on.
NodeOf = Callable[[PodState], int]


@dataclass(frozen=True)
class VictimUnit:
    """What is evicted together: a gang's core, or one elastic extra."""

    group: PodGroupState
    pods: tuple[PodState, ...]
    priority: int
    #: Sorts as time does; the younger unit goes first among equals.
    started: str
    extra: bool
    #: What the unit's pods ask for (GPU shares as parts of a GPU), and its GPUs.
    requests: Resources = field(init=False, repr=False, compare=False)
    gpus: float = field(init=False, repr=False, compare=False)
    #: When the work was created (an extra: its pod; a core: its PodGroup), and its
    #: name: the tie-break among equals (`newest_first`).
    created: str = field(init=False, repr=False, compare=False)
    name: str = field(init=False, repr=False, compare=False)
    #: `newest_first(created, name)`, worked out once.
    among_equals: tuple[str, str] = field(init=False, repr=False, compare=False)
    #: `started` as Unix seconds (None: unreadable), read once.
    started_s: float | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", total_requests(self.pods))
        object.__setattr__(self, "gpus", sum(p.requests[GPU] + p.gpu_fraction for p in self.pods))
        first = self.pods[0]
        created = first.creation_timestamp if self.extra else self.group.creation_timestamp
        name = f"{self.group.key}/{first.name}" if self.extra else self.group.key
        object.__setattr__(self, "created", created)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "among_equals", newest_first(created, name))
        object.__setattr__(self, "started_s", unix_seconds(self.started))

    @property
    def queue(self) -> str:
        return self.group.queue

    def label(self) -> str:
        what = f"extra pod {self.pods[0].key} of" if self.extra else "gang"
        return f"{what} {self.group.key}"


@dataclass(frozen=True)
class Need:
    """The job's missing pods as `count` copies of `vector`, on the `allowed` nodes;
    all inside one domain when `domains` is given."""

    vector: Vector
    count: int
    allowed: Flags
    #: The GPU column of `vector`: a node's cost is the GPUs its victims give back there.
    gpu_column: int
    #: Each node's domain (an index; -1: in none) when the pods must all go in one
    #: (a required topology level): room is then gathered in one domain at a time.
    domains: npt.NDArray[np.int64] | None = None


class Budget:
    """Refuses nothing; reclaim's fairness rules subclass it."""

    def take(self, units: Sequence[VictimUnit]) -> bool:
        """Whether all of `units` may go (and, if so, count them as gone)."""
        return True

    def take_each(self, units: Sequence[VictimUnit]) -> list[VictimUnit]:
        """The units `take([unit])` accepts, asked one after another in order (each
        one accepted counted as gone before the next is asked)."""
        return [unit for unit in units if self.take([unit])]

    def refuses_every(self, units: Sequence[VictimUnit]) -> bool:
        """True only when `take` will refuse every non-empty set of `units`, now and
        after: the search then gives up without weighing a node (with a deep
        backlog most jobs meet a budget that lets nobody go). False when unsure."""
        return False

    def takes_alone(self, unit: VictimUnit) -> bool:
        """What `take([unit])` answers on a budget that took nothing (asked of one
        that took nothing: the answer is not counted as taken)."""
        return True

    def most_taken(self, leaf: str) -> Mapping[str, float]:
        """Per resource, a bound on what the units of leaf queue `leaf` that any one
        `take` of a budget that took nothing accepts may ask for together
        (resources left out are not bounded)."""
        return {}

    def shared(self, anchor: object, build: Callable[[], T]) -> T:
        """`build()`: a value that reads, of this budget, only what `takes_alone`
        answers (asked of a budget that took nothing), and besides only `anchor`.
        Budgets that answer `takes_alone` alike may share it (`FairShareBudget`: one
        run's, at one ledger version, for one reclaimer and the same resources
        asked, kept with the anchor); here it is worked out every time."""
        return build()


def victim_units(group: PodGroupState, priority: int, started: str) -> list[VictimUnit]:
    """Elastic extras one by one (newest first), then the minimum core as one unit.

    An extra is a member above the group's `minMember` whose subgroup also
    stays at or above its own `minMember` without it."""
    bound = group.bound
    if not bound:
        return []
    minimums = {s.name: s.minMember for s in group.spec.subGroups}
    per_subgroup: dict[str | None, int] = {}
    for pod in bound:
        per_subgroup[pod.subgroup] = per_subgroup.get(pod.subgroup, 0) + 1
    extras: list[PodState] = []
    for pod in reversed(bound):
        if len(bound) - len(extras) <= group.spec.minMember:
            break
        if per_subgroup[pod.subgroup] > minimums.get(pod.subgroup or "", 0):
            per_subgroup[pod.subgroup] -= 1
            extras.append(pod)
    core = tuple(p for p in bound if p not in extras)
    units = [VictimUnit(group, (pod,), priority, pod.creation_timestamp, True) for pod in extras]
    return [*units, VictimUnit(group, core, priority, started, False)] if core else units


def unit_order(unit: VictimUnit) -> tuple[object, ...]:
    """Extras first; then fewest GPUs, lowest priority, then newest first."""
    return (not unit.extra, unit.gpus, unit.priority, *unit.among_equals)


def newest_first(created: str, name: str) -> tuple[str, str]:
    """The tie-break among equally good victims (KAI's): the most recently created
    first (RFC 3339 times sort as text), then by name."""
    return _descending(created), name


#: Each code point c to 0x10FFFF - c: the text then sorts in the reverse order.
_INVERTED = {c: 0x10FFFF - c for c in range(1, 0x250)}
#: After the last character: above every inverted one, so the longer text goes first.
_END = chr(0x10FFFF)


def _descending(text: str) -> str:
    """A key that sorts `text` backwards (later RFC 3339 times first)."""
    return text.translate(_INVERTED) + _END


def pods_fitting(free: Matrix, vector: Vector) -> npt.NDArray[np.int64]:
    """How many copies of `vector` fit in each row of `free` (rows may be negative)."""
    asked = vector > 0
    if not asked.any():
        return np.full(free.shape[0], 1 << 30, dtype=np.int64)
    ratios = np.floor(np.maximum(free[:, asked], 0.0) / vector[asked] + EPSILON)
    fits: npt.NDArray[np.int64] = ratios.min(axis=1).astype(np.int64)
    return fits


#: Per node, every subset of up to this many units is weighed; past it, prefixes.
SUBSET_UNITS = 10


@dataclass
class _NodeOption:
    node: int
    units: list[VictimUnit]
    gain: int
    #: How disruptive the units are (`_disruption`), per pod gained where it adds up.
    key: tuple[object, ...]
    #: Whether the gain was cut at the pods still missing (some set of the node's
    #: units lets more fit): the option then holds for that many missing pods only.
    capped: bool = False


#: A caller's options found in one state of its free rows (a transaction version),
#: by the units (by identity), the need and how many pods it weighed for; the very
#: list of units is kept with them, and whether some option was cut at that many.
FoundOptions = dict[tuple[object, ...], tuple[Sequence["VictimUnit"], list[_NodeOption], bool]]


def select_victims(
    free: Matrix,
    need: Need,
    units: Sequence[VictimUnit],
    pod_vector: PodVector,
    node_of: NodeOf,
    budget: Budget,
    released: Released | None = None,
    kept: KeptOptions | None = None,
    most: int | None = None,
    found: FoundOptions | None = None,
    new_budget: Callable[[], Budget] | None = None,
) -> list[VictimUnit] | None:
    """Units whose eviction should make room for `need.count` pods, or None when
    the eligible units cannot make enough room. An empty list: it fits already.
    When the pods must share a domain (`need.domains`), the room is gathered in
    one domain: the nodes' options are taken in the same order, each counted in
    its domain with a budget of the domain's own (`budget` for the first, then
    `new_budget()`), and the first domain to make room for them all gives the
    units (`_take_options`).
    `released`, kept by the caller for the same `pod_vector` and `node_of`, spares
    summing a unit's pods again in a later search; `kept`, kept for them too,
    each node's option from an earlier search with the same inputs.

    `most`, how many pods of the need any allowed node could hold at all (by its
    allocatable): no set of a node's units lets more fit there, so the options
    weighed for that many missing pods are those for any more, and searches of
    needs alike that miss different numbers of pods share them (`found`, kept by
    the caller for one state of `free`). Should a node's set let more fit (its
    option cut at `most`), the options are weighed again for every pod missing."""
    fits_now = np.where(need.allowed, pods_fitting(free, need.vector), 0)
    domains, per_domain = need.domains, None
    if domains is None:
        missing = need.count - int(fits_now.sum())
    else:
        per_domain = _missing_per_domain(fits_now, need.allowed, domains, need.count)
        # The most any domain misses: what the options are weighed for.
        missing = int(per_domain.max()) if int(per_domain.min()) > 0 else 0
    if missing <= 0:
        return []
    if budget.refuses_every(units):
        return None  # no option would be taken: weighing the nodes would find none
    reach = missing if most is None else max(min(missing, most), 1)
    key = (id(units), need.vector.tobytes(), need.gpu_column, need.allowed.tobytes(), reach)
    entry = None if found is None else found.get(key)
    if entry is None or entry[0] is not units:
        options = _weigh(free, need, units, node_of, fits_now, reach, pod_vector, released, kept)
        entry = (units, options, any(option.capped for option in options))
        if found is not None:
            found[key] = entry
    options = entry[1]
    if reach < missing and entry[2]:
        # Some node's units let more pods fit than `most` said: weighed for them all.
        options = _weigh(free, need, units, node_of, fits_now, missing, pod_vector, released, kept)
    if domains is None or per_domain is None:
        return _take_options(options, [missing], _one_domain, budget)
    if new_budget is None:
        raise ValueError("a need inside one domain takes a budget per domain (`new_budget`)")
    return _take_options(options, per_domain.tolist(), _domain_in(domains), budget, new_budget)


def _one_domain(node: int) -> int:
    return 0


def _domain_in(domains: npt.NDArray[np.int64]) -> Callable[[int], int]:
    listed = domains.tolist()
    return lambda node: int(listed[node])


def _missing_per_domain(
    fits_now: npt.NDArray[np.int64], allowed: Flags, domains: npt.NDArray[np.int64], count: int
) -> npt.NDArray[np.int64]:
    """Per domain (`domains`: each node's), how many of `count` pods its allowed nodes
    cannot take as they are (all of them when no node is in a domain)."""
    size = int(domains.max(initial=-1)) + 1
    if size == 0:
        return np.array([count], dtype=np.int64)
    inside = allowed & (domains >= 0)
    fitting = np.bincount(domains[inside], weights=fits_now[inside], minlength=size)
    missing: npt.NDArray[np.int64] = count - fitting.astype(np.int64)
    return missing


def _weigh(
    free: Matrix,
    need: Need,
    units: Sequence[VictimUnit],
    node_of: NodeOf,
    fits_now: npt.NDArray[np.int64],
    missing: int,
    pod_vector: PodVector,
    released: Released | None,
    kept: KeptOptions | None,
) -> list[_NodeOption]:
    """Every allowed node's option for `missing` pods (`_node_options`), least
    disruptive per pod first."""
    if kept is None:
        by_node = _units_by_node(sorted(units, key=unit_order), need.allowed, node_of)
    else:
        by_node = kept.by_node(units, need.allowed, node_of)
    sizes: dict[int, list[int]] = {}
    for node, on_node in by_node.items():
        sizes.setdefault(len(on_node), []).append(node)
    released = released or Released(pod_vector, node_of, free.shape[1])
    options: list[_NodeOption] = []
    store = None if kept is None else kept.search(need, missing)
    for nodes in sizes.values():
        todo, inputs = nodes, {}
        if store is not None:
            todo = []
            for node in nodes:
                inputs[node] = (free[node].tobytes(), *map(id, by_node[node]))
                found = store.get(node)
                if found is None or found[0] != inputs[node]:
                    todo.append(node)
                elif found[1] is not None:
                    options.append(found[1])
        for start in range(0, len(todo), _BATCH_NODES):
            batch = [(node, by_node[node]) for node in todo[start : start + _BATCH_NODES]]
            made = _node_options(free, need, batch, fits_now, missing, released)
            options += made
            if store is not None:
                helping = {option.node: option for option in made}
                for node, units in batch:
                    store[node] = (inputs[node], helping.get(node), units)
    # The order is total (a node's option names it): how they were found is not read.
    options.sort(key=lambda o: o.key)
    return options


#: Per node: the inputs of its option (its free row, its units by identity), the
#: option (None: its units do not help), and the units (kept alive, so that their
#: ids name them while the entry stands).
_NodeEntries = dict[int, tuple[tuple[object, ...], "_NodeOption | None", list["VictimUnit"]]]


class KeptOptions:
    """Each node's option (`_node_options`) kept from one search to the next, by what
    it is worked out from: the search's need (the pod's vector and how many pods are
    still missing) and, per node, its free row (by value) and its units (the very
    objects, in order: a group's victim units are kept while its state is). A
    node's option reads nothing else (its units' release on the node, by the
    layout of nodes and resources the store follows), so a later search, in this
    cycle or the next, works out only the nodes whose free room or units changed:
    with a deep backlog the same kinds of job are searched every cycle over a
    cluster that moved on a few nodes. The most recently used `AT_MOST` needs are
    kept, each with one entry per node."""

    AT_MOST = 64

    def __init__(self) -> None:
        self._layout: tuple[object, ...] = ()
        self._by_need: dict[tuple[object, ...], _NodeEntries] = {}
        #: The lists of units met last, each by node for one set of allowed nodes, by
        #: the list's id and the flags (the list kept, so that its id names it).
        self._by_node: dict[
            tuple[int, bytes], tuple[Sequence[VictimUnit], dict[int, list[VictimUnit]]]
        ] = {}

    def follow(self, layout: tuple[object, ...]) -> KeptOptions:
        """The nodes' and resources' layout of this search's snapshot: another layout
        starts afresh (compared by identity, then by value)."""
        if layout is not self._layout and layout != self._layout:
            self._by_need.clear()
            self._by_node.clear()
        self._layout = layout
        return self

    def by_node(
        self, units: Sequence[VictimUnit], allowed: Flags, node_of: NodeOf
    ) -> dict[int, list[VictimUnit]]:
        """`_units_by_node` of the units in `unit_order`, kept for the very list (the
        lists searched are shared and never changed: every job of a queue meets the
        same one) and the same allowed nodes; read only. A pod's node is read by the
        layout followed."""
        key = (id(units), allowed.tobytes())
        found = self._by_node.get(key)
        if found is None or found[0] is not units:
            found = (units, _units_by_node(sorted(units, key=unit_order), allowed, node_of))
            if len(self._by_node) >= self.AT_MOST:
                del self._by_node[next(iter(self._by_node))]
            self._by_node[key] = found
        return found[1]

    def search(self, need: Need, missing: int) -> _NodeEntries:
        key = (need.vector.tobytes(), need.gpu_column, missing)
        found = self._by_need.pop(key, None)
        if found is None:
            found = {}
            if len(self._by_need) >= self.AT_MOST:
                del self._by_need[next(iter(self._by_need))]
        self._by_need[key] = found  # the most recently used last
        return found


def _units_by_node(
    units: Iterable[VictimUnit], allowed: Flags, node_of: NodeOf
) -> dict[int, list[VictimUnit]]:
    """Every allowed node's units, in unit order (a unit on several nodes is listed on each)."""
    by_node: dict[int, list[VictimUnit]] = {}
    for unit in units:
        for node in dict.fromkeys(node_of(pod) for pod in unit.pods):
            if allowed[node]:
                by_node.setdefault(node, []).append(unit)
    return by_node


class Released:
    """What each unit gives back on each of its nodes, summed once per unit (in the
    order of its pods, from zero: the same sums a walk per node makes). Valid while
    `pod_vector` and `node_of` answer the same (one snapshot)."""

    def __init__(self, pod_vector: PodVector, node_of: NodeOf, width: int) -> None:
        self.pod_vector, self.node_of, self.width = pod_vector, node_of, width
        #: By unit id, the unit (kept alive, so its id is not reused) and its sums.
        self._by_unit: dict[int, tuple[VictimUnit, dict[int, Vector]]] = {}

    def rows(self, units: Sequence[VictimUnit], node: int) -> Matrix:
        """Row i: what unit i gives back on `node`."""
        rows = np.zeros((len(units), self.width), dtype=np.float64)
        for i, unit in enumerate(units):
            given = self._on_nodes(unit).get(node)
            if given is not None:
                rows[i] = given
        return rows

    def _on_nodes(self, unit: VictimUnit) -> dict[int, Vector]:
        kept = self._by_unit.get(id(unit))
        if kept is not None:
            return kept[1]
        found: dict[int, Vector] = {}
        for pod in unit.pods:
            node = self.node_of(pod)
            if node not in found:
                found[node] = np.zeros(self.width, dtype=np.float64)
            found[node] += self.pod_vector(pod)
        self._by_unit[id(unit)] = (unit, found)
        return found


#: Nodes weighed in one batch (bounds the arrays: nodes x candidate sets x resources).
_BATCH_NODES = 64


def _node_options(
    free: Matrix,
    need: Need,
    batch: Sequence[tuple[int, list[VictimUnit]]],
    fits_now: npt.NDArray[np.int64],
    missing: int,
    released_by: Released,
) -> list[_NodeOption]:
    """For each node of `batch` (all with as many units), the least disruptive set of
    its units that makes the most pods fit there (but never more than the job still
    misses), unless none helps. Weighed for the whole batch at once: per node its
    candidate sets (`_candidate_sets`), the pods each set lets fit, and among the sets
    that let the most fit, the one with the fewest whole gangs, then units, then GPUs
    given back, then the lowest priority, then whose oldest unit is the newest."""
    nodes = np.array([node for node, _ in batch])
    units_of = [units for _, units in batch]
    n = len(units_of[0])
    sets = np.stack([_candidate_sets(units) for units in units_of])  # nodes x sets x units
    weights = sets.astype(np.float64)
    released = np.stack(
        [released_by.rows(units, node) for node, units in batch]
    )  # nodes x units x resources
    total = free[nodes][:, None, :] + weights @ released
    fits = pods_fitting(total.reshape(-1, free.shape[1]), need.vector).reshape(sets.shape[:2])
    now = fits_now[nodes]
    best = np.minimum(fits.max(axis=1), now + missing)
    helps = best > now
    if not helps.any():
        return []
    core = np.array([[0.0 if u.extra else 1.0 for u in units] for units in units_of])
    cores = (weights @ core[:, :, None])[:, :, 0]
    counts = weights.sum(axis=2)
    gpus = np.round((weights @ released[:, :, need.gpu_column, None])[:, :, 0], 6)
    priorities = np.array([[u.priority for u in units] for units in units_of])
    priority = np.where(sets, priorities[:, None, :], np.iinfo(np.int64).min).max(axis=2)
    # The oldest unit of each set, by rank among the node's equals (0: the newest).
    by_age = [_by_age(units) for units in units_of]
    rank = np.empty((len(batch), n), dtype=np.int64)
    rank[np.arange(len(batch))[:, None], np.array(by_age)] = np.arange(n)
    oldest = np.where(sets, rank[:, None, :], -1).max(axis=2)
    capped = fits.max(axis=1) > best
    refused = fits < best[:, None]
    owner = np.repeat(np.arange(len(batch)), sets.shape[1])
    keys = (oldest, priority, gpus, counts, cores, refused)
    order = np.lexsort((*(k.ravel() for k in keys), owner))
    rows = order[:: sets.shape[1]] - np.arange(len(batch)) * sets.shape[1]
    options = []
    for i in np.flatnonzero(helps):
        row = int(rows[i])
        units, node = units_of[i], int(nodes[i])
        chosen = [u for u, taken in zip(units, sets[i, row], strict=True) if taken]
        gain = int(best[i] - now[i])
        per_pod = (
            float(cores[i, row]) / gain,
            float(counts[i, row]) / gain,
            float(gpus[i, row]) / gain,
        )
        last = units[by_age[i][int(oldest[i, row])]]
        key = (*per_pod, int(priority[i, row]), *last.among_equals, node)
        options.append(_NodeOption(node, chosen, gain, key, bool(capped[i])))
    return options


def _by_age(units: Sequence[VictimUnit]) -> list[int]:
    """The units' indexes from the newest to the oldest among equals."""
    return sorted(range(len(units)), key=lambda i: units[i].among_equals)


def _candidate_sets(units: Sequence[VictimUnit]) -> npt.NDArray[np.bool_]:
    """Row per candidate set of units (a core always with its group's extras here):
    every non-empty subset when there are few units, else every prefix."""
    n = len(units)
    sets = _subsets(n) if n <= SUBSET_UNITS else np.tri(n, dtype=bool)
    cores = {u.group.key for u in units if not u.extra}
    if not any(u.extra and u.group.key in cores for u in units):
        return sets  # no core here has extras here: every set is closed already
    goes_with = np.eye(n, dtype=bool)
    for i, unit in enumerate(units):
        if not unit.extra:
            goes_with[i] |= [u.extra and u.group.key == unit.group.key for u in units]
    closed: npt.NDArray[np.bool_] = (sets.astype(np.int64) @ goes_with.astype(np.int64)) > 0
    return closed


@functools.cache
def _subsets(n: int) -> npt.NDArray[np.bool_]:
    """Every non-empty subset of n units, a row each (read only: shared)."""
    codes = np.arange(1, 1 << n, dtype=np.int64)
    sets: npt.NDArray[np.bool_] = (codes[:, None] >> np.arange(n)) & 1 == 1
    sets.setflags(write=False)
    return sets


def _take_options(
    options: list[_NodeOption],
    missing: Sequence[int],
    domain_of: Callable[[int], int],
    budget: Budget,
    new_budget: Callable[[], Budget] | None = None,
) -> list[VictimUnit] | None:
    """The options taken in order, each counted in its node's domain (`domain_of`; -1:
    none, skipped) against that domain's own budget (`budget` for the first domain
    met, then `new_budget()`); the units of the first domain whose gain reaches what
    it misses (`missing`, per domain). One domain: the options taken across nodes."""
    chosen: dict[int, dict[int, VictimUnit]] = {}
    gained: dict[int, int] = {}
    budgets: dict[int, Budget] = {}
    for option in options:
        domain = domain_of(option.node)
        if domain < 0:
            continue
        mine = chosen.setdefault(domain, {})
        taker = budgets.get(domain)
        if taker is None:
            if not budgets:
                taker = budget
            elif new_budget is None:
                raise ValueError("options in more than one domain take `new_budget`")
            else:
                taker = new_budget()
            budgets[domain] = taker
        new = [u for u in option.units if id(u) not in mine]
        if not taker.take(new):
            continue
        mine.update((id(u), u) for u in new)
        gained[domain] = gained.get(domain, 0) + option.gain
        if gained[domain] >= missing[domain]:
            return list(mine.values())
    return None
