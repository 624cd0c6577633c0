"""Which GPU devices on each node are taken, whole or in part.

Bound pods carry the devices the binder chose (`kai-ray.io/gpu-devices`). Pods
without that record (other schedulers', or bound before the record was written)
get devices assigned here, deterministically, so the accounting is right either
way: whole-GPU pods take the lowest free whole devices, a share goes to the
fullest shared device it fits on, else to the lowest free device. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.state.pod_states import PodState
from kai_ray.values.errors import Problem
from kai_ray.values.names import GPU_DEVICES_ANNOTATION, GPU_MEMORY_ANNOTATION
from kai_ray.values.resources import EPSILON, GPU
from kai_ray.workloads.pod_fields import annotation_field

#: Marks the columns past a node's last device in a matrix of device free fractions.
NO_DEVICE = -1.0


@dataclass(frozen=True)
class GpuDevices:
    """The devices of one node: free fraction of each, and which hold shares."""

    free: npt.NDArray[np.float64]
    shared: npt.NDArray[np.bool_]

    @classmethod
    def untouched(cls, count: int) -> GpuDevices:
        """`count` devices that no pod holds any part of."""
        return _Ledger(count).frozen()

    @property
    def count(self) -> int:
        return len(self.free)

    @property
    def whole_free(self) -> int:
        """Devices a whole-GPU pod could take: untouched by any pod."""
        return int(np.count_nonzero(self.free >= 1.0 - EPSILON))


class _Ledger:
    """The working copy of one node's devices while pods are counted.

    Plain lists: a node has a handful of devices, and numpy's per-call overhead
    on arrays that small would dominate across tens of thousands of pods.
    """

    def __init__(self, count: int) -> None:
        self.free = [1.0] * count
        self.shared = [False] * count

    def take(self, devices: Sequence[int], amount: float, share: bool) -> None:
        for device in devices:
            self.free[device] -= amount
            self.shared[device] = self.shared[device] or share

    def recorded_fits(self, pod: PodState, fraction: float) -> str | None:
        """Why the recorded devices cannot be right, or None when they can."""
        wanted = 1 if pod.gpu_share else int(pod.requests[GPU])
        if len(pod.devices) != wanted:
            return f"lists {len(pod.devices)} devices but the pod needs {wanted}"
        if max(pod.devices) >= len(self.free):
            return f"device {max(pod.devices)} does not exist; the node has {len(self.free)}"
        need = fraction if pod.gpu_share else 1.0
        if any(self.free[d] < need - EPSILON for d in pod.devices):
            return "a listed device is already taken by another pod"
        return None

    def lowest_whole(self, count: int) -> tuple[int, ...] | None:
        whole = [d for d, free in enumerate(self.free) if free >= 1.0 - EPSILON]
        return tuple(whole[:count]) if len(whole) >= count else None

    def fullest_fit(self, fraction: float) -> tuple[int, ...] | None:
        """The shared device with the least room that still fits, else a fresh one."""
        fits = [
            (free, d)
            for d, (free, shared) in enumerate(zip(self.free, self.shared, strict=True))
            if shared and free >= fraction - EPSILON
        ]
        return (min(fits)[1],) if fits else self.lowest_whole(1)

    def frozen(self) -> GpuDevices:
        free = np.array(self.free, dtype=np.float64)
        shared = np.array(self.shared, dtype=np.bool_)
        free.setflags(write=False)
        shared.setflags(write=False)
        return GpuDevices(free, shared)


@dataclass(frozen=True)
class NodeDevices:
    """One node's accounting: its devices, its GPU pods with devices settled, the problems."""

    devices: GpuDevices
    pods: tuple[PodState, ...]
    problems: tuple[Problem, ...]


def account_node(count: int, device_mib: float, bound_gpu_pods: Sequence[PodState]) -> NodeDevices:
    """Count one node's bound GPU pods onto its `count` devices: recorded ones first,
    then the rest in age order. Nodes are independent, so a build may keep the
    result of a node whose pods did not change."""
    ledger = _Ledger(count)
    settled: dict[str, PodState] = {}
    problems: list[Problem] = []
    unrecorded: list[PodState] = []
    for pod in bound_gpu_pods:
        pod = _resolve_fraction(pod, device_mib, problems)
        if not _take_recorded(ledger, pod, settled, problems):
            unrecorded.append(pod)
    for pod in sorted(unrecorded, key=lambda p: (p.creation_timestamp, p.key)):
        _take_assigned(ledger, pod, settled, problems)
    return NodeDevices(ledger.frozen(), tuple(settled.values()), tuple(problems))


def _resolve_fraction(pod: PodState, device_mib: float, problems: list[Problem]) -> PodState:
    """A memory share becomes a fraction of this node's devices; when it cannot, a whole one."""
    if pod.gpu_share is None:
        return pod
    fraction = pod.gpu_share.fraction_of(device_mib)
    field = annotation_field(GPU_MEMORY_ANNOTATION)
    if fraction is None:
        problems.append(
            Problem(
                pod.ref(),
                field,
                f"node {pod.node} does not publish "
                "nvidia.com/gpu.memory; counted as a whole device",
            )
        )
    elif fraction > 1.0 + EPSILON:
        problems.append(
            Problem(
                pod.ref(),
                field,
                f"asks for more memory than one device of "
                f"node {pod.node} has ({device_mib:g} MiB); counted as a whole "
                "device",
            )
        )
    return pod.on_devices(pod.devices, min(fraction or 1.0, 1.0))


def _take_recorded(
    ledger: _Ledger, pod: PodState, settled: dict[str, PodState], problems: list[Problem]
) -> bool:
    if not pod.devices:
        return False
    why_not = ledger.recorded_fits(pod, pod.gpu_fraction)
    if why_not is not None:
        problems.append(
            Problem(
                pod.ref(),
                annotation_field(GPU_DEVICES_ANNOTATION),
                f"{why_not}; devices re-derived",
            )
        )
        return False
    _commit(ledger, pod, pod.devices, settled)
    return True


def _take_assigned(
    ledger: _Ledger, pod: PodState, settled: dict[str, PodState], problems: list[Problem]
) -> None:
    if pod.gpu_share:
        devices = ledger.fullest_fit(pod.gpu_fraction)
    else:
        devices = ledger.lowest_whole(int(pod.requests[GPU]))
    if devices is None:
        problems.append(
            Problem(
                pod.ref(),
                "spec.nodeName",
                f"node {pod.node} has no free GPU device left for this pod (overcommitted)",
            )
        )
        devices = ()
    _commit(ledger, pod, devices, settled)


def _commit(
    ledger: _Ledger, pod: PodState, devices: Sequence[int], settled: dict[str, PodState]
) -> None:
    share = pod.gpu_share is not None
    ledger.take(devices, pod.gpu_fraction if share else 1.0, share)
    settled[pod.key] = pod.on_devices(tuple(devices), pod.gpu_fraction)
