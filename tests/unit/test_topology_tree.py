"""Topology trees: levels, domains qualified by their parents; free resources per domain
as decisions sum them (`Transaction.domain_free`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kai_ray.decisions.transaction import Transaction
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.state.topology import TopologyTree
from tests.builders import make_node, make_pod, make_topology

BLOCK, RACK = "example.com/block", "example.com/rack"


def two_blocks() -> Snapshot:
    """Two blocks that both have a rack called rack-1; n5 has no block, n6 no rack."""
    nodes = [
        make_node("n1").gpus(8).label(BLOCK, "block-a").label(RACK, "rack-1"),
        make_node("n2").gpus(8).label(BLOCK, "block-a").label(RACK, "rack-1"),
        make_node("n3").gpus(8).label(BLOCK, "block-a").label(RACK, "rack-2"),
        make_node("n4").gpus(8).label(BLOCK, "block-b").label(RACK, "rack-1"),
        make_node("n5").gpus(8).label(RACK, "rack-1"),
        make_node("n6").gpus(8).label(BLOCK, "block-b"),
    ]
    topology = make_topology("dc").level(BLOCK, "block").level(RACK, "rack").hostname()
    pods = [make_pod("busy").gpus(3).on("n1").build()]
    return build_snapshot(
        ClusterObjects(nodes=[n.build() for n in nodes], pods=pods, topologies=[topology.build()])
    )


def tree() -> TopologyTree:
    return two_blocks().topologies["dc"]


@pytest.mark.parametrize(
    ("name", "index"),
    [
        pytest.param(BLOCK, 0, id="a level is found by its node label"),
        pytest.param("rack", 1, id="a level is found by its alias"),
        pytest.param("kubernetes.io/hostname", 2, id="the hostname level is the narrowest"),
        pytest.param("zone", None, id="an unknown level is not found"),
    ],
)
def test_level_lookup(name: str, index: int | None) -> None:
    assert tree().level_index(name) == index
    found = tree().level(name)
    assert (found is None) == (index is None)


def test_rack_names_repeated_under_two_blocks_stay_distinct() -> None:
    racks = tree().level("rack")
    assert racks is not None
    assert [d.id for d in racks.domains] == ["block-a/rack-1", "block-a/rack-2", "block-b/rack-1"]
    assert [d.value for d in racks.domains] == ["rack-1", "rack-2", "rack-1"]
    assert [d.parent for d in racks.domains] == ["block-a", "block-a", "block-b"]


def test_domains_hold_their_nodes() -> None:
    snapshot = two_blocks()
    dc = snapshot.topologies["dc"]

    def names(domain_id: str) -> list[str]:
        return [snapshot.node_names[i] for i in dc.domains[domain_id].node_indices]

    assert names("block-a") == ["n1", "n2", "n3"]
    assert names("block-b") == ["n4", "n6"]
    assert names("block-a/rack-1") == ["n1", "n2"]
    assert names("block-a/rack-1/n1") == ["n1"]
    assert [d.id for d in dc.children("block-a")] == ["block-a/rack-1", "block-a/rack-2"]
    assert dc.children("block-a/rack-1/n1") == ()


def test_nodes_missing_a_label_are_outside_that_level_and_below() -> None:
    snapshot = two_blocks()
    dc = snapshot.topologies["dc"]
    n5, n6 = snapshot.node_index["n5"], snapshot.node_index["n6"]
    assert [level.node_domain[n5] for level in dc.levels] == [-1, -1, -1]
    assert [level.node_domain[n6] for level in dc.levels][1:] == [-1, -1]
    assert dc.levels[0].node_domain[n6] == dc.levels[0].domains.index(dc.domains["block-b"])
    assert all(not d.id.endswith("/n5") and d.id != "n5" for d in dc.domains.values())


def free_gpus(tx: Transaction, topology: str, domain_id: str) -> float:
    """The GPUs the transaction counts free in one domain as it is now."""
    snapshot = tx.snapshot
    domain = snapshot.topologies[topology].domains[domain_id]
    index = snapshot.topologies[topology].levels[domain.level].domains.index(domain)
    return float(tx.domain_free(topology, domain.level)[index, snapshot.column("gpu")])


def domain_gpus(snapshot: Snapshot, topology: str, domain_id: str) -> float:
    """The GPUs a decision counts free in one domain, from a fresh transaction."""
    return free_gpus(Transaction(snapshot), topology, domain_id)


def racked(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> Transaction:
    """A transaction on these nodes and pods, with a Topology "t" of racks."""
    topologies = [make_topology("t", RACK).build()]
    return Transaction(
        build_snapshot(ClusterObjects(nodes=nodes, pods=pods, topologies=topologies))
    )


def test_domain_free_adds_up_the_free_of_its_nodes() -> None:
    snapshot = two_blocks()
    assert domain_gpus(snapshot, "dc", "block-a") == 8 * 3 - 3
    assert domain_gpus(snapshot, "dc", "block-a/rack-1") == 13
    assert domain_gpus(snapshot, "dc", "block-b") == 16


def test_unready_and_cordoned_nodes_add_nothing_to_a_domain() -> None:
    nodes = [
        make_node("ok").gpus(8).label(RACK, "r1").build(),
        make_node("down").gpus(8).label(RACK, "r1").unready().build(),
        make_node("cordoned").gpus(8).label(RACK, "r1").cordoned().build(),
    ]
    tx = racked(nodes, [])
    assert free_gpus(tx, "t", "r1") == 8
    assert len(tx.snapshot.topologies["t"].domains["r1"].node_indices) == 3


def test_an_overcommitted_node_does_not_eat_into_its_neighbours() -> None:
    nodes = [
        make_node("full").gpus(1).label(RACK, "r1").build(),
        make_node("idle").gpus(4).label(RACK, "r1").build(),
    ]
    pods = [make_pod("big").gpus(1).on("full").build(), make_pod("more").gpus(1).on("full").build()]
    tx = racked(nodes, pods)
    assert tx.snapshot.free[tx.snapshot.node_index["full"], tx.snapshot.column("gpu")] == -1
    assert free_gpus(tx, "t", "r1") == 4
    # Evicted in a transaction, its pods give the domain only what comes above zero.
    mark = tx.checkpoint()
    tx.evict(tx.snapshot.pods["default/big"], "g")
    assert free_gpus(tx, "t", "r1") == 4
    tx.evict(tx.snapshot.pods["default/more"], "g")
    assert free_gpus(tx, "t", "r1") == 5
    tx.rollback(mark + 1)
    assert free_gpus(tx, "t", "r1") == 4
    tx.rollback(mark)
    assert free_gpus(tx, "t", "r1") == 4


def test_evicting_from_a_cordoned_node_frees_nothing_in_its_domain() -> None:
    """A pod taken off a node no pod may be placed on gives its domain no room: the
    sums followed through the transaction stay what a sum made afresh counts."""
    nodes = [
        make_node("ok").gpus(8).label(RACK, "r1").build(),
        make_node("cordoned").gpus(8).label(RACK, "r1").cordoned().build(),
    ]
    pods = [make_pod("a").gpus(2).on("ok").build(), make_pod("b").gpus(4).on("cordoned").build()]
    tx = racked(nodes, pods)
    assert free_gpus(tx, "t", "r1") == 6
    mark = tx.checkpoint()
    tx.evict(tx.snapshot.pods["default/b"], "g")
    assert free_gpus(tx, "t", "r1") == 6
    tx.evict(tx.snapshot.pods["default/a"], "g")
    assert free_gpus(tx, "t", "r1") == 8
    tx.rollback(mark)
    assert free_gpus(tx, "t", "r1") == 6


def test_tree_arrays_are_read_only() -> None:
    domain = tree().domains["block-a"]
    with pytest.raises(ValueError, match="read-only"):
        domain.node_indices[0] = 1
    with pytest.raises(ValueError, match="read-only"):
        tree().levels[0].node_domain[0] = 7
    assert isinstance(domain.node_indices, np.ndarray)


def test_an_invalid_topology_is_reported_not_built() -> None:
    bad = make_topology("bad").level(RACK, "rack").level(BLOCK, "rack").build()
    snapshot = build_snapshot(ClusterObjects(topologies=[bad]))
    assert "bad" not in snapshot.topologies
    [problem] = snapshot.problems
    assert (problem.obj.kind, problem.obj.name, problem.field) == (
        "Topology",
        "bad",
        "spec.levels[1]",
    )
    assert "used twice" in problem.message
