"""Topology: required and preferred levels, fallback, per-subgroup domains, reasons."""

from __future__ import annotations

from collections import Counter

import pytest

from kai_ray.decisions.placement import Code
from kai_ray.decisions.transaction import Transaction
from tests.builders import make_node, make_pod, make_pod_group, make_topology
from tests.unit.placement_setup import cluster, gang_pods, place

TOPOLOGY = make_topology("dc").level("block").level("rack").hostname().build()


def rack_nodes(
    layout: dict[str, int], busy: dict[str, int] | None = None
) -> tuple[list[dict], list[dict]]:  # type: ignore[type-arg]
    """Nodes per "block/rack" with 8 GPUs each; `busy` says how many nodes of a rack are full."""
    nodes, pods = [], []
    for path, count in layout.items():
        block, rack = path.split("/")
        for i in range(count):
            name = f"{block}-{rack}-{i}"
            nodes.append(make_node(name).gpus(8).in_domains(block=block, rack=rack).build())
            if i < (busy or {}).get(path, 0):
                pods.append(make_pod(f"busy-{name}").gpus(8).on(name).build())
    return nodes, pods


def gang(
    size: int, required: str | None = None, preferred: str | None = None
) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    pods = [p.build() for p in gang_pods("g", size, 8)]
    group = make_pod_group("g").queue("q").min_member(size).topology("dc", required, preferred)
    return pods, group.build()


def racks(tx: Transaction) -> Counter[str]:
    return Counter("-".join(b.node.split("-")[:2]) for b in tx.binds())


@pytest.mark.parametrize(
    ("layout", "busy", "size", "required", "preferred", "expected"),
    [
        pytest.param(
            {"b1/r1": 4, "b1/r2": 4},
            {"b1/r1": 1},
            4,
            "rack",
            None,
            {"b1-r2": 4},
            id="rack required: the one rack with room for all 4",
        ),
        pytest.param(
            {"b1/r1": 6, "b1/r2": 4},
            {},
            4,
            "rack",
            None,
            {"b1-r2": 4},
            id="rack required: the fullest rack that still fits keeps the big rack whole",
        ),
        pytest.param(
            {"b1/r1": 3, "b1/r2": 3},
            {},
            4,
            "block",
            "rack",
            {"b1-r1": 3, "b1-r2": 1},
            id="preferred rack falls back to the required block",
        ),
        pytest.param(
            {"b1/r1": 2, "b2/r1": 2},
            {},
            4,
            None,
            "rack",
            {"b1-r1": 2, "b2-r1": 2},
            id="preferred only falls back to the whole cluster",
        ),
        pytest.param(
            {"b1/r1": 2, "b1/r2": 4},
            {},
            2,
            "rack",
            None,
            {"b1-r1": 2},
            id="alias or label: the smaller rack is filled first",
        ),
    ],
)
def test_domains(layout, busy, size, required, preferred, expected) -> None:  # type: ignore[no-untyped-def]
    nodes, bound = rack_nodes(layout, busy)
    pods, group = gang(size, required, preferred)
    outcome, tx = place(cluster(nodes, pods + bound, [group], [TOPOLOGY]))
    assert outcome.admitted, outcome.reason
    assert racks(tx) == Counter(expected)


def test_gang_that_fits_no_rack_says_how_close_the_best_came() -> None:
    nodes, bound = rack_nodes({"b1/r1": 5, "b1/r2": 3})
    pods, group = gang(8, "rack")
    outcome, tx = place(cluster(nodes, pods + bound, [group], [TOPOLOGY]))
    assert not outcome.admitted and tx.binds() == []
    assert outcome.code is Code.UNSCHEDULABLE
    assert outcome.reason.endswith(
        "needs 8 pods with 8 GPUs each inside one rack; the best rack has room for 5"
    )


def test_nodes_without_the_level_label_are_out() -> None:
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(4)]
    pods, group = gang(2, "rack")
    outcome, _ = place(cluster(nodes, pods, [group], [TOPOLOGY]))
    assert not outcome.admitted


def test_unknown_topology_is_a_reason() -> None:
    nodes, _ = rack_nodes({"b1/r1": 2})
    pods, group = gang(2, "rack")
    group["spec"]["topologyConstraint"]["topology"] = "missing"
    outcome, _ = place(cluster(nodes, pods, [group], [TOPOLOGY]))
    assert "topology 'missing' does not exist" in outcome.reason


def test_each_subgroup_in_its_own_rack_inside_the_required_block() -> None:
    nodes, _ = rack_nodes({"b1/r1": 2, "b1/r2": 2, "b2/r1": 3})
    pods = [p.build() for p in gang_pods("g", 2, 8, "a") + gang_pods("g", 2, 8, "b")]
    group = make_pod_group("g").queue("q").min_member(4).topology("dc", "block")
    group.subgroup("a", 2).subgroup("b", 2)
    built = group.build()
    for sub in built["spec"]["subGroups"]:
        sub["topologyConstraint"] = {"requiredLevel": "rack"}
    outcome, tx = place(cluster(nodes, pods, [built], [TOPOLOGY]))
    assert outcome.admitted, outcome.reason
    by_pod = {b.pod.split("/")[1]: "-".join(b.node.split("-")[:2]) for b in tx.binds()}
    assert by_pod["g-a-0"] == by_pod["g-a-1"] and by_pod["g-b-0"] == by_pod["g-b-1"]
    assert {r.split("-")[0] for r in by_pod.values()} == {"b1"}


@pytest.mark.parametrize(
    ("required", "words"),
    [
        pytest.param("row", "has no level 'row'", id="a level the topology lacks is an error"),
        pytest.param("rack", "does not exist", id="a topology that does not exist is an error"),
    ],
)
def test_a_constraint_naming_what_does_not_exist_is_an_error_not_a_lack_of_room(
    required: str, words: str
) -> None:
    nodes, _ = rack_nodes({"b1/r1": 4})
    pods, group = gang(2, required)
    topologies = [TOPOLOGY] if required == "row" else []
    outcome, tx = place(cluster(nodes, pods, [group], topologies))
    assert outcome.code is Code.ERROR and words in outcome.reason
    assert tx.placements == []
