"""KAI's Queue (`scheduling.run.ai/v2`) as kai-ray's (`scheduling.kai-ray.io/v1alpha1`).

Each of KAI's three resource blocks keeps its meaning exactly where kai-ray can say
the same thing:

- units: KAI's millicores become cores and its megabytes `M` (10^6 bytes);
- `limit`: -1 (no limit) is no limit; 0 or unset is a limit of 0, which blocks
  every pod asking for the resource, in KAI and as written here;
- `overQuotaWeight`: unset is 0 in KAI (no share of the surplus); kai-ray's default
  is 1, so the weight is always written;
- `quota`: -1 (everything the queue asks for) is the limit when there is one, and
  has no kai-ray equivalent when there is none (a change); a quota above the limit
  is the limit (KAI never gives more; kai-ray refuses quota > limit).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kai_ray.tools.migrate.findings import Findings
from kai_ray.tools.migrate.objects import mapping, new_metadata, text, unknown_fields
from kai_ray.tools.migrate.units import (
    UNLIMITED,
    cpu_quantity,
    duration_text,
    go_duration_seconds,
    gpu_quantity,
    memory_quantity,
    number,
    whole,
)
from kai_ray.values.api import API_VERSION
from kai_ray.values.errors import InvalidFieldError

KAI_QUEUE_API = "scheduling.run.ai/v2"
_SPEC_FIELDS = (
    "displayName",
    "parentQueue",
    "resources",
    "priority",
    "preemptMinRuntime",
    "reclaimMinRuntime",
)
#: KAI's resource blocks: how their numbers become quantities, and their unit's name.
_RESOURCES: dict[str, tuple[Callable[[float], int | str], str]] = {
    "gpu": (gpu_quantity, "GPUs"),
    "cpu": (cpu_quantity, "millicores"),
    "memory": (memory_quantity, "megabytes"),
}
NODE_POOL_LABEL = "kai.scheduler/node-pool"


def convert_queue(doc: dict[str, Any], findings: Findings) -> dict[str, Any]:
    spec = mapping(doc.get("spec"), "spec")
    unknown_fields(spec, _SPEC_FIELDS, "spec", findings)
    metadata = new_metadata(doc, findings)
    if NODE_POOL_LABEL in metadata.get("labels", {}):
        findings.change(
            f"metadata.labels[{NODE_POOL_LABEL}]",
            "kai-ray has no scheduling shards: one scheduler divides every node among "
            "all Queues; merge the node pools' queue trees under one root each",
        )
    if spec.get("displayName"):
        findings.note("spec.displayName", "kai-ray names a queue by metadata.name; dropped")
    out: dict[str, Any] = {}
    parent = text(spec.get("parentQueue"), "spec.parentQueue")
    if parent:
        out["parentQueue"] = parent
    out["priority"] = _priority(spec.get("priority"), findings)
    for key in ("preemptMinRuntime", "reclaimMinRuntime"):
        if spec.get(key) is not None:
            out[key] = _min_runtime(spec[key], f"spec.{key}")
    if parent and "reclaimMinRuntime" in out:
        findings.change(
            "spec.reclaimMinRuntime",
            "KAI reads a reclaimed job's protection from the queue just below the lowest "
            "common ancestor of the two queues (then up); kai-ray from the reclaimed job's "
            "queue up, so this value also protects from reclaims across its parent",
        )
    out["resources"] = _resources(spec, findings)
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": metadata, "spec": out}


def _priority(value: Any, findings: Findings) -> int:
    if value is None:
        return 100
    priority = whole(value, "spec.priority")
    if priority < 0:
        findings.change(
            "spec.priority", f"kai-ray's priorities start at 0; {priority} is written as 0"
        )
        return 0
    return priority


def _min_runtime(value: Any, field: str) -> str:
    seconds = go_duration_seconds(value, field)
    if seconds < 0:
        raise InvalidFieldError(field, f"a minimum runtime cannot be negative: {value!r}")
    return duration_text(seconds)


def _resources(spec: dict[str, Any], findings: Findings) -> dict[str, Any]:
    if spec.get("resources") is None:
        findings.note(
            "spec.resources",
            "unset: in KAI every limit is then 0 (the queue takes nothing); written so",
        )
    resources = mapping(spec.get("resources"), "spec.resources")
    unknown_fields(resources, tuple(_RESOURCES), "spec.resources", findings)
    out, unbounded = {}, []
    for name in _RESOURCES:
        out[name], everything = _resource(resources.get(name), name, findings)
        if everything:
            unbounded.append(name)
    if unbounded:
        findings.change(
            f"spec.resources.{{{','.join(unbounded)}}}.quota",
            "-1 with limit -1 (everything the queue asks for, never reclaimed from) has "
            "no kai-ray equivalent: written as no quota, so the queue shares what is free "
            "by its weight and may be reclaimed from; to keep the guarantee, set a quota "
            "as large as the queue may hold",
        )
    return out


def _resource(value: Any, name: str, findings: Findings) -> tuple[dict[str, Any], bool]:
    """One resource block, and whether its quota was "everything" without a limit."""
    path = f"spec.resources.{name}"
    block = mapping(value, path)
    unknown_fields(block, ("quota", "limit", "overQuotaWeight"), path, findings)
    quota, limit, weight = (
        _bound(block, key, path) for key in ("quota", "limit", "overQuotaWeight")
    )
    if weight < 0:
        raise InvalidFieldError(f"{path}.overQuotaWeight", f"must not be negative, got {weight:g}")
    quantity, unit = _RESOURCES[name]
    out: dict[str, Any] = {}
    quota_written = _quota(quota, limit, path, unit, findings)
    if quota_written is not None:
        out["quota"] = quantity(quota_written)
    if limit != UNLIMITED:
        out["limit"] = quantity(limit)
        if limit == 0 and "limit" not in block:
            findings.note(
                f"{path}.limit",
                f"unset: a limit of 0 in KAI, which refuses every pod asking for {name}; "
                "written as limit 0 (drop it for no limit)",
            )
    out["overQuotaWeight"] = int(weight) if weight.is_integer() else weight
    room_over_quota = limit == UNLIMITED or limit > (quota_written or 0)
    if "overQuotaWeight" not in block and room_over_quota:
        findings.note(
            f"{path}.overQuotaWeight",
            "unset: 0 in KAI (no share of the surplus; kai-ray's default is 1); written as 0",
        )
    return out, quota == UNLIMITED and limit == UNLIMITED


def _bound(block: dict[str, Any], key: str, path: str) -> float:
    """A quota, limit or weight: unset is 0, and -1 is the only negative KAI knows."""
    value = number(block.get(key, 0), f"{path}.{key}")
    if value < 0 and value != UNLIMITED:
        raise InvalidFieldError(f"{path}.{key}", f"-1 (unlimited) or >= 0, got {value:g}")
    return value


def _quota(quota: float, limit: float, path: str, unit: str, findings: Findings) -> float | None:
    """The quota to write, in KAI's unit; None for no quota."""
    if quota == UNLIMITED and limit == UNLIMITED:
        return None
    if quota == UNLIMITED:
        findings.note(
            f"{path}.quota",
            f"-1 (everything it asks for) is, under a limit of {limit:g} {unit}, that limit",
        )
        return limit
    if limit != UNLIMITED and quota > limit:
        findings.note(
            f"{path}.quota",
            f"{quota:g} is above the limit {limit:g}, which KAI never exceeds; written as "
            "the limit (kai-ray refuses a quota above its limit)",
        )
        return limit
    return quota if quota > 0 else None
