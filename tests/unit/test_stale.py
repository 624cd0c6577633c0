"""Stale-gang eviction through the whole cycle, its condition, and the order of actions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, builtin_actions, resolve_actions, run_cycle
from kai_ray.decisions.plan import Staleness
from kai_ray.decisions.stale import (
    STALE_GANG,
    rfc3339,
    stale_condition,
    unix_seconds,
)
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError
from tests.builders import make_node, make_pod, make_pod_group, make_queue

NOW = 100.0


@dataclass(frozen=True)
class Member:
    node: str | None = "n0"
    phase: str = "Running"
    subgroup: str | None = None
    scheduler: str = "kai-ray"


@dataclass(frozen=True)
class Case:
    members: Sequence[Member]
    min_member: int
    #: When the Stale condition says the gang went stale (None: no condition).
    stale_since: float | None = None
    grace: str | None = None
    subgroups: Sequence[tuple[str, int]] = ()
    min_subgroup: int | None = None
    actions: Sequence[str] = ("allocate", "stale-gang-eviction")
    #: Expected: pods evicted (by index), the staleness stated, the wake-up asked for.
    evicted: Sequence[int] = ()
    staleness: Staleness | None = None
    wake_at: float | None = None
    config: dict[str, Any] = field(default_factory=dict)


def run(case: Case) -> CycleResult:
    group = make_pod_group("g").queue("team").min_member(case.min_member)
    for name, minimum in case.subgroups:
        group = group.subgroup(name, minimum)
    if case.min_subgroup is not None:
        group = group.min_subgroup(case.min_subgroup)
    if case.grace:
        group = group.set("spec.staleGracePeriod", case.grace)
    if case.stale_since is not None:
        condition = stale_condition(Staleness(case.stale_since), case.stale_since)
        group = group.set("status", {"conditions": [condition]})
    objects = ClusterObjects(
        nodes=[make_node("n0").gpus(8).build()],
        queues=[make_queue("team").build()],
        pod_groups=[group.build()],
        pods=[_pod(i, member) for i, member in enumerate(case.members)],
    )
    spec = {"actions": list(case.actions), **case.config}
    config = SchedulerConfig.model_validate({"spec": spec})
    return run_cycle(build_snapshot(objects), config, 1, NOW)


def _pod(index: int, member: Member) -> dict[str, Any]:
    pod = make_pod(f"g-{index}").group("g").gpus(1).scheduler(member.scheduler).created(index)
    if member.subgroup:
        pod = pod.subgroup(member.subgroup)
    if member.node:
        pod = pod.on(member.node)
    return pod.phase(member.phase).build()


RUNNING, FAILED = Member(), Member(phase="Failed")
WAITING = Member(node=None, phase="Pending")

CASES = [
    pytest.param(
        Case([RUNNING, FAILED], 2, staleness=Staleness(NOW), wake_at=NOW + 60),
        id="a gang newly below minMember is marked stale now and a cycle asked for in 60s",
    ),
    pytest.param(
        Case(
            [RUNNING, RUNNING, FAILED],
            3,
            stale_since=NOW - 30,
            staleness=Staleness(NOW - 30),
            wake_at=NOW + 30,
        ),
        id="within its grace the gang keeps its first stale time and is not evicted",
    ),
    pytest.param(
        Case(
            [RUNNING, RUNNING, FAILED],
            3,
            stale_since=NOW - 60,
            evicted=[0, 1],
            staleness=Staleness(None),
        ),
        id="once the grace has passed every pod it still holds is evicted",
    ),
    pytest.param(
        Case(
            [RUNNING, FAILED],
            2,
            stale_since=NOW - 90,
            grace="10m",
            staleness=Staleness(NOW - 90),
            wake_at=NOW - 90 + 600,
        ),
        id="the PodGroup's staleGracePeriod overrides the default",
    ),
    pytest.param(
        Case(
            [RUNNING, FAILED],
            2,
            stale_since=NOW - 10,
            config={"staleGangGracePeriod": "5s"},
            evicted=[0],
            staleness=Staleness(None),
        ),
        id="SchedulerConfig staleGangGracePeriod sets the default grace",
    ),
    pytest.param(
        Case([RUNNING, RUNNING], 2, stale_since=NOW - 500, staleness=Staleness(None)),
        id="a gang back at its minimum has its Stale condition turned off",
    ),
    pytest.param(
        Case(
            [RUNNING, Member(phase="Succeeded")],
            2,
            stale_since=NOW - 500,
            staleness=Staleness(None),
        ),
        id="a gang with a Succeeded pod is finishing, not stale",
    ),
    pytest.param(
        Case([FAILED, FAILED], 2),
        id="a gang whose pods all ended holds nothing and is not stale",
    ),
    pytest.param(
        Case([RUNNING, WAITING], 2, stale_since=NOW - 500, staleness=Staleness(None)),
        id="a gang whose replacement pod allocate placed this cycle is not stale",
    ),
    pytest.param(
        Case(
            [RUNNING, WAITING],
            2,
            stale_since=NOW - 500,
            actions=["stale-gang-eviction"],
            evicted=[0],
            staleness=Staleness(None),
        ),
        id="without allocate before it the replacement is not placed and the gang goes",
    ),
    pytest.param(
        Case(
            [Member(subgroup="a"), Member(subgroup="a"), Member(subgroup="b", phase="Failed")],
            2,
            subgroups=[("a", 1), ("b", 1)],
            staleness=Staleness(NOW),
            wake_at=NOW + 60,
        ),
        id="a subgroup below its own minimum makes the gang stale",
    ),
    pytest.param(
        Case(
            [Member(subgroup="a"), Member(subgroup="b", phase="Failed")],
            1,
            subgroups=[("a", 1), ("b", 1)],
            min_subgroup=1,
        ),
        id="with minSubGroup 1 one subgroup at its minimum is enough",
    ),
    pytest.param(
        Case([Member(scheduler="default-scheduler"), FAILED], 2, stale_since=NOW - 500),
        id="another scheduler's gang is never evicted",
    ),
    pytest.param(
        Case([RUNNING, FAILED], 2, stale_since=NOW - 500, actions=["allocate"]),
        id="nothing is evicted when stale-gang-eviction is not configured",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_stale_gangs(case: Case) -> None:
    result = run(case)
    evicted = sorted(e.pod for e in result.plan.evictions)
    assert evicted == [f"default/g-{i}" for i in case.evicted]
    assert {e.reason for e in result.plan.evictions} <= {STALE_GANG}
    stated = [s.staleness for s in result.plan.statuses if s.staleness is not None]
    assert stated == ([case.staleness] if case.staleness else [])
    assert result.plan.wake_at == case.wake_at


@pytest.mark.parametrize(
    "seconds", [0.0, 30.0, 59.999999, 1_767_225_600.25], ids=lambda s: f"{s} seconds"
)
def test_condition_times_read_back_as_the_same_seconds(seconds: float) -> None:
    assert unix_seconds(rfc3339(seconds)) == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize("text", [None, "", "yesterday"], ids=repr)
def test_a_missing_or_unreadable_condition_time_is_no_time(text: str | None) -> None:
    assert unix_seconds(text) is None


def test_the_stale_condition_says_true_since_then_or_false_now() -> None:
    since = stale_condition(Staleness(30.0), 100.0)
    assert (since["status"], unix_seconds(since["lastTransitionTime"])) == ("True", 30.0)
    back = stale_condition(Staleness(None), 100.0)
    assert (back["status"], unix_seconds(back["lastTransitionTime"])) == ("False", 100.0)


# ----------------------------------------------------------------- actions in order


def _resolved(actions: list[str]) -> list[str]:
    config = SchedulerConfig.model_validate({"spec": {"actions": actions}})
    return [action.name for action in resolve_actions(config, builtin_actions())]


@pytest.mark.parametrize(
    "actions",
    [
        ["allocate", "consolidate", "reclaim", "preempt", "stale-gang-eviction"],
        ["stale-gang-eviction", "allocate"],
        ["consolidate"],
    ],
    ids=lambda a: " then ".join(a),
)
def test_actions_run_in_the_configured_order(actions: list[str]) -> None:
    built = set(builtin_actions().names())
    assert _resolved(actions) == [name for name in actions if name in built]


def test_the_default_order_is_least_disruptive_first() -> None:
    assert SchedulerConfig().spec.actions == [
        "allocate",
        "consolidate",
        "reclaim",
        "preempt",
        "stale-gang-eviction",
    ]


def test_consolidate_and_stale_gang_eviction_are_built_in() -> None:
    assert {"allocate", "consolidate", "stale-gang-eviction"} <= set(builtin_actions().names())


def test_an_action_listed_twice_is_refused_naming_spec_actions() -> None:
    with pytest.raises(InvalidObjectError, match="listed twice") as raised:
        _resolved(["allocate", "consolidate", "allocate"])
    assert raised.value.problems[0].field == "spec.actions"
