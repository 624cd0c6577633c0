"""What every leaf queue's groups ask for and hold: exact sums, kept from cycle to cycle.

The cycle starts from two sums over every group of the snapshot: what each leaf
queue's live pods ask for (`leaf_requests`, the fair shares' demand)
and what its bound pods hold (`booking.held_ledger`, split by preemptible, with
GPUs of the types a queue limits). With tens of thousands of groups, walking
them all costs more than the rest of a quiet cycle. `GroupTotals` keeps each
group's part and the sums; `update` follows a new snapshot by the groups that
are not the very objects of the last one (the cache keeps a group's state while
nothing of it changed), so a cycle after a few changes costs those few groups,
plus one pass comparing identities.

The sums are exact: each amount is turned into an integer count of 2**-1074
(every finite float is one), added as integers, and turned back into the float
nearest the exact sum. The result is the same whatever the order of the groups
and whichever groups were added or taken away since, so a kept `GroupTotals`
and a fresh one always agree. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kai_ray.decisions.admission import TypedKey, is_preemptible, typed_gpus, typed_keys
from kai_ray.decisions.fairness import KeptShares
from kai_ray.decisions.kept import KeptPerGroup
from kai_ray.decisions.ordering import group_priority
from kai_ray.decisions.placement.inter_pod import WithTerms
from kai_ray.decisions.placement.mix import ClassCounts
from kai_ray.decisions.placement.node_kept import KeptAcrossCycles
from kai_ray.decisions.transaction import CycleMemo, MemoKey
from kai_ray.decisions.victims import KeptOptions
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import Changed, Snapshot, differences
from kai_ray.values.resources import GPU, Resources

#: Every finite float is an integer number of 2**-1074 (the smallest subnormal).
_SCALE = 1074
T = TypeVar("T")
Exact = dict[str, int]


def exact(amount: float) -> int:
    """`amount` as an integer count of 2**-1074, with no rounding."""
    numerator, denominator = amount.as_integer_ratio()
    return numerator << (_SCALE - (denominator.bit_length() - 1))


def nearest(total: int) -> float:
    """The float nearest `total` * 2**-1074 (integer division rounds correctly)."""
    return total / (1 << _SCALE)


def add_exact(totals: Exact, amounts: Iterable[tuple[str, float]], sign: int = 1) -> None:
    for name, amount in amounts:
        totals[name] = totals.get(name, 0) + sign * exact(amount)


def as_resources(totals: Exact) -> Resources:
    return Resources.from_canonical({name: nearest(total) for name, total in totals.items()})


@dataclass(frozen=True)
class _Part:
    """One group's share of the sums."""

    leaf: str
    preemptible: bool
    live: Exact | None  # None: no live pod (the group is not counted in demand)
    held: Exact | None  # None: no bound pod
    typed: Exact


@dataclass
class _Sum:
    """An exact sum and how many groups make it (absent when none does)."""

    total: Exact = field(default_factory=dict)
    count: int = 0

    def add(self, amounts: Exact, sign: int) -> None:
        for name, amount in amounts.items():
            self.total[name] = self.total.get(name, 0) + sign * amount
        self.count += sign


class Follower(Protocol):
    """A value derived from the waiting groups that follows a new tuple of them by
    what changed (`KeptForWaiting`): given the snapshot's groups, and what changed
    among them since the groups it saw last, it may look at those alone."""

    def follow(
        self,
        waiting: tuple[PodGroupState, ...],
        groups: Mapping[str, PodGroupState] | None = None,
        changed: Changed | None = None,
    ) -> None: ...

    def same(self, groups: Mapping[str, PodGroupState]) -> None:
        """The waiting groups are the very tuple followed last (none of them changed,
        none came or went), and `groups` the snapshot's groups now."""


F = TypeVar("F", bound=Follower)


class KeptForWaiting:
    """Values derived from the snapshot's waiting groups alone (what they ask, their
    candidates in queue order), kept from cycle to cycle: the cache makes a new
    tuple of them when any waiting group changes, comes or goes, and each value
    then follows it by the groups that changed since it last looked (the snapshot
    says which, `Snapshot.groups_changed`; without that, by those that are not the
    very objects it last saw). A deep backlog is walked once, not once per cycle
    and action; a backlog into which a hundred gangs came costs those hundred."""

    def __init__(self) -> None:
        self._kept: dict[MemoKey[Any], tuple[tuple[PodGroupState, ...], Any]] = {}

    def get(self, slot: MemoKey[F], snapshot: Snapshot, make: Callable[[], F]) -> F:
        waiting = snapshot.waiting_groups
        found = self._kept.get(slot)
        value: F = make() if found is None else found[1]
        if found is None or found[0] is not waiting:
            value.follow(waiting, snapshot.pod_groups, snapshot.groups_changed)
            self._kept[slot] = (waiting, value)
        else:
            value.same(snapshot.pod_groups)
        return value


