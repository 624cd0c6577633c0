"""Queue order and job order: who goes next, as docs/architecture.md section 2 says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import Candidate, WaitingJobs, group_priority, next_candidate
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.resources import GPU, Resources
from tests.builders import make_pod, make_pod_group, make_queue


def _snapshot(
    queues: Sequence[Any], groups: Sequence[Any] = (), pods: Sequence[Any] = ()
) -> Snapshot:
    objects = ClusterObjects(
        queues=[q.build() for q in queues],
        pod_groups=[g.build() for g in groups],
        pods=[p.build() for p in pods],
    )
    return build_snapshot(objects)


def _two_teams(a_quota: int = 4, b_quota: int = 4, a_priority: int = 100) -> Snapshot:
    queues = [
        make_queue("org").created(0),
        make_queue("team-a").parent("org").gpu(a_quota).priority(a_priority).created(1),
        make_queue("team-b").parent("org").gpu(b_quota).created(2),
    ]
    groups = [
        make_pod_group("job-a").queue("team-a").created(10),
        make_pod_group("job-b").queue("team-b").created(10),
    ]
    return _snapshot(queues, groups)


def _pick(
    snapshot: Snapshot,
    held: Mapping[str, float],
    shares: Mapping[str, float],
    gpus: Mapping[str, float] | None = None,
) -> str:
    ledger = QueueLedger(snapshot.queues, {q: Resources({GPU: s}) for q, s in shares.items()})
    for queue, amount in held.items():
        ledger.add(queue, Resources({GPU: amount}), preemptible=True)
    waiting = WaitingJobs()
    for group in snapshot.pod_groups.values():
        request = Resources({GPU: (gpus or {}).get(group.queue, 1)})
        waiting.add(Candidate(group, request, 0))
    found = next_candidate(ledger, waiting)
    assert found is not None
    return found.queue


SHARES = {"org": 16, "team-a": 8, "team-b": 8}


@pytest.mark.parametrize(
    ("snapshot", "held", "shares", "gpus", "expected"),
    [
        pytest.param(
            _two_teams(),
            {"team-a": 9, "team-b": 2},
            SHARES,
            None,
            "team-b",
            id="a queue over its fair share waits for one that is not",
        ),
        pytest.param(
            _two_teams(a_quota=8, b_quota=2),
            {"team-a": 5, "team-b": 2},
            SHARES,
            None,
            "team-a",
            id="a queue still within quota with the job goes before one past quota",
        ),
        pytest.param(
            _two_teams(a_priority=50),
            {},
            SHARES,
            None,
            "team-b",
            id="higher queue priority goes first when quota does not decide",
        ),
        pytest.param(
            _two_teams(a_quota=0, b_quota=0),
            {"team-a": 1, "team-b": 3},
            SHARES,
            None,
            "team-a",
            id="the smaller dominant share with the job added goes first",
        ),
        pytest.param(
            _two_teams(a_quota=0, b_quota=0),
            {"team-a": 2},
            SHARES,
            {"team-b": 4},
            "team-a",
            id="dominant share counts the job: a big job can lose to a small one",
        ),
        pytest.param(
            _two_teams(a_quota=0, b_quota=0),
            {},
            SHARES,
            None,
            "team-a",
            id="all else equal, the older queue goes first",
        ),
    ],
)
def test_queue_order(
    snapshot: Snapshot,
    held: Mapping[str, float],
    shares: Mapping[str, float],
    gpus: Mapping[str, float] | None,
    expected: str,
) -> None:
    assert _pick(snapshot, held, shares, gpus) == expected


def test_the_walk_goes_down_the_tree_level_by_level() -> None:
    queues = [
        make_queue("dept-1").created(0),
        make_queue("dept-2").created(1),
        make_queue("a").parent("dept-1").created(2),
        make_queue("b").parent("dept-1").created(3),
        make_queue("c").parent("dept-2").created(4),
    ]
    groups = [make_pod_group(f"job-{q}").queue(q).created(10) for q in ("a", "b", "c")]
    shares = {"dept-1": 8, "dept-2": 8, "a": 4, "b": 4, "c": 8}
    # dept-1 holds 6 of 8 (b over its share), dept-2 holds 1 of 8: c goes first,
    # although a alone looks as starved as c.
    held = {"a": 1, "b": 5, "c": 1}
    assert _pick(_snapshot(queues, groups), held, shares) == "c"


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        pytest.param(
            [
                make_pod_group("old").queue("q").created(1),
                make_pod_group("new").queue("q").created(2).priority_class("inference"),
            ],
            "default/new",
            id="inside a queue the higher priority job goes first",
        ),
        pytest.param(
            [
                make_pod_group("old").queue("q").created(1),
                make_pod_group("new").queue("q").created(2),
            ],
            "default/old",
            id="inside a queue, at equal priority, the older job goes first",
        ),
    ],
)
def test_job_order_inside_a_queue(groups: list[Any], expected: str) -> None:
    snapshot = _snapshot([make_queue("q")], groups)
    ledger = QueueLedger(snapshot.queues, {})
    waiting = WaitingJobs(
        Candidate(g, Resources({GPU: 1}), group_priority(g)) for g in snapshot.pod_groups.values()
    )
    found = next_candidate(ledger, waiting)
    assert found is not None and found.group.key == expected


@pytest.mark.parametrize(
    ("class_name", "pod_priority", "expected"),
    [
        pytest.param("inference", 0, 125, id="inference is a well-known class of 125"),
        pytest.param("train", 0, 50, id="train is a well-known class of 50"),
        pytest.param("custom", 7, 7, id="another class takes the priority resolved on its pods"),
        pytest.param(None, 0, 0, id="no class means priority 0, as in Kubernetes"),
    ],
)
def test_group_priority(class_name: str | None, pod_priority: int, expected: int) -> None:
    group = make_pod_group("g").queue("q")
    if class_name is not None:
        group.priority_class(class_name)
    pod = make_pod("p").group("g").priority(pod_priority)
    snapshot = _snapshot([make_queue("q")], [group], [pod])
    assert group_priority(snapshot.pod_groups["default/g"]) == expected


@pytest.mark.parametrize(
    ("older_above", "newer_above", "first"),
    [
        pytest.param(False, False, "old", id="both at their minimum: the older first"),
        pytest.param(True, False, "new", id="a job at its minimum before an older one above it"),
        pytest.param(True, True, "old", id="both above their minimum: the older first"),
    ],
)
def test_elastic_extras_go_first_to_a_job_at_its_minimum(
    older_above: bool, newer_above: bool, first: str
) -> None:
    groups = [
        make_pod_group(name).queue("team").min_member(1).created(second).build()
        for name, second in (("old", 0), ("new", 10))
    ]
    objects = ClusterObjects(pod_groups=groups, queues=[make_queue("team").build()])
    found = {g.name: g for g in build_snapshot(objects).pod_groups.values()}
    one = Resources({GPU: 1})
    waiting = WaitingJobs(
        [Candidate(found["old"], one, 0, older_above), Candidate(found["new"], one, 0, newer_above)]
    )
    chosen = waiting.first("team")
    assert chosen is not None and chosen.group.name == first
