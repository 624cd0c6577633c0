"""Inter-pod rules on random clusters: what a cycle places never breaks a required rule,
and the equivalence shortcut plans what the plain path plans when pods carry terms.

Clusters are drawn with nodes in two zones, running pods labelled from a small
palette (some with anti-affinity of their own; in half the clusters a guard in
each zone keeps app=c pods out of both), and waiting gangs whose pods
carry terms from a palette (anti-affine to their own label by node, affine to
it by zone, anti-affine to another label by zone, affine to a running label,
preferred terms), so that gangs alike but for their labels abound. And the
count a `LogFold` keeps across placements, evictions, commits and rollbacks is
the count of the log as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.placement import gang_tree
from kai_ray.decisions.placement.log_fold import Change, LogFold
from kai_ray.decisions.plan import Bind, Plan
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.pod_states import PodState
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.clock import SIM_EPOCH_S
from kai_ray.values.config import SchedulerConfig
from kai_ray.workloads.pod_affinity import PodAffinityTerm
from tests.builders import make_node, make_pod, make_pod_group, make_queue

HOST = "kubernetes.io/hostname"
ZONE = "zone"
APPS = ("a", "b", "c")
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def _term(app: str, key: str) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}


def _terms(kind: str, app: str) -> dict[str, Any] | None:
    """The palette of a waiting pod's terms, `app` being its own label."""
    other = "a" if app != "a" else "b"
    return {
        "none": None,
        "spread": {"podAntiAffinity": {REQUIRED: [_term(app, HOST)]}},
        "together": {"podAffinity": {REQUIRED: [_term(app, ZONE)]}},
        "avoid": {"podAntiAffinity": {REQUIRED: [_term(other, ZONE)]}},
        "join": {"podAffinity": {REQUIRED: [_term(other, HOST)]}},
        "prefer": {
            "podAffinity": {PREFERRED: [{"weight": 10, "podAffinityTerm": _term(other, HOST)}]},
            "podAntiAffinity": {PREFERRED: [{"weight": 5, "podAffinityTerm": _term(app, HOST)}]},
        },
    }[kind]


KINDS = ("none", "spread", "together", "avoid", "join", "prefer")


@st.composite
def clusters(draw: st.DrawFn) -> ClusterObjects:
    count = draw(st.integers(2, 6))
    nodes = [make_node(f"n{i}").gpus(8).label(ZONE, f"z{i % 2}").build() for i in range(count)]
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for j in range(draw(st.integers(0, count))):
        app = draw(st.sampled_from(APPS))
        pod = make_pod(f"run-{j}").gpus(draw(st.sampled_from((1, 4)))).label("app", app)
        pod = pod.on(f"n{draw(st.integers(0, count - 1))}").scheduler("default-scheduler")
        if draw(st.booleans()):
            pod = pod.set("spec.affinity", {"podAntiAffinity": {REQUIRED: [_term("c", ZONE)]}})
        pods.append(pod.build())
    if draw(st.booleans()):
        pods += [_guard(f"guard-{z}", f"n{z}") for z in range(2)]
    for j in range(draw(st.integers(1, 8))):
        size, app = draw(st.integers(1, 3)), draw(st.sampled_from(APPS))
        kind, gpus = draw(st.sampled_from(KINDS)), draw(st.sampled_from((1, 4)))
        name = f"wait-{j}"
        groups.append(make_pod_group(name).queue("q").min_member(size).created(j).build())
        for k in range(size):
            pod = make_pod(f"{name}-{k}").gpus(gpus).group(name).label("app", app).created(j)
            terms = _terms(kind, app)
            pods.append((pod.set("spec.affinity", terms) if terms else pod).build())
    queues = [make_queue("q").gpu(quota=64).build()]
    return ClusterObjects(nodes=nodes, pods=pods, pod_groups=groups, queues=queues)


def _guard(name: str, node: str) -> dict[str, Any]:
    """A running pod that keeps every pod labelled app=c out of its zone."""
    guard = make_pod(name).gpus(1).on(node).scheduler("default-scheduler").label("app", "g")
    return guard.set("spec.affinity", {"podAntiAffinity": {REQUIRED: [_term("c", ZONE)]}}).build()


def _final(snapshot: Snapshot, objects: ClusterObjects) -> tuple[dict[str, str], set[str]]:
    """Where every live pod is after the cycle's plan, and which pods the plan placed."""
    config = SchedulerConfig.model_validate({"spec": {"placementStrategy": "binpack"}})
    plan = run_cycle(snapshot, config, 1, SIM_EPOCH_S).plan
    evicted = {e.pod for e in plan.evictions}
    where = {p.key: p.node for p in snapshot.pods.values() if p.node and p.key not in evicted}
    placed = {b.pod for b in plan.binds}
    where.update({b.pod: b.node for b in plan.binds})
    return where, placed


def _same(snapshot: Snapshot, key: str, first: str, second: str) -> bool:
    labels = snapshot.labels
    one = labels[snapshot.node_index[first]].get(key)
    return one is not None and one == labels[snapshot.node_index[second]].get(key)


def _selected(term: PodAffinityTerm, pod: PodState) -> bool:
    return term.matches(pod.namespace, pod.labels)


