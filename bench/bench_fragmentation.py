"""Fragmentation benchmark: GPU capacity allocated as pods arrive, per placement policy.

Run: `.venv/bin/python -m bench.bench_fragmentation [--seeds 10] [--jobs 2] [--out DIR]`.

The experiment of FGD ("Beware of Fragmentation", USENIX ATC 2023) on a
synthetic cluster of our own with the shape of Alibaba's cluster-trace-gpu-v2023:
pods are drawn at random and arrive one at a time, never leaving, until their
GPU requests reach 130 % of the cluster's GPU capacity; a pod that fits nowhere
is dropped. The figure is the share of GPU capacity allocated (fractions
included). Every policy sees the same pods in the same order for a seed:
- `random`: a node drawn among those that fit;
- `best-fit`: the node with the least left after the pod, summed over CPU,
  memory and GPUs as shares of the node;
- `binpack`: kai-ray's packing (`placementStrategy: binpack`, `fit.choose_node`);
- `fragmentation`: kai-ray's fragmentation-aware score
  (`placementStrategy: fragmentation`), learning the mix from the arrivals as
  the scheduler does from its snapshots: the pods arrive `CYCLE` at a time and
  each cycle's arrivals join the mix (one second apart; half-life `--mix`, default one hour)
  before the first of them is placed.
Devices: `random` and `best-fit` put a share on the fullest device it fits
(kai-ray's rule); the kai-ray policies choose as they do in the scheduler.

The cluster (`NODE_SHAPES`) is 1,213 GPU nodes, 6,212 GPUs of seven models,
tabulated from the trace's node list. The pods are drawn from our own tables
(`*_SHAPES`, `FRACTIONS`, `MODEL_CONSTRAINTS`), shaped on the trace's default
pod list: the share of CPU-only, fractional, whole and multi-GPU pods, their
CPU and memory, the fractions asked for, the GPU models named. Variants:
`default`; `sharing` (every GPU pod asks for a share); `multi-gpu` (multi-GPU
pods ask for about half of the GPUs); `constrained` (a third of the GPU pods
bound to one or more GPU models by node affinity). Not a test: it prints.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement.filters import static_nodes
from kai_ray.decisions.placement.fit import choose_devices, choose_node, room_on
from kai_ray.decisions.placement.mix import mix_of
from kai_ray.decisions.placement.shapes import PodShape, shape_of
from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.pod_states import PodState, read_pod
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.config import FragmentationScoring, SchedulerConfigSpec
from kai_ray.values.resources import EPSILON, GPU, GPU_PRODUCT_LABEL
from tests.builders import make_node, make_pod

#: (nodes, CPUs, memory GiB, GPUs, model).
NODE_SHAPES = (
    (549, 96, 384, 8, "G2"),
    (387, 104, 512, 2, "T4"),
    (107, 16, 120, 2, "P100"),
    (39, 128, 768, 8, "G3"),
    (28, 32, 128, 4, "V100M16"),
    (22, 64, 256, 2, "P100"),
    (21, 96, 768, 8, "V100M32"),
    (19, 8, 32, 1, "V100M16"),
    (17, 96, 384, 4, "T4"),
    (9, 48, 368, 4, "V100M32"),
    (7, 64, 256, 8, "V100M16"),
    (3, 8, 60, 1, "P100"),
    (2, 8, 60, 2, "P100"),
    (2, 128, 1024, 1, "A10"),
    (1, 82, 336, 8, "V100M16"),
)
#: (weight, CPUs, memory GiB) of pods without GPUs.
CPU_SHAPES = ((34, 12, 56), (26, 32, 48), (15, 8, 29), (11, 15, 50), (9, 16, 50), (5, 8, 15))
#: (weight, CPUs, memory GiB) of one-GPU pods.
WHOLE_SHAPES = (
    (36, 11, 48),
    (12, 3, 5),
    (7, 18, 63),
    (6, 6, 24),
    (6, 24, 96),
    (5, 9, 40),
    (5, 8, 32),
    (5, 4, 16),
    (4, 12, 24),
    (4, 15, 57),
    (3, 11, 76),
    (3, 16, 32),
)
#: (weight, CPUs, memory GiB) of pods asking for a share of a GPU.
SHARE_SHAPES = ((36, 3, 5), (20, 11, 46), (16, 8, 29), (6, 4, 22), (6, 4, 14), (5, 4, 10))
SHARE_SHAPES += ((5, 4, 29), (3, 6, 6), (2, 6, 12), (1, 6, 22))
#: (weight, fraction of a GPU) of shares.
FRACTIONS = (
    (35, 0.81),
    (24, 0.47),
    (11, 0.32),
    (8, 0.65),
    (4.5, 0.23),
    (4, 0.46),
    (2.5, 0.59),
    (2.5, 0.16),
    (2.5, 0.55),
    (2, 0.22),
    (1.5, 0.37),
    (1, 0.11),
    (0.5, 0.05),
)
#: (weight, GPUs, CPUs, memory GiB) of multi-GPU pods.
MULTI_SHAPES = ((29, 8, 88, 320), (28, 8, 64, 256), (21, 4, 32, 128), (14, 2, 16, 64))
MULTI_SHAPES += ((5, 4, 60, 312), (3, 2, 6, 64))
#: (weight, GPU models) a constrained pod may run on.
MODEL_CONSTRAINTS = (
    (54, ("T4",)),
    (14, ("G2",)),
    (12, ("P100",)),
    (6, ("V100M16", "V100M32")),
    (4, ("P100", "V100M16", "V100M32")),
    (4, ("G3",)),
    (3, ("G2", "P100", "T4", "V100M16", "V100M32")),
    (3, ("A10", "G2", "T4", "V100M16", "V100M32")),
)
#: Per variant: (CPU-only, share, one GPU, multi-GPU) pod weights, share of GPU pods constrained.
VARIANTS: dict[str, tuple[tuple[float, float, float, float], float]] = {
    "default": ((13.3, 37.8, 48.0, 0.9), 0.0),
    "sharing": ((13.3, 86.7, 0.0, 0.0), 0.0),
    "multi-gpu": ((12.0, 34.0, 43.0, 11.0), 0.0),
    "constrained": ((13.3, 37.8, 48.0, 0.9), 1 / 3),
}
POLICIES = ("random", "best-fit", "binpack", "fragmentation")
TARGET_LOAD = 1.3
#: Pods that arrive per scheduling cycle: the scheduler's mix is its snapshot's, so the
#: fragmentation policy sees a cycle's arrivals (pending) when it places the first of them.
CYCLE = 20
#: Points of the curve: arrived load in percent of the GPU capacity.
CURVE = np.arange(5, 131, 5)


@dataclass(frozen=True)
class PodClass:
    cpu: float
    memory_gib: float
    gpus: int = 0
    fraction: float = 0.0
    models: tuple[str, ...] = ()

    @property
    def gpu_request(self) -> float:
        return self.fraction or float(self.gpus)


def cluster_nodes(scale: float) -> list[dict[str, Any]]:
    nodes = []
    for count, cpus, memory, gpus, model in NODE_SHAPES:
        for _ in range(max(round(count * scale), 1)):
            node = make_node(f"node-{len(nodes):04d}").cpu(cpus).memory(f"{memory}Gi")
            nodes.append(node.gpus(gpus, product=model).resource("pods", 256).build())
    return nodes


def _pick(rng: np.random.Generator, table: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    weights = np.array([row[0] for row in table], dtype=np.float64)
    return table[int(rng.choice(len(table), p=weights / weights.sum()))][1:]


def draw_pods(variant: str, seed: int, count: int) -> list[PodClass]:
    """`count` pods of the variant, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    kinds, constrained = VARIANTS[variant]
    weights = np.array(kinds) / sum(kinds)
    pods = []
    for kind in rng.choice(4, size=count, p=weights):
        pod = _draw_kind(rng, int(kind))
        if pod.gpu_request and rng.random() < constrained:
            (models,) = _pick(rng, MODEL_CONSTRAINTS)
            pod = PodClass(pod.cpu, pod.memory_gib, pod.gpus, pod.fraction, models)
        pods.append(pod)
    return pods