#: The cycle's handle on the values kept for the waiting groups (`CycleMemo` slot).
PER_WAITING = MemoKey[KeptForWaiting]("values kept for the waiting groups")


def kept_for_waiting(
    memo: CycleMemo, slot: MemoKey[F], snapshot: Snapshot, make: Callable[[], F]
) -> F:
    """`KeptForWaiting.get` of the cycle's kept values, else made once per cycle."""
    kept = memo.find(PER_WAITING, None)
    if kept is not None:
        return kept.get(slot, snapshot, make)
    return memo.get(slot, None, lambda: _following(make(), snapshot.waiting_groups))


def _following(value: F, waiting: tuple[PodGroupState, ...]) -> F:
    value.follow(waiting)
    return value


H = TypeVar("H", bound=Hashable)


class Tally(Generic[H]):
    """How many groups give each value (`value(group)`, which reads the group alone;
    None: not counted), following the groups' changes with the sums
    (`GroupTotals.update`): a glance over every group that only asks whether some
    group has a property reads the counts instead of walking the groups."""

    def __init__(
        self, value: Callable[[PodGroupState], H | None], groups: Mapping[str, PodGroupState]
    ) -> None:
        self.value = value
        self._of: dict[str, H] = {}
        self.counts: Counter[H] = Counter()
        for key, group in groups.items():
            self.set(key, group)

    def set(self, key: str, group: PodGroupState) -> None:
        self.drop(key)
        found = self.value(group)
        if found is not None:
            self._of[key] = found
            self.counts[found] += 1

    def drop(self, key: str) -> None:
        found = self._of.pop(key, None)
        if found is not None:
            self.counts[found] -= 1
            if not self.counts[found]:
                del self.counts[found]

    @property
    def members(self) -> Mapping[str, H]:
        """Each counted group's value, by group key (read only)."""
        return self._of


class KeptTallies:
    """The tallies asked for so far, each made once from the groups of the snapshot
    `GroupTotals` follows and then told of every group that changed or went."""

    def __init__(self) -> None:
        self._tallies: dict[MemoKey[Any], Tally[Any]] = {}

    def get(
        self,
        slot: MemoKey[Tally[H]],
        groups: Mapping[str, PodGroupState],
        value: Callable[[PodGroupState], H | None],
    ) -> Tally[H]:
        tally: Tally[H] | None = self._tallies.get(slot)
        if tally is None:
            tally = Tally(value, groups)
            self._tallies[slot] = tally
        return tally

    def set(self, key: str, group: PodGroupState) -> None:
        for tally in self._tallies.values():
            tally.set(key, group)

    def drop(self, key: str) -> None:
        for tally in self._tallies.values():
            tally.drop(key)


#: The cycle's handle on the tallies kept over the groups (`CycleMemo` slot; absent
#: when the caller keeps nothing from cycle to cycle).
TALLIES = MemoKey[KeptTallies]("tallies kept over the groups")


def kept_tally(
    memo: CycleMemo,
    slot: MemoKey[Tally[H]],
    groups: Mapping[str, PodGroupState],
    value: Callable[[PodGroupState], H | None],
) -> Counter[H]:
    """How many of `groups` (the cycle's snapshot's) give each value: kept from cycle
    to cycle when the caller keeps `GroupTotals`, else counted once per cycle."""
    kept = memo.find(TALLIES, None)
    if kept is None:
        return memo.get(slot, None, lambda: Tally(value, groups)).counts
    return kept.get(slot, groups, value).counts


def kept_members(
    memo: CycleMemo,
    slot: MemoKey[Tally[H]],
    groups: Mapping[str, PodGroupState],
    value: Callable[[PodGroupState], H | None],
) -> Mapping[str, H]:
    """The groups of `groups` that give a value, with it, by key (`kept_tally`'s
    tally): a walk over the few groups with a property, not over every group."""
    kept = memo.find(TALLIES, None)
    if kept is None:
        return memo.get(slot, None, lambda: Tally(value, groups)).members
    return kept.get(slot, groups, value).members


@dataclass
class Held:
    """What the queues hold at the start of the cycle, rolled up to every ancestor."""

    allocated: dict[str, Resources]
    non_preemptible: dict[str, Resources]
    typed: dict[str, Resources]


