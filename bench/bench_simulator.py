"""Benchmark of `kai-ray simulate` (a script, not a test): time, peak memory, sweep speed-up.

    .venv/bin/python bench/bench_simulator.py [--jobs 10000] [--nodes 512] [--days 7]
        [--seed 1] [--sweep-variants 8] [--skip-single] [--skip-sweep]
        [--profile-hours 6] [--write-docs]

1. Generates a workload from a seed: a NodePool of `--nodes` x 8 GPUs in racks of 8,
   three teams, and a CSV trace of `--jobs` jobs over `--days` virtual days (60 %
   single pods of 1-8 GPUs or half a GPU, 40 % gangs of 2-16 pods of 8 GPUs, a third
   of the gangs held to one block), sized for about 75 % offered GPU load.
2. Runs `kai-ray simulate --trace` in a child process and reports wall time and the
   child's peak RSS (`--skip-single` skips it).
3. Profiles the first `--profile-hours` virtual hours in-process and reports the share
   of the scheduling cycle (kai_ray/decisions), of the snapshot build and of the rest.
4. Runs a sweep of `--sweep-variants` variants (the first 6 virtual hours, so the
   whole thing stays minutes) on Ray and with `--no-ray`, and reports the speed-up.
With `--write-docs` the figures replace the "Simulator" section of docs/benchmarks.md.

`--workload overloaded` is the oversubscribed week instead: `--nodes` x 8 GPUs in
racks of 8, eight team queues of equal quota and over-quota weights 1 to 3, and
`--jobs` batch Jobs given as one YAML file (60 % single pods of 1-8 GPUs, 40 %
gangs of 2-16 eight-GPU pods, three quarters of the gangs of 4-8 pods
rack-required; durations 10 minutes to 8 hours), about twice what the cluster
can run over `--days`. `--compare DIR` also runs `kai-ray simulate` from the code
in DIR (a `git worktree` of the baseline commit) on the same files, with
`--compare-until` as its virtual end when the baseline cannot finish the week.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KAI_RAY = [sys.executable, "-m", "kai_ray"]
SWEEP_UNTIL = "6h"
TEAMS = (("team-a", 1536, 2), ("team-b", 1536, 1), ("team-c", 1024, 1))
CLUSTER = """\
apiVersion: sim.kai-ray.io/v1alpha1
kind: NodePool
metadata: {{name: h100}}
spec:
  count: {nodes}
  namePrefix: h100
  capacity: {{cpu: "192", memory: 2Ti, nvidia.com/gpu: 8, pods: 110}}
  topology:
    - {{label: kai-ray.io/block, domains: {blocks}}}
    - {{label: kai-ray.io/rack, domains: {racks}}}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Topology
metadata: {{name: datacenter}}
spec:
  levels:
    - {{nodeLabel: kai-ray.io/block, alias: block}}
    - {{nodeLabel: kai-ray.io/rack, alias: rack}}
    - {{nodeLabel: kubernetes.io/hostname, alias: node}}
---
apiVersion: config.kai-ray.io/v1alpha1
kind: SchedulerConfig
metadata: {{name: default}}
spec: {{cyclePeriod: 10s}}
"""
QUEUE = """\
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Queue
metadata: {{name: {name}}}
spec: {{resources: {{gpu: {{quota: {quota}, overQuotaWeight: {weight}}}}}}}
"""


def write_cluster(folder: Path, nodes: int) -> Path:
    blocks = max(1, nodes // 128)
    racks = max(1, nodes // blocks // 8)
    text = CLUSTER.format(nodes=nodes, blocks=blocks, racks=racks)
    scale = nodes / 512
    for name, quota, weight in TEAMS:
        text += QUEUE.format(name=name, quota=int(quota * scale), weight=weight)
    path = folder / "cluster.yaml"
    path.write_text(text)
    return path


OVERLOADED_TEAMS = 8
OVERLOADED_CLUSTER = """\
apiVersion: sim.kai-ray.io/v1alpha1
kind: NodePool
metadata: {{name: h100}}
spec:
  count: {nodes}
  namePrefix: h100
  capacity: {{cpu: "192", memory: 2Ti, nvidia.com/gpu: 8, pods: 110}}
  topology:
    - {{label: kai-ray.io/rack, domains: {racks}}}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Topology
