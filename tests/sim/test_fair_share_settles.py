"""Acceptance: an oversubscribed three-level queue tree settles on its fair share.

The tree, the demand and the fair shares are the worked example of
docs/fairness.md, where every number is computed by hand. Every workload arrives
at once (reclaim is switched off here, so latecomers could not take GPUs back) and
runs forever; the cluster has 64 GPUs and the leaves ask for 116.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from tests.builders import make_job, make_queue
from tests.sim.inputs import gpu_pool_and_config

GPU = "nvidia.com/gpu"

#: name -> (parent, quota, limit, overQuotaWeight, GPUs wanted by the leaf)
TREE: dict[str, tuple[str | None, int, int | None, float, int]] = {
    "research": (None, 24, None, 2, 0),
    "product": (None, 24, 30, 1, 0),
    "vision": ("research", 16, None, 1, 0),
    "nlp": ("research", 8, None, 1, 0),
    "ads": ("product", 16, None, 1, 0),
    "search": ("product", 8, None, 1, 0),
    "vision-train": ("vision", 12, None, 1, 30),
    "vision-eval": ("vision", 4, None, 1, 4),
    "nlp-a": ("nlp", 4, None, 1, 20),
    "nlp-b": ("nlp", 4, None, 3, 20),
    "ads-rank": ("ads", 16, None, 1, 40),
    "search-embed": ("search", 8, None, 1, 2),
}

#: docs/fairness.md, "A three-level example", computed by hand.
FAIR_SHARE = {
    "research": 35,
    "product": 29,
    "vision": 22,
    "nlp": 13,
    "ads": 27,
    "search": 2,
    "vision-train": 18,
    "vision-eval": 4,
    "nlp-a": 5,
    "nlp-b": 8,
    "ads-rank": 27,
    "search-embed": 2,
}


def _cluster() -> list[dict[str, Any]]:
    pool, config = gpu_pool_and_config()
    return [pool, config]


def _queue(name: str) -> dict[str, Any]:
    """Created in the order listed, so that of two siblings the older comes first."""
    parent, quota, limit, weight, _ = TREE[name]
    queue = make_queue(name).created(list(TREE).index(name)).gpu(quota, limit, weight)
    if parent is not None:
        queue.parent(parent)
    return queue.build()


def _job(queue: str, index: int, pods: int) -> dict[str, Any]:
    return make_job(f"{queue}-{index}", "ml").queue(queue).gpus(1).parallelism(pods).build()


def single_gpu_jobs(queue: str, wanted: int) -> list[dict[str, Any]]:
    return [_job(queue, i, 1) for i in range(wanted)]


def one_elastic_job(queue: str, wanted: int) -> list[dict[str, Any]]:
    """One Job of `wanted` pods, minimum 1: the rest are elastic extras."""
    return [_job(queue, 0, wanted)]


def _write_inputs(folder: Path, jobs_of: Any) -> None:
    folder.mkdir()
    queues = [_queue(name) for name in TREE]
    workloads = [job for name, entry in TREE.items() if entry[4] for job in jobs_of(name, entry[4])]
    for file, docs in (("cluster", _cluster()), ("queues", queues), ("workloads", workloads)):
        (folder / f"{file}.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))


def _settled(tmp_path: Path, jobs_of: Any) -> dict[str, dict[str, Any]]:
    _write_inputs(tmp_path / "inputs", jobs_of)
    report = tmp_path / "report.json"
    assert main(["simulate", str(tmp_path / "inputs"), "--report", str(report), "--quiet"]) == 0
    queues = json.loads(report.read_text())["queues"]
    return {queue["name"]: queue["samples"][-1] for queue in queues}


@pytest.mark.parametrize(
    "jobs_of",
    [
        pytest.param(single_gpu_jobs, id="116 single-GPU jobs settle on the hand-computed shares"),
        pytest.param(
            one_elastic_job, id="one elastic job per leaf settles on the hand-computed shares"
        ),
    ],
)
def test_oversubscribed_tree_settles_on_its_fair_share(tmp_path: Path, jobs_of: Any) -> None:
    last = _settled(tmp_path, jobs_of)
    for name, share in FAIR_SHARE.items():
        assert last[name]["fair_share"][GPU] == pytest.approx(share), name
        assert abs(last[name]["allocated"][GPU] - share) <= 1, (name, last[name]["allocated"])
    assert sum(last[name]["allocated"][GPU] for name in ("research", "product")) == 64
