"""Time-based fairness: decayed usage, normalised by decayed capacity."""

from __future__ import annotations

import math

import pytest

from kai_ray.decisions.usage import UsageState, advance_usage, decay_factor, usage_from_queues
from kai_ray.values.resources import GPU, Resources

HOUR = 3600.0
CLUSTER = Resources({GPU: 64})


def _hold(state: UsageState, queue: str, gpus: float, seconds: float) -> UsageState:
    return advance_usage(state, {queue: Resources({GPU: gpus})}, CLUSTER, seconds, HOUR)


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [
        pytest.param(0.0, 1.0, id="nothing decays in no time"),
        pytest.param(HOUR, 0.5, id="one half-life halves"),
        pytest.param(3 * HOUR, 0.125, id="three half-lives leave an eighth"),
    ],
)
def test_decay_factor(elapsed: float, expected: float) -> None:
    assert decay_factor(elapsed, HOUR) == pytest.approx(expected)


def test_a_queue_holding_half_the_cluster_for_long_tends_to_half() -> None:
    state = UsageState(capacity={GPU: 0.0})
    for _ in range(40):
        state = _hold(state, "a", 32, HOUR)
    assert state.queues["a"][GPU] == pytest.approx(0.5, rel=1e-6)


def test_from_a_fresh_start_usage_is_the_share_held_so_far() -> None:
    state = _hold(UsageState(capacity={GPU: 0.0}), "a", 16, 10.0)
    assert state.queues["a"][GPU] == pytest.approx(0.25)


def test_after_a_restart_capacity_is_taken_as_steady_so_usage_moves_slowly() -> None:
    restarted = usage_from_queues({"a": {GPU: 0.0}})
    state = _hold(restarted, "a", 64, HOUR)
    assert state.queues["a"][GPU] == pytest.approx(0.5)
    assert state.capacity[GPU] == pytest.approx(64 * HOUR / math.log(2))


def test_idle_queue_usage_halves_every_half_life() -> None:
    state = _hold(UsageState(capacity={GPU: 0.0}), "a", 64, 10 * HOUR)
    before = state.queues["a"][GPU]
    state = _hold(state, "a", 0, HOUR)
    # usage halves while capacity keeps accruing, so the fraction falls below half
    assert state.queues["a"][GPU] < before * 0.5 + 1e-9


def test_zero_elapsed_changes_nothing() -> None:
    state = _hold(UsageState(capacity={GPU: 0.0}), "a", 32, HOUR)
    again = _hold(state, "a", 64, 0.0)
    assert again.queues["a"][GPU] == pytest.approx(state.queues["a"][GPU])


def test_without_a_half_life_usage_is_the_last_interval_only() -> None:
    state = advance_usage(UsageState(), {"a": Resources({GPU: 16})}, CLUSTER, 60.0, 0.0)
    assert state.queues["a"][GPU] == pytest.approx(0.25)
