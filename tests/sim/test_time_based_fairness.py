"""Time-based fairness against KAI's behaviour, in the simulator (docs/fairness.md, section 2).

Two cases of KAI's own time-based fair-share simulator, run through `kai-ray simulate`:
- KAI's bundled oscillating example: one node of 16 GPUs, two queues under one
  department with 16-GPU jobs that never finish, k = 1, half-life 128 s, window
  256 s. Nothing is submitted or completes after the start: the simulator must keep
  deciding while the fair shares drift, and the node must change hands as old usage
  leaves the window.
- Two queues, quota 16 each, over-quota weights 3 : 1 on 64 GPUs: the steady state
  is reached within seconds, as in KAI (usage normalised by the elapsed window).
`kai_sample_model` is a small model of how KAI's simulator counts usage (one sample
a second, decayed within the window, divided by the capacity of the same samples)
and divides the node, reacting `lag` samples after a fair share changes.

An evicted pod keeps its node for its termination grace (`sim.kai-ray.io/termination-grace`)
and its queue is charged for it until it is gone: the node changes hands, and usage
with it, one cycle plus the grace after the fair share does, which is the model with
`lag = grace + 1` for every grace. KAI's harness keeps the first queue on the node for
3 samples, so the comparison with KAI's run uses a grace of 2 s.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from kai_ray.values.names import SIM_TERMINATION_GRACE

GPU = "nvidia.com/gpu"
#: Where KAI's own run of its oscillating example gives the node to the other queue
#: (samples of one second); the gaps after the first come from the 256 s window.
KAI_SWITCHES = (2, 81, 321, 568, 809)


def _queue(name: str, parent: str | None = None, **gpu: float) -> dict[str, Any]:
    spec: dict[str, Any] = {"parentQueue": parent} if parent else {}
    if gpu:
        spec["resources"] = {"gpu": gpu}
    return {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def _jobs(queue: str, count: int, gpus: int, grace: str = "0s") -> list[dict[str, Any]]:
    """`count` PodGroups of one pod of `gpus` GPUs that never finish; evicted, each pod
    takes `grace` to go (the simulator's default of 30 s would delay every hand-over)."""
    objects: list[dict[str, Any]] = []
    for i in range(count):
        name = f"{queue}-{i}"
        objects.append(
            {
                "apiVersion": "scheduling.kai-ray.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": name, "annotations": {SIM_TERMINATION_GRACE: grace}},
                "spec": {"queue": queue, "minMember": 1},
            }
        )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name}-0",
                    "labels": {"kai-ray.io/queue": queue},
                    "annotations": {"kai-ray.io/pod-group": name},
                },
                "spec": {
                    "schedulerName": "kai-ray",
                    "containers": [
                        {
                            "name": "main",
                            "image": "example/work:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "1Gi", GPU: gpus}},
                        }
                    ],
                },
            }
        )
    return objects


def _simulate(tmp_path: Path, objects: list[dict[str, Any]], until: str) -> dict[str, Any]:
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(objects))
    report = tmp_path / "report.json"
    assert (
        main(
            [
                "simulate",
                str(tmp_path / "cluster.yaml"),
                "--until",
                until,
                "--quiet",
                "--report",
                str(report),
            ]
        )
        == 0
    )
    result: dict[str, Any] = json.loads(report.read_text())
    return result


def _config(k: float, half_life: str, window: str) -> dict[str, Any]:
    return {
        "apiVersion": "config.kai-ray.io/v1alpha1",
        "kind": "SchedulerConfig",
        "metadata": {"name": "default"},
        "spec": {"timeBasedFairness": {"k": k, "halfLife": half_life, "window": window}},
    }


def _pool(count: int, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "sim.kai-ray.io/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": "gpu"},
        "spec": {
            "count": count,
            "namePrefix": "gpu",
            "capacity": {"cpu": "64", "memory": "512Gi", GPU: gpus, "pods": 110},
        },
    }


