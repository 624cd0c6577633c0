"""The operator's own cost in a burst: its scheduling loop with the API server in memory.

Run: `.venv/bin/python -m bench.bench_burst [--nodes 500] [--pods 4000] [--rounds 3]
[--compare DIR]`.

`bench_operator` times a burst on the real control plane, where the operator,
kube-apiserver, etcd and kwok share the machine's cores: its figures say how fast
pods get bound, not how much of that time is kai-ray's. This benchmark runs the
same burst (`--pods` single-GPU pods of one queue, each its own gang, onto
`--nodes` nodes of 8 GPUs) through the operator's `SchedulingLoop` itself (its
thread, its bind writers and bookkeepers, its cache, the same cycle) with
`MemoryApi` in place of the API server: a write answers at once and comes back
as the watch event the API server would send (a bind as the pod's MODIFIED, a
PodGroup created or its status patched as the PodGroup's), and a stand-in for
kwok marks each bound pod Running 0.3 s later. The pods arrive as a watch
backlog does, all at once on the informer's thread, while the loop already runs
(idle for `IDLE_BEFORE_S`, then just after a cycle, as node status updates
make one about every period on a cluster).

Figures per run: wall and CPU seconds of the process from the first pod to the
last bind (the interpreter is the operator's only limit here, so CPU is about
wall), the same once every PodGroup status and Event is written, the cycles,
and the writes by kind. The in-memory API's own work (a JSON round trip per
object written) is counted in, as a client's decoding would be.

With `--compare DIR` (a `git worktree` of the baseline commit) each round runs
DIR's operator and this tree's (`--code DIR` for another) in child processes,
in turns; medians are printed. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve()
#: How long after its bind a pod is marked Running (kwok's part).
RUNNING_AFTER_S = 0.3
#: How long the loop runs idle before the burst comes (just after a cycle).
IDLE_BEFORE_S = 1.3


def _copy(obj: Any) -> Any:
    return orjson.loads(orjson.dumps(obj))


class MemoryApi:
    """The API server's answers to the operator's writes, each also sent back as
    the watch event it makes; see the module docstring."""

    def __init__(self) -> None:
        self.loop: Any = None
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, Any]] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.writes: Counter[str] = Counter()
        self.bound = 0
        self.first_bind = self.last_bind = 0.0
        #: (when, pod key): bound pods kwok marks Running.
        self.starting: list[tuple[float, str]] = []

    def call(
        self,
        method: str,
        path: str,
        query: Any = None,
        body: Any = None,
        content_type: str = "",
    ) -> Any:
        parts = path.strip("/").split("/")
        body = _copy(body)
        if method == "POST" and parts[-1] == "binding":
            self.writes["bind"] += 1
            return self._bind(f"{parts[-4]}/{parts[-2]}", body)
        if method == "POST" and parts[-1] == "podgroups":
            self.writes["PodGroup create"] += 1
            meta = body["metadata"]
            meta.update(resourceVersion="1", creationTimestamp="2026-12-01T00:00:00Z")
            with self.lock:
                self.groups[f"{meta['namespace']}/{meta['name']}"] = body
            self.loop._on_event("PodGroup", "ADDED", _copy(body))
            return body
        if method == "PATCH" and parts[-1] == "status" and "podgroups" in parts:
            self.writes["PodGroup status"] += 1
            key = f"{parts[-4]}/{parts[-2]}"
            with self.lock:
                group = self.groups.get(key)
                if group is None:
                    return {}
                group = {**group, "status": {**(group.get("status") or {}), **body["status"]}}
                self.groups[key] = group
            self.loop._on_event("PodGroup", "MODIFIED", _copy(group))
            return {}
        self.writes[f"{method} {parts[-1] if 'events' in parts else 'other'}"] += 1
        return {}

    def _bind(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            pod = _copy(self.pods[key])
            pod["spec"]["nodeName"] = body["target"]["name"]
            pod["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
            self.pods[key] = pod
            self.bound += 1
            self.last_bind = time.perf_counter()
            self.first_bind = self.first_bind or self.last_bind
            self.starting.append((self.last_bind + RUNNING_AFTER_S, key))
        self.loop._on_event("Pod", "MODIFIED", _copy(pod))
        return {}

    def run_pods(self, stop: threading.Event) -> None:
        """kwok: bound pods become Running."""
        while not stop.wait(0.05):
            now = time.perf_counter()
            with self.lock:
                due = [key for when, key in self.starting if when <= now]
                self.starting = [(when, key) for when, key in self.starting if when > now]
            for key in due:
                with self.lock:
                    pod = _copy(self.pods[key])
                    pod["status"] = {
                        "phase": "Running",
                        "startTime": "2026-12-01T00:00:01Z",
                        "conditions": [{"type": "Ready", "status": "True"}],
                    }
                    self.pods[key] = pod
                self.loop._on_event("Pod", "MODIFIED", _copy(pod))


def measure(repo: str, nodes: int, pods: int) -> dict[str, float]:
    """One burst through the operator's loop of `repo`'s code."""
    sys.path[:0] = [repo, str(Path(repo) / "tests" / "e2e")]
    from nodes import GpuNodeSpec, node_manifest  # type: ignore[import-not-found]

    from bench.bench_operator import pod_body
    from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop

    api = MemoryApi()
    loop = SchedulingLoop(api, LoopOptions(leader_elect=False))  # type: ignore[arg-type]
    api.loop = loop
    spec = GpuNodeSpec(count=nodes, prefix="bench", nodes_per_rack=8)
    loop._on_list("Node", [node_manifest(i, spec) for i in range(nodes)])
    queue = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": "bench", "resourceVersion": "1"},
        "spec": {"resources": {"gpu": {"quota": nodes * 8}}},
    }
    loop._on_list("Queue", [queue])
    for kind in ("PodGroup", "Pod", "Topology"):
        loop._on_list(kind, [])
    loop.run_once()
    backlog = []
    for i in range(pods):
        body = pod_body(f"p{i}", "kai-ray")
        body["metadata"].update(
            namespace="bench",
            uid=f"uid-{i}",
            resourceVersion=str(i + 10),
            creationTimestamp="2026-12-01T00:00:00Z",
        )
        body["status"] = {"phase": "Pending"}
        api.pods[f"bench/p{i}"] = body
        backlog.append(orjson.dumps(body))
    stop = threading.Event()
    threading.Thread(target=api.run_pods, args=(stop,), daemon=True).start()
    loop.synced = lambda: True  # type: ignore[method-assign]
    # The operator runs, idle, when the burst comes (as in bench_operator, where
    # it is released with the burst in its watches): its loop has made a cycle
    # and waits for the next period, at a point of it that varies run to run.
    loop._thread.start()
    time.sleep(IDLE_BEFORE_S)
    # On a cluster, nodes' status updates make a cycle about every period: the
    # burst comes just after one (a queue's update here), as it mostly would.
    loop._on_event(
        "Queue", "MODIFIED", {**queue, "metadata": {"name": "bench", "resourceVersion": "2"}}
    )
    time.sleep(0.05)
    cpu, start = time.process_time(), time.perf_counter()
    for raw in backlog:  # the watch's backlog, on the informer's thread (this one)
        loop._on_event("Pod", "ADDED", orjson.loads(raw))
    deadline = start + 600
    while api.bound < pods and time.perf_counter() < deadline:
        time.sleep(0.01)
    bound_cpu = time.process_time() - cpu
    quiet = 0
    while quiet < 3 and time.perf_counter() < deadline:  # statuses and Events written
        time.sleep(0.5)
        idle = loop.backlog.pending() <= 1 and not loop.backlog.binding and not api.starting
        quiet = quiet + 1 if idle else 0
    figures = {
        "bound": float(api.bound),
        "first_bind_s": api.first_bind - start,
        "last_bind_s": api.last_bind - start,
        "cpu_to_last_bind_s": bound_cpu,
        "drained_s": time.perf_counter() - start,
        "cpu_drained_s": time.process_time() - cpu,
        "cycles": float(loop.cycles),
        **{f"writes: {kind}": float(n) for kind, n in sorted(api.writes.items())},
    }
    stop.set()
    loop.stop_event.set()
    return figures


def run_in(folder: str, nodes: int, pods: int) -> dict[str, float]:
    """`measure` in a child process whose `kai_ray` is `folder`'s."""
    code = (
        f"import json, runpy, sys; sys.path.insert(0, {folder!r});"
        f"measure = runpy.run_path({str(HERE)!r})['measure'];"
        f"print(json.dumps(measure({folder!r}, {nodes}, {pods})))"
    )
    env = {**os.environ, "PYTHONPATH": folder}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=folder,
        env=env,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compare", default="", help="a worktree of the baseline commit")
    parser.add_argument("--code", default="", help="a worktree of the new commit (default: here)")
    args = parser.parse_args()
    sides = {"new": args.code or str(HERE.parents[1])}
    if args.compare:
        sides = {"baseline": args.compare, **sides}
    print(f"machine: {os.cpu_count()} cores, {platform.python_version()}, {platform.machine()}")
    print(f"{args.pods} single-GPU pods onto {args.nodes} nodes x 8 GPUs, {args.rounds} rounds")
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for side in order:
            figures = run_in(sides[side], args.nodes, args.pods)
            runs[side].append(figures)
            print(
                f"round {round_ + 1} {side}: "
                + ", ".join(f"{k}={v:.2f}" for k, v in figures.items())
            )
    for side, measured in runs.items():
        medians = {key: statistics.median(m[key] for m in measured) for key in measured[0]}
        print(
            f"{side} (median of {len(measured)}): "
            + ", ".join(f"{k}={v:.2f}" for k, v in medians.items())
        )


if __name__ == "__main__":
    main()