metadata: {{name: datacenter}}
spec:
  levels:
    - {{nodeLabel: kai-ray.io/rack, alias: rack}}
    - {{nodeLabel: kubernetes.io/hostname, alias: node}}
---
apiVersion: config.kai-ray.io/v1alpha1
kind: SchedulerConfig
metadata: {{name: default}}
spec: {{cyclePeriod: 10s}}
"""


def write_overloaded(folder: Path, nodes: int, jobs: int, days: float, seed: int) -> list[Path]:
    """The oversubscribed week: cluster.yaml and jobs.yaml (batch Jobs, one YAML file)."""
    import yaml

    from kai_ray.sim.job_trace import job_document

    text = OVERLOADED_CLUSTER.format(nodes=nodes, racks=max(1, nodes // 8))
    quota = nodes * 8 // OVERLOADED_TEAMS
    for team in range(OVERLOADED_TEAMS):
        weight = 1 + team % 3
        text += QUEUE.format(name=f"team-{team}", quota=quota, weight=weight)
    cluster = folder / "cluster.yaml"
    cluster.write_text(text)
    rng = random.Random(seed)
    submits = sorted(rng.uniform(0, days * 86400) for _ in range(jobs))
    documents = [
        job_document(overloaded_row(rng, submit), line, "datacenter")
        for line, submit in enumerate(submits, start=1)
    ]
    workload = folder / "jobs.yaml"
    with workload.open("w") as handle:
        yaml.dump_all(documents, handle, Dumper=yaml.CSafeDumper, sort_keys=False)
    return [cluster, workload]


def overloaded_row(rng: random.Random, submit: float) -> dict[str, str]:
    """One job of the oversubscribed week: a single pod or a gang of eight-GPU pods."""
    row = {"submit": f"{submit:.0f}", "queue": f"team-{rng.randrange(OVERLOADED_TEAMS)}"}
    row["duration"] = f"{rng.uniform(600, 8 * 3600):.0f}"
    if rng.random() < 0.6:
        row.update(pods="1", gpus_per_pod=str(rng.randint(1, 8)), topology="")
        return row
    pods = rng.randint(4, 8) if rng.random() < 0.75 else rng.randint(2, 16)
    rack = 4 <= pods <= 8 and rng.random() < 0.75
    row.update(pods=str(pods), gpus_per_pod="8", topology="rack" if rack else "")
    return row


def job_row(rng: random.Random, submit: float) -> dict[str, object]:
    """One job: a single pod (60 %) or a gang of 2-16 eight-GPU pods."""
    team = rng.choices([t[0] for t in TEAMS], weights=[3, 3, 2])[0]
    row: dict[str, object] = {"submit": f"{submit:.0f}", "queue": team, "topology": ""}
    if rng.random() < 0.6:
        gpus = rng.choice([1, 1, 2, 4, 8])
        half = rng.random() < 0.1
        row.update(pods=1, gpus_per_pod=0 if half else gpus, gpu_fraction="0.5" if half else "")
        mean = 2 * 3600
    else:
        row.update(pods=rng.randint(2, 16), gpus_per_pod=8, gpu_fraction="")
        row["topology"] = "block" if rng.random() < 1 / 3 else ""
        mean = 1.6 * 3600
    row["duration"] = f"{min(rng.expovariate(1 / mean) + 300, 24 * 3600):.0f}"
    return row


def write_trace(folder: Path, jobs: int, days: float, seed: int) -> Path:
    rng = random.Random(seed)
    horizon = days * 86400
    submits = sorted(rng.uniform(0, horizon) for _ in range(jobs))
    path = folder / "jobs.csv"
    columns = ["submit", "duration", "queue", "pods", "gpus_per_pod", "gpu_fraction", "topology"]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for submit in submits:
            writer.writerow(job_row(rng, submit))
    return path


def timed(
    command: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT
) -> tuple[float, float, str]:
    """Wall seconds, peak RSS of this child alone in MiB (`wait4`), and its stdout."""
    environment = {**os.environ, **(env or {})}
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err, env=environment)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            sys.exit(f"failed ({child.returncode}): {shlex.join(command)}\n{err.read()}")
        return elapsed, usage.ru_maxrss / 1024, out.read()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo") as handle:
        names = [line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")]
    cpu = names[0] if names else cpu
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB, Python {platform.python_version()}"


def main() -> None:
    args = _arguments()
    folder = Path(tempfile.mkdtemp(prefix="kai-ray-bench-"))
    lines = [f"machine: {machine()}", f"workload: {folder} (seed {args.seed})"]
    if args.workload == "overloaded":
        inputs = write_overloaded(folder, args.nodes, args.jobs, args.days, args.seed)
        lines += overloaded(folder, inputs, args)
        print("\n".join(lines), flush=True)
        return
    cluster = write_cluster(folder, args.nodes)
    trace = write_trace(folder, args.jobs, args.days, args.seed)
    command = [*KAI_RAY, "simulate", str(cluster), "--trace", str(trace), "--quiet"]
    command += ["--report", str(folder / "report.json")]
    seconds, rss, _ = timed(command)
    lines += [
        f"$ {_shown(command, folder)}",
        f"single run: {seconds:.1f} s, peak RSS {rss:.0f} MiB",
    ]
    lines += _summary(folder / "report.json")
    print("\n".join(lines), flush=True)
    if args.profile_hours:
        lines += where_the_time_goes(cluster, trace, args.profile_hours)
    if not args.skip_sweep:
        lines += sweep(folder, cluster, trace, args.sweep_variants)
    if args.write_docs:
        write_docs(lines)


def overloaded(folder: Path, inputs: list[Path], args: argparse.Namespace) -> list[str]:
    """The oversubscribed week by this code, and by the baseline's when `--compare` names it."""
    out: list[str] = []
    sides = [("new", ROOT, args.until)]
    if args.compare:
        sides.insert(0, ("baseline", Path(args.compare).resolve(), args.compare_until))
    for side, code, until in sides:
        report = folder / f"{side}.json"
        command = [*KAI_RAY, "simulate", *map(str, inputs), "--quiet", "--report", str(report)]
        command += ["--until", until] if until else []
        seconds, rss, _ = timed(command, env={"PYTHONPATH": str(code)}, cwd=code)
        out += [f"{side} ({code}): $ {_shown(command, folder)}"]
        out += [f"  {seconds:.1f} s wall, peak RSS {rss:.0f} MiB"]
        out += ["  " + line for line in _summary(report)]
        print("\n".join(out[-3:]), flush=True)
    return out


