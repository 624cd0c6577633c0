"""The reclaim action through the whole cycle: who may take from whom, and what is evicted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, timestamp


@dataclass
class Job:
    """A group with `pods` pods of `gpus` GPUs each; `on` binds the first ones."""

    name: str
    queue: str
    pods: int
    gpus: int = 8
    min_member: int | None = None
    priority_class: str = "train"
    created: int = 0
    on: Sequence[str] = field(default_factory=list)
    preemptible: bool | None = None

    def objects(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        group = make_pod_group(self.name).queue(self.queue).priority_class(self.priority_class)
        group = group.min_member(self.pods if self.min_member is None else self.min_member)
        if self.preemptible is not None:
            group = group.set("spec.preemptible", self.preemptible)
        pods = []
        for i in range(self.pods):
            pod = (
                make_pod(f"{self.name}-{i}").group(self.name).gpus(self.gpus).created(self.created)
            )
            if i < len(self.on):
                pod = pod.on(self.on[i]).phase("Running")
            pods.append(pod.build())
        return group.created(self.created).build(), pods


def run(
    nodes: int,
    queues: Sequence[Any],
    jobs: Sequence[Job],
    now: float = 0.0,
    actions: Sequence[str] = ("allocate", "reclaim", "preempt"),
    gpus_per_node: int = 8,
) -> CycleResult:
    built = [job.objects() for job in jobs]
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(gpus_per_node).build() for i in range(nodes)],
        queues=[q.build() for q in queues],
        pod_groups=[group for group, _ in built],
        pods=[pod for _, pods in built for pod in pods],
    )
    config = SchedulerConfig.model_validate({"spec": {"actions": list(actions)}})
    return run_cycle(build_snapshot(objects), config, 1, now)


def evicted(result: CycleResult) -> Counter[str]:
    return Counter(e.group.split("/")[1] for e in result.plan.evictions)


def bound(result: CycleResult) -> Counter[str]:
    return Counter(b.group.split("/")[1] for b in result.plan.binds)


def two_teams(quota_a: int = 8, quota_b: int = 8, **spec: Any) -> list[Any]:
    a = make_queue("team-a").gpu(quota=quota_a)
    b = make_queue("team-b").gpu(quota=quota_b)
    for key, value in spec.items():
        a, b = a.set(f"spec.{key}", value), b.set(f"spec.{key}", value)
    return [a, b]


@dataclass(frozen=True)
class Case:
    queues: list[Any]
    jobs: list[Job]
    evicted: dict[str, int]
    bound: dict[str, int]
    nodes: int = 4


CASES = [
    pytest.param(
        Case(
            two_teams(),
            [
                Job("b1", "team-b", 1, on=["n0"]),
                Job("b2", "team-b", 1, on=["n1"], created=1),
                Job("b3", "team-b", 2, on=["n2", "n3"], created=2),
                Job("a1", "team-a", 2, created=3),
            ],
            evicted={"b3": 2},
            bound={"a1": 2},
        ),
        id="a starved queue takes back a whole 2-node gang from a queue over its share",
    ),
    pytest.param(
        Case(
            two_teams(),
            [
                Job("b1", "team-b", 1, on=["n0"]),
                Job("b2", "team-b", 1, on=["n1"], created=1),
                Job("b3", "team-b", 1, on=["n2"], created=2),
                Job("b4", "team-b", 1, on=["n3"], created=1),
                Job("a1", "team-a", 1, created=3),
            ],
            evicted={"b3": 1},
            bound={"a1": 1},
        ),
        id="the victim gang is the youngest among gangs of the same size and priority",
    ),
    pytest.param(
        Case(
            two_teams(),
            [
                Job("b1", "team-b", 2, on=["n0", "n1"]),
                Job("b2", "team-b", 2, on=["n2", "n3"], created=1),
                Job("a1", "team-a", 1, created=3),
            ],
            evicted={},
            bound={},
        ),
        id="no victim is taken that would push its queue below its fair share",
    ),
    pytest.param(
        Case(
            two_teams(),
            [
                Job("b1", "team-b", 4, on=["n0", "n1", "n2", "n3"]),
                Job("a1", "team-a", 4, created=3),
            ],
            evicted={},
            bound={},
        ),
        id="a reclaimer that would pass its fair share with the job takes nothing",
    ),
    pytest.param(
        Case(
            two_teams(quota_a=0, quota_b=0),
            [
                Job("b1", "team-b", 2, on=["n0", "n1"], preemptible=False),
                Job("b2", "team-b", 2, on=["n2", "n3"], created=1, preemptible=False),
                Job("a1", "team-a", 1, created=3),
            ],
            evicted={},
            bound={},
        ),
        id="non-preemptible jobs are never victims",
    ),
    pytest.param(
        Case(
            two_teams(),
            [
                Job("b1", "team-b", 4, min_member=2, on=["n0", "n1", "n2", "n3"]),
                Job("a1", "team-a", 1, created=3),
            ],
            evicted={"b1": 1},
            bound={"a1": 1},
        ),
        id="an elastic gang loses one extra member, not the whole gang",
    ),
    pytest.param(
        Case(
            two_teams(quota_a=4, quota_b=4),
            [
                Job("b1", "team-b", 2, on=["n0", "n1"]),
                Job("b2", "team-b", 2, on=["n2", "n3"], created=1),
                Job("a1", "team-a", 2, created=3),
            ],
            evicted={"b2": 2},
            bound={"a1": 2},
        ),
        id="reclaim restores the full fair share between siblings, not only the quota",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_reclaim(case: Case) -> None:
    result = run(case.nodes, case.queues, case.jobs)
    assert evicted(result) == Counter(case.evicted)
    assert bound(result) == Counter(case.bound)
    assert all(e.reason == "reclaim" for e in result.plan.evictions)


def test_siblings_are_compared_under_their_common_parent() -> None:
    queues = [
        make_queue("org").gpu(quota=32),
        make_queue("a1").parent("org").gpu(quota=8),
        make_queue("a2").parent("org").gpu(quota=8),
        make_queue("other").gpu(quota=0),
    ]
    jobs = [
        Job("x", "a2", 3, on=["n0", "n1", "n2"]),
        Job("o", "other", 1, on=["n3"]),
        Job("y", "a1", 1, created=3),
    ]
    result = run(4, queues, jobs)
    # a2 holds its fair share inside org; "other" is over its share of 0 and org,
    # with y added, stays within its own: compared where the paths diverge (the roots).
    assert evicted(result) == Counter({"o": 1})
    assert bound(result) == Counter({"y": 1})


def test_the_starved_job_is_bound_in_the_same_plan_and_its_status_says_admitted() -> None:
    jobs = [
        Job("b1", "team-b", 1, on=["n0"]),
        Job("b2", "team-b", 1, on=["n1"]),
        Job("a", "team-a", 1),
    ]
    result = run(2, two_teams(), jobs)
    status = result.plan.status_of("default/a")
    assert status is not None and status.admitted
    assert {b.node for b in result.plan.binds} <= {"n0", "n1"}


def test_reclaim_min_runtime_protects_a_recent_gang_and_asks_to_wake_when_it_ends() -> None:
    queues = two_teams(reclaimMinRuntime="10m")
    jobs = [
        Job("b1", "team-b", 1, on=["n0"]),
        Job("b2", "team-b", 1, on=["n1"]),
        Job("a", "team-a", 1),
    ]
    start = build_seconds(timestamp(0))
    early = run(2, queues, jobs, now=start + 60)
    assert evicted(early) == Counter() and early.plan.wake_at == start + 600
    late = run(2, queues, jobs, now=start + 601)
    assert sum(evicted(late).values()) == 1


def test_min_runtime_is_inherited_from_the_nearest_ancestor() -> None:
    queues = [
        make_queue("org").set("spec.reclaimMinRuntime", "1h"),
        make_queue("team-a").gpu(quota=8),
        make_queue("team-b").parent("org").gpu(quota=8),
    ]
    jobs = [
        Job("b1", "team-b", 1, on=["n0"]),
        Job("b2", "team-b", 1, on=["n1"]),
        Job("a", "team-a", 1),
    ]
    start = build_seconds(timestamp(0))
    assert evicted(run(2, queues, jobs, now=start + 1800)) == Counter()
    assert sum(evicted(run(2, queues, jobs, now=start + 3601)).values()) == 1


def build_seconds(text: str) -> float:
    from kai_ray.values.clock import unix_seconds

    seconds = unix_seconds(text)
    assert seconds is not None
    return seconds
