"""Booking and placeability: every action keeps a queue within its per-GPU-type limits.

Allocate kept a queue off a GPU type its limit forbids; reclaim and preempt did
not, and evicted a job to bind the waiting one on that very type. Now every
action places the view `booking.placeable` gives and books through `booking.book`.
"""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue

H100 = "nvidia.com/gpu.product=H100"


def _job(name: str, queue: str, node: str | None, priority: str, created: int) -> list[Any]:
    group = make_pod_group(name).queue(queue).priority_class(priority).created(created)
    pod = make_pod(f"{name}-0").group(name).gpus(8).created(created)
    if node is not None:
        pod = pod.on(node).phase("Running")
    return [group.build(), pod.build()]


def _cycle(queues: list[Any], jobs: list[list[Any]], actions: list[str]) -> CycleResult:
    objects = ClusterObjects(
        nodes=[
            make_node("a100").gpus(8, product="A100").build(),
            make_node("h100").gpus(8, product="H100").build(),
        ],
        queues=[q.build() for q in queues],
        pod_groups=[job[0] for job in jobs],
        pods=[job[1] for job in jobs],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": actions}})
    return run_cycle(build_snapshot(objects), config, 1, 0.0)


def _nodes(result: CycleResult) -> dict[str, list[str]]:
    evicted = sorted(e.pod.split("/")[1] for e in result.plan.evictions)
    return {"bound": sorted(b.node for b in result.plan.binds), "evicted": evicted}


@pytest.mark.parametrize(
    ("queues", "jobs", "actions"),
    [
        pytest.param(
            [
                make_queue("team-a").gpu(quota=8).resource(H100, limit=0),
                make_queue("team-b").gpu(quota=0),
            ],
            [
                _job("old-b", "team-b", "a100", "train", 1),
                _job("young-b", "team-b", "h100", "train", 2),
                _job("waiting-a", "team-a", None, "train", 3),
            ],
            ["allocate", "reclaim"],
            id="reclaim takes room on a GPU type the reclaimer may use, not the younger victim's",
        ),
        pytest.param(
            [make_queue("team").gpu(quota=16).resource(H100, limit=0)],
            [
                _job("old-low", "team", "a100", "train", 1),
                _job("young-low", "team", "h100", "train", 2),
                _job("high", "team", None, "inference", 3),
            ],
            ["allocate", "preempt"],
            id="preempt takes room on a GPU type the preemptor may use, not the younger victim's",
        ),
    ],
)
def test_eviction_actions_keep_a_queue_off_a_gpu_type_its_limit_forbids(
    queues: list[Any], jobs: list[list[Any]], actions: list[str]
) -> None:
    victim = jobs[0][1]["metadata"]["name"]
    assert _nodes(_cycle(queues, jobs, actions)) == {"bound": ["a100"], "evicted": [victim]}