def _broken(snapshot: Snapshot, where: dict[str, str], placed: set[str]) -> Iterator[str]:
    """Every required rule a placed pod breaks, as Kubernetes states them."""
    pods = snapshot.pods
    for key in placed:
        pod, others = pods[key], [pods[k] for k in where if k != key]
        terms = pod.pod_affinity
        for other in others:
            yield from _apart(snapshot, (pod, where[key]), (other, where[other.key]))
        if terms and terms.affinity and not all(_selected(t, pod) for t in terms.affinity):
            partners = [o for o in others if all(_selected(t, o) for t in terms.affinity)]
            for term in terms.affinity:
                if not any(
                    _same(snapshot, term.topology_key, where[key], where[o.key]) for o in partners
                ):
                    yield f"{key} has no pod its affinity seeks in its {term.topology_key}"


def _apart(
    snapshot: Snapshot, placed: tuple[PodState, str], other: tuple[PodState, str]
) -> Iterator[str]:
    """The anti-affinity the placed pod breaks beside another, its own or the other's."""
    (pod, node), (neighbour, its_node) = placed, other
    own = pod.pod_affinity.anti_affinity if pod.pod_affinity else ()
    theirs = neighbour.pod_affinity.anti_affinity if neighbour.pod_affinity else ()
    for term in own:
        if _selected(term, neighbour) and _same(snapshot, term.topology_key, node, its_node):
            yield f"{pod.key} beside {neighbour.key}, against its anti-affinity"
    for term in theirs:
        if _selected(term, pod) and _same(snapshot, term.topology_key, node, its_node):
            yield f"{pod.key} beside {neighbour.key}, against that pod's anti-affinity"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(objects=clusters())
def test_no_placed_pod_breaks_a_required_inter_pod_rule(objects: ClusterObjects) -> None:
    snapshot = build_snapshot(objects)
    where, placed = _final(snapshot, objects)
    assert list(_broken(snapshot, where, placed)) == []


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(objects=clusters())
def test_the_equivalence_shortcut_plans_what_the_plain_path_plans(
    objects: ClusterObjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = build_snapshot(objects)
    config = SchedulerConfig.model_validate({"spec": {"placementStrategy": "binpack"}})
    with_shortcut = run_cycle(snapshot, config, 1, SIM_EPOCH_S).plan
    with monkeypatch.context() as patch:
        patch.setattr(gang_tree, "signature", lambda tx, group: None)
        plain = run_cycle(snapshot, config, 1, SIM_EPOCH_S).plan
    assert _fields(with_shortcut) == _fields(plain)


def _fields(plan: Plan) -> tuple[object, ...]:
    return (plan.binds, plan.evictions, plan.nominations, list(plan.statuses), plan.wake_at)


@st.composite
def log_steps(draw: st.DrawFn) -> list[tuple[str, int, int, bool]]:
    """Place (pod, node), evict (bound pod), roll back (to a checkpoint taken earlier),
    and whether the fold is read after the step."""
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(("place", "place", "evict", "checkpoint", "rollback", "commit")),
                st.integers(0, 5),
                st.integers(0, 2),
                st.booleans(),
            ),
            max_size=30,
        )
    )
    return steps


@settings(max_examples=100, deadline=None)
@given(steps=log_steps())
def test_a_log_fold_equals_the_fold_of_the_log_as_it_is(
    steps: list[tuple[str, int, int, bool]],
) -> None:
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    pending = [make_pod(f"w{k}").gpus(1).label("app", "ab"[k % 2]).build() for k in range(6)]
    bound = [make_pod(f"b{k}").gpus(1).label("app", "a").on(f"n{k}").build() for k in range(3)]
    snapshot = build_snapshot(ClusterObjects(nodes=nodes, pods=[*pending, *bound]))
    tx = Transaction(snapshot)

    def step(counts: list[int], change: Change) -> None:
        pod, node, sign = change
        if pod.labels.get("app") == "a":
            counts[node] += sign

    fold = LogFold([0, 0, 0], step)
    marks, committed = [0], 0
    for action, pod, node, read in steps:
        if action == "place" and f"default/w{pod}" not in tx.placed:
            tx.place(Placement(Bind(f"default/w{pod}", "g", f"n{node}"), node, _nothing(snapshot)))
        elif action == "evict" and f"default/b{node}" not in tx.removed:
            tx.evict(snapshot.pods[f"default/b{node}"], "g")
        elif action == "checkpoint":
            marks.append(tx.checkpoint())
        elif action == "commit":
            tx.commit()
            committed = tx.checkpoint()
            marks = [m for m in marks if m >= committed] or [committed]
        elif action == "rollback":
            mark = marks.pop() if len(marks) > 1 else marks[0]
            tx.rollback(max(mark, committed))
        plain = [0, 0, 0]
        for placement in tx.placements:
            known = snapshot.pods[placement.bind.pod]
            step(plain, (known, placement.node, -1 if placement.removal else 1))
        if read:  # some steps unread: it catches up with several changes at once
            assert fold.catch_up(tx) == plain


def _nothing(snapshot: Snapshot) -> npt.NDArray[np.float64]:
    return np.zeros(len(snapshot.resource_names), dtype=np.float64)
