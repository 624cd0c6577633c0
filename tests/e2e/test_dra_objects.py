"""DRA objects on the real API server: the v1 YAML kai-ray's models read is what the
control plane accepts and serves, and the claim writes of the binder
(kai_ray/state/dra_status.py) are accepted by the claim's status subresource."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kai_ray.state.dra import build_inventory
from kai_ray.state.dra_allocate import Allocation, allocate
from kai_ray.state.dra_status import ClaimWrite, Consumer, allocation_write, release_write
from kai_ray.values.dra import (
    CLAIM_FINALIZER,
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from kai_ray.values.validation import parse_model

from .conftest import REPO, ControlPlane

pytestmark = pytest.mark.e2e

FIXTURES = REPO / "tests" / "fixtures" / "dra"


def _load(name: str) -> dict[str, Any]:
    raw = yaml.safe_load((FIXTURES / name).read_text())
    assert isinstance(raw, dict)
    return raw


def _kubectl(plane: ControlPlane, *args: str, body: Any = None) -> str:
    done = plane.kubectl(*args, input=None if body is None else json.dumps(body))
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def _get(plane: ControlPlane, kind: str, name: str, namespace: str | None = None) -> Any:
    where = ["-n", namespace] if namespace else []
    return json.loads(_kubectl(plane, "get", kind, name, *where, "-o", "json"))


@pytest.fixture
def published(control_plane: ControlPlane, namespace: str) -> Iterator[dict[str, Any]]:
    """The fixtures' class and slices under names of this test, and its claims."""
    tag = uuid.uuid4().hex[:6]
    objects = {
        "class": _load("deviceclass.yaml"),
        "node": _load("resourceslice-node.yaml"),
        "pool": _load("resourceslice-pool.yaml"),
        "claim": _load("resourceclaim.yaml"),
        "template": _load("resourceclaimtemplate.yaml"),
    }
    objects["class"]["metadata"]["name"] = f"gpu-{tag}.example.com"
    for key in ("node", "pool"):
        objects[key]["metadata"]["name"] += f"-{tag}"
        objects[key]["spec"]["pool"]["name"] += f"-{tag}"
    objects["node"]["spec"]["nodeName"] = f"node-a-{tag}"
    for key in ("claim", "template"):
        objects[key]["metadata"]["namespace"] = namespace
    objects["claim"].pop("status")
    for obj in objects.values():
        _kubectl(control_plane, "create", "-f", "-", body=obj)
    yield objects
    for key in ("class", "node", "pool"):
        kind, name = objects[key]["kind"], objects[key]["metadata"]["name"]
        control_plane.kubectl("delete", kind, name, "--wait=false")


def test_the_control_plane_serves_what_the_models_read(
    control_plane: ControlPlane, published: dict[str, Any], namespace: str
) -> None:
    models: dict[str, Any] = {
        "class": DeviceClass,
        "node": ResourceSlice,
        "pool": ResourceSlice,
        "claim": ResourceClaim,
        "template": ResourceClaimTemplate,
    }
    for key, model in models.items():
        sent = published[key]
        served = _get(control_plane, sent["kind"], sent["metadata"]["name"], namespace)
        read = parse_model(model, served, f"{key} as served")
        mine = parse_model(model, _with_server_defaults(sent), key)
        assert read.model_dump()["spec"] == mine.model_dump()["spec"], key


