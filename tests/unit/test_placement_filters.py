"""Node filters and scoring: which node a single pod lands on, or why none."""

from __future__ import annotations

from typing import Any

import pytest

from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from tests.builders import make_node, make_pod, make_pod_group
from tests.unit.placement_setup import cluster, nodes_of, place

Obj = dict[str, Any]

AFFINITY = "spec.affinity"


def affinity(*expressions: Obj) -> Obj:
    term = {"matchExpressions": list(expressions)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }


def single(pod: Any, nodes: list[Obj]) -> tuple[bool, str, str | None]:
    snapshot = cluster(nodes, [pod.group("g").build()], [make_pod_group("g").queue("q").build()])
    outcome, tx = place(snapshot)
    return outcome.admitted, outcome.reason, nodes_of(tx).get(pod.build()["metadata"]["name"])


@pytest.mark.parametrize(
    ("pod", "nodes", "node"),
    [
        pytest.param(
            make_pod("p").gpus(1),
            [make_node("n1").build(), make_node("n2").gpus(8).build()],
            "n2",
            id="a GPU pod skips the node without GPUs",
        ),
        pytest.param(
            make_pod("p").gpus(1),
            [make_node("n1").gpus(8).unready().build(), make_node("n2").gpus(8).build()],
            "n2",
            id="an unready node is skipped",
        ),
        pytest.param(
            make_pod("p").gpus(1),
            [make_node("n1").gpus(8).cordoned().build(), make_node("n2").gpus(8).build()],
            "n2",
            id="a cordoned node is skipped",
        ),
        pytest.param(
            make_pod("p").set("spec.nodeSelector", {"pool": "b"}),
            [
                make_node("n1").label("pool", "a").build(),
                make_node("n2").label("pool", "b").build(),
            ],
            "n2",
            id="nodeSelector picks the labelled node",
        ),
        pytest.param(
            make_pod("p").set(
                AFFINITY, affinity({"key": "pool", "operator": "In", "values": ["b", "c"]})
            ),
            [
                make_node("n1").label("pool", "a").build(),
                make_node("n2").label("pool", "c").build(),
            ],
            "n2",
            id="affinity In",
        ),
        pytest.param(
            make_pod("p").set(
                AFFINITY, affinity({"key": "pool", "operator": "NotIn", "values": ["a"]})
            ),
            [make_node("n1").label("pool", "a").build(), make_node("n2").build()],
            "n2",
            id="affinity NotIn matches a node without the label",
        ),
        pytest.param(
            make_pod("p").set(AFFINITY, affinity({"key": "ssd", "operator": "Exists"})),
            [make_node("n1").build(), make_node("n2").label("ssd", "yes").build()],
            "n2",
            id="affinity Exists",
        ),
        pytest.param(
            make_pod("p").set(AFFINITY, affinity({"key": "ssd", "operator": "DoesNotExist"})),
            [make_node("n1").label("ssd", "yes").build(), make_node("n2").build()],
            "n2",
            id="affinity DoesNotExist",
        ),
        pytest.param(
            make_pod("p").set(
                AFFINITY, affinity({"key": "gen", "operator": "Gt", "values": ["3"]})
            ),
            [make_node("n1").label("gen", "3").build(), make_node("n2").label("gen", "4").build()],
            "n2",
            id="affinity Gt compares integers",
        ),
        pytest.param(
            make_pod("p").set(
                AFFINITY, affinity({"key": "gen", "operator": "Lt", "values": ["3"]})
            ),
            [make_node("n1").label("gen", "x").build(), make_node("n2").label("gen", "2").build()],
            "n2",
            id="affinity Lt skips a non-integer label",
        ),
        pytest.param(
            make_pod("p").gpus(1),
            [
                make_node("n1").gpus(8).taint("gpu", "broken").build(),
                make_node("n2").gpus(8).build(),
            ],
            "n2",
            id="an untolerated NoSchedule taint keeps the pod off",
        ),
        pytest.param(
            make_pod("p").gpus(1),
            [
                make_node("n1").gpus(8).taint("gpu", "", "NoExecute").build(),
                make_node("n2").gpus(8).build(),
            ],
            "n2",
            id="an untolerated NoExecute taint keeps the pod off",
        ),
        pytest.param(
            make_pod("p").gpus(1),
            [make_node("n1").gpus(8).taint("gpu", "", "PreferNoSchedule").build()],
            "n1",
            id="PreferNoSchedule does not filter",
        ),
        pytest.param(
            make_pod("p").gpus(1).set("spec.tolerations", [{"key": "gpu", "operator": "Exists"}]),
            [make_node("n1").gpus(8).taint("gpu", "broken").build()],
            "n1",
            id="an Exists toleration tolerates any value",
        ),
        pytest.param(
            make_pod("p").set(
                "spec.tolerations", [{"key": "gpu", "value": "ok", "effect": "NoSchedule"}]
            ),
            [
                make_node("n1").taint("gpu", "broken").build(),
                make_node("n2").taint("gpu", "ok").build(),
            ],
            "n2",
            id="an Equal toleration needs the same value",
        ),
    ],
)
def test_filters(pod: Any, nodes: list[Obj], node: str) -> None:
    admitted, reason, chosen = single(pod, nodes)
    assert admitted, reason
    assert chosen == node