def single_run(folder: Path, cluster: Path, trace: Path) -> list[str]:
    command = [*KAI_RAY, "simulate", str(cluster), "--trace", str(trace), "--quiet"]
    command += ["--report", str(folder / "report.json")]
    seconds, rss, _ = timed(command)
    out = [f"$ {_shown(command, folder)}", f"single run: {seconds:.1f} s, peak RSS {rss:.0f} MiB"]
    out += _summary(folder / "report.json")
    print("\n".join(out), flush=True)
    return out


def sweep(folder: Path, cluster: Path, trace: Path, variants: int) -> list[str]:
    values = ",".join(f"{0.25 * i:g}" for i in range(variants))
    base = [*KAI_RAY, "simulate", str(cluster), "--trace", str(trace), "--quiet"]
    base += [
        "--until",
        SWEEP_UNTIL,
        "--sweep",
        f"SchedulerConfig.spec.timeBasedFairness.k={values}",
    ]
    base += ["--report", str(folder / "sweep" / "r.json")]
    ray_s, ray_rss, _ = timed([*base, "--progress", "never"])
    seq_s, seq_rss, _ = timed([*base, "--no-ray"])
    out = [
        f"$ {_shown(base, folder)} [--no-ray]",
        f"sweep of {variants} variants ({SWEEP_UNTIL} virtual each): Ray {ray_s:.1f} s, "
        f"sequential {seq_s:.1f} s, speed-up x{seq_s / ray_s:.2f} "
        f"(peak RSS of a child so far: Ray driver {ray_rss:.0f} MiB, sequential {seq_rss:.0f} MiB)",
    ]
    print("\n".join(out), flush=True)
    return out


