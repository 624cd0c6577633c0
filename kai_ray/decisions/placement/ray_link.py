"""Whether this process can use its Ray backend, and since when it cannot.

The Ray backend's connection is the process's (one `ray.init`, one set of shard
actors), so its health is too. `RAY_LINK` records it: connected, or lost since
when and why, how many times placement fell back to the local backend, and when
Ray may be tried again (`rayBackend.retryAfter` after the last failure).
`backend_choice` asks it before it makes a Ray backend and tells it how that
went; the operator reads `status()` after each cycle to log, count and show it
(docs/placement.md). Bookkeeping only: no I/O, no Ray; the time is its clock's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from kai_ray.values.clock import Clock, WallClock


class RayUnavailable(Exception):
    """Ray did not answer (unreachable, an actor died, a query timed out): the
    transaction goes on with the local backend. The message says what failed."""


@dataclass(frozen=True)
class RayStatus:
    """The process's Ray backend as the operator shows it."""

    #: Whether Ray was ever asked for (never, when placement has always been local).
    tried: bool = False
    #: Connected and answering (False from a failure until a retry connects).
    available: bool = False
    #: When it last became available, or was lost (clock seconds).
    since: float = 0.0
    #: Why it was lost (the last failure); empty while available.
    reason: str = ""
    #: Times placement fell back to the local backend (a failed retry is not one more).
    fallbacks: int = 0
    #: When Ray may be tried again, while it is lost.
    retry_at: float | None = None


class RayLink:
    """The state of one process's Ray connection (see the module docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or WallClock()
        self._lock = threading.Lock()
        self._status = RayStatus()

    def status(self) -> RayStatus:
        with self._lock:
            return self._status

    def may_try(self) -> bool:
        """Ray may be used: it was never lost, or its retry time has come."""
        status = self.status()
        if status.available or not status.tried:
            return True
        return status.retry_at is not None and self.clock.now() >= status.retry_at

    def connected(self) -> None:
        """Ray answered: available from now (unchanged when it already was)."""
        with self._lock:
            if not self._status.available:
                now = self.clock.now()
                self._status = replace(
                    self._status, tried=True, available=True, since=now, reason="", retry_at=None
                )

    def lost(self, reason: str, retry_after_s: float) -> None:
        """Ray failed: local until `retry_after_s` from now. Losing a connection (or
        the first try) counts a fallback; a retry that fails only moves the retry on."""
        with self._lock:
            now, status = self.clock.now(), self._status
            fell_back = status.available or not status.tried
            self._status = RayStatus(
                tried=True,
                available=False,
                since=now if fell_back else status.since,
                reason=reason,
                fallbacks=status.fallbacks + (1 if fell_back else 0),
                retry_at=now + retry_after_s,
            )


#: The process's link: one Ray connection per process, as in `ray_backend`.
RAY_LINK = RayLink()
