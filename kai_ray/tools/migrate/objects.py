"""Reading KAI objects: typed field access that names the field, and metadata.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from kai_ray.tools.migrate.findings import Findings
from kai_ray.values.errors import InvalidFieldError

#: Metadata the API server or a client writes; never carried to a new object.
SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "ownerReferences",
    "finalizers",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def mapping(value: Any, field: str) -> dict[str, Any]:
    """A YAML mapping (None is an empty one)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidFieldError(field, f"expected a mapping, got {value!r}")
    return value


def sequence(value: Any, field: str) -> list[Any]:
    """A YAML list (None is an empty one)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidFieldError(field, f"expected a list, got {value!r}")
    return value


def text(value: Any, field: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidFieldError(field, f"expected a string, got {value!r}")
    return value


def new_metadata(doc: dict[str, Any], findings: Findings) -> dict[str, Any]:
    """Name, namespace, labels and annotations of a KAI object, for its kai-ray twin."""
    meta = mapping(doc.get("metadata"), "metadata")
    name = text(meta.get("name"), "metadata.name")
    if name is None:
        raise InvalidFieldError("metadata.name", "is required")
    out: dict[str, Any] = {"name": name}
    if meta.get("namespace"):
        out["namespace"] = text(meta["namespace"], "metadata.namespace")
    labels = dict(mapping(meta.get("labels"), "metadata.labels"))
    annotations = dict(mapping(meta.get("annotations"), "metadata.annotations"))
    annotations.pop(LAST_APPLIED, None)
    if labels:
        out["labels"] = labels
    if annotations:
        out["annotations"] = annotations
    if any(key in meta for key in ("ownerReferences", "finalizers")):
        findings.note("metadata", "owner references and finalizers are not carried over")
    return out


def unknown_fields(
    block: dict[str, Any], known: tuple[str, ...], path: str, findings: Findings
) -> None:
    """Fields KAI's schema does not have: its API server would have dropped them."""
    for key in block:
        if key not in known:
            findings.note(f"{path}.{key}", "not a field of KAI's schema; dropped")
