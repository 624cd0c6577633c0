"""What one Pod asks for and where it stands, read from the plain Kubernetes dict.

Pods are handled as the dicts the API server returns (no pydantic model: a
cluster holds tens of thousands of them and the snapshot reads them every
cycle). Requests follow kube-scheduler's rules, GPU sharing follows kai-ray's
annotations (docs/architecture.md section 2). Errors raise `InvalidFieldError` naming the
field. Pure: no I/O, and nothing here mutates a pod.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kai_ray.values.errors import InvalidFieldError
from kai_ray.values.names import (
    GPU_DEVICES_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_FRACTION_ANNOTATION_ALIASES,
    GPU_MEMORY_ANNOTATION,
    POD_GROUP_ANNOTATION,
    POD_GROUP_ANNOTATION_ALIASES,
    SUBGROUP_LABEL,
    first_of,
)
from kai_ray.values.resources import GPU, Resources, parse_amount

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Node label (MiB per device) published by NVIDIA GPU feature discovery.
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MIB = 2.0**20

Pod = Mapping[str, Any]


def annotation_field(key: str) -> str:
    """The field path of one annotation, as problems name it."""
    return f"metadata.annotations[{key}]"


# ------------------------------------------------------------------ identity


def pod_name(pod: Pod) -> str:
    return str(_metadata(pod).get("name", ""))


def pod_namespace(pod: Pod) -> str:
    return str(_metadata(pod).get("namespace") or "default")


def pod_key(pod: Pod) -> str:
    """`namespace/name`, the key every kai-ray map of pods uses."""
    return f"{pod_namespace(pod)}/{pod_name(pod)}"


def pod_annotations(pod: Pod) -> Mapping[str, str]:
    return _metadata(pod).get("annotations") or {}


def pod_labels(pod: Pod) -> Mapping[str, str]:
    return _metadata(pod).get("labels") or {}


def pod_creation_timestamp(pod: Pod) -> str:
    """RFC 3339 creation time, or "" when unknown (sorts first)."""
    return str(_metadata(pod).get("creationTimestamp") or "")


# ------------------------------------------------------------------ standing


def pod_node(pod: Pod) -> str | None:
    """The node the pod is bound to, or None while it waits."""
    return _spec(pod).get("nodeName") or None


def pod_scheduler(pod: Pod) -> str:
    return str(_spec(pod).get("schedulerName") or "default-scheduler")


def pod_phase(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def pod_has_controller(pod: Pod) -> bool:
    """An owner reference marked `controller: true`: something recreates the pod
    when it is evicted (a Job, a ReplicaSet, KubeRay). A bare pod evicted is gone."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return any(isinstance(o, Mapping) and o.get("controller") is True for o in owners)


