"""The one transaction type every what-if goes through.

A `Transaction` holds the working copy of what a cycle changes over a read-only
snapshot, and an undo log:
- free resources per node (`free`, nodes x resources);
- free fraction of every GPU device (`devices`, nodes x most devices per node;
  padding columns are -1 so nothing ever fits there) and, kept with it, how
  many untouched devices each node has (`whole_free`);
- free resources per topology domain (`domain_free`), built on first use and
  then kept up to date with every placement, so placement never re-sums nodes.
`checkpoint()` marks a point and `rollback(mark)` undoes everything after it
(placement tries candidates this way, and never commits). `attempt()` is the
step an action takes: what the step does is committed when the action says it
holds, else rolled back; committed work is never rolled back. Rollback restores
the saved rows exactly (no float drift). `evict(pod, group)` is the opposite
what-if: a bound pod's resources and devices are given back to its node, as
an entry of the same undo log (a removal), so rollback takes it back too;
`binds()` lists only committed placements (the plan's evictions are the
actions' `Evict` intents). `memo` holds per-cycle caches under typed keys (`MemoKey`); they
depend only on the snapshot, or on the transaction's `version` when it is part of their key.
Pure: no I/O.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Container, Hashable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.plan import Bind
from kai_ray.state.dra import DeviceRef
from kai_ray.state.dra_allocate import ClaimAllocation, result_of
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import POD_COUNT, Snapshot, vector_in
from kai_ray.values.arrays import add_rows
from kai_ray.values.resources import EPSILON, GPU, Resources

Matrix = npt.NDArray[np.float64]
#: A topology level: (Topology name, level index from the widest).
LevelKey = tuple[str, int]
T = TypeVar("T")


class MemoKey(Generic[T]):
    """A typed slot of the per-cycle memo: what is kept under it is a `T`, one per
    argument (a pod signature, a label key)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"MemoKey({self.name!r})"


#: What `CycleMemo.get` meets for a slot with no value yet (None is a value).
_MISSING: Any = object()


class CycleMemo:
    """Per-cycle caches that depend only on the snapshot, under typed keys."""

    def __init__(self) -> None:
        self._slots: dict[tuple[MemoKey[Any], Hashable], Any] = {}

    def get(self, key: MemoKey[T], argument: Hashable, build: Callable[[], T]) -> T:
        """The value under `key` for `argument`, built once per cycle."""
        slot = (key, argument)
        value: T = self._slots.get(slot, _MISSING)
        if value is _MISSING:
            value = self._slots[slot] = build()
        return value

    def of_object(
        self, key: MemoKey[T], owner: object, argument: Hashable, build: Callable[[], T]
    ) -> T:
        """The value under `key` for the very object `owner` (a list worked out once
        and shared, say) and `argument`, built once per cycle. `owner` is kept with
        the value, so that no other object takes its id while the cycle lasts."""
        slot = (key, (id(owner), argument))
        found: tuple[object, T] | None = self._slots.get(slot)
        if found is None:
            found = self._slots[slot] = (owner, build())
        return found[1]

    def find(self, key: MemoKey[T], argument: Hashable) -> T | None:
        """The value kept under `key` for `argument`, None when there is none."""
        found: T | None = self._slots.get((key, argument))
        return found

    def keep(self, key: MemoKey[T], argument: Hashable, value: T) -> None:
        self._slots[(key, argument)] = value


@dataclass
class Attempt:
    """One step an action tries (`Transaction.attempt`); set `holds` when it stands."""

    mark: int
    holds: bool = False


@dataclass(frozen=True)
class Placement:
    """One pod placed on one node: what it took and from which devices."""

    bind: Bind
    node: int
    taken: Matrix
    device_fraction: float = 0.0
    #: A bound pod taken off its node (`taken` is then what it gives back, negated).
    removal: bool = False
    #: DRA devices the placement took (its new claim allocations), or a removal freed.
    dra_devices: frozenset[DeviceRef] = frozenset()
    #: Capacity of shareable DRA devices a removal gave back (a placement's is in its bind).
    dra_freed: tuple[tuple[DeviceRef, str, float], ...] = ()


