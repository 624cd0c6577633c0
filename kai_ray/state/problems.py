"""Turning bad input into `Problem`s that name the object and the field.

Shared by the snapshot's builders so every problem reads the same way.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kai_ray.values import validation
from kai_ray.values.errors import InvalidFieldError, ObjectRef, Problem
from kai_ray.values.validation import problems_from


def object_ref(obj: Mapping[str, Any], kind: str | None = None) -> ObjectRef:
    """Who an object of `kind` is (`values.validation.object_ref`, the one reading)."""
    return validation.object_ref(obj, kind=kind)


def field_problem(ref: ObjectRef, err: InvalidFieldError) -> Problem:
    return Problem(ref, err.field, err.message)


def validation_problems(ref: ObjectRef, err: ValidationError) -> list[Problem]:
    """One problem per pydantic error, its location written as a field path."""
    return problems_from(err, ref)
