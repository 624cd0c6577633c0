"""Pod shapes: what one pod needs from a node, laid out once per distinct pod.

Pods of one workload are alike, so placement reads each distinct
(requests, GPU share) once per cycle into a `PodShape`: the request vector in
the snapshot's column order (plus one `pods` slot when nodes cap their pod
count), the number of whole GPUs, and the GPU share as a fraction of a device
on every node (a memory share depends on the node's device memory). Shapes are
cached in the transaction's memo. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import POD_COUNT
from kai_ray.values.resources import GPU, Resources
from kai_ray.workloads.pod_fields import MIB, GpuShare

Vector = npt.NDArray[np.float64]
Indices = npt.NDArray[np.intp]


@dataclass(frozen=True)
class PodShape:
    """One distinct pod shape; `need` has whole GPUs only, shares are in `fraction`."""

    requests: Resources
    share: GpuShare | None
    need: Vector
    #: Columns the pod asks for something in (the only ones a fit checks, as kube-scheduler).
    columns: Indices
    whole_gpus: int
    #: Per node: the fraction of one device the share means there; inf where it cannot
    #: be known (a memory share on a node that does not publish its device memory).
    fraction: Vector

    @property
    def shares_gpu(self) -> bool:
        return self.share is not None

    def taken(self, node: int, gpu_column: int) -> Vector:
        """What the pod takes from `node`: its requests plus its share of a device."""
        if self.share is None:
            return self.need
        taken = self.need.copy()
        taken[gpu_column] += self.fraction[node]
        return taken

    def describe(self) -> str:
        """The pod's size as a person would say it: "8 GPUs", "0.5 of a GPU", "4 CPUs"."""
        if self.whole_gpus:
            return f"{self.whole_gpus} GPU{'s' if self.whole_gpus != 1 else ''}"
        if self.share is not None and self.share.fraction is not None:
            return f"{self.share.fraction:g} of a GPU"
        if self.share is not None and self.share.memory is not None:
            return f"{self.share.memory / MIB:g} MiB of GPU memory"
        cpu = self.requests["cpu"]
        return f"{cpu:g} CPU{'s' if cpu != 1 else ''}" if cpu else "no resources"


#: Per distinct (requests, GPU share): the shape.
SHAPE = MemoKey[PodShape]("pod shape")


@dataclass(frozen=True)
class NodeSet:
    """Candidate nodes for a set of pods, and how a message names them."""

    nodes: Indices
    #: "the cluster", "rack block-0/rack-3".
    where: str


def shape_of(tx: Transaction, pod: PodState) -> PodShape:
    """The pod's shape, built once per distinct (requests, share) in this transaction."""
    build = lambda: _build_shape(tx, pod.requests, pod.gpu_share)  # noqa: E731
    return tx.memo.get(SHAPE, (pod.requests, pod.gpu_share), build)


def _build_shape(tx: Transaction, requests: Resources, share: GpuShare | None) -> PodShape:
    snapshot = tx.snapshot
    need = snapshot.vector(requests)
    if POD_COUNT in snapshot.resource_names:
        need[snapshot.column(POD_COUNT)] += 1.0
    need.setflags(write=False)
    columns = np.flatnonzero(need > 0).astype(np.intp)
    fraction = _fractions(snapshot.gpu_memory_mib, share, len(snapshot.node_names))
    return PodShape(requests, share, need, columns, int(requests[GPU]), fraction)


def _fractions(device_mib: Vector, share: GpuShare | None, nodes: int) -> Vector:
    if share is None:
        fraction = np.zeros(nodes, dtype=np.float64)
    elif share.fraction is not None:
        fraction = np.full(nodes, share.fraction, dtype=np.float64)
    else:
        memory = share.memory or 0.0
        with np.errstate(divide="ignore"):
            fraction = np.where(device_mib > 0, memory / (device_mib * MIB), np.inf)
    fraction.setflags(write=False)
    return fraction
