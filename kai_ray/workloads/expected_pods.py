"""The pods a workload's controller creates: the simulator's stand-ins for the
workload controllers, and the operator's picture of a suspended workload's gang.

Given a workload and one of the groups `kai_ray.workloads.grouping` derived
from it, `pods_for_workload` returns the Pods the Job controller, KubeRay or
Grove would create for that group, named and labelled as they name and label
them, with the API server's defaulting (requests default to limits) applied:

- KubeRay (v1.5.0 names, v1.7.0's default multi-host labels): head
  `<cluster>-head-<suffix>`, workers `<cluster>-<group>-worker-<suffix>`. A
  RayJob's cluster, whose name KubeRay draws at random, is `<rayjob>-raycluster`.
- Job controller: `<job>-<suffix>`, or `<job>-<index>-<suffix>` when Indexed.
- Grove: `<podclique>-<suffix>`, the PodClique named `<pcs>-<replica>-<clique>`.

Where a controller draws a random suffix, this draws a deterministic one from
the owner and the pod's index: same input, same pods. Every pod is annotated
with its PodGroup and labelled with its queue and subgroup; pods come in the
order a gang needs them, the minimum members first, then the elastic ones.
Pure: no I/O; it must not decide anything about scheduling.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kai_ray.values.names import POD_GROUP_ANNOTATION, QUEUE_LABEL, SCHEDULER_NAME, SUBGROUP_LABEL
from kai_ray.workloads import grove, kuberay
from kai_ray.workloads.fields import FieldReader
from kai_ray.workloads.grouping import WorkloadGroup

Pod = dict[str, Any]
#: The characters Kubernetes draws generateName suffixes from (no vowels, no 0/1/3).
SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
#: Pod spec fields the controllers copy from a template, besides the containers.
COPIED_SPEC_FIELDS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "priority",
    "overhead",
    "schedulingGates",
    "resourceClaims",
)
RAY_NODE_TYPE_LABEL = "ray.io/node-type"


def pods_for_workload(obj: Mapping[str, Any], group: WorkloadGroup) -> list[dict[str, Any]]:
    """The pods a workload's controller creates for one of its groups, minimum first.

    A PodGang yields none: Grove creates its pods from a PodCliqueSet's cliques.
    """
    make = CONTROLLERS.get(group.workload.kind)
    if make is None:
        raise ValueError(f"no controller creates pods for {group.workload.kind}")
    return [_stamp(pod, group) for pod in make(obj, group)]


def _stamp(pod: Pod, group: WorkloadGroup) -> Pod:
    pod["metadata"].setdefault("annotations", {})[POD_GROUP_ANNOTATION] = group.name
    pod["metadata"].setdefault("labels", {})[QUEUE_LABEL] = group.pod_group.spec.queue
    return pod


# ---------------------------------------------------------------- pod building


def suffix(*parts: object) -> str:
    """A five-character generateName suffix, the same for the same parts."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return "".join(SUFFIX_ALPHABET[b % len(SUFFIX_ALPHABET)] for b in digest[:5])


def object_uid(kind: str, namespace: str, name: str, metadata: Mapping[str, Any]) -> str:
    """The object's uid if it has one, else one derived from its identity."""
    uid = metadata.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kai-ray-sim/{kind}/{namespace}/{name}"))


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def make_pod(
    name: str,
    namespace: str,
    template: Mapping[str, Any],
    labels: Mapping[str, str],
    owner: dict[str, Any],
    subgroup: str | None = None,
) -> Pod:
    """A Pending pod from a pod template (`metadata` and `spec`), as its controller makes it."""
    metadata = _mapping(template.get("metadata"))
    annotations = dict(_mapping(metadata.get("annotations")))
    all_labels = dict(labels) | ({SUBGROUP_LABEL: subgroup} if subgroup else {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": all_labels,
            "annotations": annotations,
            "ownerReferences": [owner],
        },
        "spec": pod_spec(_mapping(template.get("spec"))),
        "status": {"phase": "Pending"},
    }


