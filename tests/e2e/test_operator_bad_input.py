"""Bad input on a real cluster (issue 10, "Bad input"): reported, never bound, never a crash.

A workload in a queue it cannot use (missing, not a leaf, not admitting its
namespace) gets a PodGroup condition and an Event naming the queue and what is
wrong; malformed objects (an unparsable quantity in a pod, a PodGroup asking
for more members than it has pods, a Topology naming a level twice) are
reported on the object. In every case nothing of it is bound, a canary pod of
a good queue beside it still is, and the operator stays healthy.

Where kai-ray's validating webhook refuses the object at the door instead, the
refusal must name the same things; both outcomes pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException

from kai_ray.values.names import GPU_FRACTION_ANNOTATION, GPU_MEMORY_ANNOTATION
from tests.builders import make_pod_group, make_topology

from .nodes import HOSTNAME_LABEL, RACK_LABEL, ZONE_LABEL
from .operator_process import OperatorProcess
from .polling import eventually, holds
from .sandbox import Sandbox, condition
from .workloads import QueueTree, job, pod

pytestmark = pytest.mark.e2e

CYCLES_S = 2.5


@pytest.fixture
def teams(sandbox: Sandbox) -> QueueTree:
    tree = QueueTree(sandbox.name("dept"), sandbox.name("team-a"), sandbox.name("team-b"))
    # team-b admits another namespace only
    sandbox.kubectl_apply(*tree.manifests(namespaces={tree.team_b: ["somewhere-else"]}))
    return tree


@pytest.fixture
def canary(operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree) -> str:
    """A node for the test and a good pod on it, which must be bound whatever else fails."""
    sandbox.make_nodes(1, gpus_per_node=4)
    sandbox.create(pod("canary", teams.team_a, sandbox.node_selector, gpus=1))
    return "canary"


def still_scheduling(operator: OperatorProcess, sandbox: Sandbox, canary: str) -> None:
    eventually(lambda: sandbox.pod(canary).spec.node_name, 30, "the canary pod to be bound")
    assert operator.running(), operator.log_tail()
    assert operator.probe("/healthz") == 200


def messages(sandbox: Sandbox, *names: str) -> list[str]:
    """Messages of every Event about the named objects."""
    return [e.message or "" for e in sandbox.events() if e.involved_object.name in names]


def names_all(text: str, *needles: str) -> bool:
    return all(n.lower() in text.lower() for n in needles)


def mentions_any(text: str, words: Iterable[str]) -> bool:
    return any(w.lower() in text.lower() for w in words)


def group_reports(group: dict[str, Any] | None) -> list[str]:
    """What a PodGroup says about itself: its reason and its conditions' messages."""
    status = (group or {}).get("status") or {}
    said = [str(status.get("reason") or "")]
    said += [
        f"{c.get('reason', '')}: {c.get('message', '')}" for c in status.get("conditions") or []
    ]
    return [s for s in said if s.strip(": ")]


QUEUE_PROBLEMS = [
    pytest.param(
        "missing",
        ("no queue", "not exist", "not found", "missing", "unknown"),
        id="a workload naming a missing queue",
    ),
    pytest.param("department", ("leaf",), id="a workload naming a queue that is not a leaf"),
    pytest.param(
        "team_b", ("namespace", "admit"), id="a workload in a namespace its queue does not admit"
    ),
]


@pytest.mark.parametrize(("which", "words"), QUEUE_PROBLEMS)
def test_a_workload_in_a_queue_it_cannot_use_is_reported_and_never_bound(
    operator: OperatorProcess,
    sandbox: Sandbox,
    teams: QueueTree,
    canary: str,
    which: str,
    words: tuple[str, ...],
) -> None:
    queue = sandbox.name("no-such-queue") if which == "missing" else getattr(teams, which)
    stuck = job("stuck", queue, sandbox.node_selector, parallelism=2, gpus=1, min_member=2)
    try:
        sandbox.create(stuck)
    except ApiException as refused:  # kai-ray's validating webhook said no at the door
        assert refused.status in (400, 403, 422), refused
        assert names_all(refused.body, queue) and mentions_any(refused.body, words), refused.body
        still_scheduling(operator, sandbox, canary)
        return

    def reported() -> list[str] | None:
        said = [s for s in group_reports(sandbox.get("PodGroup", "job-stuck")) if queue in s]
        return said if any(mentions_any(s, words) for s in said) else None

    eventually(reported, 30, f"a PodGroup condition naming {queue} and {words}")
    eventually(
        lambda: [
            m
            for m in messages(sandbox, "stuck", "job-stuck")
            if queue in m and mentions_any(m, words)
        ],
        30,
        f"an Event naming {queue} and {words}",
    )
    still_scheduling(operator, sandbox, canary)
    holds(
        lambda: not any(p.spec.node_name for p in sandbox.pods("job-name=stuck")),
        CYCLES_S,
        "nothing of it is bound",
    )


