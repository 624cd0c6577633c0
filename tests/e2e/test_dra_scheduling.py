"""Dynamic Resource Allocation through the kai-ray operator on the real control plane
(issue 18, docs/dra.md).

kwok runs no DRA driver, so the test publishes what one would: a DeviceClass
(`gpu.e2e.kai-ray.io`, which the e2e operators' SchedulerConfig maps to the
queue resource `gpu`: tests/e2e/operator_process.py) and one ResourceSlice per
kwok node with 8 devices, each with a product name, an index and the node's
NVLink clique. Workloads ask for devices through ResourceClaimTemplates; the
controller-manager's resource claim controller (enabled in e2e/cluster.sh)
makes each pod's claim; kai-ray allocates devices on the node it binds the pod
to, writes the claim's allocation and `reservedFor`, then binds. Deleting the
pods lets the controller release and delete their claims, and the devices are
free for the next workload.

The nodes have no `nvidia.com/gpu` at all: every GPU here is a DRA device.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.values.dra import CLAIM_FINALIZER, ResourceClaim
from kai_ray.values.validation import parse_model
from tests.builders import make_pod_group, make_queue

from .conftest import ControlPlane
from .operator_process import DRA_GPU_CLASS, OperatorProcess
from .polling import eventually, holds
from .sandbox import POOL_LABEL, Sandbox, quantity
from .workloads import pod

pytestmark = pytest.mark.e2e

RESOURCE = ("resource.k8s.io", "v1")
#: The driver publishing the devices; its class selects its devices by it.
DRIVER = DRA_GPU_CLASS
CLIQUE = f"{DRIVER}/cliqueId"
#: The driver (and DeviceClass) of NVLink switches, shared by the nodes of a pool.
FABRIC = "fabric.e2e.kai-ray.io"
DEVICES_PER_NODE = 8
#: Long enough for several cycles (500 ms each in the e2e configuration).
CYCLES_S = 2.5


def _device_class(api: client.CustomObjectsApi, name: str) -> None:
    """A DeviceClass of all the devices of the driver of the same name."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{name}"'}}]},
    }
    with contextlib.suppress(ApiException):  # left by an earlier session that was killed
        api.delete_cluster_custom_object(*RESOURCE, "deviceclasses", name)
    eventually(lambda: _absent(api, "deviceclasses", name), 30, f"the old class {name} to go")
    api.create_cluster_custom_object(*RESOURCE, "deviceclasses", body)


@pytest.fixture(scope="module")
def device_classes(kai_ray_crds: ControlPlane, admin_api: client.ApiClient) -> Iterator[None]:
    """The GPUs' class (mapped to the queue resource gpu) and the NVLink switches'
    (mapped to none), for this module's tests."""
    api = client.CustomObjectsApi(admin_api)
    for name in (DRA_GPU_CLASS, FABRIC):
        _device_class(api, name)
    yield
    for name in (DRA_GPU_CLASS, FABRIC):
        api.delete_cluster_custom_object(*RESOURCE, "deviceclasses", name)


def _absent(api: client.CustomObjectsApi, plural: str, name: str) -> bool:
    try:
        api.get_cluster_custom_object(*RESOURCE, plural, name)
    except ApiException as err:
        if err.status == 404:
            return True
        raise
    return False


