"""What usage is charged for until the next cycle: what the queues occupy on the
nodes (issue 19). A pod being deleted keeps its node, and its queue is charged for
it; a bind onto its room waits for it, and its queue is not charged yet."""

from __future__ import annotations

import dataclasses
from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.usage import UsageState, still_moving
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue, timestamp


def running(name: str, queue: str, node: str, *, deleting: bool = False) -> list[dict[str, Any]]:
    """A one-pod gang of 8 GPUs running on `node` (its pod being deleted, if so)."""
    pod = make_pod(f"{name}-0").group(name).gpus(8).on(node).phase("Running").created(0)
    if deleting:
        pod.set("metadata.deletionTimestamp", timestamp(50))
    return [make_pod_group(name).queue(queue).min_member(1).created(0).build(), pod.build()]


def cycle(*members: list[dict[str, Any]], nodes: int) -> CycleResult:
    """Queues a and b (no quota), k = 1; b waits with a gang of one 8-GPU pod."""
    waiting = make_pod_group("wants").queue("b").min_member(1).created(10).build()
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(nodes)],
        queues=[make_queue("a").build(), make_queue("b").build()],
        pod_groups=[*(m[0] for m in members), waiting],
        pods=[*(m[1] for m in members), make_pod("wants-0").group("wants").gpus(8).build()],
    )
    spec = {"timeBasedFairness": {"k": 1, "halfLife": "128s", "window": "256s"}}
    config = SchedulerConfig.model_validate({"spec": spec})
    return run_cycle(build_snapshot(objects), config, 2, 1000.0)


def gpus(rates: Any, queue: str) -> float:
    return float(rates.get(queue, Resources()).get(GPU, 0.0))


def test_a_pod_being_deleted_is_charged_to_its_queue_not_to_the_one_waiting_for_its_room() -> None:
    result = cycle(running("gone", "a", "n0", deleting=True), running("stays", "a", "n1"), nodes=2)
    assert [(b.pod, b.node) for b in result.plan.binds] == [("default/wants-0", "n0")]
    # The ledger gives the room to b at once (pipelining); the nodes do not yet.
    assert gpus(result.usage.allocated, "a") == 8 and gpus(result.usage.allocated, "b") == 8
    assert gpus(result.usage.rates, "a") == 16 and gpus(result.usage.rates, "b") == 0


def test_a_bind_onto_free_room_is_charged_at_once() -> None:
    result = cycle(running("stays", "a", "n0"), nodes=2)
    assert [(b.pod, b.node) for b in result.plan.binds] == [("default/wants-0", "n1")]
    assert gpus(result.usage.rates, "a") == 8 and gpus(result.usage.rates, "b") == 8


def test_usage_that_has_not_moved_yet_still_moves_when_a_rate_changed() -> None:
    """A queue that kept its node one more cycle (its pod being evicted) has usage 1
    at both cycles; the cycle must still look again, as the node has changed hands."""
    usage = {"a": {GPU: 1.0}}
    before = UsageState(queues=usage, occupied={"a": Resources({GPU: 16})}, updated_s=1.0)
    after = dataclasses.replace(before, occupied={"b": Resources({GPU: 16})}, updated_s=2.0)
    assert still_moving(before, after)
    assert not still_moving(before, dataclasses.replace(before, updated_s=2.0))