class GroupTotals:
    """Per leaf queue: demand (live requests) and holdings (bound requests, by
    preemptible, and typed GPUs), exact, following the snapshots it is given."""

    def __init__(self) -> None:
        #: The live pods by class, for the workload mix of `placementStrategy:
        #: fragmentation` (`mix.ClassCounts`): kept here, where the cycle's other
        #: walks over every pod are kept, and followed only when the mix is asked for.
        self.class_counts = ClassCounts()
        #: How many live pods have inter-pod terms (`inter_pod.WithTerms`).
        self.with_terms = WithTerms()
        #: Placement's per-node values, kept while each node's rows are as they were
        #: (`node_kept.KeptAcrossCycles`).
        self.per_node = KeptAcrossCycles()
        #: The victim search's options per node (`victims.KeptOptions`).
        self.victim_options = KeptOptions()
        #: Values the actions derive from the waiting groups alone (`KeptForWaiting`).
        self.per_waiting = KeptForWaiting()
        #: The last fair shares, given again while their inputs are equal.
        self.shares = KeptShares()
        #: The nodes' allocatable summed over the schedulable ones, by the very arrays
        #: it was summed from (the kept snapshot keeps them while no node changes).
        self._usable: tuple[tuple[object, ...], Resources] | None = None
        self._reset()

    def _reset(self) -> None:
        self._groups: Mapping[str, PodGroupState] | None = None
        self._tree: object = None
        self._labels: object = None
        self._parts: dict[str, _Part] = {}
        self._live: dict[str, _Sum] = {}
        self._held: dict[tuple[str, bool], _Sum] = {}
        self._typed: dict[tuple[str, bool], _Sum] = {}
        #: Per leaf, the per-type keys its path limits (for this queue tree).
        self._keys: dict[str, tuple[TypedKey, ...]] = {}
        #: Live pods of other schedulers (they take room from the queues), by key.
        self._pods: Mapping[str, PodState] | None = None
        self._foreign: dict[str, PodState] = {}
        self._scheduler = ""
        #: Values the actions derive from one group's state alone (`KeptPerGroup`),
        #: dropped here when the group changes; and tallies over every group.
        self.per_group = KeptPerGroup()
        self.tallies = KeptTallies()

    def update(self, snapshot: Snapshot) -> GroupTotals:
        """Follow `snapshot`: the groups that changed since the last one are taken out
        and put back in. A new queue tree or new node labels start afresh."""
        groups = snapshot.pod_groups
        # Node labels matter only to GPUs of the types a queue limits.
        relabelled = snapshot.labels is not self._labels and any(self._keys.values())
        if snapshot.queues is not self._tree or relabelled:
            self._reset()
            self._tree = snapshot.queues
        self._labels = snapshot.labels
        if groups is self._groups:
            return self
        gone, changed = differences(self._groups, groups, snapshot.groups_changed)
        for key in gone:
            self._drop(key)
        for key, group in changed:
            self._drop(key)
            self._take(key, group, _part(snapshot, group, self._typed_keys(snapshot, group.queue)))
        self._groups = groups
        return self

    def capacity(self, snapshot: Snapshot, scheduler_name: str) -> Resources:
        """What the queues share: allocatable on schedulable nodes, less what other
        schedulers' live pods hold there (their exact sum)."""
        self._follow_pods(snapshot, scheduler_name)
        # The nodes' part, summed again only when the kept snapshot's node arrays are new.
        inputs = (
            snapshot.allocatable,
            snapshot.ready,
            snapshot.unschedulable,
            snapshot.resource_names,
        )
        kept = self._usable
        if kept is None or any(a is not b for a, b in zip(kept[0], inputs, strict=True)):
            usable = snapshot.allocatable[snapshot.schedulable].sum(axis=0)
            names = snapshot.resource_names
            kept = self._usable = (
                inputs,
                Resources(dict(zip(names, usable.tolist(), strict=True))),
            )
        total = kept[1]
        taken: Exact = {}
        schedulable = snapshot.schedulable if self._foreign else None
        for pod in self._foreign.values():
            node = snapshot.node_index.get(pod.node or "")
            if node is not None and schedulable is not None and schedulable[node]:
                add_exact(taken, pod.effective_requests.items())
        return total - as_resources(taken) if taken else total

    def _follow_pods(self, snapshot: Snapshot, scheduler_name: str) -> None:
        pods = snapshot.pods
        if scheduler_name != self._scheduler:
            self._pods, self._foreign, self._scheduler = None, {}, scheduler_name
        if pods is self._pods:
            return
        gone, changed = differences(self._pods, pods, snapshot.pods_changed)
        for key in gone:
            self._foreign.pop(key, None)
        for key, pod in changed:
            if pod.scheduler != scheduler_name and not pod.terminal:
                self._foreign[key] = pod
            else:
                self._foreign.pop(key, None)
        self._pods = pods

    def demand(self) -> dict[str, Resources]:
        """What each leaf's live pods ask for, for leaves with live pods."""
        live = self._live
        return {leaf: as_resources(live[leaf].total) for leaf in sorted(live) if live[leaf].count}

    def live_exact(self) -> dict[str, Exact]:
        """`demand` before rounding: each leaf's exact sum (read only)."""
        return {leaf: part.total for leaf, part in self._live.items() if part.count}

    def held(self, snapshot: Snapshot) -> Held:
        """What every queue holds, the leaves' sums rolled up their paths."""
        tree = snapshot.queues
        allocated: dict[str, Exact] = {}
        non_preemptible: dict[str, Exact] = {}
        typed: dict[str, Exact] = {}
        for (leaf, preemptible), held in self._held.items():
            if not held.count:
                continue
            path = (leaf, *tree.ancestors(leaf))
            kept = self._typed.get((leaf, preemptible))
            for name in path:
                _into(allocated.setdefault(name, {}), held.total)
                if not preemptible:
                    _into(non_preemptible.setdefault(name, {}), held.total)
                _into(typed.setdefault(name, {}), kept.total if kept is not None else {})
        # By name: the order the sums were made in depends on the groups' history.
        return Held(
            {name: as_resources(allocated[name]) for name in sorted(allocated)},
            {name: as_resources(non_preemptible[name]) for name in sorted(non_preemptible)},
            {name: as_resources(typed[name]) for name in sorted(typed)},
        )

    def _typed_keys(self, snapshot: Snapshot, leaf: str) -> tuple[TypedKey, ...]:
        keys = self._keys.get(leaf)
        if keys is None:
            keys = self._keys[leaf] = typed_keys(snapshot.queues, leaf)
        return keys

    def _take(self, key: str, group: PodGroupState, part: _Part) -> None:
        self._parts[key] = part
        self._count(part, 1)
        self.tallies.set(key, group)

    def _drop(self, key: str) -> None:
        self.per_group.drop(key)
        self.tallies.drop(key)
        part = self._parts.pop(key, None)
        if part is not None:
            self._count(part, -1)

    def _count(self, part: _Part, sign: int) -> None:
        if part.live is not None:
            self._live.setdefault(part.leaf, _Sum()).add(part.live, sign)
        if part.held is not None:
            side = (part.leaf, part.preemptible)
            self._held.setdefault(side, _Sum()).add(part.held, sign)
            self._typed.setdefault(side, _Sum()).add(part.typed, sign)


