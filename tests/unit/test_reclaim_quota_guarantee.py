"""Reclaim keeps the quota guarantee in every resource the job asks for (issue 13):
a queue holding no more than its quota is never reclaimed from, one over quota loses
at most what it holds above it, and a quota it is within elsewhere does not shield it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kai_ray.decisions.cycle import run_cycle
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue


def job(name: str, queue: str, node: str | None, created: int) -> list[dict[str, Any]]:
    """One 8-GPU, 8-core pod; running on `node` when given, else kept to pool x."""
    pod = make_pod(f"{name}-0").group(name).gpus(8).cpu(8).created(created)
    pod = (
        pod.on(node).phase("Running")
        if node is not None
        else pod.set("spec.nodeSelector", {"pool": "x"})
    )
    group = make_pod_group(name).queue(queue).priority_class("train").min_member(1)
    return [group.created(created).build(), pod.build()]


def evictions(a_quota: dict[str, int], a_jobs: int) -> Counter[str]:
    """Four nodes of 8 GPUs and 64 cores, n0-n2 in pool x. Team a runs `a_jobs` 8-GPU
    jobs from n0 on; team b (quota 8 GPUs) asks for one more, in pool x. What the
    cycle evicts, by queue."""
    a = make_queue("team-a").gpu(quota=a_quota.get("gpu", 0))
    if "cpu" in a_quota:
        a = a.cpu(quota=a_quota["cpu"])
    members = [job(f"a{i}", "team-a", f"n{i}", i) for i in range(a_jobs)]
    members.append(job("b", "team-b", None, 100))
    nodes = [make_node(f"n{i}").gpus(8).cpu(64) for i in range(4)]
    objects = ClusterObjects(
        nodes=[(n.label("pool", "x") if i < 3 else n).build() for i, n in enumerate(nodes)],
        queues=[a.build(), make_queue("team-b").gpu(quota=8).build()],
        pod_groups=[m[0] for m in members],
        pods=[m[1] for m in members],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate", "reclaim"]}})
    result = run_cycle(build_snapshot(objects), config, 1, 0.0)
    return Counter(e.group.split("/")[1][0] for e in result.plan.evictions)


@pytest.mark.parametrize(
    ("a_quota", "a_jobs", "expected"),
    [
        pytest.param(
            {"gpu": 32}, 3, {}, id="below its GPU quota: never, though GPUs are free elsewhere"
        ),
        pytest.param({}, 3, {"a": 1}, id="no quota at all: no guarantee to keep"),
        pytest.param({"gpu": 16}, 4, {"a": 1}, id="over its GPU quota: down to it"),
        pytest.param({"gpu": 28}, 4, {}, id="over its GPU quota by less than a job: kept"),
        pytest.param(
            {"gpu": 16, "cpu": 512},
            4,
            {"a": 1},
            id="over its GPU quota and within its CPU quota: still reclaimed from",
        ),
    ],
)
def test_the_quota_guarantee(
    a_quota: dict[str, int], a_jobs: int, expected: dict[str, int]
) -> None:
    assert evictions(a_quota, a_jobs) == Counter(expected)
