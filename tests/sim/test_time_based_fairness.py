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
"""

from __future__ import annotations

import itertools
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


def _jobs(queue: str, count: int, gpus: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for i in range(count):
        name = f"{queue}-{i}"
        objects.append(
            {
                "apiVersion": "scheduling.kai-ray.io/v1alpha1",
                "kind": "PodGroup",
                # Renewed for issue 13: evicted pods go at once here, as they did when
                # these figures were measured against KAI's model of its samples (the
                # simulator's default grace of 30 s would delay every handover by 30 s).
                "metadata": {"name": name, "annotations": {SIM_TERMINATION_GRACE: "0s"}},
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


@pytest.fixture(scope="module")
def oscillating(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    objects = [
        _config(1, "128s", "256s"),
        _pool(1, 16),
        _queue("test-department"),
        _queue("test-queue1", "test-department"),
        _queue("test-queue2", "test-department"),
        *_jobs("test-queue1", 2, 16),
        *_jobs("test-queue2", 2, 16),
    ]
    return _simulate(tmp_path_factory.mktemp("oscillating"), objects, "1024s")


def test_the_node_changes_hands_as_old_usage_leaves_the_window(oscillating: dict[str, Any]) -> None:
    switches = _switches(_series(oscillating, "test-queue1", "allocated", 1024))
    assert switches == [1, 30, 270, 510, 750, 990]
    # After the first two, the switches are a window apart, as in KAI's run.
    ours = [b - a for a, b in itertools.pairwise(switches[1:])]
    kai = [b - a for a, b in itertools.pairwise(KAI_SWITCHES[1:])]
    assert all(abs(o - k) <= 8 for o, k in zip(ours[: len(kai)], kai, strict=True))


def test_the_fair_shares_are_those_of_kais_sample_model(oscillating: dict[str, Any]) -> None:
    shares = _series(oscillating, "test-queue1", "fair_share", 1024)
    model, _ = kai_sample_model(lag=1)
    differences = [abs(a - b) for a, b in zip(shares, model, strict=True)]
    assert sum(differences) / len(differences) <= 0.25


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