def _series(report: dict[str, Any], queue: str, field: str, seconds: int) -> list[float]:
    """The queue's `field` (GPUs) at each whole second, from the report's samples."""
    samples = next(q["samples"] for q in report["queues"] if q["name"] == queue)
    values, at = [], 0
    for second in range(seconds):
        while at + 1 < len(samples) and samples[at + 1]["t_s"] <= second:
            at += 1
        values.append(samples[at][field].get(GPU, 0.0))
    return values


def _switches(allocated: list[float]) -> list[int]:
    return [t for t in range(1, len(allocated)) if allocated[t] != allocated[t - 1]]


# ------------------------------------------------------- a model of KAI's sampling


def _divide(usage: tuple[float, float], total: int = 16) -> tuple[int, int]:
    """KAI's over-quota division of `total` between two queues of weight 1 (k = 1)."""
    weights = [max(0.0, 0.5 + (0.5 - u)) for u in usage]
    exact = [total * w / sum(weights) for w in weights]
    shares = [math.floor(x) for x in exact]
    lost = [x - s for x, s in zip(exact, shares, strict=True)]
    for _ in range(total - sum(shares)):
        best = 0 if lost[0] >= lost[1] else 1
        shares[best], lost[best] = shares[best] + 1, -1.0
    return shares[0], shares[1]


def kai_sample_model(
    lag: int, window: int = 256, half_life: float = 128, samples: int = 1024
) -> tuple[list[int], list[int]]:
    """Queue 1's fair share and GPUs at each sample; the node changes hands `lag`
    samples after the other queue's fair share reaches 16."""
    held: list[int] = []  # which queue holds the node at each sample
    holder, change_at = 0, None
    shares, allocated = [], []
    for now in range(samples):
        if change_at is not None and now >= change_at:
            holder, change_at = 1 - holder, None
        held.append(holder)
        kept = held[-window:]
        weights = [0.5 ** ((len(kept) - i) / half_life) for i in range(len(kept))]
        usage = sum(w for w, h in zip(weights, kept, strict=True) if h == 0) / sum(weights)
        share = _divide((usage, 1 - usage))
        shares.append(share[0])
        allocated.append(16 if holder == 0 else 0)
        if change_at is None and share[1 - holder] >= 16:
            change_at = now + lag
    return shares, allocated


def test_the_sample_model_with_kais_reaction_time_switches_where_kai_does() -> None:
    _, allocated = kai_sample_model(lag=3)
    for ours, kai in zip(_switches(allocated), KAI_SWITCHES, strict=True):
        assert abs(ours - kai) <= 4


# ------------------------------------------------------------------- the cases


def _oscillating(
    tmp_path: Path, grace: str, until: int, window: dict[str, str] | None = None
) -> dict[str, Any]:
    """KAI's oscillating example, each pod taking `grace` to go when evicted (and the
    usage window `window`, sliding by default)."""
    config = _config(1, "128s", "256s")
    config["spec"]["timeBasedFairness"].update(window or {})
    objects = [
        config,
        _pool(1, 16),
        _queue("test-department"),
        _queue("test-queue1", "test-department"),
        _queue("test-queue2", "test-department"),
        *_jobs("test-queue1", 2, 16, grace),
        *_jobs("test-queue2", 2, 16, grace),
    ]
    return _simulate(tmp_path, objects, f"{until}s")


