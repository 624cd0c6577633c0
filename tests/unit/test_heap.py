"""The cycle collector tuned while a cluster is held in memory, and put back after."""

from __future__ import annotations

import gc
import weakref

from kai_ray.state.heap import YOUNGEST, Settler, long_lived_heap, settle


def test_the_collector_is_tuned_inside_and_restored_after() -> None:
    before, frozen_before = gc.get_threshold(), gc.get_freeze_count()
    with long_lived_heap():
        assert gc.get_threshold()[0] >= YOUNGEST
        frozen = gc.get_freeze_count()
        assert frozen > frozen_before  # what was alive on entry is out of sight
        kept = [[i] for i in range(1000)]  # lists: the collector tracks them
        settle()
        assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


class Cycle:
    """An object in a reference cycle with itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_the_settler_keeps_what_outlives_a_cycle_and_collects_in_full_now_and_then() -> None:
    now = [0.0]
    with long_lived_heap():
        settler = Settler(every_s=600.0, clock=lambda: now[0], peak_memory=lambda: 1.0)
        kept = [[i] for i in range(100)]
        assert settler.after_cycle() is None  # nothing grew much, no time passed
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        # Garbage in a cycle, moved out of sight while alive, waits for a full
        # collection: a young-generation pass does not see it.
        garbage = weakref.ref(Cycle())
        settler.after_cycle()
        gc.collect(0)
        assert garbage() is not None
        now[0] = 599.0
        assert settler.after_cycle() is None
        assert garbage() is not None
        now[0] = 600.0
        took = settler.after_cycle()
        assert took is not None and took >= 0.0
        assert garbage() is None  # the full collection freed it
        assert gc.get_freeze_count() >= len(kept)  # and what is alive is out of sight again


def test_the_settler_collects_in_full_when_peak_memory_grew_by_half() -> None:
    peak = [100.0]
    with long_lived_heap():
        settler = Settler(every_s=3600.0, clock=lambda: 0.0, peak_memory=lambda: peak[0])
        peak[0] = 150.0
        assert settler.after_cycle() is None  # half, not more
        peak[0] = 151.0
        assert settler.after_cycle() is not None
        peak[0] = 200.0
        assert settler.after_cycle() is None  # counted again from the full collection
        peak[0] = 227.0
        assert settler.after_cycle() is not None
