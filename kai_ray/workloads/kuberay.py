"""KubeRay `ray.io/v1` RayCluster and RayJob as gangs (docs/architecture.md section 3).

The gang is the head plus, for each worker group, `minReplicas` (or `replicas`
when the minimum is 0) times `numOfHosts` pods; worker groups become subgroups
named by `groupName`, the head the subgroup `headgroup` (the `ray.io/group`
value KubeRay gives the head pod). Replicas above the minimum, up to
`replicas` and never above `maxReplicas`, are elastic. Field names and defaults
follow the KubeRay v1.5.0 CRD. Pure: no I/O; it must not create pods (the
simulator does that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.workloads.fields import EMPTY, FieldReader, child
from kai_ray.workloads.workload_group import Member, WorkloadGroup, WorkloadHeader

API_VERSION = "ray.io/v1"
HEAD_GROUP = "headgroup"
PRIORITY_CLASS_LABEL = "ray.io/priority-class-name"
#: The CRD's default for maxReplicas: the largest int32, that is "no maximum".
MAX_REPLICAS = 2**31 - 1


@dataclass(frozen=True)
class WorkerGroup:
    """The sizes of one worker group, in replicas; each replica is `hosts` pods."""

    path: str
    name: str
    gang_replicas: int
    total_replicas: int
    hosts: int

    def member(self) -> Member:
        return Member(self.name, self.gang_replicas * self.hosts, self.total_replicas * self.hosts)


def raycluster_group(obj: Mapping[str, Any], source: str | None) -> WorkloadGroup:
    header = WorkloadHeader(obj, "RayCluster", source)
    spec = header.reader.section(obj, "spec", "", required=True)
    return _cluster_group(header, spec, "spec", f"raycluster-{header.name}")


def rayjob_group(obj: Mapping[str, Any], source: str | None) -> WorkloadGroup:
    """A RayJob is the gang of the RayCluster it creates from `spec.rayClusterSpec`.

    The submitter pod of K8sJobMode is not a member: KubeRay creates it only
    once the cluster is ready, so a gang that waited for it would never start
    (the reason KubeRay refuses K8sJobMode RayJobs under KAI).
    """
    header = WorkloadHeader(obj, "RayJob", source)
    spec = header.reader.section(obj, "spec", "", required=True)
    # Not used, only checked: the API server refuses these fields' other types too.
    header.reader.text(spec, "entrypoint", "spec")
    header.reader.flag(spec, "shutdownAfterJobFinishes", "spec")
    if spec and spec.get("rayClusterSpec") is None:
        header.reader.problem("spec.rayClusterSpec", _missing_cluster_spec(spec))
    cluster_spec = header.reader.section(spec, "rayClusterSpec", "spec")
    return _cluster_group(header, cluster_spec, "spec.rayClusterSpec", f"rayjob-{header.name}")


def _missing_cluster_spec(spec: Mapping[str, Any]) -> str:
    if spec.get("clusterSelector"):
        return (
            "missing: with spec.clusterSelector the RayJob runs on an existing cluster and "
            "creates no pods of its own to schedule as a gang; give it a rayClusterSpec"
        )
    return "missing"


def _cluster_group(
    header: WorkloadHeader, spec: Mapping[str, Any], path: str, group_name: str
) -> WorkloadGroup:
    head_template = _head_template(header.reader, spec, path)
    workers = worker_groups(header.reader, spec, path)
    members = [Member(HEAD_GROUP, 1, 1), *(w.member() for w in workers)]
    header.check_unique([(child(w.path, "groupName"), w.name) for w in workers])
    head_spec = head_template.get("spec")
    return header.build(
        group_name,
        header.queue(_labels(head_template)),
        members,
        priority=header.labels.get(PRIORITY_CLASS_LABEL) or _text(head_spec, "priorityClassName"),
        topology=header.topology(),
        suspendable=True,
    )


def _head_template(reader: FieldReader, spec: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """The head's pod template, checked; empty when the cluster spec itself is missing."""
    if spec is EMPTY:
        return EMPTY
    head = reader.section(spec, "headGroupSpec", path, required=True)
    if head is EMPTY:
        return EMPTY
    return _group_template(reader, head, child(path, "headGroupSpec"))


def _group_template(reader: FieldReader, group: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    """A head or worker group's pod template, checked; `rayStartParams` a map, as in the CRD."""
    reader.section(group, "rayStartParams", path)
    template = reader.section(group, "template", path, required=True)
    if template is not EMPTY:
        reader.pod_spec(template, child(path, "template"))
    return template


def worker_groups(reader: FieldReader, spec: Mapping[str, Any], path: str) -> list[WorkerGroup]:
    """The worker groups of a RayCluster spec, in order, with their sizes."""
    return [
        _worker_group(reader, group, at)
        for at, group in reader.entries(spec, "workerGroupSpecs", path)
    ]


def _worker_group(reader: FieldReader, group: Mapping[str, Any], path: str) -> WorkerGroup:
    name = _group_name(reader, group, path)
    replicas = reader.count(group, "replicas", path, default=0)
    minimum = reader.count(group, "minReplicas", path, default=0)
    maximum = reader.count(group, "maxReplicas", path, default=MAX_REPLICAS)
    hosts = reader.count(group, "numOfHosts", path, default=1, minimum=1)
    _group_template(reader, group, path)
    if minimum > maximum:
        reader.problem(child(path, "minReplicas"), f"{minimum} is above maxReplicas {maximum}")
    desired = min(replicas, maximum)
    gang = minimum if minimum > 0 else desired
    return WorkerGroup(path, name, gang, max(gang, desired), hosts)


def _group_name(reader: FieldReader, group: Mapping[str, Any], path: str) -> str:
    name = reader.text(group, "groupName", path, required=True) or f"<{path}>"
    if name == HEAD_GROUP:
        reader.problem(child(path, "groupName"), f"{HEAD_GROUP!r} names the head's subgroup")
    return name


def _labels(template: Mapping[str, Any]) -> dict[str, str]:
    metadata = template.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): v for k, v in labels.items() if isinstance(v, str)}


def _text(values: Any, key: str) -> str | None:
    value = values.get(key) if isinstance(values, Mapping) else None
    return value if isinstance(value, str) and value else None
