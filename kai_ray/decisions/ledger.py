"""The queue ledger: what each queue holds during one cycle, as the actions change it.

Filled at the start of the cycle with what the queues hold (`booking.held_ledger`)
and grown or shrunk only by `booking.book`; ordering and admission read it.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kai_ray.state.queues import QueueTree
from kai_ray.values.resources import Resources


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
        return self.typed.get(name, Resources())

    def held(self, name: str) -> Resources:
        return self.allocated.get(name, Resources())

    def held_non_preemptible(self, name: str) -> Resources:
        return self.non_preemptible.get(name, Resources())