def where_the_time_goes(cluster: Path, trace: Path, hours: float) -> list[str]:
    """cProfile of the first `hours` virtual hours in this process: cycle against simulator."""
    import cProfile
    import pstats

    from kai_ray.sim.engine import Simulation
    from kai_ray.sim.loader import load_documents
    from kai_ray.sim.run import read_documents

    sim = Simulation(load_documents(read_documents([cluster], [trace])), until=hours * 3600)
    profiler = cProfile.Profile()
    profiler.runcall(sim.run)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    cumulative = {f"{k[0].split('kai_ray/')[-1]}:{k[2]}": v[3] for k, v in stats.items()}
    total = cumulative["sim/engine.py:run"]
    cycle = cumulative["decisions/cycle.py:run_cycle"]
    build = cumulative["sim/snapshots.py:build"]
    out = [
        f"profile of the first {hours:g} virtual hours ({sim.cycles} cycles, cProfile): "
        f"scheduling cycle (kai_ray/decisions) {cycle / total:.0%}, snapshot build "
        f"{build / total:.0%}, rest of the simulator {(total - cycle - build) / total:.0%}"
    ]
    print("\n".join(out), flush=True)
    return out


def _summary(report: Path) -> list[str]:
    import json

    summary = json.loads(report.read_text())["summary"]
    return [
        f"simulated: {summary['jobs']} jobs "
        f"({summary.get('jobs_waiting', '?')} waiting at the end), "
        f"{summary['pods_bound']} bindings, {summary.get('evictions', 0)} evictions, "
        f"{summary['cycles']} cycles, {summary['end_s'] / 86400:.1f} virtual days, "
        f"GPU utilisation {summary['gpu_utilisation']:.1%}, "
        f"wait p50 {summary['wait_s']['p50'] or 0:.0f} s, p95 {summary['wait_s']['p95'] or 0:.0f} s"
    ]


def _shown(command: list[str], folder: Path) -> str:
    text = shlex.join(["kai-ray", *command[3:]])
    return text.replace(str(folder), "$WORK")


READING = """\
Reading the figures: the targets are 120 s and 1 GiB for the single run, and a sweep
on Ray no slower than the same variants one after another. The profile line says
where a run's time goes: the scheduling cycle (`kai_ray/decisions`: fair share,
allocate, reclaim, preempt, consolidate) is the larger part and is not the
simulator's to change; the snapshot build is the state layer's code fed from the
simulator's cache (`kai_ray/sim/snapshots.py`); the rest is the engine itself
(events, bookkeeping, invariants, samples).
"""


def write_docs(lines: list[str]) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    body = (
        "## Simulator\n\nMeasured by `.venv/bin/python bench/bench_simulator.py --write-docs`"
        f"\n({time.strftime('%Y-%m-%d')}).\n\n```\n" + "\n".join(lines) + "\n```\n\n" + READING
    )
    pattern = re.compile(r"## Simulator\n.*?(?=\n## |\Z)", re.S)
    text = pattern.sub(body, text) if pattern.search(text) else text.rstrip() + "\n\n" + body
    path.write_text(text)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sweep-variants", type=int, default=8)
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-single", action="store_true", help="skip the full run")
    parser.add_argument("--profile-hours", type=float, default=6.0, help="0: no profile")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--workload", choices=("light", "overloaded"), default="light")
    parser.add_argument("--until", default="", help="overloaded: the new code's virtual end")
    parser.add_argument("--compare", default="", help="overloaded: a worktree of the baseline")
    parser.add_argument("--compare-until", default="", help="overloaded: the baseline's end")
    return parser.parse_args()


if __name__ == "__main__":
    main()
