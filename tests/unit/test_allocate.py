"""The allocate action through the whole cycle: order, reasons, limits, extras, actions."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from kai_ray.decisions.allocate import AllocateAction, Waited
from kai_ray.decisions.context import HAND_OVER_AT, ActionRegistry, CycleContext
from kai_ray.decisions.cycle import CycleResult, builtin_actions, run_cycle
from kai_ray.decisions.placement.equivalence import POD_KEY, KnownFailure
from kai_ray.decisions.placement.reasons import Code
from kai_ray.decisions.usage import UsageState
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import DEFAULT_ACTIONS, SchedulerConfig
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.resources import GPU
from tests.builders import make_node, make_pod, make_pod_group, make_queue

H100 = "nvidia.com/gpu.product=H100"


def _cycle(
    nodes: Sequence[Any],
    queues: Sequence[Any],
    jobs: Sequence[tuple[Any, int, int]],
    config: SchedulerConfig | None = None,
    usage: UsageState | None = None,
) -> CycleResult:
    """`jobs`: (pod group builder, pods, GPUs per pod)."""
    groups, pods = [], []
    for group, count, gpus in jobs:
        built = group.build()
        name = built["metadata"]["name"]
        groups.append(built)
        for i in range(count):
            pod = make_pod(f"{name}-{i}").group(name).gpus(gpus)
            pods.append(
                pod.set(
                    "metadata.creationTimestamp", built["metadata"].get("creationTimestamp")
                ).build()
            )
    objects = ClusterObjects(
        nodes=[n.build() for n in nodes],
        queues=[q.build() for q in queues],
        pod_groups=groups,
        pods=pods,
    )
    return run_cycle(build_snapshot(objects), config or SchedulerConfig(), 7, 100.0, usage)


def _per_group(result: CycleResult) -> Counter[str]:
    return Counter(bind.group.split("/")[1] for bind in result.plan.binds)


def _two_teams(a_limit: int | None = None) -> list[Any]:
    return [
        make_queue("org").created(0),
        make_queue("team-a").parent("org").gpu(quota=2, limit=a_limit).created(1),
        make_queue("team-b").parent("org").gpu(quota=2).created(2),
    ]


def _singles(queue: str, count: int, start: int) -> list[tuple[Any, int, int]]:
    return [
        (make_pod_group(f"{queue}-{i}").queue(queue).created(start + i), 1, 1) for i in range(count)
    ]


def test_queues_share_a_full_cluster_by_fair_share_not_by_age() -> None:
    jobs = [*_singles("team-a", 4, 0), *_singles("team-b", 4, 100)]
    result = _cycle([make_node("n1").gpus(4)], _two_teams(), jobs)
    queues = Counter(name.rsplit("-", 1)[0] for name in _per_group(result).elements())
    assert queues == {"team-a": 2, "team-b": 2}
    waiting = [s for s in result.plan.statuses if not s.admitted]
    assert len(waiting) == 4 and all("does not fit" in s.reason for s in waiting)


def test_a_job_over_its_queue_limit_waits_with_the_reason() -> None:
    jobs = [(make_pod_group("big").queue("team-a").min_member(3), 3, 1)]
    result = _cycle([make_node("n1").gpus(8)], _two_teams(a_limit=2), jobs)
    assert not result.plan.binds
    status = result.plan.status_of("default/big")
    assert status is not None and not status.admitted
    assert (
        status.reason == "queue team-a is at its limit of 2 GPUs: it holds 0 and the job asks for 3"
    )


@pytest.mark.parametrize(
    ("product", "admitted"),
    [
        pytest.param("H100", False, id="a gang that lands on H100s past the H100 limit is undone"),
        pytest.param("A100", True, id="the same gang on A100s does not count against it"),
    ],
)
def test_per_gpu_type_limit_is_checked_after_placement(product: str, admitted: bool) -> None:
    queues = [make_queue("team-a").gpu(quota=8).resource(H100, limit=1)]
    node = make_node("n1").gpus(8).label("nvidia.com/gpu.product", product)
    result = _cycle([node], queues, [(make_pod_group("pair").queue("team-a").min_member(2), 2, 1)])
    status = result.plan.status_of("default/pair")
    assert status is not None and status.admitted == admitted
    assert len(result.plan.binds) == (2 if admitted else 0)
    if not admitted:
        assert status.reason.startswith(f"queue team-a is at its limit of 1 {H100} GPUs")


def test_elastic_extras_wait_until_every_minimum_is_placed() -> None:
    jobs = [
        (make_pod_group("elastic").queue("team-a").min_member(1).created(0), 4, 1),
        (make_pod_group("gang").queue("team-b").min_member(2).created(50), 2, 1),
    ]
    result = _cycle([make_node("n1").gpus(3)], _two_teams(), jobs)
    assert _per_group(result) == {"elastic": 1, "gang": 2}


def test_elastic_extras_go_one_by_one_in_queue_order() -> None:
    jobs = [
        (make_pod_group("a").queue("team-a").min_member(1).created(0), 6, 1),
        (make_pod_group("b").queue("team-b").min_member(1).created(1), 6, 1),
    ]
    result = _cycle([make_node("n1").gpus(6)], _two_teams(), jobs)
    assert _per_group(result) == {"a": 3, "b": 3}


class _Noop:
    name = "allocate"

    def run(self, ctx: CycleContext) -> None:
        return None


def test_the_registry_refuses_a_name_twice() -> None:
    registry = builtin_actions()
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(_Noop())


def test_an_unknown_action_name_is_an_error_naming_the_field() -> None:
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate", "shuffle"]}})
    with pytest.raises(InvalidObjectError, match=r"spec\.actions: unknown action 'shuffle'"):
        _cycle([], [], [], config)


def test_an_action_the_registry_does_not_hold_is_an_error() -> None:
    registry = ActionRegistry()
    registry.register(AllocateAction())
    objects = ClusterObjects(queues=[q.build() for q in _two_teams()])
    unknown = r"unknown action 'consolidate' \(known: allocate\)"
    with pytest.raises(InvalidObjectError, match=unknown):
        run_cycle(build_snapshot(objects), SchedulerConfig(), 1, 0.0, registry=registry)


def test_every_default_action_is_built_in() -> None:
    assert set(DEFAULT_ACTIONS) <= set(builtin_actions().names())


def test_a_registry_decides_which_actions_exist() -> None:
    registry = ActionRegistry()
    registry.register(_Noop())
    jobs = [(make_pod_group("g").queue("team-a"), 1, 1)]
    objects = ClusterObjects(
        nodes=[make_node("n1").gpus(1).build()],
        queues=[q.build() for q in _two_teams()],
        pod_groups=[jobs[0][0].build()],
        pods=[make_pod("g-0").group("g").gpus(1).build()],
    )
    only_allocate = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    result = run_cycle(build_snapshot(objects), only_allocate, 1, 0.0, registry=registry)
    assert not result.plan.binds


def test_every_log_line_names_the_cycle(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kai_ray.cycle")
    _cycle([make_node("n1").gpus(1)], _two_teams(), _singles("team-a", 2, 0))
    assert caplog.records
    assert all(r.getMessage().startswith("[cycle 7] ") for r in caplog.records)


def test_the_cycle_returns_usage_for_the_next() -> None:
    queues = [make_queue("team-a").gpu(quota=4)]
    jobs = _singles("team-a", 2, 0)
    config = SchedulerConfig.model_validate({"spec": {"timeBasedFairness": {"k": 1}}})
    first = _cycle([make_node("n1").gpus(4)], queues, jobs, config)
    assert first.usage.updated_s == 100.0
    assert first.usage.allocated["team-a"][GPU] == 2
    later = dataclasses.replace(first.usage, updated_s=0.0)
    second = _cycle([make_node("n1").gpus(4)], queues, [], config, usage=later)
    # team-a held 2 of 4 GPUs from 0 s to 100 s
    assert second.usage.queues["team-a"][GPU] == pytest.approx(0.5)


def test_a_gpu_type_with_no_room_left_is_avoided_before_placement() -> None:
    queues = [make_queue("team-a").gpu(quota=8).resource(H100, limit=0)]
    nodes = [
        make_node("h100").gpus(8).label("nvidia.com/gpu.product", "H100"),
        make_node("a100").gpus(8).label("nvidia.com/gpu.product", "A100"),
    ]
    result = _cycle(nodes, queues, [(make_pod_group("pair").queue("team-a").min_member(2), 2, 1)])
    assert {bind.node for bind in result.plan.binds} == {"a100"}


# ------------------------------------------------------------- placement budget


def _burst(singles: int, nodes: int = 40) -> ClusterObjects:
    teams = _two_teams()
    jobs = [*_singles("team-a", singles // 2, 0), *_singles("team-b", singles // 2, 1000)]
    groups, pods = [], []
    for group, _, gpus in jobs:
        built = group.build()
        groups.append(built)
        pods.append(make_pod(f"{built['metadata']['name']}-0").group(built["metadata"]["name"]))
        pods[-1] = pods[-1].gpus(gpus).build()
    return ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(nodes)],
        queues=[q.build() for q in teams],
        pod_groups=groups,
        pods=pods,
    )


def _bound(objects: ClusterObjects, result: CycleResult) -> ClusterObjects:
    """The objects after the plan's binds (pods keyed by name: `default/<name>`)."""
    where = {bind.pod.split("/")[1]: bind.node for bind in result.plan.binds}
    pods = [
        {**p, "spec": {**p["spec"], "nodeName": where[p["metadata"]["name"]]}}
        if p["metadata"]["name"] in where
        else p
        for p in objects.pods
    ]
    return dataclasses.replace(objects, pods=pods)


