"""Time-based fairness: usage over a window (sliding, tumbling, cron), decayed, normalised."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from kai_ray.decisions.usage import (
    MAX_INTERVALS,
    UsageState,
    advance_usage,
    drift_wake,
    next_reset,
    to_persist,
    window_start,
)
from kai_ray.values.config import SchedulerConfigSpec, TimeBasedFairness
from kai_ray.values.resources import GPU, Resources

HOUR = 3600.0
CLUSTER = Resources({GPU: 64})
#: 2026-01-01T00:00:00Z, a Thursday.
T0 = 1767225600.0


def params(**fields: object) -> TimeBasedFairness:
    return TimeBasedFairness.model_validate({"k": 1, **fields})


def hold(state: UsageState, seconds: float, p: TimeBasedFairness, **gpus: float) -> UsageState:
    """`seconds` more during which each named queue holds its GPUs (the rest none)."""
    start = T0 if state.updated_s is None else state.updated_s
    ready = dataclasses.replace(
        state,
        allocated={q: Resources({GPU: n}) for q, n in gpus.items()},
        updated_s=start,
        capacity=CLUSTER,
    )
    return advance_usage(ready, start + seconds, p)


def used(state: UsageState, queue: str) -> float:
    return state.queues.get(queue, {}).get(GPU, 0.0)


def test_a_queue_holding_half_the_cluster_for_long_tends_to_half() -> None:
    p, state = params(halfLife="1h"), UsageState()
    for _ in range(40):
        state = hold(state, HOUR, p, a=32)
    assert used(state, "a") == pytest.approx(0.5, rel=1e-6)


def test_by_default_usage_is_normalised_by_the_part_of_the_window_that_elapsed() -> None:
    # KAI's normalisation: the whole cluster held for one second is a usage of 1.
    state = hold(UsageState(), 1.0, params(halfLife="1h"), a=64)
    assert used(state, "a") == pytest.approx(1.0)


def test_the_steady_normalisation_counts_the_window_before_the_first_record_as_idle() -> None:
    p = params(halfLife="0s", window="100s", normalization="steady")
    state = hold(UsageState(), 10.0, p, a=64)
    assert used(state, "a") == pytest.approx(0.1)


def test_a_sliding_window_forgets_what_left_it() -> None:
    p = params(halfLife="0s", window="200s")
    state = hold(UsageState(), 100.0, p, a=64)
    state = hold(state, 100.0, p, b=64)
    assert (used(state, "a"), used(state, "b")) == pytest.approx((0.5, 0.5))
    state = hold(state, 100.0, p, b=64)
    assert (used(state, "a"), used(state, "b")) == pytest.approx((0.0, 1.0))


def test_a_queue_that_starts_late_is_normalised_by_the_cluster_history() -> None:
    p = params(halfLife="0s")
    state = hold(UsageState(), 100.0, p, a=64)
    state = hold(state, 100.0, p, b=64)
    assert used(state, "b") == pytest.approx(0.5)


def test_a_tumbling_window_starts_again_at_every_reset() -> None:
    start = datetime.fromtimestamp(T0, UTC).isoformat()
    p = params(halfLife="0s", window="100s", windowType="tumbling", tumblingWindowStartTime=start)
    assert window_start(p, T0 + 250.0) == T0 + 200.0
    state = hold(UsageState(), 150.0, p, a=64)  # the reset at 100 s forgets the first 100
    state = hold(state, 40.0, p, b=64)
    assert (used(state, "a"), used(state, "b")) == pytest.approx((50 / 90, 40 / 90))
    state = hold(state, 20.0, p, b=64)  # past the reset at 200 s: only b's 10 s remain
    assert (used(state, "a"), used(state, "b")) == pytest.approx((0.0, 1.0))


def test_a_cron_window_starts_again_whenever_the_cron_fires() -> None:
    p = params(halfLife="0s", windowType="cron", cronString="0 * * * *")
    assert window_start(p, T0 + 1.5 * HOUR) == T0 + HOUR
    state = hold(UsageState(), 0.9 * HOUR, p, a=64)
    state = hold(state, 0.2 * HOUR, p, b=64)  # the hour struck at 1.0 h
    assert (used(state, "a"), used(state, "b")) == pytest.approx((0.0, 1.0))


def test_the_next_reset_of_each_window_type() -> None:
    start = datetime.fromtimestamp(T0 + 50.0, UTC).isoformat()
    tumbling = params(window="100s", windowType="tumbling", tumblingWindowStartTime=start)
    assert next_reset(tumbling, T0) == T0 + 50.0  # the first start, still ahead
    assert next_reset(tumbling, T0 + 50.0) == T0 + 150.0
    assert next_reset(tumbling, T0 + 149.0) == T0 + 150.0
    cron = params(windowType="cron", cronString="0 * * * *")
    assert next_reset(cron, T0) == T0 + HOUR  # firing at `now` is behind, not ahead
    assert next_reset(params(window="100s"), T0) is None  # sliding


def test_the_cycle_looks_again_at_a_reset_and_just_after_it() -> None:
    """Settled usage asks for no cycle in a sliding window; a window that starts again
    asks for one at the reset, and one a drift step after it (usage is 0 at the reset
    and moves from there, though it has not moved yet)."""
    p = params(halfLife="128s", windowType="cron", cronString="0 * * * *")
    spec = SchedulerConfigSpec.model_validate({"timeBasedFairness": p.model_dump()})
    settled = UsageState(queues={"a": {GPU: 1.0}}, updated_s=T0 + 0.5 * HOUR)
    same = dataclasses.replace(settled, updated_s=T0 + 0.6 * HOUR)
    assert drift_wake(spec, settled, same, T0 + 0.6 * HOUR) == T0 + HOUR
    after_reset = dataclasses.replace(settled, queues={}, updated_s=T0 + HOUR)
    before_reset = dataclasses.replace(settled, queues={}, updated_s=T0 + 0.9 * HOUR)
    assert drift_wake(spec, before_reset, after_reset, T0 + HOUR) == T0 + HOUR + 1.0  # 128 s / 128
    sliding = SchedulerConfigSpec.model_validate({"timeBasedFairness": {"k": 1, "halfLife": "0s"}})
    assert drift_wake(sliding, settled, same, T0 + 0.6 * HOUR) is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"windowType": "tumbling"}, "tumblingWindowStartTime", id="tumbling"),
        pytest.param({"windowType": "cron", "cronString": "every day"}, "cronString", id="cron"),
    ],
)
def test_a_window_type_without_its_setting_is_refused(fields: dict[str, str], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        params(**fields)


def test_the_history_stays_short_and_keeps_the_usage() -> None:
    p, state = params(halfLife="1h"), UsageState()
    for i in range(3 * MAX_INTERVALS):
        state = hold(state, 10.0, p, a=64 if i % 2 else 0)
    assert len(state.history["a"]) <= MAX_INTERVALS
    assert used(state, "a") == pytest.approx(0.5, abs=0.01)


def test_the_persisted_history_gives_back_the_usage_after_a_restart() -> None:
    p, state = params(halfLife="1h"), UsageState()
    for minutes in (30, 45, 20):
        state = hold(state, minutes * 60.0, p, a=64)
        state = hold(state, minutes * 60.0, p, b=32)
    persisted = {name: to_persist(kept) for name, kept in state.history.items()}
    restarted = advance_usage(UsageState(history=persisted), state.updated_s or 0.0, p)
    for queue in ("a", "b"):
        assert used(restarted, queue) == pytest.approx(used(state, queue), abs=0.01)