def resource_slice(node: str, clique: str, product: str) -> dict[str, Any]:
    """What a driver publishes for one node: its 8 GPUs, in a pool named after it."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "productName": {"string": product},
                "index": {"int": i},
                "cliqueId": {"string": clique},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i in range(DEVICES_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def fabric_slice(sandbox: Sandbox, nodes: list[str]) -> dict[str, Any]:
    """One NVLink switch, reachable from every node of the test's pool (a driver's
    shared pool: its devices are local to no node)."""
    pool = f"fabric-{sandbox.tag}"
    selector = {"key": POOL_LABEL, "operator": "In", "values": [sandbox.tag]}
    device = {"name": "switch-0", "attributes": {"model": {"string": "NVSwitch"}}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-{FABRIC}"},
        "spec": {
            "driver": FABRIC,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [selector]}]},
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }


@pytest.fixture
def publish(device_classes: None, admin_api: client.ApiClient) -> Iterator[Callable[..., None]]:
    """`publish(nodes)`: one slice of H100s per node, each node its own clique, and
    any further slices given; deleted after the test."""
    api = client.CustomObjectsApi(admin_api)
    made: list[str] = []

    def publish(nodes: list[str], *more: dict[str, Any]) -> None:
        bodies = [resource_slice(n, f"clique-{i}", "H100") for i, n in enumerate(nodes)]
        for body in [*bodies, *more]:
            api.create_cluster_custom_object(*RESOURCE, "resourceslices", body)
            made.append(body["metadata"]["name"])

    yield publish
    for name in made:
        with contextlib.suppress(ApiException):
            api.delete_cluster_custom_object(*RESOURCE, "resourceslices", name)


def device_claim_spec(count: int, product: str) -> dict[str, Any]:
    """`count` devices of `product`, all of one clique."""
    expression = f'device.attributes["{DRIVER}"].productName == "{product}"'
    exactly = {
        "deviceClassName": DRA_GPU_CLASS,
        "count": count,
        "selectors": [{"cel": {"expression": expression}}],
    }
    return {
        "devices": {
            "requests": [{"name": "gpus", "exactly": exactly}],
            "constraints": [{"requests": ["gpus"], "matchAttribute": CLIQUE}],
        }
    }


def claim_template(sandbox: Sandbox, name: str, count: int, product: str) -> None:
    """A ResourceClaimTemplate for `count` GPUs of `product`, all of one clique."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": device_claim_spec(count, product)},
    }
    api = client.CustomObjectsApi(sandbox.api)
    api.create_namespaced_custom_object(
        *RESOURCE, sandbox.namespace, "resourceclaimtemplates", body
    )


def claiming_pod(
    sandbox: Sandbox,
    name: str,
    queue: str | None,
    template: str,
    group: str | None = None,
    shared: str | None = None,
) -> dict[str, Any]:
    """A plain pod of kai-ray whose container uses the claim made from `template`,
    and the ResourceClaim `shared` as well when given."""
    body = pod(name, queue, sandbox.node_selector, group=group)
    entries = [{"name": "gpus", "resourceClaimTemplateName": template}]
    if shared is not None:
        entries.append({"name": "fabric", "resourceClaimName": shared})
    body["spec"]["resourceClaims"] = entries
    uses = [{"name": entry["name"]} for entry in entries]
    body["spec"]["containers"][0]["resources"] = {"claims": uses}
    return body


def claims(sandbox: Sandbox) -> dict[str, ResourceClaim]:
    api = client.CustomObjectsApi(sandbox.api)
    listed = api.list_namespaced_custom_object(*RESOURCE, sandbox.namespace, "resourceclaims")
    return {item["metadata"]["name"]: parse_model(ResourceClaim, item) for item in listed["items"]}


def claim_of(sandbox: Sandbox, pod_name: str) -> ResourceClaim | None:
    """The claim the controller made for the pod (named in the pod's status)."""
    statuses = sandbox.pod(pod_name).status.resource_claim_statuses or []
    made = [s.resource_claim_name for s in statuses if s.name == "gpus"]
    return claims(sandbox).get(made[0]) if made and made[0] else None


def allocated_gpus(sandbox: Sandbox, queue: str) -> Any:
    status = (sandbox.get("Queue", queue) or {}).get("status") or {}
    return quantity((status.get("allocated") or {}).get("gpu"))


def check_claim(sandbox: Sandbox, pod_name: str, count: int) -> set[tuple[str, str]]:
    """The pod's claim as kai-ray must have written it before the bind: `count`
    devices of the pod's node, usable there only, reserved for the pod, with
    kube-scheduler's finalizer. Returns the devices, as (pool, device)."""
    live = sandbox.pod(pod_name)
    node = live.spec.node_name
    claim = claim_of(sandbox, pod_name)
    assert claim is not None, f"no claim made for {pod_name}"
    owners = (claim.metadata.model_extra or {}).get("ownerReferences") or []
    assert [(o["kind"], o["name"]) for o in owners] == [("Pod", pod_name)], owners
    allocation = claim.status.allocation
    assert allocation is not None, f"{claim.metadata.name} is not allocated"
    results = allocation.devices.results
    assert len(results) == count, results
    assert {(r.request, r.driver, r.pool) for r in results} == {("gpus", DRIVER, node)}
    assert allocation.nodeSelector is not None
    assert allocation.nodeSelector.model_dump(mode="json", exclude_defaults=True) == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    assert [(r.resource, r.name, r.uid) for r in claim.status.reservedFor] == [
        ("pods", pod_name, live.metadata.uid)
    ]
    assert CLAIM_FINALIZER in ((claim.metadata.model_extra or {}).get("finalizers") or [])
    return {(r.pool, r.device) for r in results}


