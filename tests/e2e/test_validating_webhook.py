"""kai-ray's validating webhook on a real cluster (issue 12, item 2).

Every rule the CRDs' CEL cannot check is tried with `kubectl apply`, and the
refusal kubectl prints must name the object, the field and what is wrong:
a Queue's missing parent, a cycle of parents, children's quotas above their
parent's (raised by a child or lowered by the parent), a child queue under a
queue that holds workloads; a workload (pod, batch Job, PodGroup) naming a
missing queue, a queue that is not a leaf, or a queue that does not admit its
namespace; a PodGroup whose subgroups form a cycle; a Topology naming a level
twice. The webhooks are registered with failure policy Ignore and a 5 s
timeout, and with the operator stopped, pods of another scheduler (and of
kai-ray) are still created.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from kai_ray.values.api import API_VERSION
from kai_ray.values.names import QUEUE_LABEL

from .operator_process import OperatorProcess, Operators
from .polling import eventually
from .sandbox import Sandbox
from .workloads import IMAGE, job, pod

pytestmark = pytest.mark.e2e

WEBHOOK_CONFIG = "kai-ray.io"


def queue(
    name: str,
    parent: str | None = None,
    gpu: int | None = None,
    namespaces: list[str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parent is not None:
        spec["parentQueue"] = parent
    if gpu is not None:
        spec["resources"] = {"gpu": {"quota": gpu}}
    if namespaces is not None:
        spec["namespaces"] = namespaces
    return {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def pod_group(name: str, queue_name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"queue": queue_name, "minMember": 1, **spec},
    }


def apply(sandbox: Sandbox, obj: dict[str, Any]) -> tuple[int, str]:
    """`kubectl apply` of one object as a user does: its exit status and stderr."""
    if obj["kind"] in ("Queue", "Topology"):
        plural = "queues" if obj["kind"] == "Queue" else "topologies"
        sandbox.cluster_objects.append((plural, obj["metadata"]["name"]))
    obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
    result = sandbox.plane.kubectl(
        "apply", "-n", sandbox.namespace, "-f", "-", input=yaml.safe_dump(obj)
    )
    return result.returncode, result.stderr


@pytest.fixture
def tree(operator: OperatorProcess, sandbox: Sandbox) -> dict[str, str]:
    """dept (8 GPUs) > team-a (6 GPUs, this namespace, a PodGroup in it) and
    team-b (another namespace only), seen by the operator."""
    names = {key: sandbox.name(key) for key in ("dept", "team-a", "team-b")}
    sandbox.kubectl_apply(
        queue(names["dept"], gpu=8),
        queue(names["team-a"], names["dept"], gpu=6, namespaces=[sandbox.namespace]),
        queue(names["team-b"], names["dept"], namespaces=["somewhere-else"]),
    )
    sandbox.create(pod_group("holding", names["team-a"]))
    # The operator's cache has the PodGroup once the loop wrote its status.
    eventually(
        lambda: ((sandbox.get("PodGroup", "holding") or {}).get("status") or {}).get("phase"),
        30,
        "the operator to see PodGroup holding",
    )
    return names


def test_each_rule_is_refused_with_its_object_field_and_reason(
    sandbox: Sandbox, tree: dict[str, str]
) -> None:
    dept, team_a, team_b = tree["dept"], tree["team-a"], tree["team-b"]
    missing = sandbox.name("missing")
    ns = sandbox.namespace
    selector = sandbox.node_selector
    bad_levels = {"levels": [{"nodeLabel": "rack"}, {"nodeLabel": "zone", "alias": "rack"}]}
    subgroup_cycle = [{"name": "head", "parent": "tail"}, {"name": "tail", "parent": "head"}]
    cases: list[tuple[str, dict[str, Any], str]] = [
        (
            "a Queue made its own grandchild",
            queue(dept, team_a, gpu=8),
            f'Queue "{dept}": spec.parentQueue: parent queues form a cycle',
        ),
        (
            "a child whose quota does not fit its parent's",
            queue(sandbox.name("team-c"), dept, gpu=4),
            f'Queue "{sandbox.name("team-c")}": spec.resources.gpu.quota: the quotas of '
            f"the children of queue '{dept}' (*) add up to 10 gpu, more than its quota of 8",
        ),
        (
            "a parent whose quota is lowered below its children's",
            queue(dept, gpu=4),
            f'Queue "{dept}": spec.resources.gpu.quota: the quotas of the children of '
            f"queue '{dept}' (*) add up to 6 gpu, more than its quota of 4",
        ),
        (
            "a child queue under a queue that holds workloads",
            queue(sandbox.name("sub"), team_a),
            f"Queue \"{sandbox.name('sub')}\": spec.parentQueue: queue '{team_a}' holds "
            f"workloads (PodGroups {ns}/holding); only leaf queues take workloads",
        ),
        (
            "a pod of kai-ray in a queue that is not a leaf",
            pod("in-dept", dept, selector, gpus=1),
            f'Pod "{ns}/in-dept": metadata.labels[{QUEUE_LABEL}]: queue '
            f"'{dept}' is not a leaf (its children: {team_a}, {team_b}); "
            "only leaf queues take workloads",
        ),
        (
            "a batch Job in a queue that does not exist",
            job("lost", missing, selector, parallelism=1, gpus=1, min_member=1),
            f"Job \"{ns}/lost\": metadata.labels[{QUEUE_LABEL}]: queue '{missing}' does not exist",
        ),
        (
            "a PodGroup in a queue that does not admit its namespace",
            pod_group("elsewhere", team_b),
            f'PodGroup "{ns}/elsewhere": spec.queue: namespace {ns} may not use queue '
            f"{team_b} (allowed: somewhere-else)",
        ),
        (
            "a PodGroup whose subgroups form a cycle",
            pod_group("loop", team_a, subGroups=subgroup_cycle),
            f'PodGroup "{ns}/loop": spec.subGroups[0].parent: subgroups form a cycle (head -> tail -> head)',
        ),
        (
            "a Topology naming a level twice, as a label and an alias",
            {
                "apiVersion": API_VERSION,
                "kind": "Topology",
                "metadata": {"name": sandbox.name("twice")},
                "spec": bad_levels,
            },
            f'Topology "{sandbox.name("twice")}": spec.levels[1]: '
            "level name 'rack' is used twice",
        ),
    ]
    for what, obj, message in cases:
        status, stderr = apply(sandbox, obj)
        assert status != 0, f"{what}: admitted"
        # `*`: the children, in the tree's order (a new queue has no creation time yet).
        assert "denied the request" in stderr, f"{what}: {stderr}"
        assert all(part in stderr for part in message.split("*")), f"{what}: {stderr}"
    # Nothing refused was written, and what is right still is.
    assert (sandbox.get("Queue", dept) or {})["spec"]["resources"]["gpu"]["quota"] == 8
    for obj in (pod("in-team-a", team_a, selector, gpus=1), queue(sandbox.name("team-c"), dept)):
        status, stderr = apply(sandbox, obj)
        assert status == 0, stderr


def test_a_queue_whose_parent_does_not_exist_yet_is_admitted_with_a_warning(
    sandbox: Sandbox, tree: dict[str, str]
) -> None:
    """Helm, Argo CD and `kubectl apply -f` of a folder write a tree's Queues in any
    order, even at once: a parent not there yet is a warning, and the Queue says
    it is not valid until the parent comes."""
    orphan, later = sandbox.name("orphan"), sandbox.name("later")
    status, stderr = apply(sandbox, queue(orphan, later))
    assert status == 0, stderr
    assert f"Warning: Queue '{orphan}': spec.parentQueue: parent queue '{later}' " in stderr
    assert "does not exist yet" in stderr, stderr
    status, stderr = apply(sandbox, queue(later))
    assert status == 0 and "Warning" not in stderr, stderr


def test_webhooks_fail_open_fast_and_pods_are_created_with_the_operator_stopped(
    operators: Operators, operator: OperatorProcess, sandbox: Sandbox, tree: dict[str, str]
) -> None:
    admission = client.AdmissionregistrationV1Api(sandbox.api)
    config = admission.read_validating_webhook_configuration(WEBHOOK_CONFIG)
    hooks = {hook.name: hook for hook in config.webhooks or []}
    assert {name.split(".")[0] for name in hooks} >= {
        "queue-validation",
        "topology-validation",
        "pods-validation",
        "jobs-validation",
        "podgroups-validation",
    }, sorted(hooks)
    assert {(h.failure_policy, h.timeout_seconds) for h in hooks.values()} == {("Ignore", 5)}

    operator.stop()
    try:
        other = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "other-scheduler"},
            "spec": {
                "schedulerName": "default-scheduler",
                "containers": [{"name": "main", "image": IMAGE}],
            },
        }
        started = time.monotonic()
        # kai-ray's own pods too, unchecked (a queue that is not a leaf): the
        # operator reports them once it is back.
        for obj in (other, pod("unchecked", tree["dept"], sandbox.node_selector)):
            status, stderr = apply(sandbox, obj)
            assert status == 0, stderr
        assert time.monotonic() - started < 10
        assert sandbox.pod("other-scheduler").spec.scheduler_name == "default-scheduler"
    finally:
        operators.ensure_primary()
