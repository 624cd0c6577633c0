"""Gangs: all or nothing, subgroups with minSubGroup, elastic extras, rollback."""

from __future__ import annotations

import numpy as np
import pytest

from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.transaction import Transaction
from kai_ray.values.config import SchedulerConfigSpec
from tests.builders import make_node, make_pod_group
from tests.unit.placement_setup import (
    cluster,
    extras,
    gang_pods,
    nodes_of,
    place,
    simple_gang,
)


@pytest.mark.parametrize(
    ("size", "gpus", "free_nodes", "admitted"),
    [
        pytest.param(4, 8, 3, False, id="gang of 4x8 GPUs waits when only 3 nodes are free"),
        pytest.param(4, 8, 4, True, id="gang of 4x8 GPUs fits on 4 free nodes"),
        pytest.param(4, 4, 2, True, id="gang of 4x4 GPUs packs two per node"),
    ],
)
def test_all_or_nothing(size: int, gpus: int, free_nodes: int, admitted: bool) -> None:
    pods, group = simple_gang("g", size, gpus)
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(free_nodes)]
    outcome, tx = place(cluster(nodes, pods, [group]))
    assert outcome.admitted is admitted
    assert len(tx.binds()) == (size if admitted else 0)


def test_failed_gang_leaves_the_transaction_unchanged() -> None:
    pods, group = simple_gang("g", 4, 8)
    snapshot = cluster([make_node(f"n{i}").gpus(8).build() for i in range(3)], pods, [group])
    tx = Transaction(snapshot)
    before = (tx.free.copy(), tx.devices.copy(), tx.whole_free.copy())
    outcome = place_gang(tx, snapshot.pod_groups["default/g"], SchedulerConfigSpec())
    assert not outcome.admitted
    assert "needs 1 pod with 8 GPUs" in outcome.reason or "room for 3" in outcome.reason
    assert np.array_equal(tx.free, before[0]) and np.array_equal(tx.devices, before[1])
    assert np.array_equal(tx.whole_free, before[2]) and tx.placements == [] and tx.placed == {}


def test_gang_reason_says_how_much_room_there_is() -> None:
    pods, group = simple_gang("g", 4, 8)
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    outcome, _ = place(cluster(nodes, pods, [group]))
    assert (
        outcome.reason
        == (
            "gang of 4 does not fit: needs 1 pod with 8 GPUs beside the gang's other pods; "
            "the cluster has room for 3 of them before the others are placed"
        )
        or "room for 3" in outcome.reason
    )


def test_elastic_members_are_placed_one_by_one_after_the_minimum() -> None:
    pods, group = simple_gang("g", 3, 8, min_member=1)
    snapshot = cluster([make_node(f"n{i}").gpus(8).build() for i in range(2)], pods, [group])
    outcome, tx = place(snapshot)
    assert outcome.admitted and outcome.placed == 1
    assert extras(tx) == 1
    assert len(tx.binds()) == 2


def test_extras_respect_the_limit() -> None:
    pods, group = simple_gang("g", 4, 1, min_member=1)
    _outcome, tx = place(cluster([make_node("n").gpus(8).build()], pods, [group]))
    assert extras(tx, limit=2) == 2 and len(tx.binds()) == 3


def subgrouped(min_subgroup: int | None, workers: int) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    pods = [p.build() for p in gang_pods("g", 1, 8, "head")]
    pods += [p.build() for p in gang_pods("g", workers, 8, "a")]
    pods += [p.build() for p in gang_pods("g", 2, 8, "b")]
    group = (
        make_pod_group("g")
        .queue("q")
        .min_member(1 + workers + 2)
        .subgroup("head", 1)
        .subgroup("a", workers)
        .subgroup("b", 2)
    )
    if min_subgroup is not None:
        group.min_subgroup(min_subgroup)
    return pods, group.build()


@pytest.mark.parametrize(
    ("min_subgroup", "nodes", "bound"),
    [
        pytest.param(None, 5, 5, id="every subgroup reaches its minimum"),
        pytest.param(None, 4, 0, id="one subgroup short: nothing binds"),
        pytest.param(2, 3, 3, id="minSubGroup 2 of 3: the gang holds with two subgroups"),
        pytest.param(3, 3, 0, id="minSubGroup 3 of 3 needs them all"),
    ],
)
def test_subgroups_and_min_subgroup(min_subgroup: int | None, nodes: int, bound: int) -> None:
    pods, group = subgrouped(min_subgroup, 2)
    group["spec"]["minMember"] = 1
    snapshot = cluster([make_node(f"n{i}").gpus(8).build() for i in range(nodes)], pods, [group])
    outcome, tx = place(snapshot)
    assert len(tx.binds()) == bound, outcome.reason
    assert outcome.admitted is (bound > 0)


def test_a_short_subgroup_is_placed_whole_as_an_extra() -> None:
    pods, group = subgrouped(2, 2)
    group["spec"]["minMember"] = 1
    snapshot = cluster([make_node(f"n{i}").gpus(8).build() for i in range(5)], pods, [group])
    tx = Transaction(snapshot)
    tx.free[3:, :] = 0  # only three nodes have room at first
    tx.whole_free[3:] = 0
    outcome = place_gang(tx, snapshot.pod_groups["default/g"], SchedulerConfigSpec())
    tx.commit()
    assert outcome.admitted and len(tx.binds()) == 3
    tx.free[3:] = snapshot.free[3:]
    tx.whole_free[3:] = 8
    assert extras(tx) == 2
    assert {p for p in nodes_of(tx)} == {p["metadata"]["name"] for p in pods}