def pod_is_deleting(pod: Pod) -> bool:
    """`metadata.deletionTimestamp` is set: the pod is going (an eviction's grace
    period), though it may hold its node for a while yet."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_is_terminal(pod: Pod) -> bool:
    """Succeeded or Failed pods hold no resources; a deleting pod still does."""
    return pod_phase(pod) in TERMINAL_PHASES


def pod_priority(pod: Pod) -> int:
    """spec.priority as admission resolved it from the priority class; 0 when unset."""
    return int(_spec(pod).get("priority") or 0)


def pod_scheduling_gates(pod: Pod) -> tuple[str, ...]:
    return tuple(str(gate.get("name", "")) for gate in _spec(pod).get("schedulingGates") or ())


def pod_group_name(pod: Pod) -> str | None:
    """The PodGroup the pod joins explicitly (KAI's `pod-group-name` accepted)."""
    return first_of(pod_annotations(pod), POD_GROUP_ANNOTATION, POD_GROUP_ANNOTATION_ALIASES)


def pod_subgroup(pod: Pod) -> str | None:
    return pod_labels(pod).get(SUBGROUP_LABEL)


def pod_is_pending_for(pod: Pod, scheduler_name: str) -> bool:
    """A pod this scheduler still has to place."""
    return (
        pod_scheduler(pod) == scheduler_name and pod_node(pod) is None and not pod_is_terminal(pod)
    )


# ------------------------------------------------------------------ requests


def pod_requests(pod: Pod) -> Resources:
    """Effective requests as kube-scheduler computes them, overhead included.

    Regular containers and restartable init containers (sidecars) run together;
    each ordinary init container runs alone beside the sidecars started before it,
    so the pod needs the larger of the two, resource by resource. Sums are kept
    in plain dicts: this runs for every pod of the cluster every cycle.
    """
    spec = _spec(pod)
    running: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for index, container in enumerate(spec.get("initContainers") or ()):
        needs = _container_amounts(container, f"spec.initContainers[{index}]")
        if container.get("restartPolicy") == "Always":
            _add_into(running, needs)
        else:
            _max_into(init_peak, _add_into(dict(running), needs))
    for index, container in enumerate(spec.get("containers") or ()):
        _add_into(running, _container_amounts(container, f"spec.containers[{index}]"))
    total = _max_into(running, init_peak)
    return Resources(_add_into(total, _parse_map(spec.get("overhead"), "spec.overhead")))


def container_requests(container: Mapping[str, Any], field: str) -> Resources:
    """A container's requests; limits stand in for absent requests, as the API server defaults."""
    return Resources(_container_amounts(container, field))


def _container_amounts(container: Mapping[str, Any], field: str) -> dict[str, float]:
    resources = container.get("resources") or {}
    amounts = _parse_map(resources.get("limits"), f"{field}.resources.limits")
    requests = _parse_map(resources.get("requests"), f"{field}.resources.requests")
    if GPU in amounts and GPU in requests and amounts[GPU] != requests[GPU]:
        # As the API server has it: devices cannot be overcommitted.
        raise InvalidFieldError(
            f"{field}.resources.limits.{GPU}",
            f"must equal the request ({requests[GPU]:g}), got {amounts[GPU]:g}",
        )
    amounts.update(requests)
    whole_gpus = amounts.get(GPU, 0.0)
    if whole_gpus != int(whole_gpus):
        # Device plugins hand out whole devices; a share goes through the annotations.
        written = "requests" if GPU in requests else "limits"
        raise InvalidFieldError(
            f"{field}.resources.{written}.{GPU}",
            f"must be a whole number, got {whole_gpus:g}; "
            f"ask for part of a GPU with {GPU_FRACTION_ANNOTATION}",
        )
    return amounts


def _add_into(total: dict[str, float], amounts: Mapping[str, float]) -> dict[str, float]:
    for name, amount in amounts.items():
        total[name] = total.get(name, 0.0) + amount
    return total


def _max_into(peak: dict[str, float], amounts: Mapping[str, float]) -> dict[str, float]:
    for name, amount in amounts.items():
        peak[name] = max(peak.get(name, 0.0), amount)
    return peak


def _parse_map(quantities: Any, field: str) -> dict[str, float]:
    if quantities is None:
        return {}
    if not isinstance(quantities, Mapping):
        raise InvalidFieldError(field, f"expected a map of resource quantities, got {quantities!r}")
    return {str(name): _amount(value, f"{field}.{name}") for name, value in quantities.items()}


def _amount(value: Any, field: str) -> float:
    """parse_amount, memoised: a cluster repeats the same few quantity strings."""
    try:
        return _cached_amount(value)
    except InvalidFieldError as err:
        raise InvalidFieldError(field, err.message) from None
    except TypeError:  # unhashable, hence not a quantity: let parse_amount say so
        return parse_amount(value, field)


@functools.lru_cache(maxsize=4096, typed=True)
def _cached_amount(value: Any) -> float:
    return parse_amount(value, "")


# ------------------------------------------------------------------ GPU sharing


@dataclass(frozen=True)
class GpuShare:
    """Part of one GPU device: a fraction of it, or an amount of its memory in bytes."""

    fraction: float | None = None
    memory: float | None = None

    def fraction_of(self, device_memory_mib: float) -> float | None:
        """The share as a fraction of a device with that much memory; None if unknown."""
        if self.fraction is not None:
            return self.fraction
        if self.memory is None or device_memory_mib <= 0:
            return None
        return self.memory / (device_memory_mib * MIB)


def gpu_share(pod: Pod) -> GpuShare | None:
    """The pod's GPU share from its annotations, or None when it takes whole devices.

    A fraction lies in (0, 1]; 1 is accepted and fills one device, so a manifest
    that scales its fraction up to a full device keeps working. A share excludes
    whole `nvidia.com/gpu` requests: the pod must say one or the other. KAI's
    `gpu-fraction` is read as `kai-ray.io/gpu-fraction` (the same meaning).
    """
    annotations = pod_annotations(pod)
    keys = (GPU_FRACTION_ANNOTATION, *GPU_FRACTION_ANNOTATION_ALIASES)
    fraction_key = next((k for k in keys if k in annotations), GPU_FRACTION_ANNOTATION)
    fraction = annotations.get(fraction_key)
    memory = annotations.get(GPU_MEMORY_ANNOTATION)
    if fraction is not None and memory is not None:
        raise InvalidFieldError(
            annotation_field(GPU_MEMORY_ANNOTATION),
            f"set either {fraction_key} or {GPU_MEMORY_ANNOTATION}, not both",
        )
    if fraction is not None:
        return GpuShare(fraction=_parse_fraction(fraction, fraction_key))
    if memory is not None:
        return GpuShare(memory=_parse_gpu_memory(memory))
    return None


def _parse_fraction(text: str, key: str) -> float:
    field = annotation_field(key)
    try:
        fraction = float(text)
    except (TypeError, ValueError):
        raise InvalidFieldError(field, f"expected a number in (0, 1], got {text!r}") from None
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise InvalidFieldError(field, f"must lie in (0, 1], got {text!r}")
    return fraction


def _parse_gpu_memory(text: str) -> float:
    field = annotation_field(GPU_MEMORY_ANNOTATION)
    memory = parse_amount(text, field)
    if memory <= 0:
        raise InvalidFieldError(field, f"must be more than zero, got {text!r}")
    return memory


def check_gpu_request(requests: Resources, share: GpuShare | None) -> None:
    """A pod that shares a device must not also ask for whole devices."""
    if share is not None and requests[GPU] > 0:
        key = GPU_FRACTION_ANNOTATION if share.fraction is not None else GPU_MEMORY_ANNOTATION
        raise InvalidFieldError(
            annotation_field(key),
            f"a pod with {key} must not also request {GPU} (it asks for {requests[GPU]:g})",
        )


def pod_gpu_devices(pod: Pod) -> tuple[int, ...] | None:
    """Device indices the binder recorded on the pod ("0,3"), or None if it recorded none."""
    text = pod_annotations(pod).get(GPU_DEVICES_ANNOTATION)
    if text is None:
        return None
    return parse_device_list(text)


def parse_device_list(text: str) -> tuple[int, ...]:
    field = annotation_field(GPU_DEVICES_ANNOTATION)
    try:
        devices = tuple(int(part) for part in str(text).split(","))
    except ValueError:
        raise InvalidFieldError(
            field, f"expected device indices like '0,3', got {text!r}"
        ) from None
    if any(device < 0 for device in devices) or len(set(devices)) != len(devices):
        raise InvalidFieldError(field, f"device indices must be distinct and >= 0, got {text!r}")
    return devices


def format_device_list(devices: Iterable[int]) -> str:
    """The annotation value the binder writes for these devices."""
    return ",".join(str(device) for device in sorted(devices))


# ------------------------------------------------------------------ node constraints

NODE_AFFINITY_FIELD = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
#: The one field a `matchFields` requirement may name; placement reads it as the node name.
NODE_NAME_FIELD = "metadata.name"
_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


@dataclass(frozen=True)
class NodeRequirement:
    """One node selector requirement: `key` (a label, or `metadata.name`) `operator` `values`."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


#: One node selector term: its requirements all hold. Terms of a pod: any one holds.
NodeSelectorTerm = tuple[NodeRequirement, ...]


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    #: Empty tolerates every effect.
    effect: str = ""

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """Kubernetes' rule: effect matches (or is empty), then key and value match."""
        if self.effect and self.effect != effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == key
        return self.key == key and self.value == value


def pod_node_selector(pod: Pod) -> tuple[tuple[str, str], ...]:
    """spec.nodeSelector as sorted pairs (a hashable placement signature)."""
    selector = _spec(pod).get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise InvalidFieldError("spec.nodeSelector", f"expected a map, got {selector!r}")
    return tuple(sorted((str(k), str(v)) for k, v in selector.items()))


def pod_required_node_affinity(pod: Pod) -> tuple[NodeSelectorTerm, ...]:
    """Required node affinity terms; () when the pod has none."""
    affinity = ((_spec(pod).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") or []
    field = f"{NODE_AFFINITY_FIELD}.nodeSelectorTerms"
    if not isinstance(terms, list):
        raise InvalidFieldError(field, f"expected a list, got {terms!r}")
    return tuple(_term(term, f"{field}[{i}]") for i, term in enumerate(terms))


def _term(term: Any, field: str) -> NodeSelectorTerm:
    if not isinstance(term, Mapping):
        raise InvalidFieldError(field, f"expected a node selector term, got {term!r}")
    expressions = [
        _requirement(e, f"{field}.matchExpressions[{i}]", None)
        for i, e in enumerate(term.get("matchExpressions") or ())
    ]
    fields = [
        _requirement(e, f"{field}.matchFields[{i}]", NODE_NAME_FIELD)
        for i, e in enumerate(term.get("matchFields") or ())
    ]
    return (*expressions, *fields)


def _requirement(expression: Any, field: str, only_key: str | None) -> NodeRequirement:
    if not isinstance(expression, Mapping) or not expression.get("key"):
        raise InvalidFieldError(f"{field}.key", "a requirement needs a key")
    key, operator = str(expression["key"]), str(expression.get("operator") or "")
    values = tuple(str(v) for v in expression.get("values") or ())
    if only_key is not None and key != only_key:
        raise InvalidFieldError(f"{field}.key", f"only {only_key} is supported, got {key!r}")
    if operator not in _OPERATORS:
        raise InvalidFieldError(f"{field}.operator", f"unknown operator {operator!r}")
    _check_values(operator, values, f"{field}.values")
    return NodeRequirement(key, operator, values)


def _check_values(operator: str, values: tuple[str, ...], field: str) -> None:
    if operator in ("In", "NotIn") and not values:
        raise InvalidFieldError(field, f"{operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise InvalidFieldError(field, f"{operator} takes no values")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not _is_integer(values[0])):
        raise InvalidFieldError(field, f"{operator} needs exactly one integer, got {values!r}")


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def pod_tolerations(pod: Pod) -> tuple[Toleration, ...]:
    tolerations = _spec(pod).get("tolerations") or []
    if not isinstance(tolerations, list):
        raise InvalidFieldError("spec.tolerations", f"expected a list, got {tolerations!r}")
    return tuple(_toleration(t, f"spec.tolerations[{i}]") for i, t in enumerate(tolerations))


def _toleration(entry: Any, field: str) -> Toleration:
    if not isinstance(entry, Mapping):
        raise InvalidFieldError(field, f"expected a toleration, got {entry!r}")
    operator = str(entry.get("operator") or "Equal")
    if operator not in ("Equal", "Exists"):
        raise InvalidFieldError(f"{field}.operator", f"must be Equal or Exists, got {operator!r}")
    key, value = str(entry.get("key") or ""), str(entry.get("value") or "")
    if operator == "Exists" and value:
        raise InvalidFieldError(f"{field}.value", "must be empty when operator is Exists")
    if operator == "Equal" and not key:
        raise InvalidFieldError(f"{field}.key", "an Equal toleration needs a key")
    effect = str(entry.get("effect") or "")
    if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise InvalidFieldError(f"{field}.effect", f"unknown taint effect {effect!r}")
    return Toleration(key, operator, value, effect)


# ------------------------------------------------------------------ helpers


def _metadata(pod: Pod) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _spec(pod: Pod) -> Mapping[str, Any]:
    return pod.get("spec") or {}
