"""Upgrading a running kai-ray from 0.1.0 to this checkout (docs/lts.md).

0.1.0's CRDs and SchedulerConfig (kept in tests/e2e/upgrade/v0.1.0) are applied
and 0.1.0's operator (its sources from `git archive` of the 0.1.0 cut) schedules a
queue tree's workloads: a gang Job, a RayCluster through KubeRay, a bare pod. Then
the operator is stopped, this checkout's CRDs applied and its operator started, as
`helm upgrade` does. Nothing that ran is evicted, deleted or bound again, every
pod stays on its node, every Queue and PodGroup stays valid and in its phase, and a
workload submitted after the upgrade is scheduled.

0.2.0 deprecates nothing, so no deprecated field is there to be warned about yet;
the first deprecation adds that check here (docs/lts.md).

The session's operator is stopped for the test; the `operator` fixture starts it
again for the next one.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import make_pod_group

from .conftest import ControlPlane
from .operator_process import LEASE_NAMESPACE, REPO, OperatorProcess, Operators, free_port
from .polling import eventually, holds
from .sandbox import Sandbox, condition
from .workloads import QueueTree, Workers, job, pod, ray_cluster

pytestmark = pytest.mark.e2e

#: The 0.1.0 cut (CHANGELOG.md).
V0_1_0 = "2955878"
RELEASE = Path(__file__).parent / "upgrade" / "v0.1.0"
#: Starts `kai-ray` from the sources named first, ahead of this checkout's.
LAUNCH = "import sys; sys.path.insert(0, sys.argv.pop(1)); from kai_ray.tools.cli import main; sys.exit(main(sys.argv[1:]))"  # noqa: E501
CYCLES_S = 5


@pytest.fixture
def v0_1_0_sources(tmp_path: Path) -> Path:
    """kai-ray 0.1.0's package, from git (never kept in the tree)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", V0_1_0, "kai_ray"], capture_output=True, check=True
    )
    folder = tmp_path / "kai-ray-0.1.0"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    started = subprocess.run(
        [sys.executable, "-c", LAUNCH, str(folder), "version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert started.stdout.strip() == "0.1.0.dev0", "the launcher runs 0.1.0, not this checkout"
    return folder


@pytest.fixture
def v0_1_0_operator(
    operators: Operators, v0_1_0_sources: Path, kai_ray_crds: ControlPlane, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """0.1.0's CRDs applied and its operator running alone (the session's stopped);
    this checkout's CRDs applied again afterwards, whatever happened."""
    operators.primary.stop()
    apply_crds(kai_ray_crds, RELEASE / "crds")
    health = free_port()
    argv = [sys.executable, "-c", LAUNCH, str(v0_1_0_sources), "operator"]
    argv += ["--config", str(RELEASE / "scheduler-config.yaml"), "--no-webhook"]
    argv += ["--metrics-port", str(free_port()), "--health-port", str(health)]
    argv += ["--lease-namespace", LEASE_NAMESPACE, "--lease-name", f"{operators.lease_name}-v010"]
    argv += ["--identity", "kai-ray-0.1.0"]
    env = {**operators.primary.env, "PYTHONUNBUFFERED": "1"}
    old = OperatorProcess("kai-ray-0.1.0", argv, env, tmp_path / "operator-0.1.0.log", health)
    old.start()
    try:
        old.wait_ready()
        yield old
    finally:
        old.stop()
        apply_crds(kai_ray_crds, REPO / "crds")


def apply_crds(plane: ControlPlane, folder: Path) -> None:
    applied = plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(folder))
    assert applied.returncode == 0, applied.stderr


def placements(sandbox: Sandbox) -> dict[str, tuple[str, str]]:
    """Each pod's uid -> (name, node), for the pods bound to a node."""
    return {
        p.metadata.uid: (p.metadata.name, p.spec.node_name)
        for p in sandbox.pods()
        if p.spec.node_name
    }


def phases(sandbox: Sandbox) -> dict[str, str | None]:
    return {
        g["metadata"]["name"]: (g.get("status") or {}).get("phase")
        for g in sandbox.list("PodGroup")
    }


def valid(obj: dict[str, Any] | None) -> bool:
    found = condition(obj, "Valid")
    return found is not None and found["status"] == "True"


def test_upgrade_from_0_1_0_keeps_running_work_where_it_is(
    v0_1_0_operator: OperatorProcess, operators: Operators, sandbox: Sandbox
) -> None:
    sandbox.make_nodes(4, gpus_per_node=4)  # 16 GPUs
    tree = QueueTree(sandbox.name("dept"), sandbox.name("team-a"), sandbox.name("team-b"))
    sandbox.kubectl_apply(*tree.manifests(dept_quota=16, dept_limit=None, team_quota=8))
    selector = sandbox.node_selector
    # Work that runs until stopped (kwok completes only Jobs' pods): 9 GPUs held.
    sandbox.create(ray_cluster("rc-a", tree.team_a, [Workers("gpu", 2, gpus=2)], selector))
    sandbox.create(ray_cluster("rc-b", tree.team_b, [Workers("gpu", 2, gpus=1)], selector))
    sandbox.create(make_pod_group("pair").queue(tree.team_b).min_member(2).build())
    for i in range(2):
        sandbox.create(pod(f"pair-{i}", tree.team_b, selector, gpus=1, group="pair"))
    sandbox.create(pod("single", tree.team_a, selector, gpus=1))
    sandbox.wait_pods(None, 3 + 3 + 2 + 1, bound=True, timeout=90)
    eventually(
        lambda: {g for g in phases(sandbox).values()} == {"Running"} and len(phases(sandbox)) == 4,
        60,
        "every PodGroup Running under 0.1.0",
    )
    eventually(
        lambda: all(p.status.phase == "Running" for p in sandbox.pods()), 30, "every pod Running"
    )
    before, groups_before = placements(sandbox), phases(sandbox)
    v0_1_0_operator.stop()

    with sandbox.pod_history() as history:
        apply_crds(sandbox.plane, REPO / "crds")
        operators.ensure_primary()
        sandbox.create(job("after", tree.team_a, selector, parallelism=1, gpus=2, min_member=1))
        eventually(
            lambda: [p for p in sandbox.pods("job-name=after") if p.spec.node_name],
            60,
            "a Job submitted after the upgrade to be bound",
        )
        holds(lambda: placements(sandbox).items() >= before.items(), CYCLES_S, "pods in place")

    after = {uid: where for uid, where in placements(sandbox).items() if uid in before}
    assert after == before, "a pod that ran under 0.1.0 moved or went"
    deleted = [p.metadata.name for kind, p in history if kind == "DELETED"]
    assert not deleted, f"pods deleted by the upgrade: {deleted}"
    assert not sandbox.events(reason="Evicted"), "the upgrade evicted something"
    scheduled = Counter(e.involved_object.name for e in sandbox.events(reason="Scheduled"))
    twice = {name: n for name, n in scheduled.items() if n > 1}
    assert not twice, f"pods bound again: {twice}"
    groups = phases(sandbox)
    assert {name: groups[name] for name in groups_before} == groups_before
    assert all(
        valid(sandbox.get("Queue", name)) for name in (tree.department, tree.team_a, tree.team_b)
    )
    # (statuses are written in the back, after binds: the Job's new PodGroup may
    # get its condition a cycle after its pod is bound)
    eventually(lambda: all(valid(g) for g in sandbox.list("PodGroup")), 30, "every PodGroup Valid")
