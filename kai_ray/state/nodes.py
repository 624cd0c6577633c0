"""Reading Node objects: capacity, allocatable, readiness, labels and taints.

The per-node facts the snapshot turns into arrays. A node whose resources cannot
be parsed is kept (pods bound to it must still resolve) but offers nothing, and
the reason is reported. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kai_ray.state.problems import field_problem, object_ref
from kai_ray.values.errors import InvalidFieldError, Problem
from kai_ray.values.resources import Resources
from kai_ray.workloads.pod_fields import GPU_MEMORY_LABEL

NODE = "Node"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class NodeFacts:
    """One node as read from its object, before the snapshot lays out columns."""

    name: str
    capacity: Resources
    allocatable: Resources
    ready: bool
    unschedulable: bool
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    #: Memory of one GPU device in MiB (0 when the node does not say).
    gpu_memory_mib: float


@dataclass
class NodeReading:
    nodes: list[NodeFacts] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def read_nodes(objects: Sequence[Mapping[str, Any]]) -> NodeReading:
    """Every node once, in input order; duplicates and bad fields become problems."""
    reading = NodeReading()
    seen: set[str] = set()
    for obj in objects:
        ref = object_ref(obj, NODE)
        if ref.name in seen:
            reading.problems.append(Problem(ref, "metadata.name", "listed twice; kept the first"))
            continue
        seen.add(ref.name)
        facts, problems = read_node(obj)
        reading.nodes.append(facts)
        reading.problems.extend(problems)
    return reading


def read_node(obj: Mapping[str, Any]) -> tuple[NodeFacts, list[Problem]]:
    ref = object_ref(obj, NODE)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = MappingProxyType(dict((obj.get("metadata") or {}).get("labels") or {}))
    problems: list[Problem] = []
    try:
        capacity, allocatable = read_node_resources(status)
    except InvalidFieldError as err:
        # Offer nothing rather than guess: pods bound here still count, none are placed.
        problems.append(field_problem(ref, err))
        capacity = allocatable = Resources()
    try:
        taints = read_taints(spec.get("taints"))
    except InvalidFieldError as err:
        problems.append(field_problem(ref, err))
        taints = ()
    try:
        gpu_memory = read_gpu_memory(labels)
    except InvalidFieldError as err:
        problems.append(field_problem(ref, err))
        gpu_memory = 0.0
    facts = NodeFacts(
        name=ref.name,
        capacity=capacity,
        allocatable=allocatable,
        ready=node_is_ready(status),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=labels,
        taints=taints,
        gpu_memory_mib=gpu_memory,
    )
    return facts, problems


def read_node_resources(status: Mapping[str, Any]) -> tuple[Resources, Resources]:
    """Capacity and allocatable; a resource missing from allocatable falls back to capacity."""
    capacity = Resources.parse(status.get("capacity"), "status.capacity")
    allocatable = Resources.parse(status.get("allocatable"), "status.allocatable")
    return capacity, Resources({**capacity, **allocatable})


def node_is_ready(status: Mapping[str, Any]) -> bool:
    """The Ready condition; a node that reports no Ready condition (kwok, simulated) is ready."""
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


def read_taints(taints: Any) -> tuple[Taint, ...]:
    if not taints:
        return ()
    if not isinstance(taints, list):
        raise InvalidFieldError("spec.taints", f"expected a list, got {taints!r}")
    return tuple(read_taint(taint, f"spec.taints[{i}]") for i, taint in enumerate(taints))


def read_taint(taint: Any, field: str) -> Taint:
    if not isinstance(taint, Mapping) or not taint.get("key"):
        raise InvalidFieldError(f"{field}.key", "a taint needs a key")
    effect = str(taint.get("effect") or "")
    if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise InvalidFieldError(f"{field}.effect", f"unknown taint effect {effect!r}")
    return Taint(str(taint["key"]), str(taint.get("value") or ""), effect)


def read_gpu_memory(labels: Mapping[str, str]) -> float:
    text = labels.get(GPU_MEMORY_LABEL)
    if text is None:
        return 0.0
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not (math.isfinite(mib) and mib > 0):
        raise InvalidFieldError(
            f"metadata.labels[{GPU_MEMORY_LABEL}]",
            f"expected MiB per GPU device as a positive number, got {text!r}",
        )
    return mib
