"""Cycle cost against the backlog: one `run_cycle` on a full cluster with many waiting gangs.

Run: `.venv/bin/python -m bench.bench_backlog [--nodes 5000] [--backlogs 100,1000,5000,10000]`.
A cluster of `--nodes` x 8 GPUs (zones, blocks, racks of 10) is full: every node
runs one 8-GPU pod of a running job. Eight team queues of equal quota then have
`backlog` waiting jobs between them, in the issue's mix: single pods of 1-8
GPUs, and gangs of 2-16 eight-GPU pods, most of 4-8 pods rack-required. Nothing
can be placed; reclaim finds every team at its share. The figure is the wall
time of one cycle (the snapshot built apart), the best of `--repeat` runs, so
how the cycle's cost grows with the number of jobs it cannot place is seen
alone. With `--compare DIR` each backlog is also run by the code in DIR (a
`git worktree` of the baseline commit) in a child process, interleaved with
the current code's runs; both sides are measured by this file's `measure`.
With `--kept-sums` the cycle is handed a `GroupTotals` already brought up to
the snapshot, as the operator's loop and the simulator hold one from cycle to
cycle (without it every cycle sums every group afresh, as a first cycle does).
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TEAMS = 8


def objects(node_count: int, backlog: int, seed: int = 7) -> Any:
    from bench.bench_placement import LEVELS, nodes
    from kai_ray.state.snapshot import ClusterObjects
    from tests.builders import make_pod, make_pod_group, make_queue, make_topology

    rng = random.Random(seed)
    quota = node_count * 8 // TEAMS
    queues = [make_queue("root").build()]
    queues += [
        make_queue(f"team-{t}").parent("root").gpu(quota=quota).build() for t in range(TEAMS)
    ]
    node_objects = nodes(node_count)
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for i, node in enumerate(node_objects):
        name = f"run-{i}"
        groups.append(make_pod_group(name).queue(f"team-{i % TEAMS}").min_member(1).build())
        pod = make_pod(f"{name}-0").gpus(8).scheduler("kai-ray").group(name)
        pods.append(pod.on(node["metadata"]["name"]).phase("Running").build())
    for j in range(backlog):
        name = f"wait-{j}"
        group = make_pod_group(name).queue(f"team-{j % TEAMS}").created(j % 3600)
        if rng.random() < 0.6:
            size, gpus = 1, rng.choice((1, 2, 4, 8))
        else:
            size, gpus = rng.choice((2, 4, 4, 8, 8, 16)), 8
            if 4 <= size <= 8 and rng.random() < 0.75:
                group = group.topology("dc", required="rack")
        groups.append(group.min_member(size).build())
        for k in range(size):
            pods.append(make_pod(f"{name}-{k}").gpus(gpus).scheduler("kai-ray").group(name).build())
    topology = make_topology("dc", *LEVELS).hostname().build()
    return ClusterObjects(
        nodes=node_objects, pods=pods, pod_groups=groups, queues=queues, topologies=[topology]
    )


def measure(
    node_count: int, backlog: int, repeat: int, kept_sums: bool = False
) -> dict[str, float]:
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.decisions.totals import GroupTotals
    from kai_ray.state.snapshot import build_snapshot
    from kai_ray.values.clock import SIM_EPOCH_S
    from kai_ray.values.config import SchedulerConfig

    start = time.perf_counter()
    snapshot = build_snapshot(objects(node_count, backlog))
    built = time.perf_counter() - start
    # In-process placement: the Ray backend's round trips are another benchmark's.
    config = SchedulerConfig.model_validate({"spec": {"rayBackend": {"mode": "never"}}})
    totals = GroupTotals().update(snapshot) if kept_sums else None
    times, binds, evictions = [], 0, 0
    for cycle in range(repeat):
        start = time.perf_counter()
        result = run_cycle(snapshot, config, cycle + 1, SIM_EPOCH_S, totals=totals)
        times.append(time.perf_counter() - start)
        binds, evictions = len(result.plan.binds), len(result.plan.evictions)
    return {"snapshot_s": built, "cycle_s": min(times), "binds": binds, "evictions": evictions}


def run_in(
    folder: str, node_count: int, backlog: int, repeat: int, kept_sums: bool
) -> dict[str, float]:
    """This file's `measure` in a child process whose kai_ray is the one in `folder`."""
    code = (
        f"import json, sys, importlib.util; sys.path.insert(0, {folder!r});"
        f"sys.path.insert(1, {os.getcwd()!r});"
        f"spec = importlib.util.spec_from_file_location('bench_backlog_run', {__file__!r});"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module);"
        f"print(json.dumps(module.measure({node_count}, {backlog}, {repeat}, {kept_sums})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=folder
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--backlogs", default="100,1000,5000,10000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", default="", help="a worktree of the baseline commit")
    parser.add_argument("--kept-sums", action="store_true", help="the operator's kept sums")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1])
    sums = "kept sums" if args.kept_sums else "fresh sums"
    print(f"{args.nodes} nodes x 8 GPUs, full; best of {args.repeat} cycles per figure; {sums}")
    print("backlog | baseline cycle | cycle | snapshot | binds | evictions")
    for backlog in map(int, args.backlogs.split(",")):
        kept = args.kept_sums
        base = (
            run_in(args.compare, args.nodes, backlog, args.repeat, kept) if args.compare else None
        )
        new = run_in(here, args.nodes, backlog, args.repeat, kept)
        before = f"{base['cycle_s'] * 1000:.0f} ms" if base else "-"
        print(
            f"{backlog} | {before} | {new['cycle_s'] * 1000:.0f} ms | "
            f"{new['snapshot_s']:.2f} s | {new['binds']:.0f} | {new['evictions']:.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
