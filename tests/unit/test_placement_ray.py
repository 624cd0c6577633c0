"""The Ray backend returns the local backend's plan exactly, on generated clusters.

Starts one local Ray (2 CPUs) for the module: about 4 s, see
measurements of the Ray backend (docs/placement.md).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from typing import Any

import pytest

from kai_ray.decisions.placement import place_extras, place_gang
from kai_ray.decisions.placement.backend import LocalBackend
from kai_ray.decisions.placement.backend_choice import backend_for, use_ray
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.snapshot import Snapshot
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


@pytest.mark.parametrize(
    ("mode", "nodes", "expected"),
    [
        pytest.param("never", 10_000, False, id="never means local at any size"),
        pytest.param("always", 1, True, id="always means Ray at any size"),
        pytest.param("auto", 1999, False, id="auto stays local below minNodes"),
        pytest.param("auto", 2000, True, id="auto uses Ray from minNodes"),
    ],
)
def test_backend_choice(mode: str, nodes: int, expected: bool) -> None:
    assert use_ray(RayBackend(mode=mode), nodes) is expected  # type: ignore[arg-type]


def test_local_backend_is_the_default_for_small_clusters() -> None:
    tx = Transaction(cluster([make_node("n").build()], [], []))
    assert isinstance(backend_for(tx, SchedulerConfigSpec()), LocalBackend)
