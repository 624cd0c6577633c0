"""KubeWriter's ResourceClaim writes on the real API server (kai_ray/effects/kube.py).

Before a pod with claims is bound, the binder asks the writer to allocate each
claim and reserve it for the pod (`write_claim`), and to take that back when the
bind then fails (`release_claim`). The writer reads the claim, sends the
patches of `kai_ray/state/dra_status.py` with the claim's resourceVersion, and
on a conflict reads it again: the pods of a gang that share one claim are bound
in parallel. No kai-ray operator runs here; the writer talks to the API server
as the operator's does. The consumers are real pods (of a scheduler that does
not run, so they stay pending): the controller-manager's resource claim
controller drops reservations of pods that do not exist, and deallocates a
claim nobody reserves any longer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from kai_ray.effects.binder import Outcome, WriteResult
from kai_ray.effects.kube import KubeWriter, connect
from kai_ray.state.dra import DeviceRef
from kai_ray.state.dra_allocate import ClaimAllocation, DeviceResult
from kai_ray.state.dra_status import Consumer
from kai_ray.values.dra import CLAIM_FINALIZER, ResourceClaim
from kai_ray.values.node_selector import node_name_selector
from kai_ray.values.validation import parse_model

from .conftest import ControlPlane

pytestmark = pytest.mark.e2e

DRIVER = "gpu.example.com"
RESOURCE = ("resource.k8s.io", "v1")
#: A finalizer of the test's own, to keep a deleted claim around while it is looked at.
HOLD = "example.com/hold"
#: No scheduler runs under this name: the pods stay pending.
NO_SCHEDULER = "kai-ray-e2e-unscheduled"


@pytest.fixture
def writer(control_plane: ControlPlane) -> KubeWriter:
    return KubeWriter(connect(str(control_plane.kubeconfig), pool_size=16), lambda _k, _n: None)


@pytest.fixture
def claims(admin_api: client.ApiClient, namespace: str) -> Iterator[Callable[..., str]]:
    """Factory: `claims(count=2)` makes a claim asking for `count` GPUs; its name."""
    api = client.CustomObjectsApi(admin_api)

    def make(count: int = 2, finalizers: list[str] | None = None) -> str:
        name = f"claim-{uuid.uuid4().hex[:6]}"
        body: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "finalizers": finalizers or []},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": count}}
                    ]
                }
            },
        }
        api.create_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", body)
        return name

    yield make


@pytest.fixture
def consumers(core: client.CoreV1Api, namespace: str) -> Callable[[int], list[Consumer]]:
    """Factory: `consumers(8)` makes 8 pending pods; the claims' consumers."""

    def make(count: int) -> list[Consumer]:
        made = []
        for _ in range(count):
            body = {
                "metadata": {"name": f"pod-{uuid.uuid4().hex[:6]}"},
                "spec": {
                    "schedulerName": NO_SCHEDULER,
                    "containers": [{"name": "main", "image": "example.invalid/x:1"}],
                },
            }
            pod = core.create_namespaced_pod(namespace, body)
            made.append(Consumer(pod.metadata.name, pod.metadata.uid))
        return made

    return make


def read(admin_api: client.ApiClient, namespace: str, name: str) -> ResourceClaim:
    api = client.CustomObjectsApi(admin_api)
    raw = api.get_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", name)
    return parse_model(ResourceClaim, raw)


def devices(namespace: str, claim: str, node: str, *names: str) -> ClaimAllocation:
    """What the allocator gives for `names` on `node`'s own pool."""
    results = tuple(DeviceResult("gpus", DeviceRef(DRIVER, node, name)) for name in names)
    return ClaimAllocation(namespace, claim, results, node_name_selector(node))


def allocated(claim: ResourceClaim) -> list[str]:
    allocation = claim.status.allocation
    return [] if allocation is None else [r.device for r in allocation.devices.results]


def finalizers(claim: ResourceClaim) -> list[str]:
    return list((claim.metadata.model_extra or {}).get("finalizers") or [])