def _draw_kind(rng: np.random.Generator, kind: int) -> PodClass:
    if kind == 0:
        return PodClass(*_pick(rng, CPU_SHAPES))
    if kind == 1:
        (fraction,) = _pick(rng, FRACTIONS)
        return PodClass(*_pick(rng, SHARE_SHAPES), fraction=fraction)
    if kind == 2:
        return PodClass(*_pick(rng, WHOLE_SHAPES), gpus=1)
    gpus, cpu, memory = _pick(rng, MULTI_SHAPES)
    return PodClass(cpu, memory, gpus=gpus)


def pod_state(pod: PodClass) -> PodState:
    """The pod as the scheduler reads it (one per class; placements name the arrival)."""
    builder = make_pod("p").scheduler("kai-ray").cpu(f"{pod.cpu:g}").memory(f"{pod.memory_gib}Gi")
    if pod.gpus:
        builder.gpus(pod.gpus)
    if pod.fraction:
        builder.gpu_fraction(pod.fraction)
    if pod.models:
        requirement = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(pod.models)}
        terms = [{"matchExpressions": [requirement]}]
        builder.set(
            "spec.affinity",
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            },
        )
    problems: list[Any] = []
    state = read_pod(builder.build(), problems)
    assert state is not None, problems
    return state


Chooser = Callable[[Transaction, PodShape, npt.NDArray[np.intp]], tuple[int, tuple[int, ...]]]


