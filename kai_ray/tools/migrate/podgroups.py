"""KAI's PodGroup (`scheduling.run.ai/v2alpha2`) and Topology (`kai.scheduler/v1alpha1`)
as kai-ray's.

The gang fields keep their meaning (`minMember` unset is 1, 0 is no gang;
`minSubGroup` unset means every subgroup); `preemptibility` becomes `preemptible`;
the topology levels are renamed (`requiredTopologyLevel` is `requiredLevel`). What
kai-ray does not have (a preemption delay, `minSubGroup` inside a subgroup, a
stale-gang grace that never ends) is a change. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from kai_ray.tools.migrate.findings import Findings
from kai_ray.tools.migrate.objects import mapping, new_metadata, sequence, text, unknown_fields
from kai_ray.tools.migrate.units import duration_text, go_duration_seconds, whole
from kai_ray.values.api import API_VERSION
from kai_ray.values.errors import InvalidFieldError

KAI_POD_GROUP_API = "scheduling.run.ai/v2alpha2"
KAI_TOPOLOGY_API = "kai.scheduler/v1alpha1"
_SPEC_FIELDS = (
    "minMember",
    "minSubGroup",
    "queue",
    "priorityClassName",
    "preemptibility",
    "topologyConstraint",
    "subGroups",
    "markUnschedulable",
    "schedulingBackoff",
    "preemptionDelay",
    "stalenessGracePeriod",
)
#: Annotations KAI's scheduler and podgrouper write on a PodGroup; kai-ray keeps its own.
_KAI_WRITTEN = (
    "kai.scheduler/last-start-timestamp",
    "kai.scheduler/stale-podgroup-timestamp",
    "kai.scheduler/last-eviction-timestamp",
    "kai.scheduler/top-owner-metadata",
)
_PREEMPTIBILITY = {"preemptible": True, "non-preemptible": False, "": None}


def convert_pod_group(doc: dict[str, Any], findings: Findings) -> dict[str, Any]:
    spec = mapping(doc.get("spec"), "spec")
    unknown_fields(spec, _SPEC_FIELDS, "spec", findings)
    metadata = new_metadata(doc, findings)
    _drop_kai_annotations(metadata, findings)
    queue = text(spec.get("queue"), "spec.queue")
    if queue is None:
        raise InvalidFieldError("spec.queue", "is required (kai-ray has no default queue)")
    out: dict[str, Any] = {"queue": queue, "minMember": _min(spec, "minMember", "spec")}
    if spec.get("minSubGroup") is not None:
        out["minSubGroup"] = whole(spec["minSubGroup"], "spec.minSubGroup")
    priority = text(spec.get("priorityClassName"), "spec.priorityClassName")
    if priority:
        out["priorityClassName"] = priority
    preemptible = _preemptible(spec.get("preemptibility"))
    if preemptible is not None:
        out["preemptible"] = preemptible
    constraint = _constraint(spec.get("topologyConstraint"), "spec.topologyConstraint")
    if constraint:
        out["topologyConstraint"] = constraint
    subgroups = sequence(spec.get("subGroups"), "spec.subGroups")
    if subgroups:
        out["subGroups"] = [_subgroup(g, i, findings) for i, g in enumerate(subgroups)]
    _stale_grace(spec, out, findings)
    _unsupported(spec, findings)
    return {"apiVersion": API_VERSION, "kind": "PodGroup", "metadata": metadata, "spec": out}


def _drop_kai_annotations(metadata: dict[str, Any], findings: Findings) -> None:
    annotations = metadata.get("annotations", {})
    for key in _KAI_WRITTEN:
        if annotations.pop(key, None) is not None:
            findings.note(f"metadata.annotations[{key}]", "written by KAI; dropped")
    if "annotations" in metadata and not annotations:
        del metadata["annotations"]


def _min(block: dict[str, Any], key: str, path: str) -> int:
    """`minMember` (unset: 1, as KAI's scheduler reads it)."""
    if block.get(key) is None:
        return 1
    value = whole(block[key], f"{path}.{key}")
    if value < 0:
        raise InvalidFieldError(f"{path}.{key}", f"must not be negative, got {value}")
    return value


def _preemptible(value: Any) -> bool | None:
    choice = text(value, "spec.preemptibility") or ""
    if choice not in _PREEMPTIBILITY:
        raise InvalidFieldError(
            "spec.preemptibility", f"preemptible or non-preemptible, got {choice!r}"
        )
    return _PREEMPTIBILITY[choice]


def _constraint(value: Any, path: str) -> dict[str, str]:
    block = mapping(value, path)
    names = {
        "topology": "topology",
        "requiredTopologyLevel": "requiredLevel",
        "preferredTopologyLevel": "preferredLevel",
    }
    out = {}
    for kai, ours in names.items():
        written = text(block.get(kai), f"{path}.{kai}")
        if written:
            out[ours] = written
    return out


def _subgroup(value: Any, index: int, findings: Findings) -> dict[str, Any]:
    path = f"spec.subGroups[{index}]"
    block = mapping(value, path)
    name = text(block.get("name"), f"{path}.name")
    if name is None:
        raise InvalidFieldError(f"{path}.name", "is required")
    out: dict[str, Any] = {"name": name, "minMember": _min(block, "minMember", path)}
    parent = text(block.get("parent"), f"{path}.parent")
    if parent:
        out["parent"] = parent
    constraint = _constraint(block.get("topologyConstraint"), f"{path}.topologyConstraint")
    if constraint:
        out["topologyConstraint"] = constraint
    if block.get("minSubGroup") is not None:
        findings.change(
            f"{path}.minSubGroup",
            "kai-ray counts minSubGroup at the top of the group only; inside a subgroup "
            "every child must reach its minimum",
        )
    return out


def _stale_grace(spec: dict[str, Any], out: dict[str, Any], findings: Findings) -> None:
    value = spec.get("stalenessGracePeriod")
    if value is None:
        return
    seconds = go_duration_seconds(value, "spec.stalenessGracePeriod")
    if seconds < 0:
        findings.change(
            "spec.stalenessGracePeriod",
            "negative (never evict a stale gang) has no kai-ray equivalent; the "
            "scheduler's staleGangGracePeriod applies",
        )
        return
    out["staleGracePeriod"] = duration_text(seconds)


def _unsupported(spec: dict[str, Any], findings: Findings) -> None:
    if spec.get("preemptionDelay") is not None:
        findings.change(
            "spec.preemptionDelay",
            "kai-ray has no preemption delay: the group may cause evictions as soon as it waits",
        )
    for key in ("markUnschedulable", "schedulingBackoff"):
        if spec.get(key) is not None:
            findings.note(
                f"spec.{key}",
                "kai-ray always writes why a group waits on its status; dropped",
            )


def convert_topology(doc: dict[str, Any], findings: Findings) -> dict[str, Any]:
    spec = mapping(doc.get("spec"), "spec")
    unknown_fields(spec, ("levels",), "spec", findings)
    levels = spec.get("levels")
    if not isinstance(levels, list) or not levels:
        raise InvalidFieldError("spec.levels", "a list of at least one level is required")
    out = []
    for i, value in enumerate(levels):
        block = mapping(value, f"spec.levels[{i}]")
        label = text(block.get("nodeLabel"), f"spec.levels[{i}].nodeLabel")
        if label is None:
            raise InvalidFieldError(f"spec.levels[{i}].nodeLabel", "is required")
        level = {"nodeLabel": label}
        alias = text(block.get("alias"), f"spec.levels[{i}].alias")
        if alias:
            level["alias"] = alias
        out.append(level)
    metadata = new_metadata(doc, findings)
    return {
        "apiVersion": API_VERSION,
        "kind": "Topology",
        "metadata": metadata,
        "spec": {"levels": out},
    }
