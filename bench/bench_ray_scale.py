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
local (best of each, and of the last cycle), each cycle's CPU seconds in the
scheduler's thread and seconds in the garbage collector, ray.init, the room queries
of each cycle (count, seconds in `domain_room`), what each shard's actor was loaded
with (MiB), a round trip to the shard actors with nothing to compute (ms), the
making of each Ray backend (s: the connection checked, the nodes split into
shards), peak RSS of this process and of the Ray workers, the machine.
`--profile FILE` instead runs one local cycle under cProfile and writes the stats
there (and prints where the cycle's time goes). Not a test: it asserts only that
the plans agree, and prints figures.

`--reclaim [--victim-gang 10] [--gang-pods 2000] [--constraint block-preferred]`
times a reclaim cycle instead, on a full cluster: every node runs one pod x 8 GPUs
of queue `over` (quota 0, so all of it over quota, preemptible), in gangs of
`--victim-gang` pods on consecutive nodes (10: one gang per rack); queue
`starved` (quota `--gang-pods` x 8 GPUs, holding nothing) waits with one gang of
`--gang-pods` pods x 8 GPUs under `--constraint` (`none`, or `<level>-required` /
`<level>-preferred` of zone, block, rack). `--gangs` and `--singles` are not
used. The same cycles, plan checks and room timings as above; the figures add
the evictions, the victim gangs, and the starved gang's binds in the plan. With
`--profile FILE`, the local reclaim cycle under cProfile, and a table of where
its time goes: room queries (`domain_room`, what a `PlacementBackend`
computes), the rest of placement, the victim search, the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import resource
import time
from pathlib import Path
from typing import Any

from bench.bench_placement import LEVELS, gangs, nodes, single_pods, topology
from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.clock import SIM_EPOCH_S
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_pod, make_pod_group, make_queue


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


def reclaim_cluster(
    node_count: int, victim_gang: int, gang_pods: int, constraint: str
) -> ClusterObjects:
    """A full cluster (one running 8-GPU pod of queue `over` per node, gangs of
    `victim_gang` pods on consecutive nodes) and one waiting gang of queue `starved`."""
    pods: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for g in range(node_count // victim_gang):
        group = make_pod_group(f"v{g}").queue("over").min_member(victim_gang).created(g)
        groups.append(group.build())
        for k in range(victim_gang):
            node = g * victim_gang + k
            pod = make_pod(f"v{g}-{k}").gpus(8).cpu("16").group(f"v{g}").created(g)
            pods.append(pod.on(f"gpu-{node}").phase("Running").build())
    starved = make_pod_group("starved").queue("starved").min_member(gang_pods)
    if constraint != "none":
        level, kind = constraint.split("-")
        starved = starved.topology("dc", **{kind: level})
    groups.append(starved.created(node_count).build())
    pods += [
        make_pod(f"s-{i}").gpus(8).cpu("16").group("starved").created(node_count).build()
        for i in range(gang_pods)
    ]
    queues = [make_queue("over").gpu(quota=0), make_queue("starved").gpu(quota=gang_pods * 8)]
    return ClusterObjects(
        nodes=nodes(node_count),
        pods=pods,
        pod_groups=groups,
        queues=[q.build() for q in queues],
        topologies=[topology()],
    )


def reclaimed(result: CycleResult) -> dict[str, int]:
    """What the plan reclaims: pods evicted, their gangs, the starved gang's binds."""
    evictions = result.plan.evictions
    return {
        "evictions": len(evictions),
        "evicted_gangs": len({e.group for e in evictions}),
        "evictions_by_reclaim": sum(1 for e in evictions if e.reason == "reclaim"),
        "binds": len(result.plan.binds),
        "starved_binds": sum(1 for b in result.plan.binds if b.group == "default/starved"),
    }


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


#: Per mode, each cycle's CPU seconds in this thread (the scheduler's own work,
#: which other processes on the cores slow down without adding to).
CYCLE_CPU_S: dict[str, list[float]] = {}
#: Per mode, each cycle's seconds in Python's garbage collector.
CYCLE_GC_S: dict[str, list[float]] = {}
#: When the running collection started, and the cycle's seconds collecting so far.
GC_S = [0.0, 0.0]


def timing_gc(phase: str, info: dict[str, Any]) -> None:
    """A `gc.callbacks` entry adding each collection's time to `GC_S`."""
    if phase == "start":
        GC_S[0] = time.perf_counter()
    else:
        GC_S[1] += time.perf_counter() - GC_S[0]


#: Seconds each Ray backend took to be made (one per Ray cycle: the connection
#: checked, the nodes split into shards), outside the room queries.
SETUP_S: list[float] = []


def timing_setup(backend: type[Any]) -> None:
    """Time the making of `backend` (a class) into `SETUP_S`."""
    made = backend.__init__

    def timed(self: Any, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        made(self, *args, **kwargs)
        SETUP_S.append(round(time.perf_counter() - start, 3))

    backend.__init__ = timed


def cycle(snapshot: Snapshot, mode: str, number: int) -> tuple[CycleResult, float, list[float]]:
    ROOM_TIME.clear()
    GC_S[:] = [0.0, 0.0]
    start, cpu = time.perf_counter(), time.thread_time()
    result = run_cycle(snapshot, config(mode), number, SIM_EPOCH_S)
    seconds = time.perf_counter() - start
    CYCLE_CPU_S.setdefault(mode, []).append(round(time.thread_time() - cpu, 2))
    CYCLE_GC_S.setdefault(mode, []).append(round(GC_S[1], 2))
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


def profile(snapshot: Snapshot, path: str, table: bool = False) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    result = run_cycle(snapshot, config("never"), 1, SIM_EPOCH_S)
    profiler.disable()
    profiler.dump_stats(path)
    stats = pstats.Stats(path)
    stats.sort_stats("cumulative").print_stats(40)
    if table:
        print(json.dumps({"plan": reclaimed(result), "where": where_reclaim_goes(stats)}, indent=1))


#: The parts of a reclaim cycle, each as the (file ending, function name) whose
#: cumulative seconds add up to it. The parts not starting with "-" are disjoint
#: (the placement part is counted without the room queries it asks); "-" marks
#: a part of the one above it; the reclaim action as a whole is given apart.
RECLAIM_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "room queries (domain_room: what a PlacementBackend computes)": (
        ("placement/backend.py", "domain_room"),
    ),
    "placement (place_gang), room queries apart": (("placement/gang_tree.py", "place_gang"),),
    "- per-pod node choice (fit.choose_node)": (("placement/fit.py", "choose_node"),),
    "- - the workload mix, counted once per cycle (mix.snapshot_mix)": (
        ("placement/mix.py", "snapshot_mix"),
    ),
    "victim search (running_units, no_domain_could_hold, select_victims)": (
        ("decisions/eviction.py", "running_units"),
        ("decisions/eviction.py", "no_domain_could_hold"),
        ("decisions/victims.py", "select_victims"),
        ("decisions/eviction.py", "_everything"),
    ),
    "- select_victims": (("decisions/victims.py", "select_victims"),),
    "evictions in the transaction (Transaction.evict)": (("decisions/transaction.py", "evict"),),
    "group totals (totals.update)": (("decisions/totals.py", "update"),),
}
#: The whole cycle, and the reclaim action in it.
CYCLE = (("decisions/cycle.py", "run_cycle"),)
RECLAIM_ACTION = (("decisions/reclaim.py", "run"),)
REST = "the rest (fair shares, ordering, admission, booking, other actions)"


def cumulative(stats: pstats.Stats, functions: tuple[tuple[str, str], ...]) -> float:
    """The cumulative seconds of these functions, added up."""
    entries = stats.stats  # type: ignore[attr-defined]
    return float(
        sum(
            entry[3]
            for (file, _, name), entry in entries.items()
            for file_end, wanted in functions
            if name == wanted and file.replace(os.sep, "/").endswith(file_end)
        )
    )


def where_reclaim_goes(stats: pstats.Stats) -> dict[str, list[float]]:
    """Seconds and share of the cycle of each of `RECLAIM_PARTS`, and the rest."""
    total = cumulative(stats, CYCLE)
    found = {part: cumulative(stats, functions) for part, functions in RECLAIM_PARTS.items()}
    room, placement = list(RECLAIM_PARTS)[:2]
    found[placement] -= found[room]  # every room query is asked by place_gang
    found[REST] = total - sum(seconds for part, seconds in found.items() if part[0] != "-")
    found["(the reclaim action, all of it)"] = cumulative(stats, RECLAIM_ACTION)
    figures = {part: [round(s, 2), round(100 * s / total, 1)] for part, s in found.items()}
    return {"cycle": [round(total, 2), 100.0], **figures}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--gangs", type=int, default=2_000)
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--cycles", type=int, default=2, help="cycles per backend")
    parser.add_argument("--profile", help="profile one local cycle into this file instead")
    parser.add_argument("--reclaim", action="store_true", help="a reclaim cycle, full cluster")
    parser.add_argument("--victim-gang", type=int, default=10, help="--reclaim: pods a gang")
    parser.add_argument("--gang-pods", type=int, default=2_000, help="--reclaim: starved gang")
    parser.add_argument(
        "--constraint",
        default="block-preferred",
        choices=["none", *(f"{lv}-{k}" for lv in LEVELS for k in ("required", "preferred"))],
        help="--reclaim: the starved gang's topology constraint",
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "nodes": args.nodes}
    start = time.perf_counter()
    if args.reclaim:
        figures |= {"victim_gang": args.victim_gang, "gang_pods": args.gang_pods}
        figures["constraint"] = args.constraint
        objects = reclaim_cluster(args.nodes, args.victim_gang, args.gang_pods, args.constraint)
    else:
        figures |= {"gangs": args.gangs, "singles": args.singles}
        objects = backlog(args.nodes, args.gangs, args.singles)
    snapshot = build_snapshot(objects)
    figures["snapshot_build_s"] = round(time.perf_counter() - start, 2)
    if args.profile:
        profile(snapshot, args.profile, table=args.reclaim)
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from kai_ray.decisions.placement import ray_backend
    from kai_ray.decisions.placement.backend import LocalBackend

    timing_room(LocalBackend)
    timing_room(ray_backend.RayPlacementBackend)
    timing_setup(ray_backend.RayPlacementBackend)
    gc.callbacks.append(timing_gc)
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
    if args.reclaim:
        figures["reclaimed"] = reclaimed(reference)
    figures["plans_identical"] = True
    figures["local_cycle_s"] = local
    figures["ray_cycle_s"] = ray
    figures["room_queries_and_s"] = rooms
    figures["cycle_thread_cpu_s"] = {"local": CYCLE_CPU_S["never"], "ray": CYCLE_CPU_S["always"]}
    figures["cycle_gc_s"] = {"local": CYCLE_GC_S["never"], "ray": CYCLE_GC_S["always"]}
    figures["ray_backend_setup_s"] = SETUP_S
    figures["shard_loaded_mib"] = [round(b / 2**20, 1) for b in SHARD_BYTES]
    figures["ratio_best"] = round(min(ray) / min(local), 3)
    figures["ratio_last"] = round(ray[-1] / local[-1], 3)
    figures["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
