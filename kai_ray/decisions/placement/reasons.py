"""Why a gang does not fit, said for a person.

A `Failure` is recorded where placement stops (a pod that fits no node of its
candidate set, or a plain sentence from the topology search) and rendered
only after the attempt has been rolled back, so the numbers describe the
cluster as the gang found it: "no node fits pod team-a/w-0: 3 nodes lack free
nvidia.com/gpu, 2 nodes are not ready, 1 node has taint gpu=broken:NoSchedule",
or, when each pod fits alone but not all together, "needs 8 pods with 8 GPUs
each; the cluster has room for 5". Each failure carries a `Code`, as
kube-scheduler's statuses do: `UNSCHEDULABLE` when the cluster has no room
now (or the gang's pods are not all made yet), `ERROR` when the gang asks for
something that does not exist (a topology or level it names), which no room
will mend. Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.filters import static_rejections
from kai_ray.decisions.placement.fit import UNBOUNDED, resource_rejections, room_on
from kai_ray.decisions.placement.shapes import NodeSet, PodShape, shape_of
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.pod_states import PodState

Indices = npt.NDArray[np.intp]


class Code(enum.Enum):
    """What came of placing a gang."""

    SUCCESS = "success"
    #: No room now; it may fit once room frees up (or its pods are made).
    UNSCHEDULABLE = "unschedulable"
    #: The gang asks for what does not exist; it cannot fit until it is fixed.
    ERROR = "error"


@dataclass(frozen=True)
class Failure:
    text: str = ""
    pod: PodState | None = None
    node_set: NodeSet | None = None
    #: Pods of the failing pod's kind the set needed.
    count: int = 0
    cause: Failure | None = None
    code: Code = Code.UNSCHEDULABLE

    def render(self, explain: Callable[[PodState, NodeSet, int], str]) -> str:
        if self.pod is not None and self.node_set is not None:
            return explain(self.pod, self.node_set, self.count)
        if self.cause is not None:
            return f"{self.text}: {self.cause.render(explain)}"
        return self.text


def pods_phrase(count: int, shape: PodShape) -> str:
    each = " each" if count != 1 else ""
    return f"{count} pod{'s' if count != 1 else ''} with {shape.describe()}{each}"


def explain_pod(
    tx: Transaction,
    pod: PodState,
    node_set: NodeSet,
    count: int,
    allowed: Indices,
    refused: Counter[str] | None = None,
) -> str:
    """Why `pod` found no node; `allowed` passed every filter but resources, and
    `refused` counts the nodes the inter-pod rules kept it off."""
    shape = shape_of(tx, pod)
    total = int(np.minimum(room_on(tx, shape, allowed), UNBOUNDED).sum())
    if total >= count:
        apart = ""
        if pod.pod_affinity is not None and pod.pod_affinity.required:
            apart = " (its pod affinity rules count the gang's pods placed before it)"
        return (
            f"needs {pods_phrase(count, shape)} beside the gang's other pods; "
            f"{node_set.where} has room for {total} of them before the others are placed"
            f"{apart}"
        )
    if total > 0:
        return f"needs {pods_phrase(count, shape)}; {node_set.where} has room for {total}"
    within = np.zeros(len(tx.snapshot.node_names), dtype=np.bool_)
    within[node_set.nodes] = True
    counts = static_rejections(tx, pod, within) + (refused or Counter())
    counts += resource_rejections(tx, shape, allowed)
    where = "" if node_set.where == "the cluster" else f" of {node_set.where}"
    return f"no node{where} fits pod {pod.key}: {_listing(counts)}"


def _listing(counts: Counter[str]) -> str:
    if not counts:
        return "there are no nodes"
    parts = []
    for reason, n in sorted(counts.items(), key=lambda item: -item[1]):
        plural, singular = reason.split("|")
        parts.append(f"{n} nodes {plural}" if n != 1 else f"1 node {singular}")
    return ", ".join(parts)