@pytest.mark.parametrize(
    ("strategy", "node"),
    [
        pytest.param("binpack", "n2", id="bin-pack takes the fullest node that fits"),
        pytest.param("spread", "n1", id="spread takes the emptiest node"),
    ],
)
def test_strategies(strategy: str, node: str) -> None:
    nodes = [make_node(n).gpus(8).build() for n in ("n1", "n2", "n3")]
    busy = [make_pod("busy").gpus(6).on("n2").build(), make_pod("busy2").gpus(2).on("n3").build()]
    pods = [make_pod("p").gpus(1).group("g").build()]
    snapshot = cluster(nodes, busy + pods, [make_pod_group("g").queue("q").build()])
    _outcome, tx = place(snapshot, strategy=strategy)
    assert nodes_of(tx)["p"] == node


def test_reason_counts_each_cause_per_node() -> None:
    nodes = [
        make_node("a1").build(),
        make_node("a2").build(),
        make_node("a3").build(),
        make_node("b1").gpus(8).unready().build(),
        make_node("b2").gpus(8).unready().build(),
        make_node("c1").gpus(8).taint("gpu", "broken").build(),
    ]
    admitted, reason, _ = single(make_pod("x").gpus(1), nodes)
    assert not admitted
    assert reason.endswith(
        "no node fits pod default/x: 3 nodes lack free nvidia.com/gpu, "
        "2 nodes are not ready, 1 node has taint gpu=broken:NoSchedule"
    )


def test_nodes_too_small_in_all_are_told_from_nodes_that_are_full() -> None:
    nodes = [
        make_node("small1").gpus(8).build(),
        make_node("small2").gpus(8).build(),
        make_node("big").gpus(16).build(),
        make_node("cpu").build(),
    ]
    pods = [make_pod("busy").gpus(4).on("big").build(), make_pod("x").gpus(16).group("g").build()]
    outcome, _tx = place(cluster(nodes, pods, [make_pod_group("g").queue("q").build()]))
    reason = outcome.reason
    assert not outcome.admitted
    assert reason.endswith(
        "no node fits pod default/x: 2 nodes have less than 16 nvidia.com/gpu in all, "
        "2 nodes lack free nvidia.com/gpu"
    ), reason


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(
            {"nodeSelector": ["a"]}, "spec.nodeSelector", id="a nodeSelector that is not a map"
        ),
        pytest.param(
            {"affinity": affinity({"key": "k", "operator": "Near"})},
            "nodeSelectorTerms[0].matchExpressions[0].operator",
            id="an unknown affinity operator",
        ),
        pytest.param(
            {"affinity": affinity({"key": "k", "operator": "Gt", "values": ["x"]})},
            "matchExpressions[0].values",
            id="Gt with a value that is not an integer",
        ),
        pytest.param(
            {"tolerations": [{"key": "k", "operator": "Sometimes"}]},
            "spec.tolerations[0].operator",
            id="an unknown toleration operator",
        ),
    ],
)
def test_bad_constraints_become_problems_naming_the_field(spec: Obj, field: str) -> None:
    pod = make_pod("p").group("g")
    for key, value in spec.items():
        pod.set(f"spec.{key}", value)
    snapshot = build_snapshot(ClusterObjects(nodes=[make_node("n1").build()], pods=[pod.build()]))
    assert snapshot.pending_pods == ()
    assert any(field in problem.field for problem in snapshot.problems)
