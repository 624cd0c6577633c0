"""A KAI cluster's manifests (`tests/fixtures/kai/`, written from KAI's documented
formats) converted by `kai-ray migrate` and run by the simulator as they come out."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kai"
NODES = {
    "apiVersion": "sim.kai-ray.io/v1alpha1",
    "kind": "NodePool",
    "metadata": {"name": "gpu"},
    "spec": {
        "count": 4,
        "namePrefix": "gpu",
        "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": 8, "pods": 110},
        "labels": {"nvidia.com/gpu.memory": "81559"},
        "topology": [{"label": "kai-ray.io/rack", "domains": 2}],
    },
}


def migrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    output = tmp_path / "kai-ray.yaml"
    assert main(["migrate", str(FIXTURES), "-o", str(output)]) == 0
    assert "0 changes of behaviour" in capsys.readouterr().err
    return output


def test_every_kai_object_has_its_kai_ray_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = list(yaml.safe_load_all(migrated(tmp_path, capsys).read_text()))
    kinds = Counter((d["apiVersion"], d["kind"]) for d in docs)
    assert kinds == {
        ("scheduling.kai-ray.io/v1alpha1", "Queue"): 3,
        ("scheduling.kai-ray.io/v1alpha1", "Topology"): 1,
        ("scheduling.kai-ray.io/v1alpha1", "PodGroup"): 1,
        ("config.kai-ray.io/v1alpha1", "SchedulerConfig"): 1,
        ("batch/v1", "Job"): 1,
        ("v1", "Pod"): 2,
    }
    config = next(d for d in docs if d["kind"] == "SchedulerConfig")["spec"]
    assert (config["cyclePeriod"], config["timeBasedFairness"]["k"]) == ("5s", 1)
    research = next(d for d in docs if d["metadata"]["name"] == "research")["spec"]
    assert research["resources"]["cpu"] == {"quota": 128, "limit": 128, "overQuotaWeight": 1}


def test_the_migrated_cluster_runs_in_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = migrated(tmp_path, capsys)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump(NODES))
    report_path = tmp_path / "report.json"
    args = ["simulate", str(nodes), str(manifests), "--report", str(report_path), "--quiet"]
    assert main([*args, "--until", "1m"]) == 0
    report: dict[str, Any] = json.loads(report_path.read_text())
    jobs = {job["name"]: job for job in report["jobs"]}
    assert jobs["job-train"]["queue"] == "team-a" and jobs["job-train"]["started_s"] == 0.0
    assert jobs["infer"]["queue"] == "team-b" and jobs["infer"]["started_s"] == 0.0
    train = [p for p in report["pods"] if p["job"] == "ml/job-train"]
    racks = {int(p["node"].split("-")[1]) // 2 for p in train}
    assert len(train) == 4 and len(racks) == 1, "the gang shares one rack (required level)"
    infer = [p for p in report["pods"] if p["job"] == "ml/infer"]
    assert [p["requests"]["nvidia.com/gpu"] for p in infer] == [pytest.approx(20000 / 81559)] * 2