def cluster_capacity(
    snapshot: Snapshot, scheduler_name: str, totals: GroupTotals | None = None
) -> Resources:
    """What the queues share (`GroupTotals.capacity`), from `totals` when kept."""
    return (totals or GroupTotals()).capacity(snapshot, scheduler_name)


def leaf_requests(snapshot: Snapshot, totals: GroupTotals | None = None) -> dict[str, Resources]:
    """What each leaf queue's live pods ask for, bound or pending (exact sums), from
    `totals` kept from the last cycle when given."""
    return (totals or GroupTotals()).update(snapshot).demand()


#: The cycle's exact sums of what each leaf's live pods ask for (`GroupTotals.live_exact`).
LIVE_DEMAND = MemoKey[Mapping[str, Exact]]("what the leaves' live pods ask for, exact")


def live_demand(memo: CycleMemo, snapshot: Snapshot) -> Mapping[str, Exact]:
    """The exact sums the cycle keeps under `LIVE_DEMAND`, else summed afresh."""
    return memo.get(LIVE_DEMAND, None, lambda: GroupTotals().update(snapshot).live_exact())


def summed(parts: Iterable[Exact]) -> Exact:
    """The exact sum of `parts`."""
    total: Exact = {}
    for amounts in parts:
        _into(total, amounts)
    return total


def _into(totals: Exact, amounts: Exact) -> None:
    for name, amount in amounts.items():
        totals[name] = totals.get(name, 0) + amount


def _part(snapshot: Snapshot, group: PodGroupState, keys: tuple[TypedKey, ...]) -> _Part:
    """The group's pods summed one by one (a group's own float sum would round)."""
    live: Exact | None = None
    if group.live:
        live = {}
        for pod in group.live:
            add_exact(live, pod.effective_requests.items())
    held: Exact | None = None
    typed: Exact = {}
    if group.bound:
        held = {}
        for pod in group.bound:
            add_exact(held, pod.effective_requests.items())
        if keys:
            labels = snapshot.labels
            index = snapshot.node_index
            for pod in group.bound:
                gpus = pod.effective_requests[GPU]
                add_exact(typed, typed_gpus(keys, [(labels[index[pod.node or ""]], gpus)]).items())
    preemptible = is_preemptible(group, group_priority(group))
    return _Part(group.queue, preemptible, live, held, typed)
