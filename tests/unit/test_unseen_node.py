"""A pod bound to a node the snapshot does not know (watch lag, a node gone).

It is a problem of the snapshot, its group does not count it as bound, and no
action trips over it: reclaim does not take its gang apart, and placement does
not tie the rest of its gang to whichever node comes first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kai_ray.decisions.cycle import run_cycle
from kai_ray.state.groups import build_pod_groups
from kai_ray.state.pod_states import read_pods
from kai_ray.state.queues import build_queue_tree
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, make_topology


def snapshot_of(objects: ClusterObjects) -> Snapshot:
    """The snapshot, its groups built knowing the node names.

    The snapshot module passes them itself once it calls
    `build_pod_groups(..., node_names=node_index)`; until then this does it."""
    snapshot = build_snapshot(objects)
    groups, _ = build_pod_groups(
        objects.pod_groups,
        list(snapshot.pods.values()),
        snapshot.queues,
        node_names=snapshot.node_index,
    )
    waiting = tuple(group for group in groups.values() if group.waiting)
    return dataclasses.replace(snapshot, pod_groups=groups, waiting_groups=waiting)


def test_a_pod_on_an_unknown_node_is_a_problem_and_not_bound_in_its_group() -> None:
    group = make_pod_group("g").queue("q").min_member(2).build()
    pods = read_pods(
        [
            make_pod("g-0").group("g").gpus(1).on("n0").phase("Running").build(),
            make_pod("g-1").group("g").gpus(1).on("ghost").phase("Running").build(),
            make_pod("g-2").group("g").gpus(1).build(),
        ]
    ).pods
    queues, _ = build_queue_tree([make_queue("q").build()], {})
    groups, problems = build_pod_groups([group], pods, queues, node_names={"n0"})
    state = groups["default/g"]
    assert [p.name for p in state.bound] == ["g-0"]
    assert [p.name for p in state.pending] == ["g-2"]
    assert [p.name for p in state.missing] == ["g-2"]
    assert not state.seen_whole
    assert [(p.obj.name, p.field) for p in problems] == [("g-1", "spec.nodeName")]
    assert "ghost" in problems[0].message


def test_without_node_names_every_node_a_pod_names_counts_as_known() -> None:
    group = make_pod_group("g").queue("q").build()
    pods = read_pods([make_pod("g-0").group("g").on("ghost").phase("Running").build()]).pods
    queues, _ = build_queue_tree([make_queue("q").build()], {})
    groups, problems = build_pod_groups([group], pods, queues)
    assert [p.name for p in groups["default/g"].bound] == ["g-0"]
    assert problems == []


def _gang(name: str, queue: str, nodes: list[str | None], **spec: Any) -> list[dict[str, Any]]:
    group = make_pod_group(name).queue(queue).min_member(len(nodes)).priority_class("train")
    for key, value in spec.items():
        group = group.set(f"spec.{key}", value)
    pods = []
    for i, node in enumerate(nodes):
        pod = make_pod(f"{name}-{i}").group(name).gpus(8)
        pods.append((pod.on(node).phase("Running") if node else pod).build())
    return [group.build(), *pods]


def test_reclaim_leaves_a_gang_with_a_pod_on_an_unknown_node_alone() -> None:
    """The gang is not a victim (its unseen pod can be neither judged nor evicted);
    before, reclaim raised KeyError looking the unknown node up."""
    lagging = _gang("lagging", "team-b", ["n0", "ghost"])
    waiting = _gang("waiting", "team-a", [None])
    objects = ClusterObjects(
        nodes=[make_node("n0").gpus(8).build()],
        queues=[make_queue("team-a").gpu(quota=8).build(), make_queue("team-b").build()],
        pod_groups=[lagging[0], waiting[0]],
        pods=[*lagging[1:], *waiting[1:]],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate", "reclaim"]}})
    result = run_cycle(snapshot_of(objects), config, 1, 0.0)
    assert result.plan.evictions == []
    assert result.plan.binds == []


def test_an_unseen_member_does_not_tie_its_gang_to_the_first_nodes_rack() -> None:
    """Before, the unseen pod was taken to sit on node row 0, whose rack is full, and
    the gang was told "the best rack has room for 0" while rack r2 had room."""
    nodes = [
        make_node(f"{rack}-{i}").gpus(8).in_domains(block="b1", rack=rack).build()
        for rack in ("r1", "r2")
        for i in range(2)
    ]
    busy = [make_pod(f"busy-{i}").gpus(8).on(f"r1-{i}").phase("Running").build() for i in (0, 1)]
    group = make_pod_group("g").queue("q").min_member(2).topology("dc", "rack").build()
    pods = [
        make_pod("g-0").group("g").gpus(8).on("ghost").phase("Running").build(),
        *(make_pod(f"g-{i}").group("g").gpus(8).build() for i in (1, 2)),
    ]
    objects = ClusterObjects(
        nodes=nodes,
        pods=[*busy, *pods],
        pod_groups=[group],
        queues=[make_queue("q").build()],
        topologies=[make_topology("dc").level("block").level("rack").hostname().build()],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    result = run_cycle(snapshot_of(objects), config, 1, 0.0)
    assert sorted(b.node for b in result.plan.binds) == ["r2-0", "r2-1"]