def test_a_pod_with_an_unparsable_quantity_is_reported_on_the_pod(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree, canary: str
) -> None:
    """The API server checks resource quantities itself; kai-ray's annotations it does not."""
    odd = {
        "odd-fraction": (GPU_FRACTION_ANNOTATION, "half"),
        "odd-memory": (GPU_MEMORY_ANNOTATION, "lots"),
    }
    for name, (key, value) in odd.items():
        body = pod(name, teams.team_a, sandbox.node_selector)
        body["metadata"]["annotations"] = {key: value}
        sandbox.create(body)

    for name, (key, _) in odd.items():

        def reported(name: str = name, key: str = key) -> list[str] | None:
            live = sandbox.pod(name)
            said = messages(sandbox, name, f"pod-{name}")
            said += [c.message or "" for c in live.status.conditions or []]
            said += group_reports(sandbox.get("PodGroup", f"pod-{name}"))
            return [s for s in said if key in s] or None

        eventually(reported, 30, f"pod {name} to be told about its {key}")
    still_scheduling(operator, sandbox, canary)
    holds(
        lambda: not any(sandbox.pod(n).spec.node_name for n in odd),
        CYCLES_S,
        "the odd pods stay unbound",
    )


def test_a_podgroup_asking_for_more_members_than_it_has_pods_is_reported(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree, canary: str
) -> None:
    sandbox.create(make_pod_group("short").queue(teams.team_a).min_member(3).build())
    for name in ("short-0", "short-1"):
        sandbox.create(pod(name, None, sandbox.node_selector, gpus=1, group="short"))

    def reported() -> list[str] | None:
        said = group_reports(sandbox.get("PodGroup", "short"))
        return [s for s in said if re.search(r"\b3\b", s) and re.search(r"\b2\b", s)] or None

    eventually(reported, 30, "the PodGroup to say it has 2 pods of the 3 it needs")
    still_scheduling(operator, sandbox, canary)
    holds(
        lambda: not any(sandbox.pod(n).spec.node_name for n in ("short-0", "short-1")),
        CYCLES_S,
        "no member is bound",
    )


def test_a_topology_naming_a_level_twice_is_reported_on_the_topology(
    operator: OperatorProcess, sandbox: Sandbox, teams: QueueTree, canary: str
) -> None:
    """The same node label twice is refused at the door by the CRD's CEL rule; an alias
    that is another level's node label gets past CEL and is reported by kai-ray."""
    twice = make_topology(sandbox.name("twice"), ZONE_LABEL, RACK_LABEL, RACK_LABEL).build()
    refused = sandbox.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(twice))
    assert refused.returncode != 0 and "unique nodeLabels" in refused.stderr, refused.stderr

    name = sandbox.name("ambiguous")
    ambiguous = (
        make_topology(name)
        .level(ZONE_LABEL, alias=RACK_LABEL)
        .level(RACK_LABEL)
        .level(HOSTNAME_LABEL)
        .build()
    )
    sandbox.cluster_objects.append(("topologies", name))
    applied = sandbox.plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(ambiguous))
    if applied.returncode != 0:  # kai-ray's validating webhook said no at the door
        said = applied.stderr
        assert "denied the request" in said, said
    else:

        def invalid() -> dict[str, Any] | None:
            valid = condition(sandbox.get("Topology", name), "Valid")
            return valid if valid and valid["status"] == "False" else None

        said = eventually(invalid, 30, f"Topology {name} to be marked not Valid")["message"]
    assert RACK_LABEL in said and "levels" in said, said
    still_scheduling(operator, sandbox, canary)
