"""The Ray backend returns the local backend's plan exactly, on generated clusters,
and so does a transaction that loses Ray midway (it goes on locally).

Starts one local Ray (2 CPUs) for the module: about 4 s, see
measurements of the Ray backend (docs/placement.md); the test in which Ray comes
back after being lost starts one more.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from kai_ray.decisions.placement import place_extras, place_gang, ray_backend, ray_link
from kai_ray.decisions.placement.backend import LocalBackend, RoomQuery
from kai_ray.decisions.placement.backend_choice import backend_for, use_ray
from kai_ray.decisions.placement.ray_backend import RayPlacementBackend, shard_of_nodes
from kai_ray.decisions.placement.ray_link import RayLink
from kai_ray.decisions.placement.shapes import shape_of
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.clock import VirtualClock
from kai_ray.values.config import RayBackend, SchedulerConfigSpec
from tests.builders import make_node, make_pod, make_pod_group, make_topology
from tests.unit.placement_setup import cluster

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def rooms(tx: Transaction, backends: list[Any]) -> list[list[list[int]]]:
    """Every backend's room, per pending pod's shape, on all nodes at every level."""
    levels = tuple(("dc", i) for i in range(len(tx.snapshot.topologies["dc"].levels)))
    nodes = np.arange(len(tx.snapshot.node_names), dtype=np.intp)
    shapes = {p.requests: shape_of(tx, p) for p in tx.snapshot.pending_pods}.values()
    answers = []
    for backend in backends:
        answer = [backend.domain_room(tx, RoomQuery(s, nodes, levels)) for s in shapes]
        answers.append([[int(n) for level in a for n in level] for a in answer])
    return answers


def generated(seed: int) -> Snapshot:
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    bound: list[dict[str, Any]] = []
    for i in range(rng.randint(30, 60)):
        node = make_node(f"n{i}").gpus(8, memory_mib=81920)
        node.in_domains(block=f"b{i % 3}", rack=f"r{i % 7}")
        if rng.random() < 0.1:
            node.unready()
        nodes.append(node.build())
        if rng.random() < 0.4:
            bound.append(make_pod(f"busy{i}").gpus(rng.randint(1, 8)).on(f"n{i}").build())
    pods, groups = generated_gangs(rng)
    topology = make_topology("dc").level("block").level("rack").hostname().build()
    return cluster(nodes, bound + pods, groups, [topology])


def generated_gangs(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods, groups = [], []
    for g in range(12):
        size, gpus = rng.randint(1, 6), rng.choice([1, 2, 4, 8])
        level = rng.choice([("rack", None), ("block", "rack"), (None, "rack")])
        for i in range(size + 1):
            pods.append(make_pod(f"g{g}-{i}").gpus(gpus).group(f"g{g}").created(g).build())
        group = make_pod_group(f"g{g}").queue("q").min_member(size).created(g)
        groups.append(group.topology("dc", *level).build())
    return pods, groups


def plan(snapshot: Snapshot, mode: str) -> tuple[list[Any], list[str]]:
    tx = Transaction(snapshot)
    config = SchedulerConfigSpec(rayBackend=RayBackend(mode=mode))  # type: ignore[arg-type]
    ordered = sorted(snapshot.pod_groups.values(), key=lambda g: g.creation_timestamp)
    reasons = [place_gang(tx, group, config).reason for group in ordered]
    for group in ordered:
        place_extras(tx, group, config)
    tx.commit()
    assert backend_for(tx, config).name == ("ray" if mode == "always" else "local")
    return tx.binds(), reasons


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"generated cluster {s}") for s in range(4)])
def test_ray_and_local_backends_return_identical_plans(local_ray: None, seed: int) -> None:
    snapshot = generated(seed)
    assert plan(snapshot, "always") == plan(snapshot, "never")


def test_ray_room_follows_placements_rollbacks_and_another_transaction(local_ray: None) -> None:
    snapshot = generated(7)
    tx, other = Transaction(snapshot), Transaction(snapshot)
    backend, local = RayPlacementBackend(tx, None), LocalBackend()
    before = rooms(tx, [backend, local])
    assert before[0] == before[1]
    config = SchedulerConfigSpec(rayBackend=RayBackend(mode="never"))
    ordered = sorted(snapshot.pod_groups.values(), key=lambda g: g.creation_timestamp)
    mark = tx.checkpoint()
    assert any([place_gang(tx, group, config).admitted for group in ordered[:6]])
    placed = rooms(tx, [backend, local])  # the actors get the placed rows only
    assert placed[0] == placed[1] != before[1]
    tx.rollback(mark)  # and then the rows put back
    assert rooms(tx, [backend, local]) == [before[1], before[1]]
    assert any([place_gang(tx, group, config).admitted for group in ordered])
    other_backend = RayPlacementBackend(other, None)  # the actors now hold `other`
    assert rooms(other, [other_backend]) == [before[1]]
    again = rooms(tx, [backend, local])  # so they are loaded with `tx` again
    assert again[0] == again[1] != before[1]


def test_shards_hold_whole_domains_of_the_widest_level() -> None:
    snapshot = generated(3)
    owner = shard_of_nodes(Transaction(snapshot), 2)
    node_domain = snapshot.topologies["dc"].levels[0].node_domain
    assert np.all(node_domain >= 0)
    for domain in range(len(snapshot.topologies["dc"].levels[0].domains)):
        assert len(set(owner[node_domain == domain].tolist())) == 1
    sizes = np.bincount(owner, minlength=2)
    assert abs(int(sizes[0]) - int(sizes[1])) <= np.bincount(node_domain).max()


def test_one_zone_is_sharded_by_its_racks() -> None:
    nodes = [
        make_node(f"n{i}").gpus(8).in_domains(zone="z", rack=f"r{i % 3}").build() for i in range(9)
    ]
    topology = make_topology("dc").level("zone").level("rack").hostname().build()
    snapshot = cluster(nodes, [], [], [topology])
    owner = shard_of_nodes(Transaction(snapshot), 2)
    racks = snapshot.topologies["dc"].levels[1].node_domain
    assert all(len(set(owner[racks == rack].tolist())) == 1 for rack in range(3))
    assert sorted(np.bincount(owner, minlength=2).tolist()) == [3, 6]


@pytest.mark.parametrize(
    ("mode", "nodes", "expected"),
    [
        pytest.param("never", 10_000, False, id="never means local at any size"),
        pytest.param("always", 1, True, id="always means Ray at any size"),
        pytest.param("auto", 1999, False, id="auto stays local below minNodes"),
        pytest.param("auto", 2000, True, id="auto uses a joined Ray cluster from minNodes"),
    ],
)
def test_backend_choice(mode: str, nodes: int, expected: bool) -> None:
    joined = RayBackend(mode=mode, address="ray://head:10001")  # type: ignore[arg-type]
    assert use_ray(joined, nodes) is expected


@pytest.mark.parametrize("nodes", [1, 2000, 50_000])
def test_auto_never_starts_a_local_ray_cluster(nodes: int) -> None:
    """Without an address, auto stays local at any size: on the scheduler's own
    cores the Ray backend was slower at every size measured."""
    assert use_ray(RayBackend(mode="auto"), nodes) is False


def test_local_backend_is_the_default_for_small_clusters() -> None:
    tx = Transaction(cluster([make_node("n").build()], [], []))
    assert isinstance(backend_for(tx, SchedulerConfigSpec()), LocalBackend)


# ------------------------------------------------------- Ray lost mid-transaction


@pytest.fixture
def link_clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """A fresh Ray link on a virtual clock (the backoff is waited out by moving it)."""
    clock = VirtualClock(1_000_000.0)
    monkeypatch.setattr(ray_link, "RAY_LINK", RayLink(clock))
    return clock


FALLING_BACK = SchedulerConfigSpec(rayBackend=RayBackend(mode="always", retryAfter="30s"))


def plan_losing_ray(
    snapshot: Snapshot, lose_ray: Callable[[], None] | None, after: int = 4
) -> tuple[list[Any], list[str], str]:
    """`plan` with the Ray backend, `lose_ray` called once `after` gangs were placed
    through it; the binds, the reasons, and the backend the transaction ended on."""
    tx = Transaction(snapshot)
    ordered = sorted(snapshot.pod_groups.values(), key=lambda g: g.creation_timestamp)
    reasons = [place_gang(tx, group, FALLING_BACK).reason for group in ordered[:after]]
    if lose_ray is not None:
        assert backend_for(tx, FALLING_BACK).name == "ray" and ray_backend.actors()
        lose_ray()
    reasons += [place_gang(tx, group, FALLING_BACK).reason for group in ordered[after:]]
    for group in ordered:
        place_extras(tx, group, FALLING_BACK)
    tx.commit()
    return tx.binds(), reasons, backend_for(tx, FALLING_BACK).name


def kill_the_actors() -> None:
    for actor in ray_backend.actors():
        ray.kill(actor)


def test_actors_killed_mid_transaction_give_the_local_plan_then_ray_after_the_backoff(
    local_ray: None, link_clock: VirtualClock
) -> None:
    snapshot = generated(5)
    local = plan(snapshot, "never")
    assert plan_losing_ray(snapshot, kill_the_actors) == (*local, "local")
    status = ray_link.RAY_LINK.status()
    assert (status.available, status.fallbacks) == (False, 1)
    assert "a room query" in status.reason and "Actor" in status.reason, status.reason
    assert ray_backend.actors() == [] and not ray.is_initialized(), "a new session next time"
    assert plan_losing_ray(snapshot, None) == (*local, "local"), "in the backoff: local"
    assert not ray.is_initialized()
    link_clock.advance_to(link_clock.now() + 30)
    assert plan_losing_ray(snapshot, None) == (*local, "ray")  # a new local Ray, new actors
    assert ray_link.RAY_LINK.status().available and len(ray_backend.actors()) == 2


def test_ray_shut_down_mid_transaction_gives_the_local_plan(
    local_ray: None, link_clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without this, Ray's first call after the shutdown starts a local cluster of its
    # own (and then fails all the same): seconds for nothing.
    monkeypatch.setattr("ray._private.auto_init_hook.enable_auto_connect", False, raising=False)
    snapshot = generated(6)
    local = plan(snapshot, "never")
    assert plan_losing_ray(snapshot, ray.shutdown) == (*local, "local")
    status = ray_link.RAY_LINK.status()
    assert (status.available, status.fallbacks) == (False, 1) and status.reason
