"""Which gang a workload is, and which gang a pod belongs to (issue 2, item 6).

`derive_groups` turns a workload (KubeRay RayCluster or RayJob, batch Job,
Grove PodCliqueSet or PodGang, bare Pod) into the PodGroups kai-ray schedules
it as; `pod_group_name` and `subgroup_name` tell which of them a pod joins.
Pods that carry `kai-ray.io/pod-group` join that PodGroup and are never derived.

PodGroup names carry the workload kind so that they cannot collide across kinds:
`raycluster-<name>`, `rayjob-<name>`, `job-<name>`, `pod-<name>`, and for Grove
`podgang-<PodGang name>` (a PodCliqueSet's groups are its PodGangs,
`podgang-<pcs>-<replica>`; see `kai_ray.workloads.grove`). Each lives in the
workload's namespace and is labelled with the queue and the workload kind.
Pure: no I/O; it must not create pods or talk to the API server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import (
    POD_GROUP_ANNOTATION,
    POD_GROUP_ANNOTATION_ALIASES,
    SUBGROUP_LABEL,
    first_of,
)
from kai_ray.values.validation import NO_NAME, object_ref
from kai_ray.workloads import batch, grove, kuberay
from kai_ray.workloads.workload_group import WORKLOAD_KIND_LABEL, WorkloadGroup

__all__ = [
    "WORKLOAD_KIND_LABEL",
    "WorkloadGroup",
    "derive_group",
    "derive_groups",
    "pod_group_name",
    "subgroup_name",
]

Derive = Callable[[Mapping[str, Any], str | None], list[WorkloadGroup]]


def _single(derive: Callable[[Mapping[str, Any], str | None], WorkloadGroup]) -> Derive:
    return lambda obj, source: [derive(obj, source)]


#: Every workload kind kai-ray groups, by (apiVersion, kind).
DERIVERS: dict[tuple[str, str], Derive] = {
    (kuberay.API_VERSION, "RayCluster"): _single(kuberay.raycluster_group),
    (kuberay.API_VERSION, "RayJob"): _single(kuberay.rayjob_group),
    ("batch/v1", "Job"): _single(batch.job_group),
    ("v1", "Pod"): _single(batch.pod_group),
    (grove.API_VERSION, "PodCliqueSet"): grove.podcliqueset_groups,
    (grove.SCHEDULER_API_VERSION, "PodGang"): _single(grove.podgang_group),
}

#: Labels workload controllers put on the pods they create, and the group prefix each means.
#: Pods of a RayJob's cluster carry only the cluster's generated name, so whoever
#: creates or admits them (the simulator, the operator's webhook) must annotate
#: them with `kai-ray.io/pod-group: rayjob-<name>`.
CONTROLLER_LABELS: tuple[tuple[str, str], ...] = (
    ("ray.io/cluster", "raycluster-"),
    ("batch.kubernetes.io/job-name", "job-"),
    ("job-name", "job-"),
    ("grove.io/podgang", "podgang-"),
)
#: Labels that name a pod's subgroup when kai-ray has not written one.
CONTROLLER_SUBGROUP_LABELS = ("ray.io/group", "grove.io/podclique")


def derive_groups(obj: Mapping[str, Any], source: str | None = None) -> list[WorkloadGroup]:
    """Every gang a workload makes: one for most kinds, one per PodGang for a PodCliqueSet.

    Raises InvalidObjectError naming each malformed field, or the kind if kai-ray
    does not know it. `source` (a file name) is carried into the problems.
    """
    key = (obj.get("apiVersion"), obj.get("kind"))
    derive = DERIVERS.get(key)  # type: ignore[arg-type]
    if derive is None:
        raise InvalidObjectError([_unknown_kind(obj, source)])
    if key == ("v1", "Pod") and _explicit_group(_string_map(obj, "annotations")):
        raise ValueError("a pod that names its PodGroup joins it; it is not derived")
    return derive(obj, source)


def derive_group(obj: Mapping[str, Any], source: str | None = None) -> WorkloadGroup:
    """The one gang of a workload; use `derive_groups` for a PodCliqueSet with several."""
    groups = derive_groups(obj, source)
    if len(groups) != 1:
        raise ValueError(f"{obj.get('kind')} makes {len(groups)} gangs; use derive_groups")
    return groups[0]


def pod_group_name(pod: Mapping[str, Any]) -> str:
    """The PodGroup a pod belongs to.

    First the pod's own `kai-ray.io/pod-group` annotation (or KAI's
    `pod-group-name`); else the labels KubeRay, the Job controller or Grove put
    on the pods they create; else the pod is a gang of its own.
    """
    explicit = _explicit_group(_string_map(pod, "annotations"))
    if explicit:
        return explicit
    labels = _string_map(pod, "labels")
    for label, prefix in CONTROLLER_LABELS:
        if labels.get(label):
            return prefix + labels[label]
    return f"pod-{_pod_name(pod)}"


def subgroup_name(pod: Mapping[str, Any]) -> str | None:
    """The subgroup a pod belongs to: kai-ray's label, else the controller's, else None.

    A pod that names its PodGroup explicitly takes its subgroup only from
    `kai-ray.io/subgroup`: controller labels name subgroups of derived groups.
    """
    labels = _string_map(pod, "labels")
    if labels.get(SUBGROUP_LABEL):
        return labels[SUBGROUP_LABEL]
    if _explicit_group(_string_map(pod, "annotations")):
        return None
    return next((labels[key] for key in CONTROLLER_SUBGROUP_LABELS if labels.get(key)), None)


def _explicit_group(annotations: Mapping[str, str]) -> str | None:
    return first_of(annotations, POD_GROUP_ANNOTATION, POD_GROUP_ANNOTATION_ALIASES) or None


def _string_map(obj: Mapping[str, Any], key: str) -> dict[str, str]:
    metadata = obj.get("metadata")
    values = metadata.get(key) if isinstance(metadata, Mapping) else None
    if not isinstance(values, Mapping):
        return {}
    return {str(k): v for k, v in values.items() if isinstance(v, str)}


def _pod_name(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if isinstance(name, str) and name:
        return name
    raise InvalidObjectError([Problem(ObjectRef("Pod", NO_NAME), "metadata.name", "missing")])


def _unknown_kind(obj: Mapping[str, Any], source: str | None) -> Problem:
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    ref = object_ref(obj, source)
    known = ", ".join(f"{a} {k}" for a, k in DERIVERS)
    return Problem(ref, "kind", f"{api_version} {kind} is not a workload kai-ray groups ({known})")