def test_a_claim_is_allocated_reserved_and_released(
    writer: KubeWriter,
    claims: Callable[..., str],
    consumers: Callable[[int], list[Consumer]],
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    name = claims(count=2)
    (pod,) = consumers(1)
    planned = devices(namespace, name, "node-a", "gpu-0", "gpu-1")

    assert writer.write_claim(namespace, name, planned, pod).ok
    written = read(admin_api, namespace, name)
    assert allocated(written) == ["gpu-0", "gpu-1"]
    assert written.status.allocation is not None
    assert written.status.allocation.nodeSelector == node_name_selector("node-a")
    assert [(r.resource, r.name, r.uid) for r in written.status.reservedFor] == [
        ("pods", pod.name, pod.uid)
    ]
    assert finalizers(written) == [CLAIM_FINALIZER]

    # the same write again (the same plan applied twice) changes nothing
    assert writer.write_claim(namespace, name, planned, pod).ok
    again = read(admin_api, namespace, name)
    assert (allocated(again), len(again.status.reservedFor)) == (["gpu-0", "gpu-1"], 1)

    assert writer.release_claim(namespace, name, pod.uid).ok
    released = read(admin_api, namespace, name)
    assert released.status.allocation is None
    assert released.status.reservedFor == []
    assert finalizers(released) == []


def test_the_pods_of_a_gang_sharing_one_claim_reserve_it_in_parallel(
    writer: KubeWriter,
    claims: Callable[..., str],
    consumers: Callable[[int], list[Consumer]],
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    """Eight binds at once, each planning the same allocation: conflicts are read
    again, so every pod ends up in reservedFor and the claim is allocated once."""
    name = claims(count=1)
    pods = consumers(8)
    planned = devices(namespace, name, "node-b", "gpu-3")
    with ThreadPoolExecutor(len(pods)) as pool:
        results = list(pool.map(lambda p: writer.write_claim(namespace, name, planned, p), pods))
    assert all(r.ok for r in results), results
    shared = read(admin_api, namespace, name)
    assert allocated(shared) == ["gpu-3"]
    assert sorted(r.uid for r in shared.status.reservedFor) == sorted(p.uid for p in pods)

    with ThreadPoolExecutor(len(pods)) as pool:
        results = list(pool.map(lambda p: writer.release_claim(namespace, name, p.uid), pods[1:]))
    assert all(r.ok for r in results), results
    held = read(admin_api, namespace, name)
    assert [r.uid for r in held.status.reservedFor] == [pods[0].uid]
    assert allocated(held) == ["gpu-3"], "the last consumer still holds the devices"
    assert finalizers(held) == [CLAIM_FINALIZER]

    assert writer.release_claim(namespace, name, pods[0].uid).ok
    free = read(admin_api, namespace, name)
    assert (allocated(free), free.status.reservedFor, finalizers(free)) == ([], [], [])


def test_a_claim_allocated_meanwhile_to_other_devices_is_not_overwritten(
    writer: KubeWriter,
    claims: Callable[..., str],
    consumers: Callable[[int], list[Consumer]],
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    name = claims(count=1)
    first, second = consumers(2)
    assert writer.write_claim(namespace, name, devices(namespace, name, "n1", "gpu-0"), first).ok

    late = writer.write_claim(namespace, name, devices(namespace, name, "n2", "gpu-5"), second)
    assert late.outcome is Outcome.RETRY, late
    assert f"ResourceClaim {namespace}/{name} was allocated meanwhile to other devices" in (
        late.message
    )
    kept = read(admin_api, namespace, name)
    assert allocated(kept) == ["gpu-0"]
    assert [r.uid for r in kept.status.reservedFor] == [first.uid]


def test_a_claim_that_is_gone_or_going_is_not_allocated_and_has_nothing_to_release(
    writer: KubeWriter,
    claims: Callable[..., str],
    consumers: Callable[[int], list[Consumer]],
    admin_api: client.ApiClient,
    namespace: str,
) -> None:
    (pod,) = consumers(1)
    missing = writer.write_claim(namespace, "nope", devices(namespace, "nope", "n1", "g"), pod)
    assert missing == WriteResult(
        Outcome.PERMANENT, f"allocating ResourceClaim {namespace}/nope: 404 Not Found"
    )
    assert writer.release_claim(namespace, "nope", pod.uid).ok

    going = claims(count=1, finalizers=[HOLD])
    api = client.CustomObjectsApi(admin_api)
    api.delete_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", going)
    try:
        refused = writer.write_claim(namespace, going, devices(namespace, going, "n1", "g"), pod)
        assert refused == WriteResult(
            Outcome.PERMANENT, f"ResourceClaim {namespace}/{going} is being deleted"
        )
        assert read(admin_api, namespace, going).status.allocation is None
    finally:
        patch = {"metadata": {"finalizers": None}}
        try:
            api.patch_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", going, patch)
        except ApiException as err:
            if err.status != 404:
                raise
