"""The consolidate action through the whole cycle: when it moves gangs, which, and how."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kai_ray.decisions import consolidate, eviction
from kai_ray.decisions.consolidate import CONSOLIDATION
from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.plan import Evict, GroupStatus
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.clock import unix_seconds
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, timestamp

WITH_CONSOLIDATION = ["allocate", "consolidate"]
#: The cycle's time: an hour after the origin the cases' objects are created from, so
#: their gangs are past the default consolidationMinRuntime unless a case says otherwise.
NOW = float(unix_seconds(timestamp(3600)) or 0.0)


@dataclass(frozen=True)
class Gang:
    """A gang of `len(nodes)` pods of `gpus` GPUs each; `nodes` None for waiting pods."""

    name: str
    gpus: int
    nodes: Sequence[str | None]
    priority: int = 0
    queue: str = "team"
    scheduler: str = "kai-ray"
    min_member: int | None = None
    #: Its pods have a controller that makes them again (only such gangs move).
    controlled: bool = True
    #: Seconds after the origin its objects were created (default: its place in the case).
    created_at: int | None = None

    def objects(self, created: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        minimum = len(self.nodes) if self.min_member is None else self.min_member
        created = created if self.created_at is None else self.created_at
        group = make_pod_group(self.name).queue(self.queue).min_member(minimum)
        pods = []
        for i, node in enumerate(self.nodes):
            pod = make_pod(f"{self.name}-{i}").group(self.name).gpus(self.gpus)
            pod = pod.priority(self.priority).scheduler(self.scheduler).created(created)
            pod = pod.controlled_by("ReplicaSet", self.name) if self.controlled else pod
            pods.append((pod.on(node).phase("Running") if node else pod).build())
        return group.created(created).build(), pods


@dataclass(frozen=True)
class Case:
    nodes: int
    gangs: Sequence[Gang]
    #: pod -> the node nominated for it, for every pod expected to move.
    moves: dict[str, str] = field(default_factory=dict)
    #: group -> node count it should be bound to (the waiting gang that fits).
    admitted: Sequence[str] = ()
    config: dict[str, Any] = field(default_factory=dict)
    gpu_limit: int | None = None


def run(case: Case) -> CycleResult:
    groups, pods = [], []
    for created, gang in enumerate(case.gangs):
        group, members = gang.objects(created)
        groups.append(group)
        pods.extend(members)
    team = make_queue("team").gpu(limit=case.gpu_limit) if case.gpu_limit else make_queue("team")
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(case.nodes)],
        queues=[team.build(), make_queue("other").build()],
        pod_groups=groups,
        pods=pods,
    )
    spec = {"actions": WITH_CONSOLIDATION, **case.config}
    config = SchedulerConfig.model_validate({"spec": spec})
    return run_cycle(build_snapshot(objects), config, 1, NOW)


def half_full(*names: str, gpus: int = 4) -> list[Gang]:
    """One running gang of one pod per node n0, n1, ... ."""
    return [Gang(name, gpus, [f"n{i}"]) for i, name in enumerate(names)]


CASES = [
    pytest.param(
        # Renewed for issue 13: a and b are equal, so the newer one (b) moves (KAI's
        # victim order); before, the name decided and a moved.
        Case(2, [*half_full("a", "b"), Gang("big", 8, [None])], {"b-0": "n0"}, ["big"]),
        id="an 8-GPU pod fits once the newer of two 4-GPU jobs moves off a half-full node",
    ),
    pytest.param(
        Case(2, [*half_full("a", "b", gpus=6), Gang("big", 8, [None])]),
        id="nothing moves when the waiting gang does not fit the free GPUs in total",
    ),
    pytest.param(
        Case(3, [*half_full("a", "b"), Gang("big", 8, [None])], admitted=["big"]),
        id="nothing moves when the waiting gang fits as things are",
    ),
    pytest.param(
        Case(
            2,
            [
                Gang("a", 4, ["n0"], priority=100),
                Gang("b", 4, ["n1"], priority=100),
                Gang("big", 8, [None]),
            ],
        ),
        id="non-preemptible running gangs are never moved",
    ),
    pytest.param(
        Case(
            2,
            [
                Gang("a", 4, ["n0"], scheduler="default-scheduler"),
                Gang("b", 4, ["n1"], scheduler="default-scheduler"),
                Gang("big", 8, [None]),
            ],
        ),
        id="another scheduler's pods are never moved",
    ),
    pytest.param(
        Case(
            2,
            [
                Gang("a", 4, ["n0"], controlled=False),
                Gang("b", 4, ["n1"], controlled=False),
                Gang("big", 8, [None]),
            ],
        ),
        id="bare pods, which nothing makes again, are never moved",
    ),
    pytest.param(
        Case(
            2,
            [*half_full("a", "b"), Gang("big", 8, [None])],
            config={"placementStrategy": "spread"},
        ),
        id="the spread strategy turns consolidation off",
    ),
    pytest.param(
        Case(2, [*half_full("a", "b"), Gang("big", 8, [None])], config={"consolidationMaxJobs": 0}),
        id="consolidationMaxJobs 0 turns consolidation off",
    ),
    pytest.param(
        Case(
            2,
            [
                Gang("a", 2, ["n0"]),
                Gang("b", 2, ["n0"]),
                Gang("c", 2, ["n1"]),
                Gang("d", 2, ["n1"]),
                Gang("big", 8, [None]),
            ],
            config={"consolidationMaxJobs": 1},
        ),
        id="a consolidation that needs two jobs moved is not made with consolidationMaxJobs 1",
    ),
    pytest.param(
        Case(
            2,
            [
                Gang("a", 2, ["n0"]),
                Gang("b", 2, ["n0"]),
                Gang("c", 2, ["n1"]),
                Gang("d", 2, ["n1"]),
                Gang("big", 8, [None]),
            ],
            # Renewed for issue 13: the two newest (c, d) move, not the first by name.
            {"c-0": "n0", "d-0": "n0"},
            ["big"],
            config={"consolidationMaxJobs": 2},
        ),
        id="the two newest 2-GPU jobs move together off one node with consolidationMaxJobs 2",
    ),
    pytest.param(
        Case(
            3,
            [
                Gang("pair", 2, ["n0", "n0"]),
                Gang("b", 4, ["n1"], priority=100),
                Gang("c", 4, ["n2"]),
                Gang("f", 4, ["n2"]),
                Gang("big", 8, [None]),
            ],
            {"pair-0": "n1", "pair-1": "n1"},
            ["big"],
        ),
        id="a two-pod gang is moved whole, both pods evicted and bound again",
    ),
    pytest.param(
        Case(2, [*half_full("a", "b"), Gang("big", 8, [None])], gpu_limit=8),
        id="a waiting gang its queue limit refuses is not made room for",
    ),
    pytest.param(
        Case(
            2, [*half_full("a", "b"), Gang("big", 4, [None, None], min_member=2)], admitted=["big"]
        ),
        id="a gang whose pods fit on separate nodes is allocate's, not consolidation's",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_consolidation(case: Case) -> None:
    result = run(case)
    evicted = {e.pod.split("/")[1]: e.reason for e in result.plan.evictions}
    assert set(evicted) == set(case.moves)
    assert set(evicted.values()) <= {CONSOLIDATION}
    nominated = {n.pod.split("/")[1]: n.node for n in result.plan.nominations}
    assert nominated == case.moves
    bound = {b.pod for b in result.plan.binds}
    assert not bound & {e.pod for e in result.plan.evictions}, "an evicted pod is never bound"
    assert {b.group.split("/")[1] for b in result.plan.binds} == set(case.admitted)


def test_the_moved_pods_and_the_waiting_gang_share_no_device() -> None:
    result = run(Case(2, [*half_full("a", "b"), Gang("big", 8, [None])]))
    intents = [*result.plan.binds, *result.plan.nominations]
    places = [(i.node, d) for i in intents for d in i.gpu_devices]
    assert len(places) == len(set(places)) == 12


def test_a_moved_gang_is_nominated_and_the_gang_it_made_room_for_admitted_once() -> None:
    """One status per group, the last stated: the waiting gang allocate could not place
    is admitted (before, `status_of` read allocate's stale refusal first)."""
    result = run(Case(2, [*half_full("a", "b"), Gang("big", 8, [None])]))
    assert result.plan.status_of("default/big") == GroupStatus("default/big", True)
    assert [s.group for s in result.plan.statuses].count("default/big") == 1
    moved = result.plan.status_of("default/b")  # the newer of two equals moves
    assert moved is not None and moved.nominated == ("n0",)


def _moved_gang(nominated: list[str]) -> CycleResult:
    """Gang `a` of two 4-GPU pods made again after a move, nominated onto `nominated`;
    n0 is the fuller node, where bin-packing alone would put both."""
    group = make_pod_group("a").queue("team").min_member(2).build()
    group["status"] = {"nominatedNodes": nominated}
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(3)],
        queues=[make_queue("team").build()],
        pod_groups=[group],
        pods=[
            make_pod("busy").gpus(4).on("n0").phase("Running").build(),
            *(make_pod(f"a-{i}").group("a").gpus(4).build() for i in range(2)),
        ],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    return run_cycle(build_snapshot(objects), config, 2, 100.0)