def test_a_gang_claiming_gpus_through_templates_is_bound_with_its_claims_allocated(
    operator: OperatorProcess,
    sandbox: Sandbox,
    publish: Callable[..., None],
) -> None:
    """Four pods of one gang, each claiming 4 H100s of one clique, on two nodes of 8
    DRA GPUs: every claim is allocated on its pod's node before the bind, no device
    twice, and the queue holds 16 GPUs. Deleting the pods frees the devices: their
    claims go, the queue holds none, and two pods of 8 GPUs each are bound after."""
    queue = sandbox.name("dra")
    sandbox.kubectl_apply(make_queue(queue).gpu(quota=16, limit=None).build())
    nodes = sandbox.make_nodes(2, gpus_per_node=0)
    publish(nodes)
    claim_template(sandbox, "four-h100", 4, "H100")
    sandbox.create(make_pod_group("train").queue(queue).min_member(4).build())
    names = [f"train-{i}" for i in range(4)]
    for name in names:
        sandbox.create(claiming_pod(sandbox, name, None, "four-h100", group="train"))

    pods = sandbox.wait_pods(None, 4, bound=True, timeout=90)
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes * 2), "two pods a node"
    taken = [check_claim(sandbox, name, 4) for name in names]
    assert len(set().union(*taken)) == 16, "no device given twice"
    eventually(lambda: allocated_gpus(sandbox, queue) == 16, 15, "the queue to hold 16 GPUs")

    for name in names:
        sandbox.core.delete_namespaced_pod(name, sandbox.namespace)
    sandbox.wait_pods(None, 0, timeout=60)
    eventually(lambda: not claims(sandbox), 60, "the pods' claims to be released and deleted")
    eventually(lambda: allocated_gpus(sandbox, queue) == 0, 15, "the queue to hold none")

    claim_template(sandbox, "eight-h100", 8, "H100")
    for name in ("whole-0", "whole-1"):
        sandbox.create(claiming_pod(sandbox, name, queue, "eight-h100"))
    wholes = sandbox.wait_pods(None, 2, bound=True, timeout=60)
    assert sorted(p.spec.node_name for p in wholes) == sorted(nodes)
    assert len(check_claim(sandbox, "whole-0", 8) | check_claim(sandbox, "whole-1", 8)) == 16


