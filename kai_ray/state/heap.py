"""The cycle collector, tuned for a process that keeps a cluster in memory.

The simulator and the operator hold every object of a cluster for as long as
they run (pods, nodes, PodGroups, their readings and snapshots) and allocate
briskly in each cycle. Python's cycle collector walks the long-lived objects
again and again as they do: a quarter of a simulated run, and a fifth of the
operator's CPU in a burst of 4,000 pods (docs/benchmarks.md). Nothing the
cycle keeps makes reference cycles, so collecting less often loses nothing.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import time
from collections.abc import Callable, Iterator

#: The youngest generation may grow to this many objects before a collection
#: (Python's default is 700), and the older ones are collected more rarely
#: (after 20 and 100 collections of the younger, not 10 and 10).
YOUNGEST, MIDDLE, OLDEST = 50_000, 20, 100


@contextlib.contextmanager
def long_lived_heap() -> Iterator[None]:
    """Collect cycles less often while the block runs: what is alive on entry is
    moved out of the collector's sight (`gc.freeze`; `settle` does so again for
    what came since) and the youngest generation grows larger. Both are restored
    on exit."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], YOUNGEST), MIDDLE, OLDEST)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def settle() -> None:
    """Move what is alive now out of the collector's sight (within `long_lived_heap`):
    for the state a process has just loaded, which it keeps."""
    gc.freeze()


class Settler:
    """For a loop that keeps what it reads (the operator): after each cycle, what
    outlived it is moved out of the collector's sight (`settle`), so that the
    collector's passes, however rare, never walk the whole cluster again (one walk
    of 10,000 pending pods and their PodGroups takes over half a second: a cycle
    it fell in ran twice as long). Objects moved out are still freed when the
    last reference goes; only reference cycles among them wait for the full
    collection made here between two cycles, when the process's peak resident
    memory has grown by `growth` since the last one or `every_s` seconds have
    passed. (The peak is one system call; counting the objects moved out walks
    them all, some milliseconds per million.)"""

    def __init__(
        self,
        every_s: float = 600.0,
        growth: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        peak_memory: Callable[[], float] | None = None,
    ) -> None:
        self.every_s, self.growth, self.clock = every_s, growth, clock
        self.peak_memory = peak_memory or _peak_rss
        self._last_full = clock()
        self._peak_after_full = self.peak_memory()

    def after_cycle(self) -> float | None:
        """Settles what is alive; returns the seconds a full collection took when one
        was made (None when not)."""
        now = self.clock()
        grown = self.peak_memory() > self._peak_after_full * (1 + self.growth)
        if not grown and now - self._last_full < self.every_s:
            settle()
            return None
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        settle()
        self._last_full, self._peak_after_full = now, self.peak_memory()
        return time.perf_counter() - started


def _peak_rss() -> float:
    """The process's peak resident memory (in the platform's unit: only ratios are read)."""
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
