"""Label and annotation keys kai-ray reads and writes, in one place.

Keys have a kai-ray name and, where KAI users already write another, an alias
that is accepted on input (never written).
"""

from __future__ import annotations

from collections.abc import Mapping

SCHEDULER_NAME = "kai-ray"

QUEUE_LABEL = "kai-ray.io/queue"
QUEUE_LABEL_ALIASES = ("kai.scheduler/queue",)

POD_GROUP_ANNOTATION = "kai-ray.io/pod-group"
POD_GROUP_ANNOTATION_ALIASES = ("pod-group-name",)

MIN_MEMBER_ANNOTATION = "kai-ray.io/min-member"
TOPOLOGY_ANNOTATION = "kai-ray.io/topology"
TOPOLOGY_REQUIRED_ANNOTATION = "kai-ray.io/topology-required"
TOPOLOGY_PREFERRED_ANNOTATION = "kai-ray.io/topology-preferred"
#: On a workload: its derived PodGroup's `spec.placementStrategy` (binpack or spread).
PLACEMENT_STRATEGY_ANNOTATION = "kai-ray.io/placement-strategy"
GPU_FRACTION_ANNOTATION = "kai-ray.io/gpu-fraction"
#: KAI's key; the same meaning (a share of one device), so KubeRay's KAI samples run as written.
GPU_FRACTION_ANNOTATION_ALIASES = ("gpu-fraction",)
GPU_MEMORY_ANNOTATION = "kai-ray.io/gpu-memory"
#: Written by the binder: the device indices a pod was given, "0" or "0,1".
GPU_DEVICES_ANNOTATION = "kai-ray.io/gpu-devices"
#: Written on every pod kai-ray derives a group for: which subgroup it belongs to.
SUBGROUP_LABEL = "kai-ray.io/subgroup"
PRIORITY_CLASS_LABEL = "priorityClassName"

ADMISSION_GATE = "kai-ray.io/admission"
#: On the pods the operator pictures for a suspended workload (never written to a cluster).
PLACEHOLDER_ANNOTATION = "kai-ray.io/placeholder"
#: Written with the release of a suspended workload (RayCluster, RayJob): the nodes its
#: gang was placed on when admitted, one per pod, comma-separated. The operator holds
#: that room until the workload's controller has made the pods (or a minute passes).
ADMITTED_NODES_ANNOTATION = "kai-ray.io/admitted-nodes"

SIM_SUBMIT_AT = "sim.kai-ray.io/submit-at"
SIM_DURATION = "sim.kai-ray.io/duration"
#: How long an evicted pod of the workload takes to go (its termination grace period).
SIM_TERMINATION_GRACE = "sim.kai-ray.io/termination-grace"


def first_of(values: Mapping[str, str], key: str, aliases: tuple[str, ...] = ()) -> str | None:
    """The value under `key`, else under the first alias present, else None."""
    for candidate in (key, *aliases):
        if candidate in values:
            return values[candidate]
    return None
