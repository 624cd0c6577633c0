"""Small builders of workload dicts for the grouping and simulator-controller tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "workloads"
QUEUE = {"kai-ray.io/queue": "team-a"}


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((FIXTURES / name).read_text())
    return loaded


def container(name: str = "main", **requests: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {"cpu": "1"}}}


def template(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    built: dict[str, Any] = {"spec": {"containers": [container()], **spec}}
    if labels:
        built["metadata"] = {"labels": labels}
    return built


def metadata(
    name: str, labels: dict[str, str] | None, annotations: dict[str, str] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return meta


def worker(name: str, **fields: Any) -> dict[str, Any]:
    return {"groupName": name, "template": template(), **fields}


def cluster_spec(*workers: dict[str, Any], head: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"headGroupSpec": {"template": head or template()}, "workerGroupSpecs": list(workers)}


def raycluster(
    *workers: dict[str, Any],
    labels: dict[str, str] | None = QUEUE,
    annotations: dict[str, str] | None = None,
    head: dict[str, Any] | None = None,
    name: str = "rc",
) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": metadata(name, labels, annotations),
        "spec": cluster_spec(*workers, head=head),
    }


def rayjob(spec: dict[str, Any], labels: dict[str, str] | None = QUEUE) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": metadata("rj", labels, None),
        "spec": {"entrypoint": "python main.py", **spec},
    }


def job(
    labels: dict[str, str] | None = QUEUE,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata("bench", labels, annotations),
        "spec": {"template": template(restartPolicy="Never"), **spec},
    }


def pod(
    name: str = "solo",
    labels: dict[str, str] | None = QUEUE,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(name, labels, annotations),
        "spec": {"containers": [container()], **spec},
    }


def clique(name: str, replicas: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "name": name,
        "spec": {
            "roleName": name,
            "replicas": replicas,
            "podSpec": {"containers": [container()]},
            **spec,
        },
    }


def podcliqueset(
    *cliques: dict[str, Any],
    replicas: int = 1,
    scaling_groups: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = QUEUE,
    **template_fields: Any,
) -> dict[str, Any]:
    built: dict[str, Any] = {"cliques": list(cliques), **template_fields}
    if scaling_groups:
        built["podCliqueScalingGroups"] = scaling_groups
    return {
        "apiVersion": "grove.io/v1alpha1",
        "kind": "PodCliqueSet",
        "metadata": metadata("pcs", labels, None),
        "spec": {"replicas": replicas, "template": built},
    }


def podgang(*podgroups: dict[str, Any], labels: dict[str, str] | None = QUEUE) -> dict[str, Any]:
    return {
        "apiVersion": "scheduler.grove.io/v1alpha1",
        "kind": "PodGang",
        "metadata": metadata("gang", labels, None),
        "spec": {"podgroups": list(podgroups)},
    }


def podgroup(name: str, min_replicas: int, pods: int) -> dict[str, Any]:
    references = [{"namespace": "ns", "name": f"{name}-{i}"} for i in range(pods)]
    return {"name": name, "minReplicas": min_replicas, "podReferences": references}
