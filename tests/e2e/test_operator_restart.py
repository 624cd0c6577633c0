"""Restart safety and leader election (issue 10) with real processes.

SIGKILL mid-flow: the operator is killed as soon as it has bound the first pod
of a burst, more pods arrive while it is down, and it is started again: every
pod ends up bound exactly once (one Scheduled event each, none deleted), no
node holds more GPUs than it has, and a pod that no longer fits stays pending.

Leader election: a second replica stands by on the same Lease while the first
schedules; the leader is SIGKILLed; the other holds the Lease within 15 s and
schedules what arrives, and no pod is bound twice.

These tests stop the session's operator; the `operator` fixture starts it
again for the next test.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from .operator_process import OperatorProcess, Operators
from .polling import eventually, holds
from .sandbox import Sandbox, bound, gpus_of
from .workloads import QueueTree, Workers, pod, ray_cluster

pytestmark = pytest.mark.e2e

TAKEOVER_S = 15
CYCLES_S = 2.5


@pytest.fixture
def team(sandbox: Sandbox) -> str:
    tree = QueueTree(sandbox.name("dept"), sandbox.name("team-a"), sandbox.name("team-b"))
    sandbox.kubectl_apply(*tree.manifests(dept_quota=64, dept_limit=None, team_quota=32))
    return tree.team_a


def assert_bound_once_and_not_overcommitted(sandbox: Sandbox, gpus_per_node: int) -> None:
    scheduled = Counter(e.involved_object.name for e in sandbox.events(reason="Scheduled"))
    twice = {name: n for name, n in scheduled.items() if n > 1}
    assert not twice, f"pods bound more than once: {twice}"
    held = sandbox.node_gpus()
    assert all(n <= gpus_per_node for n in held.values()), f"overcommitted nodes: {held}"


def test_sigkill_mid_flow_then_restart_loses_no_pod_and_binds_none_twice(
    operator: OperatorProcess, sandbox: Sandbox, team: str
) -> None:
    sandbox.make_nodes(3, gpus_per_node=4)  # 12 GPUs, exactly what is asked for below
    selector = sandbox.node_selector
    with sandbox.pod_history() as history:
        for name in ("rc-1", "rc-2"):  # head + 2 workers of 1 GPU each
            sandbox.create(ray_cluster(name, team, [Workers("gpu", 2, gpus=1)], selector))
        for i in range(6):
            sandbox.create(pod(f"single-{i}", team, selector, gpus=1))
        eventually(lambda: bound(sandbox.pods()), 30, "the first pod to be bound", interval=0.05)
        operator.kill()
        at_kill = {p.metadata.name for p in bound(sandbox.pods())}
        print(f"killed with {len(at_kill)} of {len(sandbox.pods())} pods bound")
        for i in range(6, 8):  # arrive while no scheduler runs
            sandbox.create(pod(f"single-{i}", team, selector, gpus=1))
        operator.start()
        operator.wait_ready()
        pods = sandbox.wait_pods(None, 8 + 6, bound=True, timeout=60)

    assert {p.metadata.name for p in pods} >= at_kill
    deleted = [p.metadata.name for kind, p in history if kind == "DELETED"]
    assert not deleted, f"pods lost on the way: {deleted}"
    assert sum(gpus_of(p) for p in pods) == 12
    sandbox.create(pod("one-too-many", team, selector, gpus=1))
    holds(
        lambda: not sandbox.pod("one-too-many").spec.node_name,
        CYCLES_S,
        "a full pool takes no more",
    )
    assert_bound_once_and_not_overcommitted(sandbox, 4)


@pytest.fixture
def standby(operators: Operators, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """A second replica on the session's Lease; stopped gracefully (Lease released) after."""
    replica = operators.replica("standby")
    yield replica
    replica.stop()


def test_two_replicas_one_schedules_and_the_other_takes_over_within_15s(
    operators: Operators,
    operator: OperatorProcess,
    standby: OperatorProcess,
    sandbox: Sandbox,
    team: str,
) -> None:
    assert operators.leader() == operator.identity
    sandbox.make_nodes(1, gpus_per_node=8)
    selector = sandbox.node_selector
    for i in range(4):
        sandbox.create(pod(f"before-{i}", team, selector, gpus=1))
    sandbox.wait_pods(None, 4, bound=True, timeout=30)
    assert operators.leader() == operator.identity, "the standby took the Lease from a live leader"

    operator.kill()
    killed = time.monotonic()
    for i in range(4):
        sandbox.create(pod(f"after-{i}", team, selector, gpus=1))
    took = operators.wait_leader(standby.identity, TAKEOVER_S)
    sandbox.wait_pods(
        None, 8, bound=True, timeout=max(1.0, TAKEOVER_S + 5 - (time.monotonic() - killed))
    )
    assert time.monotonic() - killed < TAKEOVER_S + 5, "the new leader scheduled too late"
    print(f"standby holds the Lease {took:.1f}s after the leader was killed")
    assert standby.running()
    assert_bound_once_and_not_overcommitted(sandbox, 8)