@pytest.fixture(scope="module")
def oscillating(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # KAI's harness keeps the first queue on the node for 3 samples: 1 s to the
    # eviction, 2 s of grace.
    return _oscillating(tmp_path_factory.mktemp("oscillating"), "2s", 1024)


def _mean_difference(ours: list[float], model: list[int]) -> float:
    differences = [abs(a - b) for a, b in zip(ours, model, strict=True)]
    return sum(differences) / len(differences)


def test_the_node_changes_hands_where_kai_gives_it(oscillating: dict[str, Any]) -> None:
    switches = _switches(_series(oscillating, "test-queue1", "allocated", 1024))
    assert switches == [3, 80, 322, 564, 806]
    assert all(abs(o - k) <= 4 for o, k in zip(switches, KAI_SWITCHES, strict=True))


def test_the_fair_shares_are_those_of_kais_sample_model(oscillating: dict[str, Any]) -> None:
    """Issue 19's acceptance asks for a mean difference within 1.5 GPUs; 0.08 measured."""
    shares = _series(oscillating, "test-queue1", "fair_share", 1024)
    model, _ = kai_sample_model(lag=3)
    assert _mean_difference(shares, model) <= 0.1


@pytest.mark.parametrize("grace", [1, 2, 4])
def test_a_queue_is_charged_for_its_evicted_pod_until_the_pod_is_gone(
    tmp_path: Path, grace: int
) -> None:
    """While the evicted pod holds the node, its queue is charged and the waiting
    queue is not: the fair shares stay put and the node goes to the waiting queue
    when the pod is gone, whatever the grace. Before, the room was charged to the
    queue pipelined onto it while the evicted pod still held it: the shares swung
    every second of the grace and the room went to whichever queue the last swing
    favoured (with a grace of 2 or 4 s, back to the queue that had it)."""
    until = 400
    report = _oscillating(tmp_path, f"{grace}s", until)
    allocated = _series(report, "test-queue1", "allocated", until)
    model_shares, model_allocated = kai_sample_model(lag=grace + 1, samples=until)
    assert _switches(allocated)[0] == grace + 1
    assert allocated == model_allocated
    shares = _series(report, "test-queue1", "fair_share", until)
    assert _mean_difference(shares, model_shares) <= 0.15  # 0.12 measured (0.08 over 1,024 s)


@pytest.mark.parametrize(("k", "steady"), [(0, 40), (1, 43), (2, 44)], ids=["k0", "k1", "k2"])
def test_weights_three_to_one_settle_within_seconds(tmp_path: Path, k: float, steady: int) -> None:
    objects = [
        _config(k, "128s", "256s"),
        _pool(8, 8),
        _queue("dept"),
        _queue("q1", "dept", quota=16, overQuotaWeight=3),
        _queue("q2", "dept", quota=16, overQuotaWeight=1),
        *_jobs("q1", 80, 1),
        *_jobs("q2", 80, 1),
    ]
    report = _simulate(tmp_path, objects, "300s")
    allocated = _series(report, "q1", "allocated", 300)
    assert allocated[5:] == [steady] * 295


# ------------------------------------------------------------ windows that reset


def _windowed(tmp_path: Path, until: int, **window: str) -> list[int]:
    """Where queue 1's allocation changes in the oscillating example (grace 2 s) with
    the usage window `window` (KAI's `usageParams` fields)."""
    report = _oscillating(tmp_path, "2s", until, window)
    return _switches(_series(report, "test-queue1", "allocated", until))


@pytest.mark.parametrize(
    ("window", "resets"),
    [
        ({"windowType": "tumbling", "tumblingWindowStartTime": "2026-01-01T00:00:00Z"}, [256, 512]),
        ({"windowType": "tumbling", "tumblingWindowStartTime": "2026-01-01T00:01:40Z"}, [100]),
        ({"windowType": "cron", "cronString": "*/4 * * * *"}, [240, 480]),
    ],
    ids=["tumbling", "tumbling-from-100s", "cron-every-4-minutes"],
)
def test_a_window_that_resets_gives_the_node_to_the_other_queue_after_each_reset(
    tmp_path: Path, window: dict[str, str], resets: list[int]
) -> None:
    """At a reset the usage before it is forgotten: the queue that has held the node
    since has used everything in the new window and gives it up, one cycle and the
    grace later (the simulator looks again at the reset though nothing happens).
    A tumbling window whose start is ahead holds no usage until then. Before, the
    usage of the last window was kept when a reset emptied the history, and no
    cycle ran at the reset: the node never moved again."""
    switches = _windowed(tmp_path, 600, **window)
    for reset in resets:
        assert any(reset < s <= reset + 4 for s in switches), (reset, switches)
    if resets == [100]:
        assert switches[0] > 100  # nothing used before the window's start


def test_a_sliding_window_does_not_reset(tmp_path: Path) -> None:
    assert _windowed(tmp_path, 600) == [3, 80, 322, 564]
