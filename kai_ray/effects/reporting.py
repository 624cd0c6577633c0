"""What the operator writes on an object it cannot use: a `Valid` condition.

Pure construction of the status patch; kopf applies it. The operator never
crashes on a bad object: it validates with the same models as the CRDs and the
simulator and reports every problem, naming the field, on the object itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kai_ray.values.api import API_KINDS
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.validation import parse_model

VALID = "Valid"


def validity_condition(kind: str, body: Mapping[str, Any], now: str) -> dict[str, str]:
    """The `Valid` condition of one kai-ray object, its message naming bad fields."""
    try:
        parse_model(API_KINDS[kind], _without_status(body))
    except InvalidObjectError as err:
        message = "; ".join(f"{p.field}: {p.message}" for p in err.problems)
        return _condition("False", "InvalidSpec", message, now)
    return _condition("True", "SpecValid", "", now)


def _without_status(body: Mapping[str, Any]) -> dict[str, Any]:
    # The status is ours to write; only what the user wrote is judged.
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": kept,
        "spec": body.get("spec") or {},
    }


def _condition(status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": VALID,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def merge_condition(
    conditions: list[Mapping[str, Any]] | None, new: dict[str, str]
) -> list[dict[str, Any]]:
    """Replace the condition of the same type; keep its transition time if unchanged."""
    merged: list[dict[str, Any]] = []
    for old in conditions or []:
        if old.get("type") != new["type"]:
            merged.append(dict(old))
        elif old.get("status") == new["status"]:
            new = {**new, "lastTransitionTime": str(old.get("lastTransitionTime", ""))}
    merged.append(new)
    return merged
