"""Which workloads and pods of a live cluster are kai-ray's, and which gang a pod joins.

In the simulator every pod is created already naming its PodGroup. On a cluster
the workload controllers create pods that say only what their controller says
(KubeRay's `ray.io/cluster` and `ray.io/group`, the Job controller's
`batch.kubernetes.io/job-name`), so the operator reads a pod through
`with_membership`: the pod as it would be had kai-ray's admission webhook
annotated it (its PodGroup and subgroup written as the simulator writes them).
The pods of a RayJob's cluster join the RayJob's gang (`rayjob-<name>`), found
through the RayCluster's owner. Pure: no I/O; the caller hands in the lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kai_ray.values.names import (
    ADMISSION_GATE,
    POD_GROUP_ANNOTATION,
    QUEUE_LABEL,
    QUEUE_LABEL_ALIASES,
    SUBGROUP_LABEL,
    first_of,
)
from kai_ray.workloads.grouping import CONTROLLER_LABELS, pod_group_name, subgroup_name

Obj = Mapping[str, Any]
#: (namespace, RayCluster name) -> the name of the RayJob that owns it, if one does.
RayJobOf = Callable[[str, str], str | None]

RAY_CLUSTER_LABEL = "ray.io/cluster"
#: Beside a `kai-ray.io/pod-group` that kai-ray wrote from the controller's labels
#: (not the user): such a pod's gang is still the workload's, derived.
DERIVED_ANNOTATION = "kai-ray.io/pod-group-derived"


def owner_of_kind(obj: Obj, kinds: tuple[str, ...]) -> str | None:
    """The name of the object's controlling owner when it is one of `kinds`."""
    for owner in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(owner, Mapping) and owner.get("kind") in kinds:
            return str(owner.get("name") or "") or None
    return None


def with_membership(pod: Obj, rayjob_of: RayJobOf) -> Obj:
    """The pod with `kai-ray.io/pod-group` and `kai-ray.io/subgroup` written when it
    does not say them itself; the same object when it does (or nothing is known)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if pod_group_name_written(annotations):
        return pod
    group = pod_group_name(pod)
    cluster = labels.get(RAY_CLUSTER_LABEL)
    if cluster:
        owner = rayjob_of(str(meta.get("namespace") or "default"), str(cluster))
        group = f"rayjob-{owner}" if owner else group
    subgroup = subgroup_name(pod)
    new_labels = {**labels, SUBGROUP_LABEL: subgroup} if subgroup else dict(labels)
    new_meta = {
        **meta,
        "annotations": {**annotations, POD_GROUP_ANNOTATION: group, DERIVED_ANNOTATION: "true"},
        "labels": new_labels,
    }
    return {**pod, "metadata": new_meta}


def pod_group_name_written(annotations: Mapping[str, Any]) -> bool:
    return bool(annotations.get(POD_GROUP_ANNOTATION) or annotations.get("pod-group-name"))


def scheduler_names(obj: Obj) -> set[str]:
    """The `schedulerName` of every pod template of a workload (or of a pod)."""
    spec = obj.get("spec") or {}
    kind = obj.get("kind")
    templates: list[Any] = []
    if kind == "Pod":
        return {str(spec.get("schedulerName") or "default-scheduler")}
    if kind == "Job":
        templates = [spec.get("template")]
    elif kind in ("RayCluster", "RayJob"):
        cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec") or {}
        head = (cluster.get("headGroupSpec") or {}).get("template")
        workers = [w.get("template") for w in cluster.get("workerGroupSpecs") or () if w]
        templates = [head, *workers]
    return {
        str(((t or {}).get("spec") or {}).get("schedulerName") or "default-scheduler")
        for t in templates
        if isinstance(t, Mapping)
    }


def needs_derived_group(obj: Obj, scheduler_name: str) -> bool:
    """Whether kai-ray makes a PodGroup for this workload: its pods are kai-ray's,
    and no other workload's gang already covers them (a RayJob's cluster, a Job's
    pods, a pod that names its group). A Grove PodGang names no scheduler (its pods
    do): it is kai-ray's when it names a queue; its pods join its group only if
    they name kai-ray's scheduler. A workload being deleted gets none: the group
    would go with it, and a namespace being deleted refuses it."""
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False
    if obj.get("kind") == "PodGang":
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return bool(first_of(labels, QUEUE_LABEL, QUEUE_LABEL_ALIASES))
    if scheduler_name not in scheduler_names(obj):
        return False
    kind = obj.get("kind")
    if kind == "RayCluster":
        return owner_of_kind(obj, ("RayJob", "RayService")) is None
    if kind == "Pod":
        meta = obj.get("metadata") or {}
        owned = owner_of_kind(obj, ("Job", "RayCluster", "ReplicaSet", "StatefulSet", "PodClique"))
        labels = meta.get("labels") or {}
        from_controller = any(key in labels for key, _ in CONTROLLER_LABELS)
        annotations = meta.get("annotations") or {}
        chosen = pod_group_name_written(annotations) and DERIVED_ANNOTATION not in annotations
        return owned is None and not from_controller and not chosen
    return kind in ("Job", "RayJob")


def as_written(obj: Obj) -> Obj:
    """The workload as its author wrote it: a pod without the gang kai-ray derived."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if obj.get("kind") != "Pod" or DERIVED_ANNOTATION not in annotations:
        return obj
    kept = {
        k: v for k, v in annotations.items() if k not in (DERIVED_ANNOTATION, POD_GROUP_ANNOTATION)
    }
    return {**obj, "metadata": {**meta, "annotations": kept}}