@dataclass(frozen=True)
class _Undo:
    free_row: Matrix
    device_row: Matrix
    version: int


class Transaction:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.free = snapshot.free.copy()
        self.devices = snapshot.gpu_free.copy()
        self.whole_free = np.count_nonzero(self.devices >= 1.0 - EPSILON, axis=1)
        self.placements: list[Placement] = []
        #: Pods placed so far (committed or not), by key.
        self.placed: dict[str, Placement] = {}
        #: Bound pods evicted so far (committed or not), by key.
        self.removed: dict[str, Placement] = {}
        #: Per group: how many of its pending pods are placed (`placed_pending`).
        self._pending_placed: dict[str, int] = {}
        self.memo = CycleMemo()
        self._domain_free: dict[LevelKey, Matrix] = {}
        #: Every node whose free row or devices changed (a placement, a removal, a
        #: rollback), in order; it only grows: a reader keeps how far it has read.
        self.changed_nodes: list[int] = []
        self._undo: list[_Undo] = []
        self._committed = 0
        #: DRA: devices placements took and removals freed, and the claims allocated
        #: in this transaction by key (so the gang's other pods reuse a shared one).
        self._claimed: set[DeviceRef] = set()
        self._freed: set[DeviceRef] = set()
        self.claim_allocations: dict[str, ClaimAllocation] = {}
        #: Capacity of shareable devices consumed (+) or given back (-) in this transaction.
        self._consumption: dict[DeviceRef, dict[str, float]] = {}
        #: Which state the transaction is in: a new number for every placement or
        #: removal, and the number it had back when one is rolled back (rollback
        #: restores exactly), so equal versions mean equal free resources and devices.
        self.version = 0
        self._serial = 0

    def checkpoint(self) -> int:
        return len(self.placements)

    def version_at(self, mark: int) -> int:
        """The version the transaction had when it held its first `mark` placements
        (`mark` up to `checkpoint()`). Versions are never reused, so an equal value
        later means the first `mark` placements are still the same."""
        return self.version if mark >= len(self.placements) else self._undo[mark].version

    def place(self, placement: Placement) -> None:
        node = placement.node
        self._undo.append(_Undo(self.free[node].copy(), self.devices[node].copy(), self.version))
        self._serial += 1
        self.version = self._serial
        self.free[node] -= placement.taken
        amount = (placement.device_fraction or 1.0) * (-1.0 if placement.removal else 1.0)
        for index in placement.bind.gpu_devices:
            self.devices[node, index] -= amount
        self._follow_domains(node, self._undo[-1].free_row, self.free[node], -placement.taken)
        self._node_changed(node)
        if placement.dra_devices or placement.bind.claims or placement.dra_freed:
            self._claim(placement, undo=False)
        self.placements.append(placement)
        if placement.removal:
            self.removed[placement.bind.pod] = placement
        else:
            self._count_placed(placement, 1 if placement.bind.pod not in self.placed else 0)
            self.placed[placement.bind.pod] = placement

    def placed_pending(self, group: str) -> bool:
        """Whether some pending pod of the group is placed (the same as looking its
        pending pods up in `placed`, without the walk)."""
        return group in self._pending_placed

    @property
    def groups_placed_pending(self) -> Container[str]:
        """The groups `placed_pending` says True of (read only), for a walk that asks
        of many without a call each."""
        return self._pending_placed.keys()

    def _count_placed(self, placement: Placement, change: int) -> None:
        pod = self.snapshot.pods.get(placement.bind.pod)
        if change == 0 or pod is None or pod.node is not None:
            return
        group = placement.bind.group
        count = self._pending_placed.get(group, 0) + change
        if count:
            self._pending_placed[group] = count
        else:
            del self._pending_placed[group]

    def evict(self, pod: PodState, group: str) -> None:
        """Give a bound pod's resources and devices back to its node (undone by rollback)."""
        node = self.snapshot.node_index[pod.node or ""]
        bind = Bind(pod.key, group, pod.node or "", pod.devices, pod.gpu_fraction)
        taken = -held_vector(self.snapshot, pod)
        freed, given_back = self._claims_freed(pod) if pod.claims else (frozenset(), ())
        self.place(
            Placement(
                bind,
                node,
                taken,
                pod.gpu_fraction,
                removal=True,
                dra_devices=freed,
                dra_freed=given_back,
            )
        )

    def dra_taken(self) -> AbstractSet[DeviceRef]:
        """DRA devices no claim may be given now: those allocated claims hold in the
        snapshot, less what this transaction's removals freed, plus what its
        placements took."""
        return _Taken(self.snapshot.dra.taken, self._freed, self._claimed)

    def dra_consumed(self) -> Mapping[DeviceRef, Mapping[str, float]]:
        """What shareable DRA devices have given out now: the snapshot's allocated
        claims, plus this transaction's placements, less what its removals freed."""
        if not self._consumption:
            return self.snapshot.dra.consumed
        return _Consumed(self.snapshot.dra.consumed, self._consumption)

    def _claims_freed(
        self, pod: PodState
    ) -> tuple[frozenset[DeviceRef], tuple[tuple[DeviceRef, str, float], ...]]:
        """Devices of the pod's allocated claims that nobody else still uses, and the
        capacity of shareable devices those claims give back."""
        view = self.snapshot.dra
        freed: set[DeviceRef] = set()
        given_back: list[tuple[DeviceRef, str, float]] = []
        for key in pod.claims:
            claim = view.claims.get(key)
            if claim is None or claim.status.allocation is None:
                continue
            others = [u for u in view.users.get(key, ()) if u != pod.key and u not in self.removed]
            if others:
                continue
            for result in map(result_of, claim.status.allocation.devices.results):
                if result.shared:
                    given_back += [(result.ref, name, amount) for name, amount in result.consumed]
                else:
                    freed.add(result.ref)
        return frozenset(freed), tuple(given_back)

    def _consume(self, ref: DeviceRef, name: str, amount: float) -> None:
        into = self._consumption.setdefault(ref, {})
        into[name] = into.get(name, 0.0) + amount

    def _claim(self, placement: Placement, undo: bool) -> None:
        """Book (or, undoing, give back) what a placement did to DRA devices."""
        sign = -1.0 if undo else 1.0
        if placement.removal:
            (self._freed.difference_update if undo else self._freed.update)(placement.dra_devices)
            for ref, name, amount in placement.dra_freed:
                self._consume(ref, name, -sign * amount)
            return
        (self._claimed.difference_update if undo else self._claimed.update)(placement.dra_devices)
        for claim in placement.bind.claims:
            if not claim.new:
                continue
            for device in claim.devices:
                for name, amount in device.consumed if device.shared else ():
                    self._consume(device.ref, name, sign * amount)
            if claim.new:
                key = f"{claim.namespace}/{claim.name}"
                if undo:
                    self.claim_allocations.pop(key, None)
                else:
                    self.claim_allocations[key] = claim

    def rollback(self, mark: int) -> None:
        if mark < self._committed:
            raise ValueError(f"cannot roll back to {mark}: committed up to {self._committed}")
        while len(self.placements) > mark:
            placement, undo = self.placements.pop(), self._undo.pop()
            node = placement.node
            self._follow_domains(node, self.free[node], undo.free_row, placement.taken)
            self.free[node] = undo.free_row
            self.devices[node] = undo.device_row
            self.version = undo.version
            if placement.removal:
                self.removed.pop(placement.bind.pod, None)
            elif self.placed.pop(placement.bind.pod, None) is not None:
                self._count_placed(placement, -1)
            self._node_changed(node)
            if placement.dra_devices or placement.bind.claims or placement.dra_freed:
                self._claim(placement, undo=True)

    def commit(self) -> None:
        self._committed = len(self.placements)

    @contextlib.contextmanager
    def attempt(self) -> Iterator[Attempt]:
        """One step: committed on leaving when `holds` was set, rolled back otherwise
        (an exception rolls it back too)."""
        step = Attempt(self.checkpoint())
        try:
            yield step
        except BaseException:
            self.rollback(step.mark)
            raise
        if step.holds:
            self.commit()
        else:
            self.rollback(step.mark)

    def binds(self) -> list[Bind]:
        return [p.bind for p in self.placements[: self._committed] if not p.removal]

    def domain_free(self, topology: str, level: int) -> Matrix:
        """Free resources per domain of one level (domains in the tree's order); read-only view."""
        key = (topology, level)
        if key not in self._domain_free:
            self._domain_free[key] = self._sum_domains(topology, level)
        view = self._domain_free[key].view()
        view.setflags(write=False)
        return view

    def _sum_domains(self, topology: str, level: int) -> Matrix:
        tree_level = self.snapshot.topologies[topology].levels[level]
        countable = np.where(self.snapshot.schedulable[:, None], np.maximum(self.free, 0.0), 0.0)
        inside = tree_level.node_domain >= 0
        sums = np.zeros((len(tree_level.domains), self.free.shape[1]), dtype=np.float64)
        add_rows(sums, tree_level.node_domain[inside], countable[inside])
        return sums

    def _node_changed(self, node: int) -> None:
        self.changed_nodes.append(node)
        self.whole_free[node] = np.count_nonzero(self.devices[node] >= 1.0 - EPSILON)

    def _follow_domains(self, node: int, before: Matrix, after: Matrix, delta: Matrix) -> None:
        """The node's free row goes from `before` to `after`, by `delta`: the domain
        sums follow what `_sum_domains` counts of it (nothing on a node no pod may be
        placed on, nothing below zero), the raw delta when both rows count whole."""
        if not self._domain_free or not self.snapshot.schedulable[node]:
            return
        if (before < 0.0).any() or (after < 0.0).any():
            delta = np.maximum(after, 0.0) - np.maximum(before, 0.0)
        for (topology, level), sums in self._domain_free.items():
            domain = self.snapshot.topologies[topology].levels[level].node_domain[node]
            if domain >= 0:
                sums[domain] += delta


