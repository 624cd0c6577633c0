"""The workload mix of `placementStrategy: fragmentation`, kept from cycle to cycle.

`ClassCounts` follows the cache's snapshots by the pods that changed. After any
sequence of the cache's events (the kept-snapshot test's), the mix made from the
kept counts must be the mix of counts made afresh on the same snapshot, to the
last bit: the same classes, in the same order, with the same probabilities.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.placement.mix import ClassCounts, _time, _Times, class_key
from kai_ray.decisions.totals import GroupTotals
from kai_ray.state.cache import POD, ClusterCache
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import FragmentationScoring, SchedulerConfig
from tests.builders import make_pod
from tests.unit.test_group_totals import EVENTS
from tests.unit.test_incremental_snapshot import PODS, SCHEDULER, apply, pod_events, started

#: The snapshot's events, with more pods coming, changing and going.
MIX_EVENTS = st.one_of(
    EVENTS, pod_events, pod_events, st.tuples(st.just("delete pod"), st.integers(0, PODS - 1))
)
SETTINGS = [
    pytest.param(FragmentationScoring(), id="one-hour half-life"),
    pytest.param(FragmentationScoring(halfLife="0s"), id="no decay"),
    pytest.param(FragmentationScoring(halfLife="1s", coverage=0.5), id="short, half covered"),
]


def mix_of_counts(counts: ClassCounts, settings: FragmentationScoring) -> list[tuple[Any, float]]:
    return [(class_key(pod), p) for pod, p in counts.mix(settings).heaviest()]


def fresh(snapshot: Snapshot, settings: FragmentationScoring) -> list[tuple[Any, float]]:
    return mix_of_counts(ClassCounts().follow(snapshot.pods), settings)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(MIX_EVENTS, min_size=1, max_size=40))
def test_kept_counts_give_the_fresh_mix_after_every_event(steps: list[tuple[Any, ...]]) -> None:
    cache, clock = started()
    # Told what changed, or comparing every pod; following every snapshot, or one in two
    # (what changed then spans a snapshot it did not see: it compares every pod).
    kept, walking, skipping = ClassCounts(), ClassCounts(), ClassCounts()
    for number, step in enumerate(steps):
        apply(cache, clock, step)
        snapshot = cache.snapshot()
        followers = [
            kept.follow(snapshot.pods, snapshot.pods_changed),
            walking.follow(snapshot.pods),
        ]
        if number % 2:
            followers.append(skipping.follow(snapshot.pods, snapshot.pods_changed))
        for scoring in (FragmentationScoring(), FragmentationScoring(halfLife="0s")):
            expected = fresh(snapshot, scoring)
            assert all(mix_of_counts(counts, scoring) == expected for counts in followers)


@pytest.mark.parametrize("scoring", SETTINGS)
def test_the_mix_does_not_depend_on_the_order_pods_came_in(scoring: FragmentationScoring) -> None:
    """The same live pods, reached by two histories, give the same mix."""
    pods = [
        make_pod(f"p{i}").cpu(str(1 + i % 3)).gpu_fraction(0.25 * (1 + i % 2)).created(i % 5)
        for i in range(12)
    ]
    forward, backward = _cache(), _cache()
    for builder in pods:
        forward.upsert(builder.build(), POD)
    for builder in reversed(pods):
        backward.upsert(builder.build(), POD)
    backward.upsert(make_pod("gone").gpus(2).created(9).build(), POD)
    kept = ClassCounts().follow(backward.snapshot().pods)
    backward.delete(POD, "default/gone")
    kept.follow(backward.snapshot().pods)
    assert mix_of_counts(kept, scoring) == fresh(forward.snapshot(), scoring)


def test_finished_pods_leave_the_mix() -> None:
    cache = _cache()
    cache.upsert(make_pod("a").gpus(1).created(0).build(), POD)
    cache.upsert(make_pod("b").gpu_fraction(0.5).created(0).build(), POD)
    kept = ClassCounts().follow(cache.snapshot().pods)
    cache.upsert(make_pod("b").gpu_fraction(0.5).created(0).phase("Succeeded").build(), POD)
    ((pod, probability),) = (
        kept.follow(cache.snapshot().pods).mix(FragmentationScoring()).heaviest()
    )
    assert pod.gpu_share is None and probability == 1.0


def test_a_cycle_with_kept_counts_decides_as_one_without() -> None:
    cache, clock = started()
    for i in range(4):
        apply(cache, clock, ("group", i, {"queue": "team-a", "min_member": 1}))
    config = SchedulerConfig.model_validate(
        {"spec": {"actions": ["allocate"], "placementStrategy": "fragmentation"}}
    )
    kept = GroupTotals()
    for wave in range(4):
        for i in range(8):
            bound = i < 2 * wave
            apply(cache, clock, ("pod", i, _pod(i, wave, "n0" if bound else None)))
        snapshot = cache.snapshot()
        with_kept = run_cycle(snapshot, config, wave, 0.0, totals=kept)
        assert with_kept.plan.binds
        assert with_kept.plan.binds == run_cycle(snapshot, config, wave, 0.0).plan.binds


def _pod(index: int, wave: int, node: str | None) -> dict[str, Any]:
    return {
        "gpus": ("1", "0.5", "2")[(index + wave) % 3],
        "node": node,
        "phase": "Running",
        "group": f"g{index % 4}",
        "scheduler": SCHEDULER,
        "created": wave,
        "extra": None,
        "gate": False,
        "devices": None,
        "leaving": 5,
    }


def _cache() -> ClusterCache:
    return ClusterCache(SCHEDULER)


#: Creation times as the counts read them: a few readable ones, sharing seconds with
#: another text, and unreadable ones.
TEXTS = [
    "2026-01-01T00:00:00Z",
    "2026-01-01T00:00:00+00:00",
    "2026-01-01T00:00:05Z",
    "2025-12-31T23:59:59Z",
    "not a time",
    "",
]


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(TEXTS)), max_size=60))
def test_a_class_s_times_stay_in_the_order_a_fresh_sort_gives(
    steps: list[tuple[bool, str]],
) -> None:
    """`_Times`, followed through pods coming and going, lays out what sorting the
    counts afresh gives: times in order, unreadable ones (NaN) last, the counts."""
    times, counted = _Times(), Counter[str]()
    for adding, text in steps:
        if adding:
            counted[text] += 1
            times.add(_time(text))
        elif counted[text]:
            counted[text] -= 1
            times.remove(_time(text))
    rows = sorted((_time(text), n) for text, n in counted.items() if n)
    assert times.keys == [key for key, _ in rows]
    assert times.counts == [n for _, n in rows]
    expected = [math.nan if key[0] else key[1] for key, _ in rows]
    assert np.array_equal(np.array(times.seconds), np.array(expected), equal_nan=True)
    counts = ClassCounts()
    counts._counts["class"] = times
    seconds, numbers, newest = counts._layout("class")
    readable = [key[1] for key, _ in rows if not key[0]]
    assert newest == (readable[-1] if readable else None)
    assert np.array_equal(seconds, np.array(expected), equal_nan=True)
    assert numbers.tolist() == [float(n) for _, n in rows]
