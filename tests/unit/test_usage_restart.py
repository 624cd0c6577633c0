"""Usage history survives a restart of the operator: written in `Queue.status.usageHistory`,
read back by the queue tree, and the usage taken again over the window from it."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.effects.status import queue_status
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import GPU
from tests.builders import make_node, make_pod, make_pod_group, make_queue

#: 2026-01-01T00:00:00Z
START = 1767225600.0
CONFIG = SchedulerConfig.model_validate(
    {"spec": {"actions": ["allocate"], "timeBasedFairness": {"k": 1, "halfLife": "1h"}}}
)


def snapshot(statuses: dict[str, dict[str, Any]] | None = None) -> Snapshot:
    queues = []
    for name in ("team-a", "team-b"):
        queue = make_queue(name).build()
        if statuses and name in statuses:
            queue["status"] = statuses[name]
        queues.append(queue)
    group = make_pod_group("a").queue("team-a").min_member(1).build()
    pod = make_pod("a-0").group("a").gpus(6).on("n0").phase("Running").build()
    return build_snapshot(
        ClusterObjects(
            nodes=[make_node("n0").gpus(8).build()], queues=queues, pod_groups=[group], pods=[pod]
        )
    )


def run(start: float, minutes: int) -> CycleResult:
    result, usage = None, None
    for minute in range(minutes + 1):
        result = run_cycle(snapshot(), CONFIG, minute + 1, start + 60.0 * minute, usage)
        usage = result.usage
    assert result is not None
    return result


def test_the_usage_history_is_written_and_read_back_after_a_restart() -> None:
    before = run(START, 90)
    statuses = {name: queue_status(name, snapshot(), before, 0) for name in ("team-a", "team-b")}
    assert statuses["team-a"]["usageHistory"]
    restarted = run_cycle(snapshot(statuses), CONFIG, 1, before.usage.updated_s or 0.0, None)
    used = before.usage.queues["team-a"][GPU]
    assert used == pytest.approx(0.75, abs=0.01)
    assert restarted.usage.queues["team-a"][GPU] == pytest.approx(used, abs=0.01)


def test_a_status_written_before_usage_history_keeps_its_usage_at_the_first_cycle() -> None:
    status = {"usage": {"gpu": "0.4"}}
    first = run_cycle(snapshot({"team-b": status}), CONFIG, 1, START, None)
    assert first.usage.queues["team-b"][GPU] == pytest.approx(0.4)
