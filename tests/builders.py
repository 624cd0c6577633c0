"""Fluent builders of plain Kubernetes objects for tests and scenarios.

    make_node("n1").gpus(8).cpu("64").memory("512Gi").label(k, v).unready().build()
    make_pod("p").gpus(1).on("n1").annotate(k, v).build()
    make_queue("team-a").parent("root").gpu(quota=8, limit=16).build()
    make_pod_group("pg").queue("team-a").min_member(4).build()
    make_topology("dc").level("block").level("rack").hostname().build()
    make_job("train").gpus(8).parallelism(4).queue("team-a").runs_for("1h").build()

Every `build()` returns a fresh dict shaped as the API server returns it, so the
code under test sees exactly what it sees in a cluster. Builders never share
state between calls. Odd input goes through `.set(path, value)` on a builder,
or `patched(obj, path, value)` on any dict; both read paths as `set_field` does.
"""

from __future__ import annotations

import copy
import re
from abc import abstractmethod
from typing import Any, Self

from kai_ray.values.api import API_VERSION, HOSTNAME_LABEL
from kai_ray.values.names import (
    GPU_DEVICES_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    POD_GROUP_ANNOTATION,
    QUEUE_LABEL,
    SCHEDULER_NAME,
    SIM_DURATION,
    SIM_SUBMIT_AT,
    SUBGROUP_LABEL,
)
from kai_ray.values.resources import GPU, GPU_PRODUCT_LABEL

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
Quantity = int | float | str
#: Passed as the value to `set_field` or `patched`: remove the field instead.
DELETE: Any = object()
_PATH_PART = re.compile(r"([^.\[\]]+)|\[([^\]]+)\]")


def timestamp(second: int) -> str:
    """A creation timestamp `second` seconds after a fixed origin (sorts as time does)."""
    minutes, seconds = divmod(second, 60)
    hours, minutes = divmod(minutes, 60)
    return f"2025-01-01T{hours:02d}:{minutes:02d}:{seconds:02d}Z"


