"""`kai-ray explain` and `kai-ray snapshot --kubeconfig` against the live e2e cluster.

- explain, run as a user runs it, on a Job that waits for a rack no rack has room
  for and on a pod of a gang that runs: what it prints is checked against the
  PodGroup and Queue statuses the operator wrote and the nodes' room;
- snapshot in the middle of a flow (team-a's gang bound, the operator stopped,
  team-b's and team-a's next gangs created): the simulator's first cycle on the
  snapshot binds exactly the pods, on exactly the nodes, that the operator binds
  once it is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import make_pod_group

from .nodes import RACK_LABEL
from .operator_process import CONFIG, OperatorProcess
from .polling import eventually, holds
from .sandbox import Sandbox, bound
from .workloads import QueueTree, in_one, job, pod, topology

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def teams(sandbox: Sandbox) -> QueueTree:
    return QueueTree(sandbox.name("dept"), sandbox.name("team-a"), sandbox.name("team-b"))


def kai_ray(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    """The command line as a user runs it, on a wide terminal (no wrapped lines)."""
    env = {**os.environ, "COLUMNS": "400", "KUBECONFIG": str(sandbox.plane.kubeconfig)}
    return subprocess.run(
        [sys.executable, "-m", "kai_ray", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )


def status(sandbox: Sandbox, kind: str, name: str) -> dict[str, object]:
    return dict((sandbox.get(kind, name) or {}).get("status") or {})


def row(printed: str, first: str) -> list[str]:
    """The cells of the printed table row whose first cell is `first`."""
    for line in printed.splitlines():
        cells = [c.strip() for c in line.split("│") if c.strip()]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{printed}")


def test_explain_prints_what_the_cluster_says_of_a_waiting_job_and_a_running_gang(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree
) -> None:
    sandbox.kubectl_apply(*teams.manifests(dept_quota=16, dept_limit=None))
    sandbox.make_nodes(2, gpus_per_node=4, nodes_per_rack=1)
    dc = sandbox.name("dc")
    sandbox.kubectl_apply(topology(dc))
    selector = sandbox.node_selector
    sandbox.create(make_pod_group("pair").queue(teams.team_a).min_member(2).build())
    for name in ("pair-0", "pair-1"):
        sandbox.create(pod(name, None, selector, gpus=1, group="pair"))
    wide = job("wide", teams.team_b, selector, parallelism=2, gpus=4, min_member=2)
    wide["metadata"]["annotations"].update(in_one("rack", dc))
    sandbox.create(wide)
    eventually(
        lambda: all(sandbox.pod(n).spec.node_name for n in ("pair-0", "pair-1")), 30, "the pair"
    )
    eventually(lambda: status(sandbox, "PodGroup", "job-wide").get("reason"), 30, "a reason")
    eventually(
        lambda: (
            status(sandbox, "Queue", teams.team_b).get("pendingWorkloads") == 1
            and (status(sandbox, "Queue", teams.team_a).get("allocated") or {}).get("gpu") == 2
        ),
        15,
        "queue statuses: team-a holds 2 GPUs, team-b has 1 gang pending",
    )

    waiting = kai_ray(sandbox, "explain", "job/wide", "-n", sandbox.namespace)
    assert waiting.returncode == 0, waiting.stderr
    out = waiting.stdout
    group = status(sandbox, "PodGroup", "job-wide")
    assert f"Job {sandbox.namespace}/wide  →  PodGroup {sandbox.namespace}/job-wide" in out
    assert f"Phase Pending · queue {teams.team_b} < {teams.department}" in out
    assert f"Last cycle: {group['reason']}" in out
    assert "inside one rack" in str(group["reason"])
    assert "Gang: minMember 2, bound 0, pending 2, missing from the minimum 2" in out
    # the pair holds 2 GPUs of one node: only the other node has room for a 4-GPU pod
    assert "Missing members that fit one by one (no gang, no topology): 1 of 2" in out
    (pair_node,) = {sandbox.pod(n).spec.node_name for n in ("pair-0", "pair-1")}
    (free_node,) = set(sandbox.nodes) - {pair_node}
    free_rack = sandbox.core.read_node(free_node).metadata.labels[RACK_LABEL]
    domain, room, needs, size = row(out, "rack (required)")[1:]
    assert (domain.rsplit("/", 1)[-1], room, needs, size) == (free_rack, "1", "2", "4 GPUs")
    team_b = status(sandbox, "Queue", teams.team_b)
    written = [str(team_b[key]["gpu"]) for key in ("fairShare", "allocated", "requested")]  # type: ignore[index]
    assert written[2] == "8"
    assert row(out, teams.team_b)[1:] == ["4", "none", "1", *written, "1"]
    assert "Unschedulable" in out, "the PodGroup's Event"
    # each waiting pod of the gang is told the reason too (`kubectl describe pod`)
    wide_pods = [p.metadata.name for p in sandbox.pods("job-name=wide")]
    assert len(wide_pods) == 2, wide_pods
    for name in wide_pods:
        said = eventually(
            lambda n=name: [e.message for e in sandbox.events(name=n, reason="Unschedulable")],
            15,
            f"an Unschedulable Event on pod {name}",
        )
        assert any(m and m.startswith("PodGroup job-wide: ") and "rack" in m for m in said), said
        described = sandbox.plane.kubectl("describe", "pod", "-n", sandbox.namespace, name).stdout
        assert "PodGroup job-wide: " in described.partition("\nEvents:")[2], described

    running = kai_ray(sandbox, "explain", "pod/pair-0", "-n", sandbox.namespace)
    assert running.returncode == 0, running.stderr
    out = running.stdout
    pair = status(sandbox, "PodGroup", "pair")
    assert pair["phase"] == "Running" and f"Phase Running · queue {teams.team_a}" in out
    assert "Gang: minMember 2, bound 2, pending 0, missing from the minimum 0" in out
    assert row(out, teams.team_a)[5] == "2", "team-a's allocated GPUs as its status says"

    ghost = kai_ray(sandbox, "explain", "rayjob/ghost", "-n", sandbox.namespace)
    assert ghost.returncode == 1
    assert ghost.stderr == (
        f"kai-ray: explain: no RayJob named 'ghost' in namespace '{sandbox.namespace}'\n"
    )


def test_the_simulated_next_cycle_of_a_snapshot_binds_what_the_operator_then_binds(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree, tmp_path: Path
) -> None:
    sandbox.kubectl_apply(*teams.manifests(dept_quota=8, dept_limit=8, team_quota=4))
    sandbox.make_nodes(2, gpus_per_node=4)
    selector = sandbox.node_selector

    def gang(name: str, queue: str) -> list[str]:
        sandbox.create(make_pod_group(name).queue(queue).min_member(2).build())
        pods = [f"{name}-{i}" for i in range(2)]
        for member in pods:
            sandbox.create(pod(member, None, selector, gpus=2, group=name))
        return pods

    gang("a1", teams.team_a)
    sandbox.wait_pods(None, 2, bound=True)
    operator.stop()
    waiting = gang("b1", teams.team_b) + gang("a2", teams.team_a)

    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    taken = kai_ray(
        sandbox, "snapshot", "--kubeconfig", "--config", str(config), "-o", str(tmp_path / "s.yaml")
    )
    assert taken.returncode == 0, taken.stderr
    report = tmp_path / "report.json"
    simulated = kai_ray(
        sandbox, "simulate", str(tmp_path / "s.yaml"), "--report", str(report), "--quiet"
    )
    assert simulated.returncode == 0, simulated.stderr
    pods = [
        p for p in json.loads(report.read_text())["pods"] if p["namespace"] == sandbox.namespace
    ]
    first_cycle = min(p["bound_s"] for p in pods)
    expected = {p["name"]: p["node"] for p in pods if p["bound_s"] == first_cycle}
    assert set(expected) == {"b1-0", "b1-1"}, "team-b, below its fair share, goes first"

    operator.start()
    operator.wait_ready()
    names = ",".join(waiting)

    def binds() -> dict[str, str] | None:
        now = {
            p.metadata.name: p.spec.node_name
            for p in bound(sandbox.pods())
            if p.metadata.name in waiting
        }
        return now if len(now) >= len(expected) else None

    assert eventually(binds, 30, f"the operator to bind some of {names}") == expected
    holds(lambda: binds() == expected, 2.5, "the operator binds nothing else")