def test_a_spent_budget_ends_the_cycle_after_the_first_pods_and_says_nothing_of_the_rest() -> None:
    objects = _burst(200)
    result = run_cycle(build_snapshot(objects), SchedulerConfig(), 1, 100.0, time_up=lambda: True)
    assert result.cut_short
    assert len(result.plan.binds) == HAND_OVER_AT
    told = {status.group for status in result.plan.statuses}
    assert told == {bind.group for bind in result.plan.binds}  # the rest: not tried, not told
    unbudgeted = run_cycle(build_snapshot(objects), SchedulerConfig(), 1, 100.0)
    assert not unbudgeted.cut_short and len(unbudgeted.plan.binds) == 200


def test_cycles_cut_short_place_the_whole_burst_in_the_same_shares() -> None:
    objects, placed, cycles = _burst(200), Counter[str](), 0
    while True:
        cycles += 1
        result = run_cycle(
            build_snapshot(objects),
            SchedulerConfig(),
            cycles,
            100.0,
            None,
            None,
            None,
            lambda: True,
        )
        placed.update(bind.group.split("/")[1].rsplit("-", 1)[0] for bind in result.plan.binds)
        objects = _bound(objects, result)
        if not result.cut_short:
            break
    assert cycles == 4  # 64 + 64 + 64 + the last 8
    assert placed == {"team-a": 100, "team-b": 100}