def _with_server_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server fills in on a request: ExactCount, and its count of 1."""
    body = json.loads(json.dumps(obj))
    if body["kind"] not in ("ResourceClaim", "ResourceClaimTemplate"):
        return body
    spec = body["spec"]["spec"] if body["kind"] == "ResourceClaimTemplate" else body["spec"]
    for request in spec["devices"]["requests"]:
        for exact in [request.get("exactly") or {}, *request.get("firstAvailable", [])]:
            if exact and exact.setdefault("allocationMode", "ExactCount") == "ExactCount":
                exact.setdefault("count", 1)
    return body


def _patch(plane: ControlPlane, write: ClaimWrite, namespace: str) -> None:
    """The patches in order, each after the first with the version the last gave."""
    claim = ["resourceclaim", write.name, "-n", namespace, "--type=merge", "-o", "json"]
    version = None
    for subresource, body in write.patches():
        if version is not None:
            body = {**body, "metadata": {**body.get("metadata", {}), "resourceVersion": version}}
        where = [f"--subresource={subresource}"] if subresource else []
        answer = _kubectl(plane, "patch", *claim, *where, "-p", json.dumps(body))
        version = json.loads(answer)["metadata"]["resourceVersion"]


def test_the_claim_writes_are_accepted_and_undone(
    control_plane: ControlPlane, published: dict[str, Any], namespace: str
) -> None:
    node = published["node"]["spec"]["nodeName"]
    slices = [parse_model(ResourceSlice, published[k]) for k in ("node", "pool")]
    gpu_class = parse_model(DeviceClass, published["class"])
    nic_class = DeviceClass.model_validate(
        {
            "metadata": {"name": "nic.example.com"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "nic.example.com"'}}]},
        }
    )
    inventory = build_inventory(
        slices, [gpu_class, nic_class], {node: {"example.com/rack": "rack-1"}}
    )
    served = _get(control_plane, "resourceclaim", "two-h100", namespace)
    spec = served["spec"]
    spec["devices"]["requests"][0]["exactly"]["deviceClassName"] = gpu_class.metadata.name
    claim = parse_model(ResourceClaim, {**served, "spec": spec})
    allocation = allocate([claim], node, inventory, set())
    assert isinstance(allocation, Allocation), allocation
    # a pod that exists (of no scheduler that runs): the resource claim controller
    # drops reservations of pods that do not, and deallocates what nobody reserves
    pending = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer-0", "namespace": namespace},
        "spec": {
            "schedulerName": "kai-ray-e2e-unscheduled",
            "containers": [{"name": "main", "image": "example.invalid/x:1"}],
        },
    }
    made = json.loads(_kubectl(control_plane, "create", "-f", "-", "-o", "json", body=pending))
    pod = Consumer("trainer-0", made["metadata"]["uid"])

    _patch(control_plane, allocation_write(claim, allocation.claims[0], pod), namespace)
    written = parse_model(
        ResourceClaim, _get(control_plane, "resourceclaim", "two-h100", namespace)
    )
    assert written.status.allocation is not None
    devices = [(r.request, r.device) for r in written.status.allocation.devices.results]
    assert devices == [("gpus", "gpu-0"), ("gpus", "gpu-1"), ("nic/any", "nic-0")]
    assert [r.uid for r in written.status.reservedFor] == [pod.uid]
    assert CLAIM_FINALIZER in (written.metadata.model_extra or {})["finalizers"]

    _patch(control_plane, release_write(written, pod.uid), namespace)
    released = parse_model(
        ResourceClaim, _get(control_plane, "resourceclaim", "two-h100", namespace)
    )
    assert released.status.allocation is None and released.status.reservedFor == []
    assert CLAIM_FINALIZER not in ((released.metadata.model_extra or {}).get("finalizers") or [])


def test_a_stale_write_is_a_conflict_not_an_overwrite(
    control_plane: ControlPlane, published: dict[str, Any], namespace: str
) -> None:
    served = _get(control_plane, "resourceclaim", "two-h100", namespace)
    claim = parse_model(ResourceClaim, served)
    first = release_write(claim, "nobody")
    _kubectl(control_plane, "label", "resourceclaim", "two-h100", "-n", namespace, "touched=yes")
    subresource, body = first.patches()[0]
    where = [f"--subresource={subresource}"] if subresource else []
    done = control_plane.kubectl(
        "patch", "resourceclaim", "two-h100", "-n", namespace, "--type=merge", *where,
        "-p", json.dumps(body),
    )  # fmt: skip
    assert done.returncode != 0 and "modified" in done.stderr, done.stderr
