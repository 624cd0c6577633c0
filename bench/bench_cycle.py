"""Whole-cycle benchmark: pending single-GPU pods placed per second by `run_cycle`.

Run: `.venv/bin/python -m bench.bench_cycle [--pods 10000] [--nodes 5000] [--inter-pod 0]`.
Unlike bench_placement (which calls place_gang directly), this goes through the
whole cycle: fair shares, queue order and admission for every job, placement,
and the other actions of the default list. The baseline, measured in the same
run on the same snapshot, is the simplest vectorised allocator: for each pod in
age order, the first node whose free resources hold it (one numpy comparison
over all nodes per pod), with no queues, topology or scoring. `--inter-pod N`
gives N of the pods a required anti-affinity to each other by node, to see
what inter-pod rules cost a cycle once some pod uses them. Not a test: it
prints figures.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time
from typing import Any

import numpy as np

from bench.bench_placement import nodes
from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.placement.mix import ClassCounts
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.clock import SIM_EPOCH_S
from kai_ray.values.config import FragmentationScoring, SchedulerConfig
from tests.builders import make_pod, make_pod_group, make_queue

QUEUES = 4


#: What `--inter-pod` gives every k-th pod: kept off the node of any other such pod.
SPREAD_LABEL = ("app", "spread")
SPREAD_AFFINITY = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {
                "labelSelector": {"matchLabels": dict([SPREAD_LABEL])},
                "topologyKey": "kubernetes.io/hostname",
            }
        ]
    }
}


def objects(
    pod_count: int, node_count: int, inter_pod: int = 0, mixed: bool = False
) -> ClusterObjects:
    queues = [make_queue("root").build()]
    queues += [
        make_queue(f"team-{i}").parent("root").gpu(quota=node_count * 2).build()
        for i in range(QUEUES)
    ]
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    every = pod_count // inter_pod if inter_pod else 0
    for i in range(pod_count):
        pod = make_pod(f"p{i}").gpus(1).scheduler("kai-ray").group(f"g{i}").created(i % 3600)
        if mixed:  # CPU and memory asked too, in several proportions to the GPU
            cores = MIXED_CORES[i % len(MIXED_CORES)]
            pod = pod.cpu(cores).memory(f"{cores * 4}Gi")
        if every and i % every == 0 and i // every < inter_pod:
            pod = pod.label(*SPREAD_LABEL).set("spec.affinity", SPREAD_AFFINITY)
        pods.append(pod.build())
        groups.append(
            make_pod_group(f"g{i}")
            .queue(f"team-{i % QUEUES}")
            .min_member(1)
            .created(i % 3600)
            .build()
        )
    return ClusterObjects(nodes=nodes(node_count), pods=pods, pod_groups=groups, queues=queues)


#: With `--mixed`: the cores of each pod in turn (and 4 GiB of memory per core).
MIXED_CORES = (1, 4, 12, 24)


def baseline_first_fit(snapshot: Snapshot) -> int:
    free = snapshot.free.copy()
    placed = 0
    for pod in snapshot.pending_pods:
        need = snapshot.vector(pod.requests)
        fits = np.flatnonzero(np.all(free >= need, axis=1))
        if len(fits):
            free[fits[0]] -= need
            placed += 1
    return placed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument(
        "--strategies",
        default="binpack",
        help="placementStrategy values, each timed on the same snapshot (binpack,fragmentation)",
    )
    parser.add_argument(
        "--mixed",
        action="store_true",
        help="pods ask 1 to 24 cores (and memory) with their GPU, not a GPU alone",
    )
    parser.add_argument(
        "--inter-pod",
        type=int,
        default=0,
        help="this many pods, spread through the backlog, anti-affine to each other by node",
    )
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {platform.python_version()}, "
        f"{__import__('os').cpu_count()} CPUs"
    )
    start = time.perf_counter()
    snapshot = build_snapshot(objects(args.pods, args.nodes, args.inter_pod, args.mixed))
    built = time.perf_counter()
    placed = baseline_first_fit(snapshot)
    base = time.perf_counter()
    base_rate = placed / (base - built)
    print(f"snapshot: {args.nodes} nodes, {args.pods} pending pods built in {built - start:.2f} s")
    print(f"baseline first fit: {placed} pods in {base - built:.2f} s = {base_rate:,.0f} pods/s")
    for strategy in args.strategies.split(","):
        config = SchedulerConfig.model_validate({"spec": {"placementStrategy": strategy}})
        began = time.perf_counter()
        result = run_cycle(snapshot, config, 1, SIM_EPOCH_S)
        took = time.perf_counter() - began
        cycle_rate = len(result.plan.binds) / took
        print(
            f"run_cycle ({strategy}): {len(result.plan.binds)} pods in {took:.2f} s = "
            f"{cycle_rate:,.0f} pods/s ({cycle_rate / base_rate:.2f}x the baseline), "
            f"{took / max(len(result.plan.binds), 1) * 1e3:.3f} ms per pod"
        )
    if "fragmentation" in args.strategies:
        print(mix_cost(snapshot))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {rss:.0f} MiB")


def mix_cost(snapshot: Snapshot) -> str:
    """What fragmentation's workload mix costs a cycle: every pod counted afresh, and
    kept counts following a snapshot whose pods are the same objects in a new mapping
    (the pass comparing identities that a kept cycle pays)."""
    settings = FragmentationScoring()
    began = time.perf_counter()
    kept = ClassCounts().follow(snapshot.pods)
    kept.mix(settings).heaviest()
    counted = time.perf_counter()
    kept.follow(dict(snapshot.pods)).mix(settings).heaviest()
    followed = time.perf_counter()
    return (
        f"workload mix of {len(snapshot.pods)} pods: counted afresh "
        f"{(counted - began) * 1e3:.1f} ms, kept {(followed - counted) * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
