"""The queue ledger: what each queue holds during one cycle, as the actions change it.

Filled at the start of the cycle with what the queues hold (`booking.held_ledger`)
and grown or shrunk only by `booking.book`; ordering and admission read it.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kai_ray.state.queues import QueueTree
from kai_ray.values.resources import NO_RESOURCES, Resources

T = TypeVar("T")


@dataclass
class QueueLedger:
    """What each queue holds this cycle, rolled up to every ancestor; it grows as
    jobs are placed. `non_preemptible` counts only non-preemptible jobs."""

    tree: QueueTree
    fair_share: Mapping[str, Resources]
    allocated: dict[str, Resources] = field(default_factory=dict)
    non_preemptible: dict[str, Resources] = field(default_factory=dict)
    #: GPUs by per-type key (`nvidia.com/gpu.product=H100`); only limits read these.
    typed: dict[str, Resources] = field(default_factory=dict)
    #: A new number for every change through `add` and `add_typed`: equal versions
    #: of one ledger mean equal holdings (what an action kept from an attempt is
    #: known to hold only while the ledger is at the same version).
    version: int = 0
    #: Answers worked out from the holdings at `_answers_at` (`answer`).
    _answers: dict[Hashable, Any] = field(default_factory=dict, compare=False, repr=False)
    _answers_at: int = field(default=-1, compare=False, repr=False)

    def answer(self, key: Hashable, work_out: Callable[[], T]) -> T:
        """What `work_out` gives, kept while the holdings stay as they are (the same
        version): for a question of the holdings, the tree and what `key` names.
        A deep backlog asks the same question (may this queue take one more GPU?)
        thousands of times between two changes."""
        if self._answers_at != self.version:
            self._answers.clear()
            self._answers_at = self.version
        if key not in self._answers:
            self._answers[key] = work_out()
        found: T = self._answers[key]
        return found

    def path(self, leaf: str) -> tuple[str, ...]:
        """The leaf and its ancestors, leaf first."""
        return (leaf, *self.tree.ancestors(leaf))

    def add(self, leaf: str, amount: Resources, preemptible: bool) -> None:
        self.version += 1
        for name in self.path(leaf):
            self.allocated[name] = self.held(name) + amount
            if not preemptible:
                self.non_preemptible[name] = self.held_non_preemptible(name) + amount

    def add_typed(self, leaf: str, amount: Resources) -> None:
        self.version += 1
        for name in self.path(leaf):
            self.typed[name] = self.held_typed(name) + amount

    def held_typed(self, name: str) -> Resources:
        return self.typed.get(name, NO_RESOURCES)

    def held(self, name: str) -> Resources:
        return self.allocated.get(name, NO_RESOURCES)

    def held_non_preemptible(self, name: str) -> Resources:
        return self.non_preemptible.get(name, NO_RESOURCES)
