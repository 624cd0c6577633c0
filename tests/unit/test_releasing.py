"""Pods being deleted release their room: the cycle places onto it, and never evicts
again for it (pipelining, issue 13 rule 5)."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, timestamp


def running(name: str, queue: str, node: str, *, deleting: bool = False) -> list[dict[str, Any]]:
    """A one-pod gang of 8 GPUs running on `node` (its pod being deleted, if so)."""
    pod = make_pod(f"{name}-0").group(name).gpus(8).on(node).phase("Running").created(0)
    if deleting:
        pod.set("metadata.deletionTimestamp", timestamp(50))
    return [make_pod_group(name).queue(queue).min_member(1).created(0).build(), pod.build()]


def cycle(
    *members: list[dict[str, Any]], nodes: int = 2, actions: list[str] | None = None
) -> CycleResult:
    """Queues a (no quota) and b (quota 8); b waits with a gang of one 8-GPU pod."""
    groups = [m[0] for m in members]
    pods = [m[1] for m in members]
    waiting = make_pod_group("wants").queue("b").min_member(1).created(10).build()
    pods.append(make_pod("wants-0").group("wants").gpus(8).created(10).build())
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(nodes)],
        queues=[make_queue("a").build(), make_queue("b").gpu(8).build()],
        pod_groups=[*groups, waiting],
        pods=pods,
    )
    spec = {"actions": actions} if actions else {}
    config = SchedulerConfig.model_validate({"spec": spec})
    return run_cycle(build_snapshot(objects), config, 2, 1000.0)


def test_a_waiting_gang_is_placed_onto_the_room_a_terminating_pod_releases() -> None:
    result = cycle(running("gone", "a", "n0", deleting=True), running("stays", "a", "n1"))
    assert [(b.pod, b.node) for b in result.plan.binds] == [("default/wants-0", "n0")]
    assert result.plan.evictions == []


@pytest.mark.parametrize("actions", [["reclaim"], ["allocate", "reclaim", "preempt"]])
def test_nothing_more_is_evicted_while_the_victim_terminates(actions: list[str]) -> None:
    """Queue a is over its share only with the pod it is losing; b's gang waits for that
    pod's room. Before issue 13 the terminating pod counted as held and reclaim took
    a second victim for the same room."""
    members = (running("gone", "a", "n0", deleting=True), running("stays", "a", "n1"))
    result = cycle(*members, actions=actions)
    assert result.plan.evictions == []
    assert result.usage.allocated["a"]["nvidia.com/gpu"] == 8  # what stays, not what goes


def test_a_terminating_pod_is_not_placed_or_bound_again() -> None:
    result = cycle(running("gone", "a", "n0", deleting=True), nodes=1)
    assert "default/gone-0" not in {b.pod for b in result.plan.binds}
