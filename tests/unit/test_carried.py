"""Failures carried across states are the failures a fresh attempt finds.

`placement/carried.py` answers a gang no node had room for from the failure kept
for its signature, while every node it may use fails for the same first reason.
Hypothesis draws sequences of a cache's events (the kept-values test's: pods
placed and pending, nodes resized, cordoned, made unready and deleted, PodGroups,
a Topology); after each, every waiting gang of the kept snapshot is placed in
turn in a transaction that keeps what the transactions before it kept (the node
versions and the carried failures), and in a fresh transaction on a fresh build
of the same objects. Each outcome (code, reason, pods placed) must be equal;
placed gangs stay placed, so the later gangs meet a transaction that moved on.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.placement import carried, gang_tree
from kai_ray.decisions.placement.gang_tree import place_gang
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES, KeptAcrossCycles
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.cache import NODE, POD, POD_GROUP, TOPOLOGY, ClusterCache
from kai_ray.state.snapshot import build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_pod, make_pod_group, make_topology
from tests.unit.test_node_kept import SCHEDULER, apply, events, node, started

CONFIG = SchedulerConfig().spec


def _kept_transaction(cache: ClusterCache, across: KeptAcrossCycles) -> Transaction:
    tx = Transaction(cache.snapshot())
    tx.memo.keep(ACROSS_CYCLES, None, across)
    return tx


def _placed_as_afresh(cache: ClusterCache, across: KeptAcrossCycles) -> None:
    """Every waiting gang of the kept snapshot placed in turn, keeping what was kept,
    and on a fresh build of the same objects: the same outcome each time."""
    kept = _kept_transaction(cache, across)
    fresh = Transaction(build_snapshot(cache.objects(), scheduler_name=SCHEDULER))
    for group in kept.snapshot.waiting_groups:
        found = place_gang(kept, group, CONFIG)
        afresh = place_gang(fresh, fresh.snapshot.pod_groups[group.key], CONFIG)
        assert (found.code, found.reason, found.placed) == (
            afresh.code,
            afresh.reason,
            afresh.placed,
        )


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(events, min_size=1, max_size=25))
def test_failures_carried_across_events_are_those_found_afresh(
    steps: list[tuple[Any, ...]],
) -> None:
    cache, across = started(), KeptAcrossCycles()
    for step in steps:
        apply(cache, step)
        _placed_as_afresh(cache, across)


#: (GPUs, CPUs) of a running pod; (0, 0): gone.
RUNNING = st.sampled_from([(0, 0), (2, 8), (4, 60), (6, 1), (8, 1), (1, 64), (3, 30)])
#: A running pod (one of eight) set to a size on one of four nodes (two racks).
resizes = st.tuples(st.integers(0, 7), RUNNING, st.integers(0, 3))
#: The waiting gangs: (pods, GPUs each, CPUs each, rack required).
WAITING = (
    (1, 4, 1, False),
    (2, 4, 16, False),
    (1, 8, 1, False),
    (1, 2, 40, False),
    (3, 1, 1, False),
    (2, 4, 1, True),
    (2, 8, 1, True),
    (3, 2, 8, True),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(resizes, min_size=1, max_size=30))
def test_failures_carried_while_running_pods_change_are_those_found_afresh(
    steps: list[tuple[int, tuple[int, int], int]],
) -> None:
    """Four nodes in two racks whose running pods change size: the nodes' room and the
    first reason each fails for (GPUs, CPUs, devices) move without any static fact
    moving; gangs that must share a rack find no rack with room for all of them."""
    cache, across = _started_small(), KeptAcrossCycles()
    for index in (2, 3):
        shape = {"gpus": 8, "cpu": 64, "ready": True, "cordoned": False, "rack": f"r{index % 2}"}
        cache.upsert(node(index, shape), NODE)
    cache.upsert(make_topology("dc", "rack", "kubernetes.io/hostname").build(), TOPOLOGY)
    for index, (pods, gpus, cpu, rack) in enumerate(WAITING):
        group = make_pod_group(f"w{index}", "ns").queue("team").min_member(pods)
        if rack:
            group = group.topology("dc", required="rack")
        cache.upsert(group.build(), POD_GROUP)
        for member in range(pods):
            pod = make_pod(f"w{index}-{member}", "ns").scheduler(SCHEDULER).created(member)
            cache.upsert(pod.gpus(gpus).cpu(cpu).group(f"w{index}").build(), POD)
    for running, (gpus, cpu), on in steps:
        if gpus:
            pod = make_pod(f"run{running}", "ns").scheduler(SCHEDULER).gpus(gpus).cpu(cpu)
            cache.upsert(pod.on(f"n{on}").phase("Running").build(), POD)
        else:
            cache.delete(POD, f"ns/run{running}")
        _placed_as_afresh(cache, across)


def _answers_carried(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each call of `carried_failure` from now on answered from a kept failure."""
    answered: list[bool] = []
    original = carried.carried_failure

    def spy(*args: Any) -> Any:
        found = original(*args)
        answered.append(found is not None)
        return found

    monkeypatch.setattr(gang_tree, "carried_failure", spy)
    return answered