def set_field(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set the field at `path` in place, or remove it when `value` is DELETE.

    Paths are written as problems name fields: `spec.workerGroupSpecs[1].minReplicas`,
    `metadata.labels[kai-ray.io/queue]` (brackets hold a list index or a key with dots).
    Missing objects on the way are created.
    """
    *parents, last = [name or key for name, key in _PATH_PART.findall(path)]
    target: Any = obj
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
    index: Any = int(last) if isinstance(target, list) else last
    if value is DELETE:
        del target[index]
    else:
        target[index] = value


def patched(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with the field at `path` set (or removed) as `set_field` does."""
    result = copy.deepcopy(obj)
    set_field(result, path, value)
    return result


class _Builder:
    def __init__(self, obj: dict[str, Any]) -> None:
        self._obj = obj

    @property
    def _metadata(self) -> dict[str, Any]:
        metadata: dict[str, Any] = self._obj["metadata"]
        return metadata

    def label(self, key: str, value: str) -> Self:
        self._metadata.setdefault("labels", {})[key] = value
        return self

    def annotate(self, key: str, value: str) -> Self:
        self._metadata.setdefault("annotations", {})[key] = value
        return self

    def created(self, second: int) -> Self:
        """Creation time as seconds after the fixed origin of `timestamp`."""
        self._metadata["creationTimestamp"] = timestamp(second)
        return self

    def set(self, path: str, value: Any) -> Self:
        """Escape hatch for odd input: `set("spec.priority", -1)` writes any field."""
        set_field(self._obj, path, value)
        return self

    def build(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


# --------------------------------------------------------------------- Node


class NodeBuilder(_Builder):
    def __init__(self, name: str) -> None:
        super().__init__(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name}},
                "spec": {},
                "status": {
                    "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
        self._allocatable: dict[str, Quantity] | None = None

    def resource(self, name: str, amount: Quantity) -> Self:
        self._obj["status"]["capacity"][name] = amount
        return self

    def gpus(self, count: int, product: str | None = None, memory_mib: int | None = None) -> Self:
        self.resource(GPU, count)
        if product is not None:
            self.label(GPU_PRODUCT_LABEL, product)
        if memory_mib is not None:
            self.label(GPU_MEMORY_LABEL, str(memory_mib))
        return self

    def cpu(self, amount: Quantity) -> Self:
        return self.resource("cpu", amount)

    def memory(self, amount: Quantity) -> Self:
        return self.resource("memory", amount)

    def allocatable(self, **amounts: Quantity) -> Self:
        """Allocatable below capacity (system reserved); `nvidia_com_gpu` means nvidia.com/gpu."""
        named = {name.replace("nvidia_com_", "nvidia.com/"): v for name, v in amounts.items()}
        self._obj["status"].setdefault("allocatable", {}).update(named)
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> Self:
        taint = {"key": key, "effect": effect, **({"value": value} if value else {})}
        self._obj["spec"].setdefault("taints", []).append(taint)
        return self

    def unready(self) -> Self:
        self._obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        return self

    def without_conditions(self) -> Self:
        """As kwok and simulated nodes are: no conditions at all."""
        self._obj["status"].pop("conditions", None)
        return self

    def cordoned(self) -> Self:
        self._obj["spec"]["unschedulable"] = True
        return self

    def in_domains(self, **labels: str) -> Self:
        """Topology labels by short key: `in_domains(block="b1", rack="r1")`."""
        for key, value in labels.items():
            self.label(key, value)
        return self


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


# --------------------------------------------------------------------- Pod


def _new_pod_spec() -> dict[str, Any]:
    return {"schedulerName": SCHEDULER_NAME, "containers": [{"name": "main", "resources": {}}]}


class _PodSpecBuilder(_Builder):
    """What a pod and a workload's pod template share: the main container's resources."""

    @property
    @abstractmethod
    def _pod_spec(self) -> dict[str, Any]: ...

    @property
    def _main(self) -> dict[str, Any]:
        container: dict[str, Any] = self._pod_spec["containers"][0]
        return container

    def request(self, name: str, amount: Quantity) -> Self:
        self._main["resources"].setdefault("requests", {})[name] = amount
        return self

    def limit(self, name: str, amount: Quantity) -> Self:
        self._main["resources"].setdefault("limits", {})[name] = amount
        return self

    def cpu(self, amount: Quantity) -> Self:
        return self.request("cpu", amount)

    def memory(self, amount: Quantity) -> Self:
        return self.request("memory", amount)

    def gpus(self, count: Quantity) -> Self:
        """Whole GPUs, set as a limit as device plugins expect (requests default to it)."""
        return self.limit(GPU, count)

    def scheduler(self, name: str) -> Self:
        self._pod_spec["schedulerName"] = name
        return self

    def submitted_at(self, duration: str) -> Self:
        """When the simulator submits it, e.g. "1h" into the run."""
        return self.annotate(SIM_SUBMIT_AT, duration)

    def runs_for(self, duration: str) -> Self:
        """How long the simulator lets it run once started, e.g. "100h"."""
        return self.annotate(SIM_DURATION, duration)


class PodBuilder(_PodSpecBuilder):
    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace},
                "spec": _new_pod_spec(),
                "status": {},
            }
        )

    @property
    def _pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]
        return spec

    def container(self, requests: dict[str, Quantity] | None = None, **extra: Any) -> Self:
        name = f"c{len(self._obj['spec']['containers'])}"
        entry = {"name": name, "resources": {"requests": dict(requests or {})}, **extra}
        self._obj["spec"]["containers"].append(entry)
        return self

    def init_container(self, requests: dict[str, Quantity], sidecar: bool = False) -> Self:
        entry: dict[str, Any] = {"name": "init", "resources": {"requests": dict(requests)}}
        if sidecar:
            entry["restartPolicy"] = "Always"
        self._obj["spec"].setdefault("initContainers", []).append(entry)
        return self

    def overhead(self, **amounts: Quantity) -> Self:
        self._obj["spec"]["overhead"] = amounts
        return self

    def gpu_fraction(self, fraction: float | str) -> Self:
        return self.annotate(GPU_FRACTION_ANNOTATION, str(fraction))

    def gpu_memory(self, amount: str) -> Self:
        return self.annotate(GPU_MEMORY_ANNOTATION, amount)

    def devices(self, indices: str) -> Self:
        """The device record the binder writes, e.g. "0,3"."""
        return self.annotate(GPU_DEVICES_ANNOTATION, indices)

    def on(self, node: str) -> Self:
        """Bound to `node` and, unless a phase is set, Running."""
        self._obj["spec"]["nodeName"] = node
        self._obj["status"].setdefault("phase", "Running")
        return self

    def phase(self, phase: str) -> Self:
        self._obj["status"]["phase"] = phase
        return self

    def group(self, name: str) -> Self:
        return self.annotate(POD_GROUP_ANNOTATION, name)

    def subgroup(self, name: str) -> Self:
        return self.label(SUBGROUP_LABEL, name)

    def priority(self, value: int) -> Self:
        self._obj["spec"]["priority"] = value
        return self

    def gate(self, name: str) -> Self:
        self._obj["spec"].setdefault("schedulingGates", []).append({"name": name})
        return self

    def controlled_by(self, kind: str, name: str) -> Self:
        """A controlling owner (a Job, a ReplicaSet): it makes the pod again when evicted."""
        owner = {"apiVersion": "v1", "kind": kind, "name": name, "uid": f"uid-{name}"}
        self._obj["metadata"]["ownerReferences"] = [owner | {"controller": True}]
        return self


def make_pod(name: str, namespace: str = "default") -> PodBuilder:
    return PodBuilder(name, namespace)