def kai_ray_policy(strategy: str) -> Chooser:
    config = SchedulerConfigSpec(placementStrategy=strategy)  # type: ignore[arg-type]

    def choose(tx: Transaction, shape: PodShape, nodes: npt.NDArray[np.intp]) -> Any:
        node = choose_node(tx, shape, nodes, config)
        return (node, choose_devices(tx, shape, node, config)) if node is not None else None

    return choose


def random_policy(rng: np.random.Generator) -> Chooser:
    def choose(tx: Transaction, shape: PodShape, nodes: npt.NDArray[np.intp]) -> Any:
        fit = nodes[room_on(tx, shape, nodes) > 0]
        if not fit.size:
            return None
        node = int(rng.choice(fit))
        return node, choose_devices(tx, shape, node, SchedulerConfigSpec())

    return choose


def best_fit_policy(tx: Transaction, shape: PodShape, nodes: npt.NDArray[np.intp]) -> Any:
    fit = nodes[room_on(tx, shape, nodes) > 0]
    if not fit.size:
        return None
    snapshot = tx.snapshot
    columns = [snapshot.column(name) for name in ("cpu", "memory", GPU)]
    taken = np.broadcast_to(shape.need[columns], (len(fit), 3)).copy()
    taken[:, 2] += shape.fraction[fit]
    allocatable = snapshot.allocatable[np.ix_(fit, columns)]
    left = (tx.free[np.ix_(fit, columns)] - taken) / np.where(allocatable > 0, allocatable, 1.0)
    node = int(fit[np.argmin(left.sum(axis=1))])
    return node, choose_devices(tx, shape, node, SchedulerConfigSpec())


def run_policy(
    policy: str, variant: str, seed: int, scale: float, mix: FragmentationScoring | None = None
) -> dict[str, Any]:
    """One policy on one seed's arrivals: the allocation curve and the figures at 130 %."""
    tx = Transaction(build_snapshot(ClusterObjects(nodes=cluster_nodes(scale))))
    gpu = tx.snapshot.column(GPU)
    capacity = float(tx.snapshot.allocatable[:, gpu].sum())
    pods = draw_pods(variant, seed, int(capacity * 3))
    states = {pod: pod_state(pod) for pod in set(pods)}
    choose = _chooser(policy, seed)
    settings = mix or SchedulerConfigSpec().fragmentation
    arrived = allocated = 0.0
    curve: list[float] = []
    started = time.perf_counter()
    for i, pod in enumerate(pods):
        if arrived >= TARGET_LOAD * capacity - EPSILON:
            break
        state = states[pod]
        arrived += pod.gpu_request
        if policy == "fragmentation" and i % CYCLE == 0:
            for j, arriving in enumerate(pods[i : i + CYCLE]):
                mix_of(tx, settings).mix.observe(states[arriving], float(i + j))
        allocated += pod.gpu_request * _place(tx, state, choose, f"bench/p{i}")
        while len(curve) < len(CURVE) and arrived >= CURVE[len(curve)] / 100 * capacity - EPSILON:
            curve.append(100 * allocated / capacity)
    return {
        "policy": policy,
        "variant": variant,
        "seed": seed,
        "allocated": 100 * allocated / capacity,
        "curve": curve,
        "idle_gpus": capacity - allocated,
        "idle_behind_cpu": _idle_behind_cpu(tx),
        "idle_by_model": _idle_by_model(tx),
        "pods": i,
        "seconds": time.perf_counter() - started,
    }


def _chooser(policy: str, seed: int) -> Chooser:
    if policy == "random":
        return random_policy(np.random.default_rng(seed + 1000))
    if policy == "best-fit":
        return best_fit_policy
    return kai_ray_policy(policy)


def _place(tx: Transaction, pod: PodState, choose: Chooser, key: str) -> bool:
    shape = shape_of(tx, pod)
    chosen = choose(tx, shape, static_nodes(tx, pod))
    if chosen is None:
        return False
    node, devices = chosen
    fraction = float(shape.fraction[node]) if shape.shares_gpu else 0.0
    bind = Bind(key, "bench/g", tx.snapshot.node_names[node], devices, fraction)
    tx.place(Placement(bind, node, shape.taken(node, tx.snapshot.column(GPU)), fraction))
    return True


def _idle_behind_cpu(tx: Transaction) -> float:
    """Idle GPU capacity on nodes with less than one free core."""
    free = tx.free
    starved = free[:, tx.snapshot.column("cpu")] < 1.0 - EPSILON
    return float(free[starved, tx.snapshot.column(GPU)].sum())


