"""Clocks: the only place that reads the wall clock.

Everything else is handed a `Clock`; the simulator and the tests pass a
`VirtualClock` they move by hand.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock that moves only when told to; never backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time cannot go back from {self._now} to {t}")
        self._now = t
