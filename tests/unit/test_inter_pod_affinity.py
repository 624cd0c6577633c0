"""Inter-pod affinity and anti-affinity: read from pods, then filters and a score in placement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.placement.equivalence import signature
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.pod_states import read_pod
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.errors import Problem
from kai_ray.workloads.pod_affinity import LabelRequirement
from tests.builders import PodBuilder, make_node, make_pod, make_pod_group
from tests.unit.placement_setup import BINPACK, cluster, nodes_of, place

Obj = dict[str, Any]
HOST = "kubernetes.io/hostname"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def term(labels: dict[str, str] | None, key: str = HOST, **extra: Any) -> Obj:
    body: Obj = {"topologyKey": key, **extra}
    if labels is not None:
        body["labelSelector"] = {"matchLabels": labels}
    return body


def required(kind: str, *terms: Obj) -> Obj:
    return {kind: {REQUIRED: list(terms)}}


def preferred(kind: str, weight: int, body: Obj) -> Obj:
    return {kind: {PREFERRED: [{"weight": weight, "podAffinityTerm": body}]}}


def with_affinity(pod: PodBuilder, affinity: Obj) -> PodBuilder:
    return pod.set("spec.affinity", affinity)


def running(name: str, node: str, gpus: int = 1, **labels: str) -> PodBuilder:
    pod = make_pod(name).gpus(gpus).on(node).scheduler("default-scheduler")
    for key, value in labels.items():
        pod.label(key, value)
    return pod


def zoned(*zones: str, gpus: int = 8) -> list[Obj]:
    """One node per zone letter: `zoned("a", "a", "b")` gives n0, n1 in zone a and n2 in b."""
    return [make_node(f"n{i}").gpus(gpus).label("zone", z).build() for i, z in enumerate(zones)]


def gang(name: str, pods: list[PodBuilder], min_member: int | None = None) -> tuple[list[Obj], Obj]:
    built = [p.group(name).build() for p in pods]
    return built, make_pod_group(name).queue("q").min_member(min_member or len(pods)).build()


def solo(
    pod: PodBuilder, nodes: list[Obj], others: Sequence[PodBuilder] = ()
) -> tuple[bool, str, str]:
    """One pod placed as a gang of one beside `others` (already running)."""
    pods, group = gang("g", [pod])
    snapshot = cluster(nodes, [*pods, *(o.build() for o in others)], [group])
    outcome, tx = place(snapshot)
    name = pods[0]["metadata"]["name"]
    return outcome.admitted, outcome.reason, nodes_of(tx).get(name, "")


# ------------------------------------------------------------------ reading


def _read(affinity: Obj, **labels: str) -> tuple[Any, list[Problem]]:
    pod = with_affinity(make_pod("p", "ml"), affinity)
    for key, value in labels.items():
        pod.label(key, value)
    problems: list[Problem] = []
    return read_pod(pod.build(), problems), problems


@pytest.mark.parametrize(
    ("affinity", "field", "words"),
    [
        pytest.param(
            required("podAntiAffinity", {"labelSelector": {"matchLabels": {"a": "b"}}}),
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".topologyKey",
            "topologyKey",
            id="a term without topologyKey is refused naming it",
        ),
        pytest.param(
            required(
                "podAffinity",
                {
                    "topologyKey": HOST,
                    "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]},
                },
            ),
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchExpressions[0].operator",
            "unknown operator 'Gt'",
            id="a label selector takes no Gt",
        ),
        pytest.param(
            required(
                "podAffinity",
                {
                    "topologyKey": HOST,
                    "labelSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]},
                },
            ),
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".labelSelector.matchExpressions[0].values",
            "at least one value",
            id="In without values is refused",
        ),
        pytest.param(
            preferred("podAffinity", 101, term({"a": "b"})),
            "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            "1-100",
            id="a weight above 100 is refused",
        ),
        pytest.param(
            required(
                "podAffinity", term({"a": "b"}, namespaceSelector={"matchLabels": {"x": "y"}})
            ),
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".namespaceSelector",
            "Namespace",
            id="a namespaceSelector with labels is refused as unsupported",
        ),
        pytest.param(
            {"podAntiAffinity": {REQUIRED: {"topologyKey": HOST}}},
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            "expected a list",
            id="terms that are not a list are refused",
        ),
    ],
)
def test_bad_terms_become_problems_naming_the_field(affinity: Obj, field: str, words: str) -> None:
    state, problems = _read(affinity)
    assert state is None
    assert [p.field for p in problems] == [field]
    assert words in problems[0].message
    assert "pod will not be scheduled" in problems[0].message


def test_a_pod_without_inter_pod_terms_reads_none() -> None:
    state, problems = _read({"nodeAffinity": {}})
    assert state.pod_affinity is None and not problems


def test_namespaces_default_to_the_pods_own() -> None:
    state, _ = _read(required("podAffinity", term({"a": "b"})))
    assert state.pod_affinity.affinity[0].namespaces == frozenset({"ml"})


def test_an_empty_namespace_selector_means_every_namespace() -> None:
    state, _ = _read(required("podAffinity", term({"a": "b"}, namespaceSelector={})))
    found = state.pod_affinity.affinity[0]
    assert found.namespaces is None
    assert found.matches("elsewhere", {"a": "b"})


def test_match_and_mismatch_label_keys_take_the_pods_own_values() -> None:
    body = term({"app": "web"}, matchLabelKeys=["run", "absent"], mismatchLabelKeys=["team"])
    state, _ = _read(required("podAntiAffinity", body), app="web", run="7", team="t1")
    selector = state.pod_affinity.anti_affinity[0].selector
    assert selector == (
        LabelRequirement("app", "In", ("web",)),
        LabelRequirement("run", "In", ("7",)),
        LabelRequirement("team", "NotIn", ("t1",)),
    )


def test_a_term_without_label_selector_selects_no_pod() -> None:
    state, _ = _read(required("podAffinity", term(None)))
    assert not state.pod_affinity.affinity[0].matches("ml", {})


def test_an_empty_label_selector_selects_every_pod_of_its_namespaces() -> None:
    state, _ = _read(required("podAffinity", {"topologyKey": HOST, "labelSelector": {}}))
    found = state.pod_affinity.affinity[0]
    assert found.matches("ml", {"x": "y"}) and not found.matches("other", {})


# ------------------------------------------------------------------ required anti-affinity


def test_anti_affinity_keeps_the_pod_off_the_node_of_a_matching_pod() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"})))
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    admitted, _, node = solo(pod, nodes, [running("db", "n1", app="db")])
    assert admitted and node == "n2"  # bin-packing alone would take the fuller n1


def test_anti_affinity_by_zone_keeps_the_pod_out_of_the_whole_zone() -> None:
    pod = with_affinity(
        make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"}, "zone"))
    )
    admitted, _, node = solo(pod, zoned("a", "a", "b"), [running("db", "n0", app="db")])
    assert admitted and node == "n2"


def test_anti_affinity_ignores_pods_of_other_namespaces() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"})))
    other = make_pod("db", "elsewhere").gpus(1).on("n1").scheduler("x").label("app", "db")
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    assert solo(pod, nodes, [other])[2] == "n1"


def test_anti_affinity_everywhere_waits_and_says_why() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"})))
    admitted, reason, _ = solo(pod, zoned("a"), [running("db", "n0", app="db")])
    assert not admitted
    assert "1 node is in a domain its pod anti-affinity excludes" in reason


def test_a_node_without_the_topology_key_passes_anti_affinity() -> None:
    pod = with_affinity(
        make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"}, "zone"))
    )
    nodes = [*zoned("a"), make_node("bare").gpus(8).build()]
    assert solo(pod, nodes, [running("db", "n0", app="db")])[2] == "bare"


def test_an_existing_pods_anti_affinity_keeps_a_matching_pod_away() -> None:
    guard = with_affinity(
        running("guard", "n1", app="guard"), required("podAntiAffinity", term({"app": "web"}))
    )
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    web = make_pod("p").gpus(1).label("app", "web")
    admitted, _, node = solo(web, nodes, [guard])
    assert admitted and node == "n2"
    # A pod the guard's term does not select may join it.
    assert solo(make_pod("p").gpus(1).label("app", "batch"), nodes, [guard])[2] == "n1"


def test_a_gang_anti_affine_to_itself_spreads_over_nodes() -> None:
    anti = required("podAntiAffinity", term({"app": "ps"}))
    pods = [with_affinity(make_pod(f"w{i}").gpus(1).label("app", "ps"), anti) for i in range(3)]
    members, group = gang("g", pods)
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    outcome, tx = place(cluster(nodes, members, [group]))
    assert outcome.admitted
    assert sorted(nodes_of(tx).values()) == ["n0", "n1", "n2"]


def test_a_gang_anti_affine_to_itself_waits_when_nodes_are_too_few() -> None:
    anti = required("podAntiAffinity", term({"app": "ps"}))
    pods = [with_affinity(make_pod(f"w{i}").gpus(1).label("app", "ps"), anti) for i in range(3)]
    members, group = gang("g", pods)
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(2)]
    outcome, tx = place(cluster(nodes, members, [group]))
    assert not outcome.admitted and not tx.binds()
    assert "pod affinity rules count the gang's pods placed before it" in outcome.reason


def test_an_evicted_pod_no_longer_counts() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAntiAffinity", term({"app": "db"})))
    members, group = gang("g", [pod])
    snapshot = cluster(zoned("a"), [*members, running("db", "n0", app="db").build()], [group])
    tx = Transaction(snapshot)
    assert not place_gang(tx, snapshot.pod_groups["default/g"], BINPACK).admitted
    tx.evict(snapshot.pods["default/db"], "x")
    assert place_gang(tx, snapshot.pod_groups["default/g"], BINPACK).admitted


# ------------------------------------------------------------------ required affinity


def test_affinity_puts_the_pod_in_the_zone_of_a_matching_pod() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAffinity", term({"app": "db"}, "zone")))
    nodes = zoned("a", "b", "b")
    others = [running("db", "n2", gpus=4, app="db"), running("big", "n0", gpus=7)]
    admitted, _, node = solo(pod, nodes, others)
    # n0 is the fullest node, but only zone b holds a db pod; n2 is the fuller there.
    assert admitted and node == "n2"


def test_affinity_with_no_matching_pod_waits_and_says_why() -> None:
    pod = with_affinity(make_pod("p").gpus(1), required("podAffinity", term({"app": "db"}, "zone")))
    admitted, reason, _ = solo(pod, zoned("a", "b"))
    assert not admitted
    assert "2 nodes are outside the domains its pod affinity requires" in reason


def test_a_pod_affine_to_itself_may_go_first_but_only_to_nodes_with_the_key() -> None:
    body = required("podAffinity", term({"app": "web"}, "zone"))
    pod = with_affinity(make_pod("p").gpus(1).label("app", "web"), body)
    nodes = [make_node("bare").gpus(8).build(), *zoned("a")]
    admitted, _, node = solo(pod, nodes)
    assert admitted and node == "n0"


def test_a_gang_affine_to_itself_lands_in_the_zone_of_its_first_member() -> None:
    body = required("podAffinity", term({"app": "web"}, "zone"))
    pods = [with_affinity(make_pod(f"w{i}").gpus(4).label("app", "web"), body) for i in range(3)]
    members, group = gang("g", pods)
    nodes = zoned("a", "b", "b")
    outcome, tx = place(cluster(nodes, members, [group]))
    assert outcome.admitted
    zones = {"n0": "a", "n1": "b", "n2": "b"}
    assert len({zones[n] for n in nodes_of(tx).values()}) == 1


def test_affinity_counts_only_pods_matching_every_term() -> None:
    body = required("podAffinity", term({"app": "db"}, "zone"), term({"tier": "hot"}, HOST))
    pod = with_affinity(make_pod("p").gpus(1), body)
    nodes = zoned("a", "a")
    others = [running("db", "n0", app="db"), running("hot", "n1", tier="hot")]
    admitted, _, _ = solo(pod, nodes, others)
    assert not admitted  # no single pod is both app=db and tier=hot
    both = [running("db", "n1", app="db", tier="hot")]
    assert solo(pod, nodes, both)[2] == "n1"


# ------------------------------------------------------------------ preferred


def test_preferred_affinity_outweighs_the_strategy() -> None:
    pod = with_affinity(make_pod("p").gpus(1), preferred("podAffinity", 10, term({"app": "db"})))
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    others = [running("big", "n1", gpus=6), running("db", "n2", app="db")]
    assert solo(pod, nodes, others)[2] == "n2"


def test_preferred_anti_affinity_steers_away_but_never_blocks() -> None:
    body = preferred("podAntiAffinity", 50, term({"app": "db"}))
    pod = with_affinity(make_pod("p").gpus(1), body)
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    assert solo(pod, nodes, [running("db", "n1", app="db")])[2] == "n2"
    assert solo(pod, nodes[:1], [running("db", "n1", app="db")])[0]


def test_preferred_weights_are_summed_per_matching_pod() -> None:
    body = {
        "podAffinity": {PREFERRED: [{"weight": 10, "podAffinityTerm": term({"app": "a"})}]},
        "podAntiAffinity": {PREFERRED: [{"weight": 15, "podAffinityTerm": term({"app": "b"})}]},
    }
    pod = with_affinity(make_pod("p").gpus(1), body)
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    others = [
        running("a1", "n0", app="a"),
        running("a2", "n0", app="a"),
        running("b1", "n0", app="b"),  # n0: 20 - 15 = 5
        running("a3", "n1", app="a"),  # n1: 10
        running("big", "n2", gpus=6),  # n2: 0, the fullest
    ]
    assert solo(pod, nodes, others)[2] == "n1"


def test_an_existing_pods_preferred_affinity_draws_a_matching_pod() -> None:
    host = with_affinity(
        running("host", "n2", app="host"), preferred("podAffinity", 5, term({"app": "web"}))
    )
    nodes = [make_node("n1").gpus(8).build(), make_node("n2").gpus(8).build()]
    others = [host, running("big", "n1", gpus=6)]
    assert solo(make_pod("p").gpus(1).label("app", "web"), nodes, others)[2] == "n2"
    assert solo(make_pod("p").gpus(1), nodes, others)[2] == "n1"


# ------------------------------------------------------------------ equivalence


def test_gangs_differing_only_in_labels_are_not_equivalent_when_terms_exist() -> None:
    guard = with_affinity(
        running("guard", "n0", app="guard"), required("podAntiAffinity", term({"app": "web"}))
    )
    web, web_group = gang("web", [make_pod("w").gpus(1).label("app", "web")])
    other, other_group = gang("other", [make_pod("o").gpus(1).label("app", "batch")])
    snapshot = cluster(zoned("a"), [*web, *other, guard.build()], [web_group, other_group])
    tx = Transaction(snapshot)
    groups = snapshot.pod_groups
    assert signature(tx, groups["default/web"]) != signature(tx, groups["default/other"])
    assert not place_gang(tx, groups["default/web"], BINPACK).admitted
    assert place_gang(tx, groups["default/other"], BINPACK).admitted


def test_labels_stay_out_of_the_signature_when_no_pod_has_terms() -> None:
    web, web_group = gang("web", [make_pod("w").gpus(1).label("app", "web")])
    other, other_group = gang("other", [make_pod("o").gpus(1).label("app", "batch")])
    snapshot = cluster(zoned("a"), [*web, *other], [web_group, other_group])
    tx = Transaction(snapshot)
    groups = snapshot.pod_groups
    assert signature(tx, groups["default/web"]) == signature(tx, groups["default/other"])


def test_spread_strategy_still_breaks_ties_between_equally_preferred_nodes() -> None:
    pod = with_affinity(
        make_pod("p").gpus(1), preferred("podAffinity", 10, term({"app": "db"}, "zone"))
    )
    members, group = gang("g", [pod])
    nodes = zoned("a", "a", "b")
    others = [running("db", "n0", gpus=4, app="db")]
    snapshot = cluster(nodes, [*members, *(o.build() for o in others)], [group])
    tx = Transaction(snapshot)
    spread = SchedulerConfigSpec(placementStrategy="spread")
    assert place_gang(tx, snapshot.pod_groups["default/g"], spread).admitted
    assert tx.placed["default/p"].bind.node == "n1"  # zone a, the emptier of its nodes
