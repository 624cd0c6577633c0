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
from collections.abc import Iterator

#: The youngest generation may grow to this many objects before a collection
#: (Python's default is 700), and the older ones are collected more rarely
#: (after 20 and 100 collections of the younger, not 10 and 10).
YOUNGEST, MIDDLE, OLDEST = 50_000, 20, 100


#: How many `long_lived_heap` blocks are open (the outermost tunes and restores).
_open = 0


@contextlib.contextmanager
def long_lived_heap() -> Iterator[None]:
    """Collect cycles less often while the block runs: what is alive on entry is
    moved out of the collector's sight (`gc.freeze`; `settle` does so again for
    what came since) and the youngest generation grows larger. Both are restored
    on exit. A block inside another runs within the outer one's setting and leaves
    it as it is (the simulator's run inside the command that loads its input)."""
    global _open
    if _open:
        _open += 1
        try:
            yield
        finally:
            _open -= 1
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], YOUNGEST), MIDDLE, OLDEST)
    _open += 1
    try:
        yield
    finally:
        _open -= 1
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def settle() -> None:
    """Move what is alive now out of the collector's sight (within `long_lived_heap`):
    for the state a process has just loaded, which it keeps. Inside
    `collector_paused`, before the collector comes back: what the block made was
    never collected, so it is all in the youngest generation, and the first
    collection after the pause would walk every object of it (2 s after loading
    the 4,096-node week)."""
    gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cycle collection while the block runs, for a block that makes many objects
    and keeps them (a snapshot built; a simulation's inputs read and loaded): each
    full pass would walk every object made so far and find nothing to free (40% of a
    snapshot's build at 40,000 pods; half of loading the 80,000 jobs of the 4,096-node
    week). The collector's state is restored on exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
