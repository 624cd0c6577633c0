"""The short soak with faults (issue 15), in the e2e session.

Two kai-ray replicas on the session's Lease (the session's operator and one
standby), fifty kwok GPU nodes, three teams' stream of workloads for about two
minutes, and every fault class of tests/e2e/soak_faults.py once, in an order the
seed draws (etcd compaction first, so that the API server's restart later finds
the informers' versions compacted). Every count of the checker must be zero;
a failure prints each count with the lines that explain it.

The long run is `python -m tests.e2e.soak` (docs/reliability.md).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
from kubernetes import client

from .conftest import ControlPlane
from .operator_process import OperatorProcess, Operators
from .soak import SoakOptions, read_scheduler_config, run_soak
from .soak_checker import lines
from .soak_faults import KINDS

pytestmark = pytest.mark.e2e

SEED = 15


@pytest.fixture
def standby(operators: Operators, operator: OperatorProcess) -> Iterator[OperatorProcess]:
    replica = operators.replica("soak")
    yield replica
    replica.stop()


def test_short_soak_with_every_fault_counts_nothing_wrong(
    control_plane: ControlPlane,
    operators: Operators,
    operator: OperatorProcess,
    standby: OperatorProcess,
    admin_api: client.ApiClient,
) -> None:
    rest = [kind for kind in KINDS if kind != "compact-etcd"]
    random.Random(SEED).shuffle(rest)
    options = SoakOptions(
        seed=SEED,
        minutes=1.5,
        faults=["compact-etcd", *rest],
        fault_gap_s=(6.0, 10.0),
        warmup_s=10.0,
        settle_s=30.0,
    )
    result = run_soak(
        control_plane.env,
        [operator, standby],
        operators.lease_name,
        admin_api,
        read_scheduler_config(operators.config_file),
        options,
    )
    figures = result.figures
    print(json.dumps({k: v for k, v in figures.items() if k != "timeline"}, indent=2))
    problems = [*lines(result.counts)] if not result.counts.clean() else []
    missing = sorted(set(KINDS) - set(figures["faults"]))
    problems += [f"fault never injected: {kind}" for kind in missing]
    problems += [f"fault not injected: {line}" for line in figures["faults_not_injected"]]
    problems += [f"soak error: {line}" for line in figures["errors"]]
    if not figures["kills_with_standby_takeover"]:
        problems.append("the standby never took the Lease over")
    assert not problems, "\n".join(problems)
    assert figures["binds"] > 0
