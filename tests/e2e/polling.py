"""Waiting on a live cluster with deadlines, never with long fixed sleeps.

`eventually` polls until a probe returns something truthy; `holds` checks that
a probe stays truthy for a while (how "nothing is bound" is shown: a scheduler
that binds late would be caught within the window).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.25


def eventually(
    probe: Callable[[], T | None], timeout: float = 60, what: str = "", interval: float = POLL_S
) -> T:
    """Poll `probe` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}")
        time.sleep(interval)


def holds(probe: Callable[[], object], seconds: float, what: str = "") -> None:
    """Fail as soon as `probe` turns falsy within the next `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if not probe():
            raise AssertionError(f"no longer true: {what or probe}")
        if time.monotonic() > deadline:
            return
        time.sleep(POLL_S)