# --------------------------------------------------------------------- Job


class JobBuilder(_PodSpecBuilder):
    """A batch/v1 Job; the simulator creates its pods from the template, `parallelism` at once."""

    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"template": {"spec": {**_new_pod_spec(), "restartPolicy": "Never"}}},
            }
        )

    @property
    def _pod_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj["spec"]["template"]["spec"]
        return spec

    def queue(self, name: str) -> Self:
        """The queue label, on the pod template as Job users write it."""
        template = self._obj["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})[QUEUE_LABEL] = name
        return self

    def parallelism(self, count: int) -> Self:
        self._obj["spec"]["parallelism"] = count
        return self


def make_job(name: str, namespace: str = "default") -> JobBuilder:
    return JobBuilder(name, namespace)


# --------------------------------------------------------------------- Queue


class QueueBuilder(_Builder):
    def __init__(self, name: str) -> None:
        super().__init__(
            {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": {}}
        )

    def parent(self, name: str) -> Self:
        self._obj["spec"]["parentQueue"] = name
        return self

    def priority(self, value: int) -> Self:
        self._obj["spec"]["priority"] = value
        return self

    def resource(
        self,
        name: str,
        quota: Quantity | None = None,
        limit: Quantity | None = None,
        over_quota_weight: float | None = None,
    ) -> Self:
        entry = {"quota": quota, "limit": limit, "overQuotaWeight": over_quota_weight}
        resources = self._obj["spec"].setdefault("resources", {})
        resources[name] = {k: v for k, v in entry.items() if v is not None}
        return self

    def gpu(
        self,
        quota: Quantity | None = None,
        limit: Quantity | None = None,
        over_quota_weight: float | None = None,
    ) -> Self:
        return self.resource("gpu", quota, limit, over_quota_weight)

    def cpu(self, quota: Quantity | None = None, limit: Quantity | None = None) -> Self:
        return self.resource("cpu", quota, limit)

    def memory(self, quota: Quantity | None = None, limit: Quantity | None = None) -> Self:
        return self.resource("memory", quota, limit)

    def namespaces(self, *names: str) -> Self:
        self._obj["spec"]["namespaces"] = list(names)
        return self

    def usage(self, **amounts: Quantity) -> Self:
        self._obj.setdefault("status", {}).setdefault("usage", {}).update(amounts)
        return self


def make_queue(name: str) -> QueueBuilder:
    return QueueBuilder(name)


# --------------------------------------------------------------------- PodGroup


class PodGroupBuilder(_Builder):
    def __init__(self, name: str, namespace: str) -> None:
        super().__init__(
            {
                "apiVersion": API_VERSION,
                "kind": "PodGroup",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"queue": "default", "minMember": 1},
            }
        )

    def queue(self, name: str) -> Self:
        self._obj["spec"]["queue"] = name
        return self

    def min_member(self, count: int) -> Self:
        self._obj["spec"]["minMember"] = count
        return self

    def priority_class(self, name: str) -> Self:
        self._obj["spec"]["priorityClassName"] = name
        return self

    def topology(
        self, topology: str, required: str | None = None, preferred: str | None = None
    ) -> Self:
        self._obj["spec"]["topologyConstraint"] = _constraint(topology, required, preferred)
        return self

    def subgroup(self, name: str, min_member: int = 1, parent: str | None = None) -> Self:
        entry: dict[str, Any] = {"name": name, "minMember": min_member}
        if parent is not None:
            entry["parent"] = parent
        self._obj["spec"].setdefault("subGroups", []).append(entry)
        return self

    def min_subgroup(self, count: int) -> Self:
        self._obj["spec"]["minSubGroup"] = count
        return self


def _constraint(topology: str, required: str | None, preferred: str | None) -> dict[str, str]:
    entry = {"topology": topology, "requiredLevel": required, "preferredLevel": preferred}
    return {k: v for k, v in entry.items() if v is not None}


def make_pod_group(name: str, namespace: str = "default") -> PodGroupBuilder:
    return PodGroupBuilder(name, namespace)


# --------------------------------------------------------------------- Topology


class TopologyBuilder(_Builder):
    def __init__(self, name: str) -> None:
        super().__init__(
            {
                "apiVersion": API_VERSION,
                "kind": "Topology",
                "metadata": {"name": name},
                "spec": {"levels": []},
            }
        )

    def level(self, node_label: str, alias: str | None = None) -> Self:
        entry = {"nodeLabel": node_label, **({"alias": alias} if alias else {})}
        self._obj["spec"]["levels"].append(entry)
        return self

    def hostname(self) -> Self:
        return self.level(HOSTNAME_LABEL, "host")


def make_topology(name: str, *levels: str) -> TopologyBuilder:
    """A topology with `levels` as node labels (widest first); add more with `.level()`."""
    builder = TopologyBuilder(name)
    for label in levels:
        builder.level(label)
    return builder
