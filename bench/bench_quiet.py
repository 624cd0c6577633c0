"""Quiet cycles on the operator's cache: the snapshot and the cycle when little changed.

Run: `.venv/bin/python -m bench.bench_quiet [--nodes 5000] [--pods 20000] [--compare DIR]`.
The cluster of `bench_operator.quiet_cycle`: `--nodes` nodes of 8 GPUs, one
team queue, `--pods` bound single-GPU pods, each its own PodGroup. After a few
warm-up cycles three figures, each the best of `--repeat`, timing
`cache.snapshot()` and `run_cycle` apart:

- **nothing changed** since the last snapshot;
- **one pod added**: a pending single-GPU pod of a new PodGroup (the cycle
  places it; it is taken away again, untimed, before the next repetition);
- **one pod finished**: a bound pod's phase becomes Succeeded (put back after);
- **one node cordoned**: `spec.unschedulable` set on a node holding pods
  (uncordoned after).

With `--compare DIR` (a `git worktree` of the baseline commit) the same
measurement runs with DIR's `kai_ray` in a child process, interleaved with the
current code's (also a child process), `--rounds` times; each figure is the
best over rounds. `--code DIR` runs the new side from DIR too (a worktree of the
new commit, so that work in progress in this tree is left out). Not a test: it
prints figures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
FIGURES = ("nothing changed", "one pod added", "one pod finished", "one node cordoned")


def full_cache(nodes: int, pods: int) -> Any:
    """A `ClusterCache` of `nodes` nodes of 8 GPUs, one team queue, and `pods` bound
    single-GPU pods, each its own PodGroup (also `bench_operator.quiet_cycle`'s)."""
    from bench.bench_placement import nodes as make_node_objects
    from kai_ray.state.cache import ClusterCache
    from tests.builders import make_pod, make_pod_group, make_queue

    cache = ClusterCache()
    for node in make_node_objects(nodes):
        cache.upsert(node, "Node")
    cache.upsert(make_queue("root").build(), "Queue")
    cache.upsert(make_queue("team").parent("root").gpu(quota=nodes * 8).build(), "Queue")
    names = [key for key, _ in cache.items("Node")]
    for i in range(pods):
        pod = make_pod(f"p{i}").gpus(1).scheduler("kai-ray").group(f"g{i}").on(names[i % nodes])
        cache.upsert(pod.build(), "Pod")
        cache.upsert(make_pod_group(f"g{i}").queue("team").min_member(1).build(), "PodGroup")
    return cache


def measure(nodes: int, pods: int, repeat: int) -> dict[str, dict[str, float]]:
    """Per figure: the best snapshot and cycle times in milliseconds."""
    from kai_ray.decisions.cycle import run_cycle
    from kai_ray.values.config import SchedulerConfig
    from tests.builders import make_pod, make_pod_group

    cache = full_cache(nodes, pods)
    names = [key for key, _ in cache.items("Node")]
    config = SchedulerConfig()
    state: dict[str, Any] = {"usage": None, "cycle": 0}
    # The operator keeps the cycle's sums over every group from cycle to cycle
    # (`totals.GroupTotals`); code from before they existed has no such argument.
    keep: dict[str, Any] = {}
    if "totals" in inspect.signature(run_cycle).parameters:
        from kai_ray.decisions.totals import GroupTotals

        keep["totals"] = GroupTotals()

    def timed() -> tuple[float, float]:
        state["cycle"] += 1
        start = time.perf_counter()
        snapshot = cache.snapshot()
        built = time.perf_counter()
        now = 1.0e9 + state["cycle"]
        result = run_cycle(snapshot, config, state["cycle"], now, state["usage"], **keep)
        state["usage"] = result.usage
        return 1000 * (built - start), 1000 * (time.perf_counter() - built)

    def added(i: int) -> Callable[[], None]:
        cache.upsert(make_pod_group(f"new{i}").queue("team").min_member(1).build(), "PodGroup")
        pod = make_pod(f"new{i}").gpus(1).scheduler("kai-ray").group(f"new{i}")
        cache.upsert(pod.build(), "Pod")

        def undo() -> None:
            cache.delete("Pod", f"default/new{i}")
            cache.delete("PodGroup", f"default/new{i}")

        return undo

    def finished(i: int) -> Callable[[], None]:
        key = f"default/p{i}"
        running = cache.get("Pod", key)
        assert running is not None
        cache.upsert({**running, "status": {"phase": "Succeeded"}}, "Pod")
        return lambda: cache.upsert(running, "Pod")

    def cordoned(i: int) -> Callable[[], None]:
        node = cache.get("Node", names[i])
        assert node is not None
        cache.upsert({**node, "spec": {**(node.get("spec") or {}), "unschedulable": True}}, "Node")
        return lambda: cache.upsert(node, "Node")

    for _ in range(3):
        timed()
    best: dict[str, list[tuple[float, float]]] = {figure: [] for figure in FIGURES}
    for i in range(repeat):
        best["nothing changed"].append(timed())
        changes = (added, finished, cordoned)
        for figure, change in zip(FIGURES[1:], changes, strict=True):
            undo = change(i)
            best[figure].append(timed())
            undo()
            timed()
    return {
        figure: {"snapshot_ms": min(s for s, _ in runs), "cycle_ms": min(c for _, c in runs)}
        for figure, runs in best.items()
    }


def run_in(folder: str, nodes: int, pods: int, repeat: int) -> dict[str, dict[str, float]]:
    """`measure` in a child process whose `kai_ray` (and builders) are `folder`'s."""
    code = (
        f"import json, runpy, sys; sys.path.insert(0, {folder!r});"
        f"measure = runpy.run_path({str(HERE)!r})['measure'];"
        f"print(json.dumps(measure({nodes}, {pods}, {repeat})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=folder
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", default="", help="a worktree of the baseline commit")
    parser.add_argument("--code", default="", help="a worktree of the new commit (default: here)")
    args = parser.parse_args()
    here = args.code or str(HERE.parents[1])
    print(f"machine: {os.cpu_count()} cores, {platform.python_version()}")
    print(f"{args.nodes} nodes x 8 GPUs, {args.pods} bound pods; best of {args.repeat} x rounds")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"baseline": [], "new": []}
    for _ in range(args.rounds):
        if args.compare:
            runs["baseline"].append(run_in(args.compare, args.nodes, args.pods, args.repeat))
        runs["new"].append(run_in(here, args.nodes, args.pods, args.repeat))
    print("figure | code | snapshot ms | cycle ms | snapshot + cycle ms")
    for figure in FIGURES:
        for code, measured in runs.items():
            if not measured:
                continue
            snapshot = min(m[figure]["snapshot_ms"] for m in measured)
            cycle = min(m[figure]["cycle_ms"] for m in measured)
            print(f"{figure} | {code} | {snapshot:.1f} | {cycle:.0f} | {snapshot + cycle:.0f}")


if __name__ == "__main__":
    main()
