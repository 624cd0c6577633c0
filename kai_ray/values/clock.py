"""Clocks: the only place that reads the wall clock.

Everything else is handed a `Clock`; the simulator and the tests pass a
`VirtualClock` they move by hand.
"""

from __future__ import annotations

import datetime as dt
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


#: Where the simulator's virtual clock starts, as Unix time: its objects' timestamps and
#: the `now` it hands the cycle count from here, so that they agree with each other.
SIM_EPOCH_S = 1767225600.0  # 2026-01-01T00:00:00Z

_UNIX = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def rfc3339(seconds: float) -> str:
    """Unix seconds as the RFC 3339 time Kubernetes writes (microseconds, UTC)."""
    moment = _UNIX + dt.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def unix_seconds(text: str | None) -> float | None:
    """An RFC 3339 time as Unix seconds; None for a missing or unreadable time."""
    if not text:
        return None
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - _UNIX).total_seconds()
