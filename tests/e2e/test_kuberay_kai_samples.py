"""KubeRay's own KAI samples on a real control plane, after `kai-ray migrate`.

Both samples (tests/kuberay_samples.py) go through `kai-ray migrate` whole: their
KAI Queues become kai-ray's, and their RayClusters get kai-ray's queue label, the
scheduler name in their pod templates (KubeRay here runs without
`--batch-scheduler`, which would name `kai-scheduler` on every Ray pod of the
cluster) and `kai-ray.io/gpu-fraction`. Applied as they come out, with the real
KubeRay operator, the session's kai-ray admits each RayCluster whole and binds
its pods; the GPU-sharing sample's two halves share one device.

Unchanged RayClusters (no scheduler name in their templates) are left to
kube-scheduler by KubeRay without `--batch-scheduler`; they run unchanged in the
simulator (tests/sim/test_kuberay_kai_samples.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kai_ray.tools.cli import main
from kai_ray.values.names import GPU_DEVICES_ANNOTATION
from tests.kuberay_samples import BASIC, GPU_SHARING, sample_path

from .operator_process import OperatorProcess
from .polling import eventually
from .sandbox import Sandbox

pytestmark = pytest.mark.e2e


def migrated(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    output = tmp_path / f"migrated-{name}"
    assert main(["migrate", str(sample_path(name)), "-o", str(output)]) == 1  # the -1 quotas
    capsys.readouterr()
    return [d for d in yaml.safe_load_all(output.read_text()) if d]


def running_group(sandbox: Sandbox, name: str) -> dict[str, Any] | None:
    group = sandbox.get("PodGroup", name)
    return group if group and (group.get("status") or {}).get("phase") == "Running" else None


def test_both_samples_run_on_kai_ray_after_migration(
    operator: OperatorProcess,
    sandbox: Sandbox,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sandbox.make_nodes(1, gpus_per_node=1)
    basic, sharing = migrated(BASIC, tmp_path, capsys), migrated(GPU_SHARING, tmp_path, capsys)
    queues = [d for d in basic if d["kind"] == "Queue"]
    assert [q["metadata"]["name"] for q in queues] == ["department-1", "team-a"]
    sandbox.kubectl_apply(*queues)
    for docs in (basic, sharing):
        (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
        sandbox.create(cluster)

    pods = sandbox.wait_pods(None, 6, bound=True, timeout=90)
    for name in ("raycluster-raycluster-sample", "raycluster-raycluster-half-gpu"):
        group = eventually(lambda n=name: running_group(sandbox, n), 60, f"PodGroup {name} Running")
        assert group["spec"]["queue"] == "team-a"
    halves = [p for p in pods if "-shared-gpu-" in p.metadata.name]
    assert len(halves) == 2
    devices = {
        (p.spec.node_name, (p.metadata.annotations or {}).get(GPU_DEVICES_ANNOTATION))
        for p in halves
    }
    assert len(devices) == 1 and None not in next(iter(devices)), devices
