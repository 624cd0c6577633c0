"""Turning bad input into `Problem`s that name the object and the field.

Shared by the snapshot's builders so every problem reads the same way.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kai_ray.values.errors import InvalidFieldError, ObjectRef, Problem


def object_ref(obj: Mapping[str, Any], kind: str | None = None) -> ObjectRef:
    """Who an object is, read defensively: a bad object must still be named."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        metadata = {}
    return ObjectRef(
        kind=str(kind or obj.get("kind") or "object"),
        name=str(metadata.get("name") or "<unnamed>"),
        namespace=metadata.get("namespace"),
    )


def field_problem(ref: ObjectRef, err: InvalidFieldError) -> Problem:
    return Problem(ref, err.field, err.message)


def validation_problems(ref: ObjectRef, err: ValidationError) -> list[Problem]:
    """One problem per pydantic error, its location written as a field path."""
    return [
        Problem(ref, field_path(error["loc"]) or "<object>", error["msg"])
        for error in err.errors(include_url=False)
    ]


def field_path(location: tuple[int | str, ...]) -> str:
    """('spec', 'subGroups', 0, 'minMember') -> 'spec.subGroups[0].minMember'."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path
