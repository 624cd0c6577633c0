"""KubeRay's own KAI samples run unchanged on kai-ray once their Queues are migrated.

The samples (`ray-cluster.kai-scheduler.yaml` and `ray-cluster.kai-gpu-sharing.yaml`)
are read at test time from the KubeRay module the e2e control plane builds
(tests/kuberay_samples.py), never copied here. Their KAI Queues go through
`kai-ray migrate`; their RayClusters, with KAI's `kai.scheduler/queue` label and
`gpu-fraction` annotation, go to the simulator as they are.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from tests.kuberay_samples import BASIC, GPU_SHARING, sample_documents

#: The one change `migrate` reports on these Queues: KAI's quota -1 with limit -1.
UNLIMITED_QUOTA = "spec.resources.{gpu,cpu,memory}.quota: -1 with limit -1"


def split_sample(name: str, folder: Path) -> tuple[Path, dict[str, Any]]:
    """The sample's Queues as a file of their own, and its RayCluster as written."""
    docs = sample_documents(name)
    queues = [d for d in docs if d["kind"] == "Queue"]
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    assert {q["apiVersion"] for q in queues} == {"scheduling.run.ai/v2"}
    path = folder / "kai-queues.yaml"
    path.write_text(yaml.safe_dump_all(queues))
    return path, cluster


def gpu_nodes(count: int) -> dict[str, Any]:
    capacity = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 1, "pods": 110}
    return {
        "apiVersion": "sim.kai-ray.io/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": "gpu"},
        "spec": {"count": count, "namePrefix": "gpu", "capacity": capacity},
    }


def migrate_and_simulate(
    sample: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`kai-ray migrate` of the sample's Queues, then the simulator on them, two GPU
    nodes and the sample's RayCluster unchanged. Returns the report and the RayCluster."""
    queues, cluster = split_sample(sample, tmp_path)
    migrated = tmp_path / "queues.yaml"
    assert main(["migrate", str(queues), "-o", str(migrated)]) == 1
    reported = [
        line for line in capsys.readouterr().err.splitlines() if "changes behaviour" in line
    ]
    assert [line.split(": ", 4)[-1].split(" (")[0] for line in reported] == [UNLIMITED_QUOTA] * 2
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(gpu_nodes(2)))
    (tmp_path / "raycluster.yaml").write_text(yaml.safe_dump(cluster))
    report = tmp_path / "report.json"
    inputs = [tmp_path / "cluster.yaml", migrated, tmp_path / "raycluster.yaml"]
    status = main(["simulate", *map(str, inputs), "--report", str(report), "--quiet"])
    assert status == 0
    return json.loads(report.read_text()), cluster


def test_basic_sample_runs_whole_in_its_team_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, cluster = migrate_and_simulate(BASIC, tmp_path, capsys)
    assert cluster["metadata"]["labels"] == {"kai.scheduler/queue": "team-a"}
    (job,) = report["jobs"]
    assert (job["kind"], job["queue"], job["min_member"]) == ("RayCluster", "team-a", 3)
    assert job["started_s"] == 0.0
    assert len(report["pods"]) == 3
    assert all(p["node"] and p["bound_s"] == 0.0 for p in report["pods"])


def test_gpu_sharing_sample_puts_both_halves_on_one_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, cluster = migrate_and_simulate(GPU_SHARING, tmp_path, capsys)
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert group["template"]["metadata"]["annotations"] == {"gpu-fraction": "0.5"}
    (job,) = report["jobs"]
    assert (job["queue"], job["min_member"], job["started_s"]) == ("team-a", 3, 0.0)
    workers = [p for p in report["pods"] if "-shared-gpu-" in p["name"]]
    assert len(workers) == 2
    assert [w["requests"]["nvidia.com/gpu"] for w in workers] == [0.5, 0.5]
    placed = {(w["node"], tuple(w["gpu_devices"])) for w in workers}
    assert len(placed) == 1, f"the two halves share one device (binpack): {placed}"
    assert report["summary"]["gpu_utilisation"] == pytest.approx(0.5)