@pytest.mark.parametrize(
    ("nominated", "nodes"),
    [
        pytest.param(["n2", "n2"], ["n2", "n2"], id="both recreated pods go where nominated"),
        pytest.param(
            ["n1", "n2"], ["n1", "n2"], id="each recreated pod takes one nomination, one node each"
        ),
        pytest.param(
            ["n0", "n0"], ["n0", "n1"], id="a nominated node that no longer fits both takes one"
        ),
        pytest.param(["gone", "n2"], ["n0", "n2"], id="a nominated node not known is passed over"),
    ],
)
def test_the_next_cycle_places_a_moved_gang_on_its_nominated_nodes_first(
    nominated: list[str], nodes: list[str]
) -> None:
    result = _moved_gang(nominated)
    assert sorted(b.node for b in result.plan.binds) == nodes
    assert result.plan.status_of("default/a") == GroupStatus("default/a", True, nominated=())


def test_two_waiting_gangs_each_get_a_node_and_no_pod_moves_twice() -> None:
    gangs = [*half_full("a", "b", "c", "d"), Gang("big", 8, [None]), Gang("big2", 8, [None])]
    result = run(Case(4, gangs, config={"consolidationMaxJobs": 1}))
    moved = [e.pod for e in result.plan.evictions]
    assert len(moved) == len(set(moved)) == 2
    assert {b.group for b in result.plan.binds} >= {"default/big", "default/big2"}


