"""Per-node values kept while each node's free row and devices are as they were.

Placement works out, for every node, values that depend on that node's free
resources and devices alone, given inputs that stay put (a pod shape, the
workload mix's classes, the nodes' allocatable): how many pods of a shape fit
(`fit.room_on`), which classes fit before and after a pod, a pod's stranding
score, the tie-break (`stranding.py`, `fit.py`). Each such value is kept with,
per node, the version of the node's rows it was worked out on (`PerNode`);
`NodeVersions` gives a node a new version whenever its rows may have changed,
so a value is worked out again only on the nodes whose version moved.

Within a transaction a node's version moves when the transaction places on it,
takes from it or rolls either back (`Transaction.changed_nodes`). A caller that
runs cycle after cycle on one cache keeps the values and the versions across
cycles (`KeptAcrossCycles`, in `run_cycle`'s `GroupTotals`): a new transaction
compares every node's free row and devices with the ones last seen, once, and
moves the versions of the nodes that differ. A kept value is taken only when
every input it was worked out from is equal (arrays by value). A cycle then
pays for the nodes that changed since the last one, not for every node, and
every value is the one a fresh transaction works out
(`tests/unit/test_node_kept.py`). Pure: no I/O.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.transaction import MemoKey, Transaction

Matrix = npt.NDArray[np.float64]
Indices = npt.NDArray[np.intp]
Versions = npt.NDArray[np.int64]


class NodeVersions:
    """Per node, a number that changes whenever its free row or devices may have."""

    def __init__(self) -> None:
        self._versions: Versions = np.zeros(0, dtype=np.int64)
        self._serial = 0
        #: The rows the versions stand for, and the transaction they were read from
        #: (weakly), with how much of its `changed_nodes` was read.
        self._free: Matrix = np.zeros((0, 0))
        self._devices: Matrix = np.zeros((0, 0))
        self._tx: Callable[[], Transaction | None] = _none
        self._read = 0

    def __getstate__(self) -> dict[str, Any]:
        """Picklable: the transaction last seen is not kept (it would be stale)."""
        return {**self.__dict__, "_tx": _none}

    def of(self, tx: Transaction) -> Versions:
        """Every node's version in the transaction as it is now."""
        if self._tx() is not tx:
            self._follow(tx)
        elif self._read < len(tx.changed_nodes):
            rows = np.unique(np.asarray(tx.changed_nodes[self._read :], dtype=np.intp))
            self._moved(rows)
            self._free[rows], self._devices[rows] = tx.free[rows], tx.devices[rows]
            self._read = len(tx.changed_nodes)
        return self._versions

    def _follow(self, tx: Transaction) -> None:
        """Another transaction: the nodes whose rows differ from the ones last seen
        move (all of them when the nodes' layout differs)."""
        if self._free.shape == tx.free.shape and self._devices.shape == tx.devices.shape:
            same = np.all(self._free == tx.free, axis=1)
            same &= np.all(self._devices == tx.devices, axis=1)
            self._moved(np.flatnonzero(~same))
        else:
            self._serial += 1
            self._versions = np.full(len(tx.free), self._serial, dtype=np.int64)
        self._free, self._devices = tx.free.copy(), tx.devices.copy()
        self._tx, self._read = weakref.ref(tx), len(tx.changed_nodes)

    def _moved(self, rows: Indices) -> None:
        if len(rows):
            self._serial += 1
            self._versions[rows] = self._serial


def _none() -> None:
    return None


class PerNode(Protocol):
    """A value with one entry per node, and the node versions each entry was worked
    out at (-1: not yet)."""

    versions: Versions


V = TypeVar("V", bound=PerNode)
T = TypeVar("T")


def unworked(tx: Transaction) -> Versions:
    """Versions for a new `PerNode` value of the transaction's nodes: none worked out."""
    return np.full(len(tx.free), -1, dtype=np.int64)


