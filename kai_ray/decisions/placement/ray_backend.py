"""The Ray placement backend: domain room evaluated by Ray tasks over node shards.

The only module that imports Ray, and only inside functions, so a small
cluster never loads it. Per transaction (one per cycle) the snapshot's node
arrays (the domain of every node at every topology level) are put into the
object store once; each query sends the shards' current free rows and the
pod shape, and every task returns its shard's per-domain room, summed here in
a fixed order. The numbers are the local backend's exactly (same `fit.room`,
integer sums). `ray.init` joins `address` when one is set, else starts a local
cluster (2 CPUs, no dashboard, worker logs not forwarded); the caller's SIGTERM
handler is put back afterwards (a kopf operator must keep its own).
I/O: talks to Ray; holds no Kubernetes state.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.backend import Counts, RoomQuery, per_domain
from kai_ray.decisions.placement.fit import room
from kai_ray.decisions.placement.shapes import PodShape
from kai_ray.decisions.transaction import LevelKey, Transaction

#: Node shards per query: one per CPU of the default local cluster.
SHARDS = 2
NodeArrays = Mapping[LevelKey, tuple[npt.NDArray[np.int64], int]]
_lock = threading.Lock()
_remote: dict[str, Any] = {}


def connect(address: str | None) -> Any:
    """The `ray` module, initialised once per process (joined, or a local cluster)."""
    import ray

    with _lock:
        if not ray.is_initialized():
            _init_keeping_sigterm(ray, address)
        if "shard_room" not in _remote:
            _remote["shard_room"] = ray.remote(num_cpus=1)(shard_room)
    return ray


def disconnect() -> None:
    """Stop this process's Ray (a local cluster it started goes with it)."""
    import ray

    with _lock:
        _remote.clear()
        if ray.is_initialized():
            ray.shutdown()


def _init_keeping_sigterm(ray: Any, address: str | None) -> None:
    """`ray.init` in this thread, then the caller's SIGTERM handler put back.

    Ray replaces the main thread's SIGTERM handler with one that exits, which
    would skip a kopf operator's graceful shutdown. (Initialising Ray in a
    helper thread that then ends is no way out: the process dies on first use.)
    """
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if in_main else None
    _init(ray, address)
    if in_main:
        signal.signal(signal.SIGTERM, previous)


def _init(ray: Any, address: str | None) -> None:
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


def node_arrays(tx: Transaction) -> NodeArrays:
    """What the tasks read from the object store: every level's node -> domain map."""
    return {
        (name, index): (level.node_domain, len(level.domains))
        for name, tree in tx.snapshot.topologies.items()
        for index, level in enumerate(tree.levels)
    }


def shard_room(
    arrays: NodeArrays,
    nodes: npt.NDArray[np.intp],
    state: tuple[npt.NDArray[np.float64], ...],
    whole_free: Counts,
    shape: PodShape,
    levels: tuple[LevelKey, ...],
) -> list[Counts]:
    """One shard's per-domain room (runs in a Ray worker; numpy only)."""
    free, devices, fraction = state
    counts = room(free, devices, whole_free, shape, fraction)
    return [per_domain(arrays[level][0], nodes, counts, arrays[level][1]) for level in levels]


class RayPlacementBackend:
    name = "ray"

    def __init__(self, tx: Transaction, address: str | None, shards: int = SHARDS) -> None:
        self._ray = connect(address)
        self._arrays = self._ray.put(node_arrays(tx))
        self._shards = shards

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        # The shape's per-node fractions travel with each shard, not whole.
        slim = dataclasses.replace(query.shape, fraction=np.zeros(0))
        refs = [
            _remote["shard_room"].remote(
                self._arrays,
                part,
                _state(tx, query.shape, part),
                tx.whole_free[part],
                slim,
                query.levels,
            )
            for part in np.array_split(query.nodes, self._shards)
        ]
        results: list[list[Counts]] = self._ray.get(refs)
        return [
            sum((r[i] for r in results), np.zeros_like(results[0][i]))
            for i in range(len(query.levels))
        ]


def _state(
    tx: Transaction, shape: PodShape, part: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.float64], ...]:
    return tx.free[part], tx.devices[part], shape.fraction[part]
