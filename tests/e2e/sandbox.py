"""One test's share of the e2e cluster, so that tests cannot disturb each other.

The operator schedules every kai-ray pod of the cluster, and queues and
topologies are cluster-scoped, so each test gets:

- its own namespace;
- its own pool of kwok GPU nodes, labelled `kai-ray.io/e2e-pool=<tag>`, with
  zone names unique to the test (topology domains are paths of label values,
  so unique zones make every block and rack unique too); the workload
  builders put that label in every pod's nodeSelector;
- cluster-scoped objects (Queues, Topologies) named `<name>-<tag>` and deleted
  after the test.

The Sandbox also reads what the tests look at: pods, PodGroups, Queues, Events.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import urllib3
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from .nodes import GPU, GpuNodeSpec, create_gpu_nodes, delete_gpu_nodes
from .polling import eventually

if TYPE_CHECKING:
    from .conftest import ControlPlane

GROUP, VERSION = "scheduling.kai-ray.io", "v1alpha1"
RAY, RAY_VERSION = "ray.io", "v1"
POOL_LABEL = "kai-ray.io/e2e-pool"
#: group, version, plural of each custom kind the tests use, and whether it is namespaced
CUSTOM = {
    "Queue": (GROUP, VERSION, "queues", False),
    "Topology": (GROUP, VERSION, "topologies", False),
    "PodGroup": (GROUP, VERSION, "podgroups", True),
    "RayCluster": (RAY, RAY_VERSION, "rayclusters", True),
    "RayJob": (RAY, RAY_VERSION, "rayjobs", True),
    "PodGang": ("scheduler.grove.io", "v1alpha1", "podgangs", True),
}


@dataclass
class Sandbox:
    namespace: str
    tag: str
    plane: ControlPlane
    api: client.ApiClient
    nodes: list[str] = field(default_factory=list)
    cluster_objects: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # ------------------------------------------------------------- naming

    def name(self, base: str) -> str:
        """A cluster-scoped name unique to this test."""
        return f"{base}-{self.tag}"

    @property
    def node_selector(self) -> dict[str, str]:
        return {POOL_LABEL: self.tag}

    # ------------------------------------------------------------ creating

    def make_nodes(self, count: int, **spec: Any) -> list[str]:
        """Ready kwok GPU nodes of this test's pool (GpuNodeSpec fields as keywords)."""
        labels = {**spec.pop("extra_labels", {}), POOL_LABEL: self.tag}
        spec.setdefault("zone_prefix", f"zone-{self.tag}")
        spec.setdefault("prefix", f"{self.tag}-n{len(self.nodes)}")
        names = create_gpu_nodes(self.core, GpuNodeSpec(count=count, extra_labels=labels, **spec))
        self.nodes.extend(names)
        return names

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object through the API (the namespace is this test's)."""
        kind = obj["kind"]
        if kind in CUSTOM:
            group, version, plural, namespaced = CUSTOM[kind]
            if not namespaced:
                self.cluster_objects.append((plural, obj["metadata"]["name"]))
                return dict(self.custom.create_cluster_custom_object(group, version, plural, obj))
            obj["metadata"]["namespace"] = self.namespace
            return dict(
                self.custom.create_namespaced_custom_object(
                    group, version, self.namespace, plural, obj
                )
            )
        obj["metadata"]["namespace"] = self.namespace
        if kind == "Pod":
            return self.api.sanitize_for_serialization(
                self.core.create_namespaced_pod(self.namespace, obj)
            )
        if kind == "Job":
            return self.api.sanitize_for_serialization(
                self.batch.create_namespaced_job(self.namespace, obj)
            )
        raise ValueError(f"Sandbox.create knows no {kind}")

    def kubectl_apply(self, *objs: dict[str, Any]) -> str:
        """`kubectl apply -f -` as a user does; cluster-scoped objects are cleaned up."""
        for obj in objs:
            if obj["kind"] in CUSTOM and not CUSTOM[obj["kind"]][3]:
                self.cluster_objects.append((CUSTOM[obj["kind"]][2], obj["metadata"]["name"]))
        result = self.plane.kubectl(
            "apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump_all(objs)
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def delete(self, kind: str, name: str) -> None:
        """Delete a namespaced custom object; what it owns goes with it (garbage collector)."""
        group, version, plural, _ = CUSTOM[kind]
        self.custom.delete_namespaced_custom_object(group, version, self.namespace, plural, name)

    def cleanup(self) -> None:
        delete_gpu_nodes(self.core, self.nodes)
        for plural, name in reversed(self.cluster_objects):
            with contextlib.suppress(ApiException):
                self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)

    # ------------------------------------------------------------- reading

    def pods(self, selector: str | None = None) -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def wait_pods(
        self, selector: str | None, count: int, *, bound: bool = False, timeout: float = 60
    ) -> list[client.V1Pod]:
        """Wait until exactly `count` pods match, all of them on nodes when `bound`."""

        def probe() -> tuple[list[client.V1Pod]] | None:
            pods = self.pods(selector)
            if len(pods) != count or (bound and any(not p.spec.node_name for p in pods)):
                return None
            return (pods,)  # truthy when no pod is wanted, too

        state = "bound " if bound else ""
        return eventually(probe, timeout, f"{count} {state}pods matching {selector!r}")[0]

    def wait_get(self, kind: str, name: str, timeout: float = 30) -> dict[str, Any]:
        return eventually(lambda: self.get(kind, name), timeout, f"{kind} {name}")

    def pod(self, name: str) -> client.V1Pod:
        return self.core.read_namespaced_pod(name, self.namespace)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """A custom object of this test (namespaced or not), None when absent."""
        group, version, plural, namespaced = CUSTOM[kind]
        try:
            if namespaced:
                return dict(
                    self.custom.get_namespaced_custom_object(
                        group, version, self.namespace, plural, name
                    )
                )
            return dict(self.custom.get_cluster_custom_object(group, version, plural, name))
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list(self, kind: str) -> list[dict[str, Any]]:
        group, version, plural, _ = CUSTOM[kind]
        answer = self.custom.list_namespaced_custom_object(group, version, self.namespace, plural)
        return list(answer["items"])

    def events(
        self, name: str | None = None, reason: str | None = None
    ) -> list[client.CoreV1Event]:
        """Events in the namespace, about `name` and of `reason` when given."""
        selectors = [f"involvedObject.name={name}"] if name else []
        if reason:
            selectors.append(f"reason={reason}")
        answer = self.core.list_namespaced_event(
            self.namespace, field_selector=",".join(selectors) or None
        )
        return list(answer.items)

    def node_gpus(self) -> dict[str, int]:
        """GPUs held on each of this test's nodes by pods bound there and not finished."""
        held = dict.fromkeys(self.nodes, 0)
        for pod in self.core.list_pod_for_all_namespaces().items:
            if pod.spec.node_name in held and pod.status.phase not in ("Succeeded", "Failed"):
                held[pod.spec.node_name] += gpus_of(pod)
        return held

    @contextlib.contextmanager
    def pod_history(self) -> Iterator[list[tuple[str, client.V1Pod]]]:
        """Every pod event in the namespace while the block runs, in order.

        Conditions that last only a moment (kai-ray's DisruptionTarget, which
        the Eviction API replaces with its own) are seen only this way."""
        seen: list[tuple[str, client.V1Pod]] = []
        stream = watch.Watch()
        started = threading.Event()

        def run() -> None:
            version = self.core.list_namespaced_pod(self.namespace).metadata.resource_version
            started.set()
            # stopping the watch may cut its response short: that is its end, not an error
            with contextlib.suppress(urllib3.exceptions.HTTPError):
                for event in stream.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=300,
                ):
                    if event:  # a stream cut short by `stop` may end on an empty event
                        seen.append((event["type"], event["object"]))

        thread = threading.Thread(target=run, name="pod-history", daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield seen
        finally:
            stream.stop()


def gpus_of(pod: client.V1Pod) -> int:
    """Whole GPUs a pod asks for (requests, else limits) over its app containers."""
    total = 0
    for container in pod.spec.containers:
        resources = container.resources
        amount = ((resources and resources.requests) or {}).get(GPU) or (
            (resources and resources.limits) or {}
        ).get(GPU)
        total += int(amount or 0)
    return total


def bound(pods: list[client.V1Pod]) -> list[client.V1Pod]:
    return [p for p in pods if p.spec.node_name]


def quantity(value: Any) -> Decimal:
    """A quantity as written in a status (a number, a string, or absent: 0)."""
    return Decimal(0) if value in (None, "") else Decimal(parse_quantity(str(value)))


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


def kubectl_table(text: str) -> list[dict[str, str]]:
    """The rows of `kubectl get` output keyed by column header; empty cells are ""."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    columns = [(m.group(), m.start()) for m in re.finditer(r"\S+(?: \S+)*", header)]
    rows = []
    for line in lines[1:]:
        cells = {}
        for i, (name, start) in enumerate(columns):
            end = columns[i + 1][1] if i + 1 < len(columns) else len(line)
            cells[name] = line[start:end].strip()
        rows.append(cells)
    return rows


def headers(text: str) -> list[str]:
    first = text.splitlines()[0] if text.strip() else ""
    return [m.group() for m in re.finditer(r"\S+(?: \S+)*", first)]
