"""First-fit gang placement: the foundation's simple allocation.

A group's minimum is placed all-or-nothing (checkpoint, then rollback on the
first member that fits nowhere); members above the minimum are placed one by
one afterwards. Nodes are tried in snapshot order; a node fits when it is
schedulable and has the free resources and, for GPU pods, the free devices.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.resources import GPU

EPSILON = 1e-9


@dataclass(frozen=True)
class GangOutcome:
    """What placing one group did: admitted (its minimum holds) or why not; pods placed."""

    admitted: bool
    reason: str = ""
    placed: int = 0


def share_on(tx: Transaction, pod: PodState, node: int) -> float:
    """The fraction of one device of `node` the pod's GPU share means (0 for none)."""
    if pod.gpu_share is None:
        return 0.0
    fraction = pod.gpu_share.fraction_of(float(tx.snapshot.gpu_memory_mib[node]))
    return 1.0 if fraction is None else fraction


def _device_choice(
    devices: npt.NDArray[np.float64], fraction: float, whole: int
) -> tuple[int, ...] | None:
    if fraction > 0:
        fits = [i for i, free in enumerate(devices) if free >= fraction - EPSILON]
        if not fits:
            return None
        # Pack: the fullest device that still fits, lowest index on ties.
        return (min(fits, key=lambda i: (devices[i], i)),)
    untouched = [i for i, free in enumerate(devices) if free >= 1.0 - EPSILON]
    return tuple(untouched[:whole]) if len(untouched) >= whole else None


def place_pod(tx: Transaction, group: PodGroupState, pod: PodState) -> bool:
    """Put one pod on the first node that fits; False when none does."""
    snapshot = tx.snapshot
    need = snapshot.vector(pod.requests)
    whole = round(pod.requests[GPU])
    fits = np.all(tx.free >= need - EPSILON, axis=1) & snapshot.schedulable
    for node in np.flatnonzero(fits):
        devices: tuple[int, ...] = ()
        fraction = share_on(tx, pod, int(node))
        if pod.uses_gpu:
            chosen = _device_choice(tx.devices[node], fraction, whole)
            if chosen is None:
                continue
            devices = chosen
        bind = Bind(pod.key, group.key, snapshot.node_names[node], devices, fraction)
        tx.place(Placement(bind, int(node), need, fraction))
        return True
    return False


def _pending(group: PodGroupState) -> list[PodState]:
    return [p for p in group.live_pods() if p.node is None]


def place_gang(tx: Transaction, group: PodGroupState, config: SchedulerConfigSpec) -> GangOutcome:
    """The group's missing minimum, all or nothing, committed when it holds."""
    pending = _pending(group)
    bound = len(group.live_pods()) - len(pending)
    missing = max(group.spec.minMember - bound, 0)
    mark = tx.checkpoint()
    for placed, pod in enumerate(pending[:missing]):
        if not place_pod(tx, group, pod):
            tx.rollback(mark)
            return GangOutcome(False, _reason(group, missing, placed))
    tx.commit()
    return GangOutcome(True, placed=missing)


def place_extras(
    tx: Transaction, group: PodGroupState, config: SchedulerConfigSpec, limit: int | None = None
) -> int:
    """Members above the minimum, one by one; returns how many were placed."""
    pending = _pending(group)
    bound = len(group.live_pods()) - len(pending)
    extras = pending[max(group.spec.minMember - bound, 0) :]
    placed = 0
    for pod in extras[:limit]:
        if place_pod(tx, group, pod):
            tx.commit()
            placed += 1
    return placed


def _reason(group: PodGroupState, missing: int, placed: int) -> str:
    return (
        f"gang of {group.spec.minMember} does not fit: only {placed} of the "
        f"{missing} pods still needed fit on the free nodes"
    )
