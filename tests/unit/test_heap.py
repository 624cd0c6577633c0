"""The cycle collector tuned while a cluster is held in memory, and put back after."""

from __future__ import annotations

import gc

from kai_ray.state.heap import YOUNGEST, long_lived_heap, settle


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


def test_a_block_inside_another_leaves_the_outer_setting_as_it_is() -> None:
    before = gc.get_threshold()
    with long_lived_heap():
        tuned = gc.get_threshold()
        kept = [[i] for i in range(1000)]
        settle()
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        with long_lived_heap():
            assert gc.get_threshold() == tuned
            assert gc.get_freeze_count() == frozen
        # The inner block's end neither gives back what the outer froze nor its tuning.
        assert gc.get_freeze_count() == frozen
        assert gc.get_threshold() == tuned
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
