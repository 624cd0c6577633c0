"""The plan's group statuses: one per group, the last stated wins."""

from __future__ import annotations

from kai_ray.decisions.plan import GroupStatus, Plan, Staleness


def test_a_later_status_replaces_an_earlier_one_but_keeps_what_it_says_nothing_of() -> None:
    plan = Plan(cycle=1)
    plan.statuses.state(GroupStatus("ns/g", True, nominated=("n1",)))
    plan.statuses.state(GroupStatus("ns/g", False, "stale gang: evicted", Staleness(None)))
    assert list(plan.statuses) == [
        GroupStatus("ns/g", False, "stale gang: evicted", Staleness(None), nominated=("n1",))
    ]


def test_statuses_stated_all_at_once_are_what_stating_each_in_turn_leaves() -> None:
    first = [
        GroupStatus("ns/a", True, nominated=("n1",)),
        GroupStatus("ns/b", False, "waits", Staleness(5.0)),
    ]
    then = [
        GroupStatus("ns/c", False, "no node fits"),
        GroupStatus("ns/a", False, "waits"),  # keeps its nomination
        GroupStatus("ns/d", False, "no node fits"),
        GroupStatus("ns/b", False, "quota", Staleness(None)),
        GroupStatus("ns/c", False, "again"),
    ]
    each, at_once = Plan(cycle=1), Plan(cycle=1)
    for status in first:
        each.statuses.state(status)
        at_once.statuses.state(status)
    for status in then:
        each.statuses.state(status)
    at_once.statuses.state_all(then)
    assert list(at_once.statuses) == list(each.statuses)
    assert at_once.statuses["ns/a"].nominated == ("n1",)
    assert at_once.statuses["ns/c"].reason == "again"
