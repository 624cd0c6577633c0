"""Problems found in input objects, and the exception that carries them.

A `Problem` names the object and the field that is wrong, so that a person can fix
it; the operator reports problems on the object, the simulator prints them and
exits with status 2. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ObjectRef:
    """Which object a problem is about: `Kind namespace/name`, from `source` if known."""

    kind: str
    name: str
    namespace: str | None = None
    source: str | None = None

    def __str__(self) -> str:
        name = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {name}"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one field of one object."""

    obj: ObjectRef
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.obj.source}: " if self.obj.source else ""
        return f"{where}{self.obj}: {self.field}: {self.message}"


class InvalidFieldError(ValueError):
    """A single field could not be understood; the caller adds the object."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InvalidObjectError(ValueError):
    """An object (or several) cannot be used; carries every problem found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = tuple(problems)


class UnavailableError(Exception):
    """What a command needs cannot be had: a cluster that cannot be read, an object
    that is not there. Its text is one line for a person, never a traceback."""