def _idle_by_model(tx: Transaction) -> dict[str, float]:
    idle: dict[str, float] = {}
    for node, labels in enumerate(tx.snapshot.labels):
        model = labels.get(GPU_PRODUCT_LABEL, "")
        idle[model] = idle.get(model, 0.0) + float(tx.free[node, tx.snapshot.column(GPU)])
    return idle


Task = tuple[str, int, float, tuple[str, ...], FragmentationScoring]


def run_seed(task: Task) -> list[dict[str, Any]]:
    variant, seed, scale, policies, mix = task
    return [run_policy(policy, variant, seed, scale, mix) for policy in policies]


def summarise(results: list[dict[str, Any]]) -> str:
    lines = ["| variant | " + " | ".join(POLICIES) + " |", "|---" * (len(POLICIES) + 1) + "|"]
    for variant in VARIANTS:
        cells = []
        for policy in POLICIES:
            cells.append(_cell(_of(results, variant, policy, "allocated")))
        if any(cells):
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _of(results: list[dict[str, Any]], variant: str, policy: str, figure: str) -> list[Any]:
    return [r[figure] for r in results if (r["variant"], r["policy"]) == (variant, policy)]


def _cell(values: list[float]) -> str:
    if not values:
        return ""
    array = np.array(values)
    return f"{array.mean():.1f} ± {array.std():.1f} ({array.min():.1f}-{array.max():.1f})"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if any(r["variant"] == v for r in results)]
    figure, axes = plt.subplots(1, len(variants), figsize=(4.2 * len(variants), 3.6), sharey=True)
    for axis, variant in zip(np.atleast_1d(axes), variants, strict=True):
        for policy in POLICIES:
            curves = _of(results, variant, policy, "curve")
            if curves:
                width = min(len(c) for c in curves)
                mean = np.mean([c[:width] for c in curves], axis=0)
                axis.plot(CURVE[:width], mean, label=policy)
        axis.plot([0, 130], [0, 130], color="grey", linewidth=0.5, linestyle=":")
        axis.set(title=variant, xlabel="arrived GPU requests (% of capacity)", xlim=(50, 131))
        axis.set_ylim(50, 100)
        axis.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("GPU capacity allocated (%)")
    np.atleast_1d(axes)[0].legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--scale", type=float, default=1.0, help="node counts scaled by this")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="results.json and the plot here")
    parser.add_argument(
        "--mix",
        default="{}",
        help='SchedulerConfig fragmentation settings, e.g. {"halfLife": "0s"}',
    )
    parser.add_argument(
        "--report", type=Path, default=None, help="only print and plot a runs.jsonl written before"
    )
    args = parser.parse_args()
    policies = tuple(args.policies.split(","))
    mix = FragmentationScoring.model_validate(json.loads(args.mix))
    if args.report:
        lines = args.report.read_text().splitlines()
        report([json.loads(line) for line in lines], policies, args.report.parent)
        return
    tasks = [
        (variant, seed, args.scale, policies, mix)
        for seed in range(args.first_seed, args.first_seed + args.seeds)
        for variant in args.variants.split(",")
    ]
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, jobs {args.jobs}")
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for batch in pool.imap_unordered(run_seed, tasks):
            results += batch
            _keep(args.out, batch)
    print(f"{len(tasks)} runs in {time.perf_counter() - started:.0f} s")
    report(results, policies, args.out)


def report(results: list[dict[str, Any]], policies: Sequence[str], out: Path | None) -> None:
    seeds = sorted({r["seed"] for r in results})
    print(f"GPU capacity allocated at 130 % arrived, seeds {seeds} (mean ± std, min-max):")
    print(summarise(results))
    for policy in policies:
        timing = [r["seconds"] / max(r["pods"], 1) * 1e3 for r in results if r["policy"] == policy]
        idle = [r["idle_gpus"] for r in results if r["policy"] == policy]
        behind = [r["idle_behind_cpu"] for r in results if r["policy"] == policy]
        print(
            f"{policy}: {np.mean(timing):.2f} ms per pod; idle GPUs at 130 % {np.mean(idle):.0f}, "
            f"of which on nodes with < 1 free core {np.mean(behind):.0f}"
        )
    if out:
        (out / "results.json").write_text(json.dumps(results, indent=1))
        plot(results, out / "fragmentation.png")


def _keep(out: Path | None, batch: list[dict[str, Any]]) -> None:
    """Each finished run as a line of `runs.jsonl`, so a long run's results survive it."""
    if out is not None:
        with (out / "runs.jsonl").open("a") as runs:
            runs.writelines(json.dumps(r) + "\n" for r in batch)


if __name__ == "__main__":
    main()