#: (kind, namespace/name) -> the object the cache holds, if any.
Lookup = Callable[[str, str], Obj | None]
#: Workload kinds that make other workloads: KubeRay's RayJob makes its submitter Job.
QUEUE_GIVING_OWNERS = ("RayJob",)


def with_owner_queue(obj: Obj, lookup: Lookup) -> Obj:
    """A workload that names no queue, read with its owner's queue label when a
    workload that names one made it (KubeRay's submitter Job of a RayJob: KubeRay
    copies none of the RayJob's labels onto it). The same object otherwise."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if first_of(labels, QUEUE_LABEL, QUEUE_LABEL_ALIASES):
        return obj
    owner_name = owner_of_kind(obj, QUEUE_GIVING_OWNERS)
    if owner_name is None:
        return obj
    namespace = str(meta.get("namespace") or "default")
    for kind in QUEUE_GIVING_OWNERS:
        owner = lookup(kind, f"{namespace}/{owner_name}")
        owner_labels = ((owner or {}).get("metadata") or {}).get("labels") or {}
        queue = first_of(owner_labels, QUEUE_LABEL, QUEUE_LABEL_ALIASES)
        if queue:
            return {**obj, "metadata": {**meta, "labels": {**labels, QUEUE_LABEL: queue}}}
    return obj


def admission_changes(pod: Obj, scheduler_name: str, rayjob_of: RayJobOf) -> dict[str, Any]:
    """What the admission webhook writes on a new pod of kai-ray: the gate that holds
    it until its gang is admitted, and its gang's name when the pod can be named
    now (a pod with only a generateName and no controller labels is named later).
    Empty for pods of other schedulers."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != scheduler_name:
        return {}
    gates = [g for g in spec.get("schedulingGates") or () if isinstance(g, Mapping)]
    changes: dict[str, Any] = {}
    if not any(g.get("name") == ADMISSION_GATE for g in gates):
        changes["schedulingGates"] = [*gates, {"name": ADMISSION_GATE}]
    meta = pod.get("metadata") or {}
    named_by_controller = any(
        key in (meta.get("labels") or {}) for key in (RAY_CLUSTER_LABEL, "job-name")
    )
    if not pod_group_name_written(meta.get("annotations") or {}) and (
        meta.get("name") or named_by_controller
    ):
        member = with_membership(pod, rayjob_of)
        changes["annotations"] = dict((member.get("metadata") or {}).get("annotations") or {})
        changes["labels"] = dict((member.get("metadata") or {}).get("labels") or {})
    return changes


def holds_with_suspend(obj: Obj, scheduler_name: str) -> bool:
    """Whether admission creates this RayCluster or RayJob suspended: its pods are
    kai-ray's and it names a queue. A RayJob only with `shutdownAfterJobFinishes`
    (KubeRay refuses to suspend one without it) and its own cluster spec."""
    kind = obj.get("kind")
    if kind not in ("RayCluster", "RayJob") or not needs_derived_group(obj, scheduler_name):
        return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if not first_of(labels, QUEUE_LABEL, QUEUE_LABEL_ALIASES):
        return False
    spec = obj.get("spec") or {}
    if kind == "RayJob":
        return spec.get("shutdownAfterJobFinishes") is True and not spec.get("clusterSelector")
    return True