def _full_cluster(cache: ClusterCache) -> None:
    """Two 8-GPU nodes, each running a 6-GPU pod: no room for a pod of 4 GPUs and a CPU."""
    for index in range(2):
        running = make_pod(f"run{index}", "ns").scheduler(SCHEDULER).gpus(6).cpu(1)
        cache.upsert(running.on(f"n{index}").phase("Running").build(), POD)
    cache.upsert(make_pod_group("wait", "ns").queue("team").min_member(1).build(), POD_GROUP)
    waiting = make_pod("w", "ns").scheduler(SCHEDULER).gpus(4).cpu(1).group("wait")
    cache.upsert(waiting.build(), POD)


def _started_small() -> ClusterCache:
    cache = started()
    for index in range(2, 5):
        cache.delete(NODE, f"n{index}")
    for index in range(4):
        cache.delete(POD_GROUP, f"ns/g{index}")
    return cache


def test_a_failure_is_carried_while_no_node_gains_room_and_dropped_once_one_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The waiting pod fails; then a running pod shrinks from 6 to 5 GPUs (the node's
    row moves, it still lacks free GPUs): the failure is answered from the kept one;
    then it shrinks to 2 GPUs: the pod fits, and the kept failure is not used."""
    answered = _answers_carried(monkeypatch)
    cache, across = _started_small(), KeptAcrossCycles()
    _full_cluster(cache)
    outcomes = []
    for gpus in (6, 5, 2):
        running = make_pod("run0", "ns").scheduler(SCHEDULER).gpus(gpus).cpu(1)
        cache.upsert(running.on("n0").phase("Running").build(), POD)
        tx = _kept_transaction(cache, across)
        outcome = place_gang(tx, tx.snapshot.pod_groups["ns/wait"], CONFIG)
        outcomes.append((outcome.admitted, outcome.reason))
    assert answered == [False, True, False]
    reason = "gang of 1 does not fit: no node fits pod ns/w: 2 nodes lack free nvidia.com/gpu"
    assert outcomes == [(False, reason), (False, reason), (True, "")]


def test_a_failure_is_not_carried_once_a_node_fails_for_another_reason() -> None:
    """The running pod on n0 gives back GPUs but takes every CPU: n0 still has no
    room for the waiting pod, now for lack of CPU, and the reason found says so."""
    cache, across = _started_small(), KeptAcrossCycles()
    _full_cluster(cache)
    tx = _kept_transaction(cache, across)
    before = place_gang(tx, tx.snapshot.pod_groups["ns/wait"], CONFIG).reason
    running = make_pod("run0", "ns").scheduler(SCHEDULER).gpus(2).cpu(64)
    cache.upsert(running.on("n0").phase("Running").build(), POD)
    tx = _kept_transaction(cache, across)
    after = place_gang(tx, tx.snapshot.pod_groups["ns/wait"], CONFIG).reason
    assert before.endswith(": 2 nodes lack free nvidia.com/gpu")
    assert after.endswith(": 1 node lacks free cpu, 1 node lacks free nvidia.com/gpu")


def test_a_gang_with_a_member_held_by_a_gate_is_not_judged_alike_to_one_without() -> None:
    """Two gangs alike but for a scheduling gate on one's pod are not equivalent."""
    cache = _started_small()
    for name, gated in (("open", False), ("gated", True)):
        cache.upsert(make_pod_group(name, "ns").queue("team").min_member(1).build(), POD_GROUP)
        pod = make_pod(f"{name}-0", "ns").scheduler(SCHEDULER).gpus(4).group(name)
        cache.upsert((pod.gate("other.io/gate") if gated else pod).build(), POD)
    tx = Transaction(cache.snapshot())
    signatures = [
        gang_tree.signature(tx, tx.snapshot.pod_groups[f"ns/{name}"]) for name in ("open", "gated")
    ]
    assert None not in signatures and signatures[0] != signatures[1]


