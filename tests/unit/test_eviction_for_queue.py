"""An eviction says which queue gained: in the plan's `Evict`, and in the pod's Evicted event."""

from __future__ import annotations

from kai_ray.decisions.plan import Evict, Plan
from kai_ray.effects.binder import Binder
from kai_ray.state.cache import ClusterCache
from kai_ray.values.errors import ObjectRef
from tests.builders import make_queue

from .test_cluster_cache import MemoryWriter, node, pod
from .test_reclaim import Job, run


class MessageWriter(MemoryWriter):
    """Keeps each event's message as well."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        super().record_event(ref, warning, reason, message)
        self.messages.append(message)


def department_at_its_limit() -> list[Job]:
    return [
        Job("a0", "team-a", 1, gpus=4, on=["n0"]),
        Job("a1", "team-a", 1, gpus=4, on=["n0"]),
        Job("o", "other", 1, on=["n1"]),
        Job("b", "team-b", 2, gpus=2, created=3),
    ]


def test_reclaim_inside_a_department_at_its_limit_names_the_queue_that_gains() -> None:
    queues = [
        make_queue("dept").gpu(quota=8, limit=8),
        make_queue("team-a").parent("dept"),
        make_queue("team-b").parent("dept"),
        make_queue("other").gpu(quota=8),
    ]
    result = run(2, queues, department_at_its_limit())
    # One of team-a's two gangs goes (it holds 8, its fair share is 4); the department
    # holds 8 before and after, so its limit of 8 does not stand in the way.
    (evict,) = result.plan.evictions
    assert evict.group in ("default/a0", "default/a1")
    assert (evict.reason, evict.for_queue) == ("reclaim", "team-b")
    # ... and what team-a keeps as the cycle counted it: why it could be taken from
    assert evict.standing == "team-a keeps nvidia.com/gpu 4 (quota 0, fair share 4)"
    assert {b.group for b in result.plan.binds} == {"default/b"}


def test_the_evicted_event_names_the_queue_the_room_was_made_for() -> None:
    cache = ClusterCache()
    for obj in (node("n1"), pod("v", 8, "n1"), pod("m", 8, "n1")):
        cache.upsert(obj)
    plan = Plan(cycle=1)
    kept = "team-a keeps nvidia.com/gpu 8 (quota 8, fair share 6)"
    plan.evictions.append(Evict("ns/v", "ns/vg", "reclaim", for_queue="team-b", standing=kept))
    plan.evictions.append(Evict("ns/m", "ns/mg", "consolidation"))
    writer = MessageWriter()
    Binder(writer).apply(plan, cache.snapshot(), 0.0)
    assert writer.messages == [
        f"evicted by kai-ray (reclaim) with its gang ns/vg, for queue team-b: {kept}",
        "evicted by kai-ray (consolidation) with its gang ns/mg",
    ]
