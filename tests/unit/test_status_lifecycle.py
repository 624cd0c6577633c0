"""The PodGroup phase: one named case per edge of the transition table, and its walks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kai_ray.state.lifecycle import TRANSITIONS, GroupFacts, next_phase, transitions
from kai_ray.values.api import Phase

P, A, R = Phase.PENDING, Phase.ADMITTED, Phase.RUNNING
S, F, E = Phase.SUCCEEDED, Phase.FAILED, Phase.EVICTED


@dataclass(frozen=True)
class EdgeCase:
    source: Phase
    facts: GroupFacts
    target: Phase


def facts(min_member: int = 4, **counts: int | bool | None) -> GroupFacts:
    return GroupFacts(min_member, **counts)  # type: ignore[arg-type]


def edge(source: Phase, target: Phase, given: GroupFacts, name: str) -> object:
    return pytest.param(EdgeCase(source, given, target), id=f"{source} -> {target}: {name}")


EDGES = [
    # Pending
    edge(P, S, facts(succeeded=4), "every pod finished and the minimum succeeded"),
    edge(P, F, facts(failed=1, succeeded=3), "every pod finished and too few succeeded"),
    edge(P, E, facts(bound=2, pending=2, evicted=True), "stale gang evicted before it ran"),
    edge(P, R, facts(bound=4, running=4), "found running after a restart"),
    edge(P, A, facts(pending=4, admitted=True), "its queue took it and there is room"),
    # Admitted
    edge(A, S, facts(succeeded=4), "a short job finished between two cycles"),
    edge(A, F, facts(failed=4), "its pods failed before a cycle saw them run"),
    edge(A, E, facts(bound=4, evicted=True), "reclaimed before its pods started"),
    edge(A, R, facts(bound=4, running=4), "its minimum started"),
    edge(A, P, facts(pending=4, admitted=False), "binds failed and it no longer fits"),
    # Running
    edge(R, S, facts(succeeded=4), "every pod completed"),
    edge(R, F, facts(succeeded=1, failed=3), "its pods failed"),
    edge(R, E, facts(bound=4, running=4, evicted=True), "reclaimed by a queue below its share"),
    edge(
        R,
        A,
        facts(bound=3, running=3, pending=1, admitted=True),
        "a member was lost and its replacement placed",
    ),
    edge(
        R,
        P,
        facts(bound=3, running=3, pending=1, admitted=False),
        "a member was lost and its replacement does not fit",
    ),
    # Evicted
    edge(E, A, facts(pending=4, admitted=True), "the recreated gang fits again"),
    edge(E, P, facts(pending=4, admitted=False), "the evicted pods are gone"),
    # Finished
    edge(S, P, facts(pending=4), "new pods joined the finished group"),
    edge(F, P, facts(pending=1, failed=1), "its workload retries with a new pod"),
]


@pytest.mark.parametrize("case", EDGES)
def test_each_edge_of_the_table(case: EdgeCase) -> None:
    taken = transitions(case.source, case.facts)
    assert taken, "no edge taken"
    assert (taken[0].source, taken[0].target) == (case.source, case.target)


def test_every_edge_of_the_table_has_a_case() -> None:
    covered = {(c.values[0].source, c.values[0].target) for c in EDGES}  # type: ignore[attr-defined]
    table = {(e.source, e.target) for e in TRANSITIONS}
    assert covered == table
    assert len(table) == len(TRANSITIONS), "one row per edge"


def test_every_edge_says_why() -> None:
    assert all(e.cause and e.cause[0].islower() for e in TRANSITIONS)


@pytest.mark.parametrize(
    ("previous", "given", "expected"),
    [
        pytest.param(None, facts(), P, id="a new group with no pods is Pending"),
        pytest.param(None, facts(pending=4, admitted=True), A, id="a new group admitted at once"),
        pytest.param(P, facts(pending=4, admitted=False), P, id="a refused group stays Pending"),
        pytest.param(A, facts(bound=4), A, id="admitted while its pods start, plan silent"),
        pytest.param(P, facts(bound=4), A, id="its minimum bound before Admitted was written"),
        pytest.param(
            P, facts(bound=3, pending=1), P, id="fewer than its minimum bound, plan silent"
        ),
        pytest.param(P, facts(bound=4, admitted=False), P, id="minimum bound, refused: it waits"),
        pytest.param(A, facts(), A, id="admitted while its workload makes its pods"),
        pytest.param(R, facts(bound=6, running=6, admitted=True), R, id="extras do not move it"),
        pytest.param(R, facts(bound=3, running=3), R, id="a lost member alone, plan silent"),
        pytest.param(R, facts(), P, id="every pod deleted, none finished: it waits for pods"),
        pytest.param(R, facts(pending=4, admitted=True), A, id="every pod replaced and admitted"),
        pytest.param(E, facts(bound=4, running=4), E, id="evicted while its pods terminate"),
        pytest.param(E, facts(bound=4, admitted=False), E, id="evicted, pods not gone, refused"),
        pytest.param(S, facts(succeeded=4), S, id="finished stays finished"),
        pytest.param(F, facts(failed=4), F, id="failed stays failed"),
        pytest.param(
            F, facts(pending=4, failed=4, admitted=True), A, id="a retry admitted in one cycle"
        ),
        pytest.param(
            P, facts(min_member=0, bound=1, running=1), R, id="minMember 0 runs with one pod"
        ),
    ],
)
def test_next_phase(previous: Phase | None, given: GroupFacts, expected: Phase) -> None:
    assert next_phase(previous, given) is expected


def test_a_walk_never_visits_a_phase_twice() -> None:
    # Evicted and refused with nothing bound goes to Pending, which would go
    # back to Evicted if the eviction flag were read again: it is not.
    taken = transitions(E, facts(pending=4, evicted=True))
    assert [e.target for e in taken] == []
    for source in Phase:
        for given in (facts(pending=4, admitted=True, evicted=True), facts(failed=1)):
            targets = [e.target for e in transitions(source, given)]
            assert len(targets) == len(set(targets)) and source not in targets
