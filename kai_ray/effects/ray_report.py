"""What the operator tells about its Ray placement backend: log, metrics, Event, health.

The Ray backend falls back to the local one when Ray is lost, and tries Ray
again after `rayBackend.retryAfter` (`decisions/placement/ray_link.py`). After
each cycle the loop hands `RayReport.cycle_ended` the link's status; it then
- logs a warning when placement falls back, and an info line when Ray is back
  (once per change, not once per cycle; a retry that fails is a debug line);
- sets the metrics (`kai_ray_ray_backend_available`, `..._fallbacks_total`);
- posts an Event (`RayBackendLost` Warning, `RayBackendRestored` Normal)
  through the callable it is given (the loop's: on the leader Lease);
- keeps one line for the health endpoints' body (`health_line`).
Does no I/O of its own (the Event callable and the log aside).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kai_ray.decisions.placement.ray_link import RayStatus
from kai_ray.effects.metrics import SchedulerMetrics
from kai_ray.values.clock import rfc3339

LOG = logging.getLogger("kai_ray.loop")
#: Posts an Event: (warning, reason, message).
EventPoster = Callable[[bool, str, str], None]


class RayReport:
    """Follows the Ray link's status from cycle to cycle (see the module docstring)."""

    def __init__(self, metrics: SchedulerMetrics, post_event: EventPoster | None = None) -> None:
        self.metrics, self.post_event = metrics, post_event
        self._lock = threading.Lock()
        self.last = RayStatus()

    def cycle_ended(self, status: RayStatus, cycle: int) -> None:
        """Tell what changed since the last cycle (nothing when nothing did)."""
        with self._lock:
            last, self.last = self.last, status
        self.metrics.set_ray_backend(status)
        if status == last or not status.tried:
            return
        if status.fallbacks > last.fallbacks:
            message = f"Ray backend lost: {status.reason}; placing with the local backend"
            LOG.warning("[cycle %d] %s, Ray tried again at %s", cycle, message, _when(status))
            self._post(True, "RayBackendLost", message)
        elif status.available and not last.available:
            message = "Ray backend connected; placing with Ray"
            if last.tried:
                message = f"Ray backend connected again after {status.since - last.since:.0f} s"
                message += "; placing with Ray"
            LOG.info("[cycle %d] %s", cycle, message)
            if last.tried:
                self._post(False, "RayBackendRestored", message)
        elif not status.available:
            LOG.debug("[cycle %d] Ray backend still lost: %s", cycle, status.reason)

    def health_line(self) -> str:
        """The Ray backend in one line for `/healthz` and `/readyz` ("" when never used)."""
        with self._lock:
            status = self.last
        if not status.tried:
            return ""
        if status.available:
            return f"ray backend: connected since {rfc3339(status.since)}"
        return (
            f"ray backend: lost since {rfc3339(status.since)} ({status.reason}); "
            f"placing with the local backend; next try at {_when(status)}"
        )

    def _post(self, warning: bool, reason: str, message: str) -> None:
        if self.post_event is not None:
            self.post_event(warning, reason, message)


def _when(status: RayStatus) -> str:
    return rfc3339(status.retry_at) if status.retry_at is not None else "the next cycle"