def test_the_pods_of_a_gang_share_one_claim_allocated_once_and_reserved_for_each(
    operator: OperatorProcess,
    sandbox: Sandbox,
    publish: Callable[..., None],
) -> None:
    """Two pods of 8 GPUs each (so on two nodes) that also share one ResourceClaim for
    the pool's NVLink switch (a class of its own, which counts towards no queue
    resource): the shared claim is allocated once, from the pool both
    nodes reach, and reserved for both pods (written by two binds at once). Once the
    pods go, the controller releases it: not allocated, reserved for nobody."""
    queue = sandbox.name("dra")
    sandbox.kubectl_apply(make_queue(queue).gpu(quota=16, limit=None).build())
    nodes = sandbox.make_nodes(2, gpus_per_node=0)
    publish(nodes, fabric_slice(sandbox, nodes))
    claim_template(sandbox, "eight-h100", 8, "H100")
    request = {"name": "switch", "exactly": {"deviceClassName": FABRIC}}
    spec = {"devices": {"requests": [request]}}
    api = client.CustomObjectsApi(sandbox.api)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}
    body |= {"metadata": {"name": "fabric"}, "spec": spec}
    api.create_namespaced_custom_object(*RESOURCE, sandbox.namespace, "resourceclaims", body)
    sandbox.create(make_pod_group("ring").queue(queue).min_member(2).build())
    for name in ("ring-0", "ring-1"):
        sandbox.create(claiming_pod(sandbox, name, None, "eight-h100", "ring", "fabric"))

    pods = sandbox.wait_pods(None, 2, bound=True, timeout=90)
    assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
    gpus = check_claim(sandbox, "ring-0", 8) | check_claim(sandbox, "ring-1", 8)
    assert len(gpus) == 16
    fabric = claims(sandbox)["fabric"]
    assert fabric.status.allocation is not None
    results = fabric.status.allocation.devices.results
    assert [(r.pool, r.device) for r in results] == [(f"fabric-{sandbox.tag}", "switch-0")]
    selector = fabric.status.allocation.nodeSelector
    assert selector is not None and all(
        selector.matches(n, {POOL_LABEL: sandbox.tag}) for n in nodes
    )
    assert sorted(r.uid for r in fabric.status.reservedFor) == sorted(p.metadata.uid for p in pods)

    for name in ("ring-0", "ring-1"):
        sandbox.core.delete_namespaced_pod(name, sandbox.namespace)
    sandbox.wait_pods(None, 0, timeout=60)

    def released() -> bool:
        kept = claims(sandbox).get("fabric")
        return kept is not None and kept.status.allocation is None and not kept.status.reservedFor

    eventually(released, 60, "the shared claim to be released")


def test_a_pod_claiming_a_model_no_node_has_waits_with_the_reason_on_its_podgroup(
    operator: OperatorProcess,
    sandbox: Sandbox,
    publish: Callable[..., None],
) -> None:
    queue = sandbox.name("dra")
    sandbox.kubectl_apply(make_queue(queue).gpu(quota=16, limit=None).build())
    nodes = sandbox.make_nodes(1, gpus_per_node=0)
    publish(nodes)
    claim_template(sandbox, "one-b200", 1, "B200")
    sandbox.create(claiming_pod(sandbox, "wants-b200", queue, "one-b200"))

    def waiting() -> dict[str, Any] | None:
        status = (sandbox.get("PodGroup", "pod-wants-b200") or {}).get("status") or {}
        return status if status.get("phase") == "Pending" and status.get("reason") else None

    status = eventually(waiting, 30, "the PodGroup to say why it waits")
    assert "cannot reach the devices its ResourceClaims ask for" in status["reason"], status
    claim = eventually(lambda: claim_of(sandbox, "wants-b200"), 30, "the claim to be made")
    holds(
        lambda: not sandbox.pod("wants-b200").spec.node_name,
        CYCLES_S,
        "the pod stays pending",
    )
    again = claims(sandbox)[claim.metadata.name]
    assert again.status.allocation is None and again.status.reservedFor == []


def test_a_pod_claiming_through_a_template_that_does_not_exist_waits_and_others_run(
    operator: OperatorProcess, sandbox: Sandbox, publish: Callable[..., None]
) -> None:
    """A pod naming a template nobody made: the controller makes no claim, the pod
    waits with a reason, and a pod of the same queue without claims is bound."""
    queue = sandbox.name("dra")
    sandbox.kubectl_apply(make_queue(queue).gpu(quota=16, limit=None).build())
    publish(sandbox.make_nodes(1, gpus_per_node=0))
    missing = f"missing-{uuid.uuid4().hex[:4]}"
    sandbox.create(claiming_pod(sandbox, "orphan", queue, missing))
    sandbox.create(pod("plain", queue, sandbox.node_selector))
    eventually(lambda: sandbox.pod("plain").spec.node_name, 30, "the plain pod to be bound")

    def waiting() -> dict[str, Any] | None:
        status = (sandbox.get("PodGroup", "pod-orphan") or {}).get("status") or {}
        return status if status.get("phase") == "Pending" and status.get("reason") else None

    status = eventually(waiting, 30, "the orphan's PodGroup to say why it waits")
    template = f"ResourceClaimTemplate {sandbox.namespace}/{missing} (claim 'gpus')"
    assert f"{template} does not exist" in status["reason"], status
    assert not sandbox.pod("orphan").spec.node_name
    assert operator.running()
