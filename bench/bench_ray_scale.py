"""Ray placement at scale: one whole cycle on the local backend and on the Ray backend.

Run: `.venv/bin/python -m bench.bench_ray_scale [--nodes 50000] [--gangs 2000]
[--singles 20000] [--cycles 2] [--profile FILE]`.
The cluster is bench_placement's (8 GPUs a node; 2 zones x 10 blocks x racks of 10
nodes). The backlog: `--gangs` gangs of 8 pods x 8 GPUs, each required inside one
rack, and `--singles` single-GPU pods, in one queue, interleaved by age. Each
`run_cycle` (fair shares, ordering, admission, placement, the default actions) runs
on the same snapshot with `rayBackend.mode: never` (local) and `always` (Ray),
alternately, `--cycles` times each; every plan must equal the first local one (the
script stops otherwise). `ray.init` is timed apart, before the first Ray cycle: it
is paid once per process (the shard actors start during the first Ray cycle). Prints
one JSON object: snapshot build, each cycle's wall time per backend, the ratio Ray /
local (best of each, and of the last cycle), ray.init, the room queries of each cycle
(count, seconds in `domain_room`), what each shard's actor was loaded with (MiB), a
round trip to the shard actors with nothing to compute (ms),
peak RSS of this process and of the Ray workers, the machine.
`--profile FILE` instead runs one local cycle under cProfile and writes the stats
there (and prints where the cycle's time goes). Not a test: it asserts only that
the plans agree, and prints figures.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import resource
import time
from pathlib import Path
from typing import Any

from bench.bench_placement import gangs, nodes, single_pods, topology
from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.clock import SIM_EPOCH_S
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_queue


def backlog(node_count: int, gang_count: int, single_count: int) -> ClusterObjects:
    gang_pods, gang_groups = gangs(gang_count)
    pods, groups = single_pods(single_count)
    return ClusterObjects(
        nodes=nodes(node_count),
        pods=gang_pods + pods,
        pod_groups=gang_groups + groups,
        queues=[make_queue("q").build()],
        topologies=[topology()],
    )


def config(mode: str) -> SchedulerConfig:
    return SchedulerConfig.model_validate({"spec": {"rayBackend": {"mode": mode}}})


#: Per backend name: room queries answered, and seconds spent answering them.
ROOM_TIME: dict[str, list[float]] = {}
#: What the Ray backend loaded each shard's actor with, in bytes (the last cycle's).
SHARD_BYTES: list[int] = []


def timing_room(backend: type[Any]) -> None:
    """Count `domain_room`'s calls and time on `backend` (a class), per cycle."""
    answer = backend.domain_room

    def timed(self: Any, tx: Any, query: Any) -> Any:
        start = time.perf_counter()
        result = answer(self, tx, query)
        if hasattr(self, "shard_bytes"):
            SHARD_BYTES[:] = self.shard_bytes
        spent = ROOM_TIME.setdefault(self.name, [0, 0.0])
        spent[0] += 1
        spent[1] += time.perf_counter() - start
        return result

    backend.domain_room = timed


def cycle(snapshot: Snapshot, mode: str, number: int) -> tuple[CycleResult, float, list[float]]:
    ROOM_TIME.clear()
    start = time.perf_counter()
    result = run_cycle(snapshot, config(mode), number, SIM_EPOCH_S)
    seconds = time.perf_counter() - start
    room = next(iter(ROOM_TIME.values()), [0, 0.0])
    return result, seconds, [int(room[0]), round(room[1], 2)]


def same_plan(a: CycleResult, b: CycleResult) -> bool:
    return (
        a.plan.binds == b.plan.binds
        and a.plan.evictions == b.plan.evictions
        and a.plan.nominations == b.plan.nominations
        and list(a.plan.statuses) == list(b.plan.statuses)
    )


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory = Path("/proc/meminfo").read_text().split()[1]
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "python": platform.python_version(),
    }


def ray_worker_peak_rss_mib() -> dict[str, float]:
    """Peak RSS (VmHWM) of the Ray worker processes, by name and pid, from /proc."""
    peaks: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if not command.startswith("ray::"):
            continue
        if int(entry.name) == os.getpid():
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peaks[f"{command.split()[0]} {entry.name}"] = round(int(line.split()[1]) / 1024, 1)
    return peaks


def round_trip_ms(ray: Any, actors: list[Any], calls: int = 500) -> dict[str, float]:
    """One call answered by one shard actor, and by every one at once (nothing to compute)."""
    ray.get([actor.holds.remote() for actor in actors])
    figures = {}
    for label, asked in (("one_actor", actors[:1]), ("all_actors", actors)):
        start = time.perf_counter()
        for _ in range(calls):
            ray.get([actor.holds.remote() for actor in asked])
        figures[label] = round((time.perf_counter() - start) / calls * 1e3, 2)
    return figures


def profile(snapshot: Snapshot, path: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run_cycle(snapshot, config("never"), 1, SIM_EPOCH_S)
    profiler.disable()
    profiler.dump_stats(path)
    stats = pstats.Stats(path)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--gangs", type=int, default=2_000)
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=2, help="cycles per backend")
    parser.add_argument("--profile", help="profile one local cycle into this file instead")
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "nodes": args.nodes}
    figures |= {"gangs": args.gangs, "singles": args.singles}
    start = time.perf_counter()
    snapshot = build_snapshot(backlog(args.nodes, args.gangs, args.singles))
    figures["snapshot_build_s"] = round(time.perf_counter() - start, 2)
    if args.profile:
        profile(snapshot, args.profile)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from kai_ray.decisions.placement import ray_backend
    from kai_ray.decisions.placement.backend import LocalBackend

    timing_room(LocalBackend)
    timing_room(ray_backend.RayPlacementBackend)
    rooms: dict[str, list[list[float]]] = {"local": [], "ray": []}
    reference: CycleResult | None = None
    local: list[float] = []
    ray: list[float] = []
    try:
        for number in range(args.cycles):
            result, seconds, room = cycle(snapshot, "never", 2 * number + 1)
            rooms["local"].append(room)
            reference = reference or result
            assert same_plan(result, reference), "local plans differ between cycles"
            local.append(round(seconds, 2))
            if number == 0:
                began = time.perf_counter()
                ray_backend.connect(None)
                figures["ray_init_s"] = round(time.perf_counter() - began, 2)
            result, seconds, room = cycle(snapshot, "always", 2 * number + 2)
            rooms["ray"].append(room)
            assert same_plan(result, reference), "the Ray plan differs from the local plan"
            ray.append(round(seconds, 2))
        figures["ray_round_trip_ms"] = round_trip_ms(
            ray_backend.connect(None), ray_backend.actors()
        )
        figures["ray_worker_peak_rss_mib"] = ray_worker_peak_rss_mib()
    finally:
        ray_backend.disconnect()
    assert reference is not None
    figures["binds"] = len(reference.plan.binds)
    figures["plans_identical"] = True
    figures["local_cycle_s"] = local
    figures["ray_cycle_s"] = ray
    figures["room_queries_and_s"] = rooms
    figures["shard_loaded_mib"] = [round(b / 2**20, 1) for b in SHARD_BYTES]
    figures["ratio_best"] = round(min(ray) / min(local), 3)
    figures["ratio_last"] = round(ray[-1] / local[-1], 3)
    figures["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