def test_a_failure_no_rack_held_is_carried_while_the_best_rack_has_the_same_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four 8-GPU nodes in two racks; a gang of three 8-GPU pods must share a rack.
    Each rack has one free node: the best rack has room for 1. When r1's free node
    fills up, a node's room moved but the best rack's did not: the kept failure
    answers. When r0's second node is freed, the best rack has room for 2: the
    failure is found afresh, and says so. When r1's two nodes are freed and one of
    r0's filled, no rack holds the gang and the best (now r1) has room for 2
    again: answered from the failure kept last. Each answer is a fresh attempt's."""
    answered = _answers_carried(monkeypatch)
    cache, across = _started_small(), KeptAcrossCycles()
    for index in (2, 3):
        shape = {"gpus": 8, "cpu": 64, "ready": True, "cordoned": False, "rack": f"r{index % 2}"}
        cache.upsert(node(index, shape), NODE)
    cache.upsert(make_topology("dc", "rack", "kubernetes.io/hostname").build(), TOPOLOGY)
    group = make_pod_group("wait", "ns").queue("team").min_member(3)
    cache.upsert(group.topology("dc", required="rack").build(), POD_GROUP)
    for member in range(3):
        pod = make_pod(f"w-{member}", "ns").scheduler(SCHEDULER).gpus(8).cpu(1).group("wait")
        cache.upsert(pod.build(), POD)

    def busy(name: str, on: str | None) -> None:
        if on is None:
            cache.delete(POD, f"ns/{name}")
            return
        running = make_pod(name, "ns").scheduler(SCHEDULER).gpus(8).cpu(1)
        cache.upsert(running.on(on).phase("Running").build(), POD)

    # n0 and n2 are in r0, n1 and n3 in r1.
    busy("run-a", "n0")
    busy("run-b", "n1")
    reasons: list[str] = []
    carried_now: list[bool] = []
    for step in (
        [],
        [("run-c", "n3")],
        [("run-a", None)],
        [("run-c", None), ("run-b", None), ("run-d", "n2")],
    ):
        for name, on in step:
            busy(name, on)
        fresh = Transaction(build_snapshot(cache.objects(), scheduler_name=SCHEDULER))
        afresh = place_gang(fresh, fresh.snapshot.pod_groups["ns/wait"], CONFIG)
        answered.clear()
        tx = _kept_transaction(cache, across)
        outcome = place_gang(tx, tx.snapshot.pod_groups["ns/wait"], CONFIG)
        carried_now.extend(answered)
        assert (outcome.admitted, outcome.reason) == (afresh.admitted, afresh.reason)
        reasons.append(outcome.reason.rsplit("; ", 1)[-1])
    assert reasons == [
        "the best rack has room for 1",
        "the best rack has room for 1",
        "the best rack has room for 2",
        "the best rack has room for 2",
    ]
    assert carried_now == [False, True, False, True]
