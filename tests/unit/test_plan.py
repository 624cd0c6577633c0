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
