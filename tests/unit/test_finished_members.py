"""Members that ran to completion count towards their gang's minimum.

A Job's gang whose first pods were bound (and finished) before the rest, after a
restart of the scheduler between the binds, or a bind that failed for one pod,
must not wait forever for pods that already did their part.
"""

from __future__ import annotations

from kai_ray.decisions.cycle import run_cycle
from kai_ray.state.groups import build_pod_groups
from kai_ray.state.pod_states import read_pods
from kai_ray.state.queues import build_queue_tree
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue

ALLOCATE = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})


def _members(name: str, phases: list[str | None], subgroup: str | None = None) -> list[object]:
    pods = []
    for i, phase in enumerate(phases):
        pod = make_pod(f"{name}-{i}").group("g").gpus(8)
        if subgroup is not None:
            pod = pod.subgroup(subgroup)
        pods.append((pod.on("n0").phase(phase) if phase else pod).build())
    return pods


def test_succeeded_members_shorten_what_the_gang_misses() -> None:
    group = make_pod_group("g").queue("q").min_member(4).build()
    pods = read_pods(_members("g", ["Succeeded", "Succeeded", None, None, None])).pods  # type: ignore[arg-type]
    queues, _ = build_queue_tree([make_queue("q").build()], {})
    groups, _ = build_pod_groups([group], pods, queues)
    state = groups["default/g"]
    assert [p.name for p in state.succeeded] == ["g-0", "g-1"]
    assert [p.name for p in state.missing] == ["g-2", "g-3"]


def test_a_gang_whose_first_members_finished_binds_the_rest() -> None:
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(3)],
        queues=[make_queue("q").build()],
        pod_groups=[make_pod_group("g").queue("q").min_member(4).build()],
        pods=_members("g", ["Succeeded", "Succeeded", None, None]),  # type: ignore[arg-type]
    )
    result = run_cycle(build_snapshot(objects), ALLOCATE, 1, 0.0)
    assert sorted(b.pod for b in result.plan.binds) == ["default/g-2", "default/g-3"]


def test_a_failed_member_does_not_count() -> None:
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(2)],
        queues=[make_queue("q").build()],
        pod_groups=[make_pod_group("g").queue("q").min_member(4).build()],
        pods=_members("g", ["Failed", "Succeeded", None, None]),  # type: ignore[arg-type]
    )
    result = run_cycle(build_snapshot(objects), ALLOCATE, 1, 0.0)
    assert result.plan.binds == []
    assert "needed for the minimum" in result.plan.statuses["default/g"].reason


def test_a_subgroups_finished_members_count_for_that_subgroup_only() -> None:
    group = make_pod_group("g").queue("q").min_member(4)
    group = group.subgroup("a", min_member=2).subgroup("b", min_member=2)
    pods = [
        *_members("a", ["Succeeded", "Succeeded"], subgroup="a"),
        *_members("b", [None, None], subgroup="b"),
    ]
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(2)],
        queues=[make_queue("q").build()],
        pod_groups=[group.build()],
        pods=pods,  # type: ignore[arg-type]
    )
    result = run_cycle(build_snapshot(objects), ALLOCATE, 1, 0.0)
    assert sorted(b.pod for b in result.plan.binds) == ["default/b-0", "default/b-1"]
