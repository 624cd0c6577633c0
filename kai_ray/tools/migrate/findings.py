"""What the migration could not carry over unchanged, said per object and field.

A finding is a *note* when kai-ray keeps KAI's behaviour (a field dropped that
decides nothing, a value spelled differently) and a *change* when the converted
manifests would schedule differently from KAI (a feature kai-ray lacks, a value it
cannot express). Changes make `kai-ray migrate` exit with status 1. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    source: str
    obj: str
    field: str
    message: str
    changes_behaviour: bool

    def __str__(self) -> str:
        kind = "changes behaviour" if self.changes_behaviour else "note"
        return f"{kind}: {self.source}: {self.obj}: {self.field}: {self.message}"


@dataclass
class Findings:
    """The findings about one object, collected as it is converted."""

    source: str
    obj: str
    found: list[Finding] = field(default_factory=list)

    def note(self, path: str, message: str) -> None:
        self.found.append(Finding(self.source, self.obj, path, message, False))

    def change(self, path: str, message: str) -> None:
        self.found.append(Finding(self.source, self.obj, path, message, True))