class _Consumed(Mapping[DeviceRef, Mapping[str, float]]):
    """`base` with `delta` added, per device and capacity, without copying `base`."""

    def __init__(
        self,
        base: Mapping[DeviceRef, Mapping[str, float]],
        delta: Mapping[DeviceRef, Mapping[str, float]],
    ) -> None:
        self.base, self.delta = base, delta

    def __getitem__(self, ref: DeviceRef) -> Mapping[str, float]:
        if ref not in self.delta:
            return self.base[ref]
        merged = dict(self.base.get(ref, {}))
        for name, amount in self.delta[ref].items():
            merged[name] = merged.get(name, 0.0) + amount
        return merged

    def __iter__(self) -> Iterator[DeviceRef]:
        yield from self.base
        yield from (ref for ref in self.delta if ref not in self.base)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Taken(AbstractSet[DeviceRef]):
    """(base - freed) | claimed, without copying any of them."""

    def __init__(
        self, base: AbstractSet[DeviceRef], freed: set[DeviceRef], claimed: set[DeviceRef]
    ) -> None:
        self.base, self.freed, self.claimed = base, freed, claimed

    def __contains__(self, item: object) -> bool:
        return item in self.claimed or (item in self.base and item not in self.freed)

    def __iter__(self) -> Iterator[DeviceRef]:
        yield from (d for d in self.base if d not in self.freed and d not in self.claimed)
        yield from self.claimed

    def __len__(self) -> int:
        return sum(1 for _ in self)


def held_vector(snapshot: Snapshot, pod: PodState) -> Matrix:
    """What a bound pod holds on its node, laid out as the snapshot's `used` counts it
    (read only: pods asking alike share one row)."""
    return _held_row(pod.requests, pod.gpu_fraction, snapshot.resource_names)


@functools.lru_cache(maxsize=4096)
def _held_row(requests: Resources, fraction: float, names: tuple[str, ...]) -> Matrix:
    """`held_vector` of a pod asking `requests` and `fraction`, in the columns `names`."""
    row = vector_in(names, requests)
    row[names.index(GPU)] += fraction
    if POD_COUNT in names:
        row[names.index(POD_COUNT)] += 1.0
    row.setflags(write=False)
    return row
