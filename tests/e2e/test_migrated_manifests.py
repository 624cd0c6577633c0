"""What `kai-ray migrate` writes is what a real API server accepts.

The KAI cluster of tests/fixtures/kai (Queues with KAI's units, a Topology, a
PodGroup, workloads), converted, goes through `kubectl apply --dry-run=server`:
the API server checks every kai-ray object against the CRDs' schemas and CEL
rules (quantities, quota not above limit, unique levels) and the workloads
against their own, without keeping anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kai_ray.tools.cli import main

from .sandbox import Sandbox

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kai"


def test_migrated_kai_manifests_pass_the_api_servers_checks(
    sandbox: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "kai-ray.yaml"
    assert main(["migrate", str(FIXTURES), "-o", str(output)]) == 0
    capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(output.read_text()) if d]
    # The SchedulerConfig is a file the operator reads, not an API object.
    objects = [d for d in docs if d["kind"] != "SchedulerConfig"]
    for obj in objects:
        if obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = sandbox.namespace
    applied = sandbox.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects)
    )
    assert applied.returncode == 0, applied.stderr
    created = [line for line in applied.stdout.splitlines() if "(server dry run)" in line]
    assert len(created) == len(objects) == 8, applied.stdout