def test_a_gang_started_within_the_min_runtime_is_not_moved_an_older_one_is() -> None:
    # Without the protection the newer gang, `a`, would move (victim order).
    gangs = [Gang("b", 4, ["n0"], created_at=0), Gang("a", 4, ["n1"], created_at=3590)]
    result = run(Case(2, [*gangs, Gang("big", 8, [None])]))
    assert [e.pod for e in result.plan.evictions] == ["default/b-0"]
    unprotected = run(
        Case(2, [*gangs, Gang("big", 8, [None])], config={"consolidationMinRuntime": "0s"})
    )
    assert [e.pod for e in unprotected.plan.evictions] == ["default/a-0"]


def test_when_every_movable_gang_is_protected_nothing_moves_and_a_cycle_comes_at_the_end() -> None:
    gangs = [Gang("a", 4, ["n0"], created_at=3570), Gang("b", 4, ["n1"], created_at=3580)]
    result = run(
        Case(2, [*gangs, Gang("big", 8, [None])], config={"consolidationMinRuntime": "2m"})
    )
    assert not result.plan.evictions
    assert result.plan.wake_at == unix_seconds(timestamp(3570 + 120))


def test_a_kind_nothing_came_of_is_judged_again_once_an_attempt_moved_the_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk skips a gang alike to one nothing came of only while the state is the
    one it was judged at: after an attempt that moved the state (here one that plans
    an eviction), the next gang of that kind is judged again."""
    judged: list[str] = []

    def attempt(ctx: Any, group: Any) -> None:
        judged.append(group.key.split("/")[-1])
        if group.key.endswith("/x"):
            ctx.plan.evictions.append(Evict("default/r1-0", "default/r1", CONSOLIDATION))
        return None

    monkeypatch.setattr(consolidate, "consolidation_for", attempt)
    # Full nodes but 2 GPUs each: x (4 GPUs) fits the free room in total, so the
    # action runs; k1, k2 and k3 are alike, x between k2 and k3 in turn.
    gangs = [
        Gang("r1", 6, ["n0"]),
        Gang("r2", 6, ["n1"]),
        Gang("k1", 8, [None]),
        Gang("k2", 8, [None]),
        Gang("x", 4, [None]),
        Gang("k3", 8, [None]),
    ]
    run(Case(2, gangs))
    assert judged == ["k1", "x", "k3"]


FRAGMENTED = Case(
    4,
    [
        Gang("a", 6, ["n0"]),
        Gang("b", 6, ["n1"]),
        Gang("c", 2, ["n2", "n3"]),
        Gang("d", 4, ["n2"]),
        Gang("e", 3, ["n3"]),
        Gang("big", 8, [None]),
        Gang("pair", 4, [None, None]),
    ],
)


@pytest.mark.parametrize("case", [*(param.values[0] for param in CASES), FRAGMENTED])
def test_the_counts_for_every_move_at_once_answer_as_those_made_move_by_move(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`domain_could_hold_moved` answers as `eviction.domain_could_hold` given every
    moved pod, and a move `moves_counted_out` rules out is one `could_pack` rules out,
    for each waiting gang the cycle tries."""
    asked = {"moved": 0, "counted": 0}
    could_hold, counted_out = consolidate.domain_could_hold_moved, consolidate.moves_counted_out

    def hold(tx: Any, target: Any, domains: Any, moved: Sequence[Any]) -> bool:
        answer = could_hold(tx, target, domains, moved)
        pods = [pod for gang in moved for pod in gang.bound]
        assert answer == eviction.domain_could_hold(tx, target, domains, pods)
        asked["moved"] += 1
        return answer

    def counted(tx: Any, target: Any, movable: Sequence[Any]) -> list[bool]:
        answers = counted_out(tx, target, movable)
        for k, out in enumerate(answers, start=1):
            assert not (out and consolidate.could_pack(tx, target, movable[:k]))
        asked["counted"] += len(answers)
        return answers

    monkeypatch.setattr(consolidate, "domain_could_hold_moved", hold)
    monkeypatch.setattr(consolidate, "moves_counted_out", counted)
    run(case)
    if case is FRAGMENTED:
        assert asked["moved"] and asked["counted"]
