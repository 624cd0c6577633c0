"""Workloads and queues as a user writes them, for the e2e tests.

Pods, Jobs, Queues, PodGroups and Topologies come from the fluent builders of
tests/builders.py; this module adds what a real API server needs on top (an
image on every container, the test's nodeSelector) and KubeRay's RayCluster and
RayJob. Nothing pulls images under kwok, but the API server requires the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kai_ray.values.names import (
    GPU_FRACTION_ANNOTATION,
    MIN_MEMBER_ANNOTATION,
    QUEUE_LABEL,
    QUEUE_LABEL_ALIASES,
    SCHEDULER_NAME,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
)
from tests.builders import make_job, make_pod, make_queue, make_topology

from .nodes import BLOCK_LABEL, GPU, HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL

IMAGE = "example.invalid/ray:2.40.0"
RAY_VERSION = "2.40.0"
#: The queue label KubeRay's KAI integration and KAI manifests write.
KAI_QUEUE_LABEL = QUEUE_LABEL_ALIASES[0]


@dataclass(frozen=True)
class Workers:
    """One worker group of a RayCluster: `replicas` pods (at least `min_replicas`)."""

    name: str
    replicas: int
    gpus: int = 0
    min_replicas: int | None = None

    def spec(self, scheduler: str, selector: dict[str, str]) -> dict[str, Any]:
        minimum = self.replicas if self.min_replicas is None else self.min_replicas
        return {
            "groupName": self.name,
            "replicas": self.replicas,
            "minReplicas": minimum,
            "maxReplicas": max(self.replicas, minimum),
            "rayStartParams": {},
            "template": _template("ray-worker", scheduler, selector, self.gpus),
        }


def _template(
    container: str, scheduler: str, selector: dict[str, str], gpus: int
) -> dict[str, Any]:
    main: dict[str, Any] = {"name": container, "image": IMAGE}
    if gpus:
        main["resources"] = {"limits": {GPU: str(gpus)}}
    spec = {"schedulerName": scheduler, "nodeSelector": dict(selector), "containers": [main]}
    return {"spec": spec}


def ray_cluster_spec(
    workers: list[Workers], selector: dict[str, str], scheduler: str = SCHEDULER_NAME
) -> dict[str, Any]:
    return {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {
            "rayStartParams": {},
            "template": _template("ray-head", scheduler, selector, 0),
        },
        "workerGroupSpecs": [w.spec(scheduler, selector) for w in workers],
    }


def _metadata(
    name: str, queue: str | None, queue_label: str, annotations: dict[str, str] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if queue is not None:
        meta["labels"] = {queue_label: queue}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def ray_cluster(
    name: str,
    queue: str | None,
    workers: list[Workers],
    selector: dict[str, str],
    *,
    queue_label: str = QUEUE_LABEL,
    annotations: dict[str, str] | None = None,
    scheduler: str = SCHEDULER_NAME,
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _metadata(name, queue, queue_label, annotations),
        "spec": ray_cluster_spec(workers, selector, scheduler),
    }


def ray_job(
    name: str,
    queue: str | None,
    workers: list[Workers],
    selector: dict[str, str],
    *,
    queue_label: str = QUEUE_LABEL,
    annotations: dict[str, str] | None = None,
    scheduler: str = SCHEDULER_NAME,
    **spec: Any,
) -> dict[str, Any]:
    """A RayJob in KubeRay's default K8sJobMode (the submitter Job comes once the
    cluster is ready); `spec` adds fields such as `suspend`."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(name, queue, queue_label, annotations),
        "spec": {
            "entrypoint": "python -c 'import ray; ray.init()'",
            "rayClusterSpec": ray_cluster_spec(workers, selector, scheduler),
            **spec,
        },
    }


def pod(
    name: str,
    queue: str | None,
    selector: dict[str, str],
    *,
    gpus: int = 0,
    fraction: str | None = None,
    group: str | None = None,
) -> dict[str, Any]:
    """A plain pod of kai-ray: whole GPUs, a GPU fraction, or none."""
    builder = (
        make_pod(name)
        .set("spec.containers[0].image", IMAGE)
        .set("spec.nodeSelector", dict(selector))
    )
    if queue is not None:
        builder.label(QUEUE_LABEL, queue)
    if gpus:
        builder.gpus(str(gpus))
    if fraction is not None:
        builder.annotate(GPU_FRACTION_ANNOTATION, fraction)
    if group is not None:
        builder.group(group)
    obj = builder.build()
    del obj["status"]
    return obj


def job(
    name: str, queue: str, selector: dict[str, str], *, parallelism: int, gpus: int, min_member: int
) -> dict[str, Any]:
    """A batch Job of kai-ray, labelled with its queue, a gang of `min_member` pods."""
    return (
        make_job(name)
        .label(QUEUE_LABEL, queue)
        .annotate(MIN_MEMBER_ANNOTATION, str(min_member))
        .parallelism(parallelism)
        .set("spec.completions", parallelism)
        .set("spec.template.spec.containers[0].image", IMAGE)
        .set("spec.template.spec.nodeSelector", dict(selector))
        .gpus(str(gpus))
        .build()
    )


@dataclass(frozen=True)
class QueueTree:
    """A department queue and its two team queues, named for one test."""

    department: str
    team_a: str
    team_b: str

    def manifests(
        self,
        dept_quota: int = 8,
        dept_limit: int | None = 8,
        team_quota: int = 4,
        namespaces: dict[str, list[str]] | None = None,
    ) -> list[dict[str, Any]]:
        """The department owns `dept_quota` GPUs (at most `dept_limit`); each team has
        `team_quota` and may borrow up to the department's limit, by equal weight."""
        department = make_queue(self.department).gpu(quota=dept_quota, limit=dept_limit).build()
        teams = [
            make_queue(name)
            .parent(self.department)
            .gpu(quota=team_quota, limit=dept_limit, over_quota_weight=1)
            .build()
            for name in (self.team_a, self.team_b)
        ]
        for queue in teams:
            allowed = (namespaces or {}).get(queue["metadata"]["name"])
            if allowed is not None:
                queue["spec"]["namespaces"] = allowed
        return [department, *teams]


def topology(name: str) -> dict[str, Any]:
    """zone > block > rack > host, with the aliases workloads use."""
    return (
        make_topology(name)
        .level(ZONE_LABEL, "zone")
        .level(BLOCK_LABEL, "block")
        .level(RACK_LABEL, "rack")
        .level(HOSTNAME_LABEL, "host")
        .build()
    )


def in_one(level: str, topology_name: str) -> dict[str, str]:
    """Annotations asking that all of a workload's pods share one domain of `level`."""
    return {TOPOLOGY_ANNOTATION: topology_name, TOPOLOGY_REQUIRED_ANNOTATION: level}
