"""Reclaim benchmark: a starved queue's 500-pod gang finds its victims in one cycle.

Run: `taskset -c 0,1 .venv/bin/python -m bench.bench_reclaim [--nodes 5000] [--jobs 4000]`.
5,000 nodes x 8 GPUs are fully used by 4,000 jobs (5 pods x 2 GPUs each, laid
out contiguously) of queue `over`, which holds everything; queue `starved`
(quota 4,000 GPUs) submits one gang of 500 pods x 8 GPUs. One whole cycle
(allocate, reclaim) is timed apart from building the snapshot; the figures are
the cycle's wall time, victims and evicted GPUs, and whether the gang was bound.
Not a test: it asserts nothing, it prints figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
from typing import Any

from kai_ray.decisions.cycle import run_cycle
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue

PODS_PER_JOB, GPUS_PER_POD, GANG, GANG_GPUS = 5, 2, 500, 8


def cluster(nodes: int, jobs: int) -> ClusterObjects:
    """Every node full; job j's pods fill slots 5j..5j+4 (4 slots of 2 GPUs per node)."""
    node_objs = [make_node(f"n{i}").gpus(8).cpu("128").memory("1Ti").build() for i in range(nodes)]
    groups: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for j in range(jobs):
        groups.append(
            make_pod_group(f"j{j}").queue("over").min_member(PODS_PER_JOB).created(j).build()
        )
        for k in range(PODS_PER_JOB):
            node = (j * PODS_PER_JOB + k) // (8 // GPUS_PER_POD)
            pod = make_pod(f"j{j}-{k}").group(f"j{j}").gpus(GPUS_PER_POD).created(j)
            pods.append(pod.on(f"n{node}").phase("Running").build())
    groups.append(
        make_pod_group("gang").queue("starved").min_member(GANG).created(jobs + 1).build()
    )
    pods += [
        make_pod(f"gang-{i}").group("gang").gpus(GANG_GPUS).created(jobs + 1).build()
        for i in range(GANG)
    ]
    queues = [make_queue("over").gpu(quota=0), make_queue("starved").gpu(quota=GANG * GANG_GPUS)]
    return ClusterObjects(
        nodes=node_objs, pods=pods, pod_groups=groups, queues=[q.build() for q in queues]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=4000)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, python {platform.python_version()}, {cores} cores usable")
    print(f"command: python -m bench.bench_reclaim --nodes {args.nodes} --jobs {args.jobs}")
    started = time.perf_counter()
    snapshot = build_snapshot(cluster(args.nodes, args.jobs))
    built = time.perf_counter() - started
    print(f"snapshot: {len(snapshot.pods)} pods, {len(snapshot.node_names)} nodes, {built:.2f} s")
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate", "reclaim"]}})
    started = time.perf_counter()
    result = run_cycle(snapshot, config, 1, time.time())
    elapsed = time.perf_counter() - started
    victims = {e.group for e in result.plan.evictions}
    gpus = sum(snapshot.pods[e.pod].requests["nvidia.com/gpu"] for e in result.plan.evictions)
    bound = sum(1 for b in result.plan.binds if b.group == "default/gang")
    print(f"cycle (allocate + reclaim): {elapsed:.2f} s")
    print(f"victims: {len(victims)} jobs, {len(result.plan.evictions)} pods, {gpus:g} GPUs evicted")
    print(f"gang bound in the same plan: {bound}/{GANG} pods")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
