"""Placement benchmark: throughput of place_gang on a large generated cluster.

Run: `.venv/bin/python -m bench.bench_placement [--nodes 5000] [--ray]`.
Prints the machine, then, with snapshot build timed apart from placement:
(a) single-GPU pods placed per second from a backlog of 10,000 in one cycle;
(b) 1,000 gangs of 8 pods x 8 GPUs with a rack-required constraint, in one cycle;
(c) peak RSS; (d) with --ray, (b) again on the Ray backend, at 5,000 and 20,000 nodes.
Not a test: it asserts nothing, it prints figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from collections.abc import Callable
from typing import Any

from kai_ray.decisions.placement import place_gang
from kai_ray.decisions.transaction import Transaction
from kai_ray.sim.nodepool import NodePool, expand
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import RayBackend, SchedulerConfigSpec
from tests.builders import make_pod, make_pod_group, make_queue, make_topology

LEVELS = ("zone", "block", "rack")


def nodes(count: int) -> list[dict[str, Any]]:
    racks_per_block = max(count // (2 * 10 * 10), 1)
    pool = NodePool.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "count": count,
                "namePrefix": "gpu",
                "capacity": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"},
                "topology": [
                    {"label": "zone", "domains": 2},
                    {"label": "block", "domains": 10},
                    {"label": "rack", "domains": racks_per_block},
                ],
            },
        }
    )
    return expand(pool)


def topology() -> dict[str, Any]:
    return make_topology("dc", *LEVELS).hostname().build()


def single_pods(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = [
        make_pod(f"p{i}").gpus(1).cpu("4").group(f"g{i}").created(i).build() for i in range(count)
    ]
    groups = [make_pod_group(f"g{i}").queue("q").created(i).build() for i in range(count)]
    return pods, groups


def gangs(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = [
        make_pod(f"j{g}-{i}").gpus(8).cpu("16").group(f"j{g}").created(g).build()
        for g in range(count)
        for i in range(8)
    ]
    groups = [
        make_pod_group(f"j{g}")
        .queue("q")
        .min_member(8)
        .topology("dc", required="rack")
        .created(g)
        .build()
        for g in range(count)
    ]
    return pods, groups


def timed(label: str, work: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = work()
    print(f"  {label}: {time.perf_counter() - start:.2f} s")
    return result


def snapshot(node_count: int, pods: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Snapshot:
    objects = ClusterObjects(
        nodes=nodes(node_count),
        pods=pods,
        pod_groups=groups,
        queues=[make_queue("q").build()],
        topologies=[topology()],
    )
    return timed("snapshot build", lambda: build_snapshot(objects))


def place_all(snap: Snapshot, config: SchedulerConfigSpec) -> tuple[int, float]:
    tx = Transaction(snap)
    ordered = sorted(snap.pod_groups.values(), key=lambda g: (g.creation_timestamp, g.key))
    start = time.perf_counter()
    admitted = sum(place_gang(tx, group, config).admitted for group in ordered)
    return admitted, time.perf_counter() - start


def bench_singles(node_count: int) -> None:
    print(f"(a) 10,000 pending single-GPU pods, {node_count} nodes")
    snap = snapshot(node_count, *single_pods(10_000))
    config = SchedulerConfigSpec(rayBackend=RayBackend(mode="never"))
    admitted, seconds = place_all(snap, config)
    print(f"  placement: {admitted} pods in {seconds:.2f} s = {admitted / seconds:,.0f} pods/s")


def bench_gangs(node_count: int, mode: str) -> None:
    print(f"(b) 1,000 gangs of 8x8 GPUs, rack required, {node_count} nodes, backend {mode}")
    snap = snapshot(node_count, *gangs(1_000))
    config = SchedulerConfigSpec(rayBackend=RayBackend(mode=mode))  # type: ignore[arg-type]
    admitted, seconds = place_all(snap, config)
    print(f"  placement: {admitted} of 1000 gangs admitted, decided in {seconds:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--ray", action="store_true", help="also time the Ray backend (d)")
    args = parser.parse_args()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {platform.platform()}"
    )
    bench_singles(args.nodes)
    bench_gangs(args.nodes, "never")
    if args.ray:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        for count in (args.nodes, 4 * args.nodes):
            bench_gangs(count, "never")
            bench_gangs(count, "always")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"(c) peak RSS of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()