def test_a_cycle_that_places_little_is_never_cut_short() -> None:
    """Below `HAND_OVER_AT` placements the budget is not looked at: a backlog that
    does not fit still gets reclaim and the other actions every cycle."""
    objects = _burst(200, nodes=4)  # 32 GPUs: 32 placed, 168 wait
    asked: list[bool] = []
    result = run_cycle(
        build_snapshot(objects),
        SchedulerConfig(),
        1,
        100.0,
        time_up=lambda: asked.append(True) or True,
    )
    assert not result.cut_short and len(result.plan.binds) == 32 and not asked
    assert len([s for s in result.plan.statuses if not s.admitted]) == 168


def test_a_kinds_reason_read_once_is_the_one_each_gang_would_render() -> None:
    """`Waited.every` (the reason read once for a kind) is each gang's own reason
    whenever it is set, and unset only where the reason names a gang's pod."""
    pods = [make_pod(f"g-{i}").group("g").gpus(8).scheduler("kai-ray").build() for i in range(2)]
    objects = ClusterObjects(
        queues=[make_queue("q").build()],
        pod_groups=[make_pod_group("g").queue("q").min_member(2).build()],
        pods=pods,
    )
    group = build_snapshot(objects).pod_groups["default/g"]
    whole = KnownFailure(Code.UNSCHEDULABLE, "no node fits", None)
    named = KnownFailure(Code.UNSCHEDULABLE, f"pod {POD_KEY} fits nowhere", 1)
    cases = [
        (Waited("over its limit", None), "over its limit"),
        (Waited("over its limit", named), "over its limit"),
        (Waited(None, whole), "no node fits"),
        (Waited(None, named), None),
        (Waited(None, None), None),
        (Waited("", whole), "no node fits"),
    ]
    for waited, every in cases:
        assert waited.every == every
        assert (waited.every or waited.reason_for(group)) == waited.reason_for(group)
    assert Waited(None, named).reason_for(group) == f"pod {group.live_pods()[1].key} fits nowhere"
