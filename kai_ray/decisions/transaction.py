"""The one transaction type every what-if goes through.

A `Transaction` holds the working copy of what a cycle changes (free resources
per node and free fraction per GPU device) over a read-only snapshot, and an
undo log. `checkpoint()` marks a point, `rollback(mark)` undoes everything after
it, `commit()` keeps all so far, `discard()` undoes all. Gangs are placed inside
a checkpoint: if any member fails, the attempt rolls back and nothing is bound.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.plan import Bind
from kai_ray.state.snapshot import Snapshot


@dataclass(frozen=True)
class Placement:
    """One pod placed on one node: what it took and from which devices."""

    bind: Bind
    node: int
    taken: npt.NDArray[np.float64]
    device_fraction: float = 0.0


class Transaction:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.free = snapshot.free.copy()
        self.devices = [d.free.copy() for d in snapshot.gpu_devices]
        self.placements: list[Placement] = []
        self._committed = 0

    def checkpoint(self) -> int:
        return len(self.placements)

    def place(self, placement: Placement) -> None:
        self.free[placement.node] -= placement.taken
        self._take_devices(placement, -1.0)
        self.placements.append(placement)

    def rollback(self, mark: int) -> None:
        if mark < self._committed:
            raise ValueError(f"cannot roll back to {mark}: committed up to {self._committed}")
        while len(self.placements) > mark:
            placement = self.placements.pop()
            self.free[placement.node] += placement.taken
            self._take_devices(placement, +1.0)

    def commit(self) -> None:
        self._committed = len(self.placements)

    def discard(self) -> None:
        self.rollback(self._committed)

    def binds(self) -> list[Bind]:
        return [p.bind for p in self.placements[: self._committed]]

    def _take_devices(self, placement: Placement, sign: float) -> None:
        devices = self.devices[placement.node]
        for index in placement.bind.gpu_devices:
            amount = placement.device_fraction if placement.device_fraction else 1.0
            devices[index] += sign * amount
