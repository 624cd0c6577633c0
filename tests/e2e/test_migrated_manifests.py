"""What `kai-ray migrate` writes is what a real API server and kai-ray's webhooks accept.

The KAI cluster of tests/fixtures/kai (Queues with KAI's units, a Topology, a
PodGroup, workloads), converted: its Queues are applied, and the rest goes
through `kubectl apply --dry-run=server`, so the API server checks every object
against the CRDs' schemas and CEL rules (quantities, quota not above limit,
unique levels) and calls the operator's validating webhooks (the queue exists,
is a leaf, children's quotas fit the parent's) without keeping anything.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kai_ray.tools.cli import main

from .operator_process import OperatorProcess
from .sandbox import Sandbox

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kai"


def test_migrated_kai_manifests_pass_the_api_servers_checks(
    operator: OperatorProcess, sandbox: Sandbox, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "kai-ray.yaml"
    assert main(["migrate", str(FIXTURES), "-o", str(output)]) == 0
    capsys.readouterr()
    docs = [d for d in yaml.safe_load_all(output.read_text()) if d]
    # The SchedulerConfig is a file the operator reads, not an API object.
    objects = [d for d in docs if d["kind"] != "SchedulerConfig"]
    queues = [d for d in objects if d["kind"] == "Queue"]
    assert len(queues) == 3
    sandbox.kubectl_apply(*queues)  # the workloads' queues must exist for the webhook
    rest = [d for d in objects if d["kind"] != "Queue"]
    for obj in rest:
        if obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = sandbox.namespace
    applied = sandbox.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(rest)
    )
    assert applied.returncode == 0, applied.stderr
    created = [line for line in applied.stdout.splitlines() if "(server dry run)" in line]
    assert len(created) == len(rest) == 5, applied.stdout
    # The webhooks were asked: the same Job sent to a queue that does not exist is refused.
    (job,) = [d for d in rest if d["kind"] == "Job"]
    job["metadata"]["labels"]["kai-ray.io/queue"] = "no-such-queue"
    refused = sandbox.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(job)
    )
    assert refused.returncode != 0 and "no-such-queue" in refused.stderr, refused