class KeptAcrossCycles:
    """The node versions, and per-node values kept from one transaction to the next
    by what they are and the inputs they were worked out from (the most recently
    used `AT_MOST`: a value costs a few numbers per node); and values of the nodes'
    static facts alone (`node_static`)."""

    AT_MOST = 64
    #: Past this many values of the nodes' static facts, they start afresh.
    STATIC_AT_MOST = 4096

    def __init__(self) -> None:
        self.versions = NodeVersions()
        self._kept: dict[Hashable, tuple[tuple[object, ...], Any]] = {}
        self._facts: tuple[object, ...] = ()
        self._static: dict[tuple[MemoKey[Any], Hashable], Any] = {}

    def node_static(
        self, tx: Transaction, slot: MemoKey[T], key: Hashable, build: Callable[[], T]
    ) -> T:
        """The value under `slot` and `key` that the nodes' static facts alone give
        (names, labels, taints, readiness, cordons, resource columns, GPU memory): kept
        while the snapshots carry the very same arrays of them (a kept snapshot
        keeps them while no node changes), else built again."""
        snapshot = tx.snapshot
        facts = (
            snapshot.node_names,
            snapshot.labels,
            snapshot.taints,
            snapshot.ready,
            snapshot.unschedulable,
            snapshot.resource_names,
            snapshot.gpu_memory_mib,
        )
        if len(facts) != len(self._facts) or any(
            a is not b for a, b in zip(facts, self._facts, strict=True)
        ):
            self._facts, self._static = facts, {}
        found = self._static.get((slot, key))
        if found is None:
            if len(self._static) >= self.STATIC_AT_MOST:
                self._static.clear()
            found = self._static[(slot, key)] = build()
        value: T = found
        return value

    def find(self, key: Hashable, inputs: tuple[object, ...]) -> Any | None:
        found = self._kept.pop(key, None)
        if found is None or not same_values(found[0], inputs):
            return None
        self._kept[key] = found  # the last used last
        return found[1]

    def keep(self, key: Hashable, inputs: tuple[object, ...], value: object) -> None:
        self._kept[key] = (inputs, value)
        if len(self._kept) > self.AT_MOST:
            del self._kept[next(iter(self._kept))]


#: The caller's values kept across cycles (`run_cycle` puts its `GroupTotals`' here;
#: a transaction without one keeps its own, for itself).
ACROSS_CYCLES = MemoKey[KeptAcrossCycles]("per-node values kept across cycles")
#: A transaction's slot for per-node values: the inputs, and the value.
Slot = MemoKey[tuple[tuple[object, ...], V]]


def node_static(tx: Transaction, slot: MemoKey[T], key: Hashable, build: Callable[[], T]) -> T:
    """`KeptAcrossCycles.node_static` of the caller's store (or the transaction's own),
    through the transaction's memo."""
    return tx.memo.get(
        slot,
        key,
        lambda: tx.memo.get(ACROSS_CYCLES, None, KeptAcrossCycles).node_static(
            tx, slot, key, build
        ),
    )


def kept_per_node(
    tx: Transaction,
    slot: Slot[V],
    key: Hashable,
    inputs: tuple[object, ...],
    build: Callable[[], V],
) -> V:
    """The value under `slot` and `key` worked out from `inputs` (arrays compared by
    value): the transaction's, else one kept across cycles from equal inputs, else
    `build()`."""
    kept = tx.memo.find(slot, key)
    if kept is not None and same_values(kept[0], inputs):
        return kept[1]
    across = tx.memo.get(ACROSS_CYCLES, None, KeptAcrossCycles)
    found = across.find((slot, key), inputs)
    value: V = found if found is not None else build()
    if found is None:
        across.keep((slot, key), inputs, value)
    tx.memo.keep(slot, key, (inputs, value))
    return value


def bring_up_to_date(
    tx: Transaction, value: PerNode, nodes: Indices, work_out: Callable[[Indices], None]
) -> None:
    """`work_out(rows)` for those of `nodes` whose entries of `value` no longer hold
    (their node's version moved since), which it writes into `value`; then recorded
    as holding at the versions they were worked out at."""
    versions = tx.memo.get(ACROSS_CYCLES, None, KeptAcrossCycles).versions.of(tx)
    stale: Indices = nodes[value.versions[nodes] != versions[nodes]]
    if len(stale):
        work_out(stale)
        value.versions[stale] = versions[stale]


def same_values(a: object, b: object) -> bool:
    """Equal inputs: the very object, arrays by dtype and value, tuples part by part,
    anything else by `==`."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