def pod_spec(template_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a new pod: the template's containers, placement fields and scheduler."""
    spec: dict[str, Any] = {
        "schedulerName": template_spec.get("schedulerName") or SCHEDULER_NAME,
        "containers": [container(c) for c in template_spec.get("containers") or ()],
    }
    if template_spec.get("initContainers"):
        spec["initContainers"] = [container(c) for c in template_spec["initContainers"]]
    for key in COPIED_SPEC_FIELDS:
        if template_spec.get(key) is not None:
            spec[key] = copy.deepcopy(template_spec[key])
    return spec


def container(template: Mapping[str, Any]) -> dict[str, Any]:
    """A container's name, image, restart policy and resources; requests default to limits."""
    resources = _mapping(template.get("resources"))
    limits = dict(_mapping(resources.get("limits")))
    requests = limits | dict(_mapping(resources.get("requests")))
    made: dict[str, Any] = {"name": template.get("name"), "resources": {"requests": requests}}
    if limits:
        made["resources"]["limits"] = limits
    for key in ("image", "restartPolicy"):
        if template.get(key) is not None:
            made[key] = template[key]
    return made


def _mapping(value: Any) -> Mapping[str, Any]:
    # A plain dict first: every parsed document is made of them, and the check against
    # the abstract Mapping costs a walk of its registry (loading 80,000 jobs asks ~3M times).
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def _identity(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    metadata = _mapping(obj.get("metadata"))
    return str(metadata.get("name")), str(metadata.get("namespace") or "default"), metadata


# -------------------------------------------------------------------- KubeRay


def _raycluster_pods(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    name, namespace, metadata = _identity(obj)
    uid = object_uid("RayCluster", namespace, name, metadata)
    owner = owner_reference(kuberay.API_VERSION, "RayCluster", name, uid)
    return _ray_pods(_mapping(obj.get("spec")), name, namespace, owner, group)


def _rayjob_pods(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    name, namespace, _ = _identity(obj)
    cluster = f"{name}-raycluster"
    uid = object_uid("RayCluster", namespace, cluster, {})
    owner = owner_reference(kuberay.API_VERSION, "RayCluster", cluster, uid)
    spec = _mapping(_mapping(obj.get("spec")).get("rayClusterSpec"))
    return _ray_pods(spec, cluster, namespace, owner, group)


def _ray_pods(
    spec: Mapping[str, Any],
    cluster: str,
    namespace: str,
    owner: dict[str, Any],
    group: WorkloadGroup,
) -> list[Pod]:
    """The head, then each group's gang replicas, then each group's elastic replicas."""
    head = _mapping(spec.get("headGroupSpec"))
    template = _mapping(head.get("template"))
    labels = _ray_labels(cluster, "head", kuberay.HEAD_GROUP, template, head)
    name = f"{_ray_prefix(cluster, 'head')}{suffix(cluster, 'head')}"
    pods = [make_pod(name, namespace, template, labels, owner, kuberay.HEAD_GROUP)]
    specs = [s for s in spec.get("workerGroupSpecs") or () if isinstance(s, Mapping)]
    sizes = kuberay.worker_groups(FieldReader(group.workload), spec, "spec")
    workers = list(zip(sizes, specs, strict=True))
    gang = [(w, s, r) for w, s in workers for r in range(w.gang_replicas)]
    elastic = [(w, s, r) for w, s in workers for r in range(w.gang_replicas, w.total_replicas)]
    for worker, worker_spec, replica in gang + elastic:
        pods += _ray_replica(worker, worker_spec, replica, cluster, namespace, owner)
    return pods


def _ray_replica(
    worker: kuberay.WorkerGroup,
    spec: Mapping[str, Any],
    replica: int,
    cluster: str,
    namespace: str,
    owner: dict[str, Any],
) -> list[Pod]:
    """The `numOfHosts` pods of one worker replica, with KubeRay's multi-host labels."""
    template = _mapping(spec.get("template"))
    replica_name = f"{worker.name}-{suffix(cluster, worker.name, replica)}"
    prefix = _ray_prefix(f"{cluster}-{worker.name}", "worker")
    pods = []
    for host in range(worker.hosts):
        labels = _ray_labels(cluster, "worker", worker.name, template, spec)
        labels["ray.io/worker-group-replica-index"] = str(replica)
        if worker.hosts > 1:
            labels["ray.io/worker-group-replica-name"] = replica_name
            labels["ray.io/replica-host-index"] = str(host)
        name = prefix + suffix(cluster, worker.name, replica, host)
        pods.append(make_pod(name, namespace, template, labels, owner, worker.name))
    return pods


def _ray_prefix(prefix: str, node_type: str) -> str:
    """KubeRay's generateName: at most 50 characters of prefix, the node type, lower case."""
    return f"{prefix[:50]}-{node_type}-".lower()


def _ray_labels(
    cluster: str,
    node_type: str,
    group_name: str,
    template: Mapping[str, Any],
    group_spec: Mapping[str, Any],
) -> dict[str, str]:
    """The template's and the group's labels under KubeRay's own, which they cannot override."""
    merged = dict(_mapping(_mapping(template.get("metadata")).get("labels")))
    merged |= dict(_mapping(group_spec.get("labels")))
    fixed = {"ray.io/cluster", RAY_NODE_TYPE_LABEL, "ray.io/group"}
    return {
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": f"{cluster}-{node_type}"[:63],
        "app.kubernetes.io/name": "kuberay",
        "app.kubernetes.io/created-by": "kuberay-operator",
        **{k: v for k, v in merged.items() if k not in fixed},
        "ray.io/cluster": cluster,
        RAY_NODE_TYPE_LABEL: node_type,
        "ray.io/group": group_name,
    }


# ------------------------------------------------------------------ batch Job


def _job_pods(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    name, namespace, metadata = _identity(obj)
    uid = object_uid("Job", namespace, name, metadata)
    spec = _mapping(obj.get("spec"))
    template = _mapping(spec.get("template"))
    indexed = spec.get("completionMode") == "Indexed"
    owner = owner_reference("batch/v1", "Job", name, uid)
    return [
        _job_pod(name, namespace, uid, template, owner, i, indexed)
        for i in range(group.max_members)
    ]


def _job_pod(
    job: str,
    namespace: str,
    uid: str,
    template: Mapping[str, Any],
    owner: dict[str, Any],
    index: int,
    indexed: bool,
) -> Pod:
    labels = dict(_mapping(_mapping(template.get("metadata")).get("labels")))
    labels |= {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": job,
        "controller-uid": uid,
        "job-name": job,
    }
    name = f"{job}-{index}-{suffix(job, index)}" if indexed else f"{job}-{suffix(job, index)}"
    pod = make_pod(name, namespace, template, labels, owner)
    if indexed:
        pod["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] = str(index)
        pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = str(index)
    return pod


# ----------------------------------------------------------------------- Grove


def _podcliqueset_pods(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    """The pods of one PodGang: each clique's `minAvailable` first, then the rest."""
    gang = group.name.removeprefix("podgang-")
    cliques = [c for c in grove.pod_cliques(obj, group.workload.source) if c.gang == gang]
    template = _mapping(_mapping(obj.get("spec")).get("template"))
    priority = template.get("priorityClassName")
    order = [(c, i) for c in cliques for i in range(c.template.min_available)]
    order += [(c, i) for c in cliques for i in range(c.template.min_available, c.template.replicas)]
    return [_grove_pod(obj, clique, index, priority) for clique, index in order]


def _grove_pod(
    obj: Mapping[str, Any], clique: grove.PodCliqueInstance, index: int, priority: Any
) -> Pod:
    pcs, namespace, _ = _identity(obj)
    entry = clique.template.entry
    spec = dict(_mapping(_mapping(entry.get("spec")).get("podSpec")))
    if priority and not spec.get("priorityClassName"):
        spec["priorityClassName"] = priority
    template = {"metadata": {"annotations": entry.get("annotations")}, "spec": spec}
    uid = object_uid("PodClique", namespace, clique.name, {})
    owner = owner_reference(grove.API_VERSION, "PodClique", clique.name, uid)
    name = f"{clique.name}-{suffix(clique.name, index)}"
    labels = _grove_labels(pcs, clique, index)
    return make_pod(name, namespace, template, labels, owner, clique.name)


def _grove_labels(pcs: str, clique: grove.PodCliqueInstance, index: int) -> dict[str, str]:
    """The clique template's labels under Grove's PodClique and pod labels."""
    labels = {str(k): str(v) for k, v in _mapping(clique.template.entry.get("labels")).items()}
    labels |= {
        "app.kubernetes.io/managed-by": "grove-operator",
        "app.kubernetes.io/part-of": pcs,
        "app.kubernetes.io/name": clique.name,
        "app.kubernetes.io/component": "pcsg-podclique"
        if clique.scaling_group
        else "pcs-podclique",
        "grove.io/podclique": clique.name,
        "grove.io/podcliqueset-replica-index": str(clique.pcs_replica),
        "grove.io/podgang": clique.gang,
        "grove.io/podclique-pod-index": str(index),
    }
    labels |= dict(_scaling_group_labels(clique))
    return labels


def _scaling_group_labels(clique: grove.PodCliqueInstance) -> Iterator[tuple[str, str]]:
    if clique.scaling_group is not None:
        yield "grove.io/podcliquescalinggroup", clique.scaling_group
        yield "grove.io/podcliquescalinggroup-replica-index", str(clique.scaling_group_replica)
    if clique.base_gang is not None:
        yield "grove.io/base-podgang", clique.base_gang


# ------------------------------------------------------------------- bare pods


def _bare_pod(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    """A bare pod is its own controller's output: itself, Pending, in the kai-ray scheduler."""
    pod: Pod = copy.deepcopy(dict(obj))
    metadata = pod["metadata"] = dict(pod.get("metadata") or {})
    metadata.setdefault("namespace", "default")
    metadata["labels"] = dict(metadata.get("labels") or {})
    metadata["annotations"] = dict(metadata.get("annotations") or {})
    pod["spec"] = dict(pod.get("spec") or {})
    pod["spec"].setdefault("schedulerName", SCHEDULER_NAME)
    pod["status"] = {"phase": "Pending"}
    return [pod]


def _no_pods(obj: Mapping[str, Any], group: WorkloadGroup) -> list[Pod]:
    return []


CONTROLLERS: dict[str, Callable[[Mapping[str, Any], WorkloadGroup], list[Pod]]] = {
    "RayCluster": _raycluster_pods,
    "RayJob": _rayjob_pods,
    "Job": _job_pods,
    "PodCliqueSet": _podcliqueset_pods,
    "PodGang": _no_pods,
    "Pod": _bare_pod,
}
