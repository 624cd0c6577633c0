"""The preempt action through the whole cycle: strictly lower priority, same queue, preemptible."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from tests.builders import make_queue, timestamp
from tests.unit.test_reclaim import Job, bound, build_seconds, evicted, run

ONE_QUEUE = [make_queue("team").gpu(quota=16)]


@dataclass(frozen=True)
class Case:
    jobs: list[Job]
    evicted: dict[str, int]
    bound: dict[str, int]


CASES = [
    pytest.param(
        Case(
            [
                Job("low", "team", 2, on=["n0", "n1"]),
                Job("high", "team", 2, priority_class="build-preemptible", created=5),
            ],
            evicted={"low": 2},
            bound={"high": 2},
        ),
        id="a higher-priority gang evicts a lower-priority gang of its queue",
    ),
    pytest.param(
        Case(
            [Job("same", "team", 2, on=["n0", "n1"]), Job("new", "team", 2, created=5)],
            evicted={},
            bound={},
        ),
        id="equal priority never preempts",
    ),
    pytest.param(
        Case(
            [
                Job("low", "team", 2, on=["n0", "n1"], preemptible=False),
                Job("high", "team", 2, priority_class="build-preemptible", created=5),
            ],
            evicted={},
            bound={},
        ),
        id="a non-preemptible gang is never a victim",
    ),
    pytest.param(
        Case(
            [
                Job("elastic", "team", 2, min_member=1, on=["n0", "n1"]),
                Job("high", "team", 1, priority_class="build-preemptible", created=5),
            ],
            evicted={"elastic": 1},
            bound={"high": 1},
        ),
        id="an elastic extra goes before any whole gang",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_preempt(case: Case) -> None:
    result = run(2, ONE_QUEUE, case.jobs, actions=("allocate", "preempt"))
    assert evicted(result) == Counter(case.evicted)
    assert bound(result) == Counter(case.bound)
    assert all(e.reason == "preempt" for e in result.plan.evictions)


def test_preempt_never_crosses_queues() -> None:
    queues = [make_queue("a").gpu(quota=8), make_queue("b").gpu(quota=8)]
    jobs = [
        Job("low", "b", 2, on=["n0", "n1"]),
        Job("high", "a", 1, priority_class="build-preemptible"),
    ]
    assert evicted(run(2, queues, jobs, actions=("allocate", "preempt"))) == Counter()


def test_preempt_min_runtime_protects_then_wakes() -> None:
    queues = [make_queue("team").gpu(quota=16).set("spec.preemptMinRuntime", "5m")]
    jobs = [
        Job("low", "team", 2, on=["n0", "n1"]),
        Job("high", "team", 2, priority_class="build-preemptible"),
    ]
    start = build_seconds(timestamp(0))
    early = run(2, queues, jobs, now=start + 10, actions=("allocate", "preempt"))
    assert evicted(early) == Counter() and early.plan.wake_at == start + 300
    late = run(2, queues, jobs, now=start + 301, actions=("allocate", "preempt"))
    assert evicted(late) == Counter({"low": 2})
