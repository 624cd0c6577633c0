"""The simulator's DRA parts: the NodePool `dra` option, the loader's DRA kinds, the
resource claim controller it plays, and its writer's claim writes."""

from __future__ import annotations

import copy
from pathlib import Path
from textwrap import dedent
from typing import Any

import pytest
import yaml

from kai_ray.sim.claims import ClaimController
from kai_ray.sim.dra_input import DraObjects
from kai_ray.sim.engine import Simulation
from kai_ray.sim.export import normalised
from kai_ray.sim.invariants import InvariantViolation
from kai_ray.sim.loader import iter_documents, load
from kai_ray.sim.nodepool import NodePool, device_classes, resource_slices
from kai_ray.sim.writer import SimWriter
from kai_ray.state.cache import RESOURCE_CLAIM, ClusterCache
from kai_ray.state.dra import DeviceRef
from kai_ray.state.dra_allocate import ClaimAllocation, DeviceResult
from kai_ray.state.dra_status import Consumer
from kai_ray.tools.cli import EXIT_INVALID_INPUT, main
from kai_ray.values.dra import CLAIM_FINALIZER, DraSettings
from kai_ray.values.errors import InvalidObjectError
from kai_ray.values.node_selector import node_name_selector

DRIVER = "gpu.example.com"


def pool(**dra: Any) -> NodePool:
    return NodePool.model_validate(
        {
            "metadata": {"name": "p"},
            "spec": {
                "count": 5,
                "namePrefix": "h100",
                "capacity": {"cpu": "32"},
                "dra": {"driver": DRIVER, "devices": 4, **dra},
            },
        }
    )


# ------------------------------------------------------------------ NodePool dra


def test_one_slice_per_node_with_typed_attributes_and_capacity() -> None:
    slices = resource_slices(
        pool(
            attributes={"productName": "H100", "index": 3, "mig": False},
            capacity={"memory": "80Gi"},
        )
    )
    assert [s["spec"]["nodeName"] for s in slices] == [f"h100-{i}" for i in range(5)]
    first = slices[0]["spec"]
    assert first["pool"] == {"name": "h100-0", "generation": 0, "resourceSliceCount": 1}
    assert [d["name"] for d in first["devices"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    device = first["devices"][2]
    assert device["attributes"] == {
        "productName": {"string": "H100"},
        "index": {"int": 3},
        "mig": {"bool": False},
    }
    assert device["capacity"] == {"memory": {"value": "80Gi"}}


def test_consecutive_nodes_share_a_clique_id() -> None:
    slices = resource_slices(pool(nvlinkDomainSize=2))
    cliques = [s["spec"]["devices"][0]["attributes"]["cliqueId"]["string"] for s in slices]
    assert cliques == ["h100-nvl-0", "h100-nvl-0", "h100-nvl-1", "h100-nvl-1", "h100-nvl-2"]
    every_device = {d["attributes"]["cliqueId"]["string"] for d in slices[3]["spec"]["devices"]}
    assert every_device == {"h100-nvl-1"}


def test_the_device_class_selects_the_driver_and_is_optional() -> None:
    assert device_classes(pool()) == []
    (cls,) = device_classes(pool(deviceClass="gpu.example.com"))
    assert cls["metadata"]["name"] == "gpu.example.com"
    assert cls["spec"]["selectors"][0]["cel"]["expression"] == 'device.driver == "gpu.example.com"'


@pytest.mark.parametrize(
    ("dra", "field"),
    [
        pytest.param({"devices": 0}, "spec.dra.devices", id="no devices"),
        pytest.param({"devices": 129}, "spec.dra.devices", id="more devices than a slice lists"),
        pytest.param({"driver": "GPU_Driver"}, "spec.dra.driver", id="driver not a DNS name"),
        pytest.param({"nvlinkDomainSize": 6}, "spec.dra", id="domain larger than the pool"),
        pytest.param(
            {"nvlinkDomainSize": 2, "attributes": {"cliqueId": "x"}},
            "spec.dra.attributes[cliqueId]",
            id="clique attribute given by hand too",
        ),
        pytest.param({"attributes": {"bad name": "x"}}, "spec.dra.attributes", id="attribute name"),
        pytest.param({"capacity": {"memory": "lots"}}, "spec.dra.capacity", id="bad capacity"),
        pytest.param({"colour": "green"}, "spec.dra.colour", id="unknown field"),
    ],
)
def test_bad_dra_options_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dra: dict[str, Any], field: str
) -> None:
    spec = {"count": 5, "namePrefix": "h", "capacity": {"cpu": "8"}}
    spec["dra"] = {"driver": DRIVER, "devices": 4, **dra}
    doc = {"apiVersion": "sim.kai-ray.io/v1alpha1", "kind": "NodePool", "metadata": {"name": "p"}}
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({**doc, "spec": spec}))
    assert main(["simulate", str(tmp_path), "--quiet"]) == EXIT_INVALID_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "NodePool p" in err and field in err, err


# ------------------------------------------------------------------ the loader

BASE = """\
apiVersion: sim.kai-ray.io/v1alpha1
kind: NodePool
metadata: {name: h100}
spec:
  count: 2
  namePrefix: h100
  capacity: {cpu: "32", memory: 256Gi, pods: 110}
  dra: {driver: gpu.example.com, deviceClass: gpu.example.com, devices: 8,
        attributes: {productName: H100}}
---
apiVersion: scheduling.kai-ray.io/v1alpha1
kind: Queue
metadata: {name: team}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.example.com, count: 2}
"""


def pod_doc(claims: str, name: str = "p") -> str:
    return dedent(
        f"""\
        apiVersion: v1
        kind: Pod
        metadata: {{name: {name}, namespace: ml, labels: {{kai-ray.io/queue: team}}}}
        spec:
          schedulerName: kai-ray
          resourceClaims: {claims}
          containers: [{{name: c, resources: {{requests: {{cpu: "1"}}}}}}]
        """
    )


CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: c, namespace: ml}}
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: {cls}
        selectors:
        - cel: {{expression: '{expression}'}}
"""


def write_input(tmp_path: Path, *documents: str) -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    (tmp_path / "more.yaml").write_text("---\n".join(documents))
    return tmp_path


def test_the_four_kinds_are_read_and_the_pools_class_joins_them(tmp_path: Path) -> None:
    claim = CLAIM.format(cls="gpu.example.com", expression='device.driver == "gpu.example.com"')
    sim = load([write_input(tmp_path, claim, pod_doc("[{name: gpus, resourceClaimName: c}]"))])
    assert [c["metadata"]["name"] for c in sim.dra.device_classes] == ["gpu.example.com"]
    assert [s["spec"]["nodeName"] for s in sim.dra.resource_slices] == ["h100-0", "h100-1"]
    assert [c["metadata"]["name"] for c in sim.dra.resource_claims] == ["c"]
    assert [t["metadata"]["name"] for t in sim.dra.claim_templates] == ["two"]


BAD_INPUT = [
    pytest.param(
        CLAIM.format(cls="gpu.example.com", expression="device.attributes[ ==") + "---\n",
        "ResourceClaim ml/c",
        "spec.devices.requests[0].exactly.selectors[0].cel.expression",
        id="malformed selector names the claim and the field",
    ),
    pytest.param(
        CLAIM.format(cls="nic.example.com", expression="true") + "---\n",
        "ResourceClaim ml/c",
        "spec.devices.requests[0].exactly.deviceClassName",
        id="class that does not exist",
    ),
    pytest.param(
        pod_doc("[{name: gpus, resourceClaimTemplateName: ghost}]"),
        "Pod ml/p",
        "spec.resourceClaims[0].resourceClaimTemplateName",
        id="template that does not exist",
    ),
    pytest.param(
        pod_doc("[{name: gpus, resourceClaimName: ghost}]"),
        "Pod ml/p",
        "spec.resourceClaims[0].resourceClaimName",
        id="claim that does not exist",
    ),
    pytest.param(
        pod_doc("[{name: gpus, resourceClaimName: c, resourceClaimTemplateName: two}]"),
        "Pod ml/p",
        "spec.resourceClaims[0]",
        id="entry naming both a claim and a template",
    ),
    pytest.param(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s}\n"
        "spec: {driver: d.example.com, nodeName: ghost, pool: {name: p, generation: 0, "
        "resourceSliceCount: 1}, devices: [{name: g}]}\n",
        "ResourceSlice s",
        "spec.nodeName",
        id="slice of a node that does not exist",
    ),
    pytest.param(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: a, namespace: ml}\n"
        "spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.example.com}}]}}\n"
        "status: {allocation: {devices: {results: [{request: g, driver: gpu.example.com, "
        "pool: h100-0, device: gpu-0}]}}}\n---\n"
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: b, namespace: ml}\n"
        "spec: {devices: {requests: [{name: g, exactly: {deviceClassName: gpu.example.com}}]}}\n"
        "status: {allocation: {devices: {results: [{request: g, driver: gpu.example.com, "
        "pool: h100-0, device: gpu-0}]}}}\n",
        "ResourceClaim ml/b",
        "status.allocation.devices.results[0]",
        id="device allocated to two claims",
    ),
    pytest.param(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.example.com}\n",
        "DeviceClass gpu.example.com",
        "metadata.name",
        id="class the pool publishes given again",
    ),
    pytest.param(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n"
        "metadata: {name: t, namespace: ml}\nspec: {spec: {devices: {requests: "
        "[{name: g, exactly: {deviceClassName: gpu.example.com, allocationMode: All, "
        "count: 2}}]}}}\n",
        "ResourceClaimTemplate ml/t",
        "spec.spec.devices.requests[0].exactly.count",
        id="count with allocationMode All",
    ),
]


@pytest.mark.parametrize(("document", "obj", "field"), BAD_INPUT)
def test_bad_dra_input_exits_2_naming_object_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str, obj: str, field: str
) -> None:
    claim = CLAIM.format(cls="gpu.example.com", expression="true")
    extra = [document]
    if "resourceClaimName: c" in document:
        extra.append(claim)
    write_input(tmp_path, *extra)
    assert main(["simulate", str(tmp_path), "--quiet"]) == EXIT_INVALID_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert obj in err and field in err, err


def test_snapshot_writes_what_the_pool_publishes(tmp_path: Path) -> None:
    write_input(tmp_path, pod_doc("[{name: gpus, resourceClaimTemplateName: two}]"))
    objects = normalised(list(iter_documents([tmp_path])))
    kinds = [o["kind"] for o in objects]
    assert kinds[:5] == ["Node", "Node", "DeviceClass", "ResourceSlice", "ResourceSlice"]
    assert "NodePool" not in kinds
    (tmp_path / "base.yaml").unlink()
    (tmp_path / "more.yaml").write_text(yaml.safe_dump_all(objects))
    again = load([tmp_path])
    assert [s["spec"]["nodeName"] for s in again.dra.resource_slices] == ["h100-0", "h100-1"]


# ------------------------------------------------------------- claim controller


def _controller(*claims: dict[str, Any]) -> tuple[ClaimController, ClusterCache]:
    template = yaml.safe_load(BASE.split("---\n")[2])
    dra = DraObjects(claim_templates=[template], resource_claims=list(claims))
    cache = ClusterCache("kai-ray")
    return ClaimController(dra, cache, DraSettings()), cache


def _pod(name: str, uid: str, entries: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"resourceClaims": entries, "containers": []},
    }


def _allocation(name: str, *devices: str, new: bool = True) -> ClaimAllocation:
    results = tuple(DeviceResult("gpus", DeviceRef(DRIVER, "h100-0", d)) for d in devices)
    return ClaimAllocation("ml", name, results, node_name_selector("h100-0"), new=new)


def _claim_in_cache(cache: ClusterCache, key: str) -> dict[str, Any] | None:
    found = cache.get(RESOURCE_CLAIM, key)
    return None if found is None else dict(found)


def test_a_template_entry_gets_a_claim_owned_by_the_pod() -> None:
    claims, cache = _controller()
    pod = _pod("train-0", "uid-0", [{"name": "gpus", "resourceClaimTemplateName": "two"}])
    claims.pod_created(pod)
    assert pod["status"]["resourceClaimStatuses"] == [
        {"name": "gpus", "resourceClaimName": "train-0-gpus"}
    ]
    made = _claim_in_cache(cache, "ml/train-0-gpus")
    assert made is not None
    assert made["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    (owner,) = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", "train-0", "uid-0")
    assert [c["metadata"]["name"] for c in cache.objects().resource_claims] == ["train-0-gpus"]


def test_a_gone_pod_releases_and_deletes_its_template_claim() -> None:
    claims, cache = _controller()
    pod = _pod("train-0", "uid-0", [{"name": "gpus", "resourceClaimTemplateName": "two"}])
    claims.pod_created(pod)
    claims.write(
        "ml",
        "train-0-gpus",
        _allocation("train-0-gpus", "gpu-0", "gpu-1"),
        Consumer("train-0", "uid-0"),
    )
    assert claims.devices_held() == {
        DeviceRef(DRIVER, "h100-0", "gpu-0"),
        DeviceRef(DRIVER, "h100-0", "gpu-1"),
    }
    claims.pod_gone(pod)
    assert _claim_in_cache(cache, "ml/train-0-gpus") is None
    assert claims.devices_held() == set()
    assert "resourceClaimStatuses" not in pod["status"]


def _shared_claim() -> dict[str, Any]:
    raw = yaml.safe_load(CLAIM.format(cls="gpu.example.com", expression="true"))
    raw["metadata"]["name"] = "shared"
    return dict(raw)


def test_a_shared_claim_is_deallocated_only_when_its_last_pod_goes() -> None:
    claims, cache = _controller(_shared_claim())
    entry = [{"name": "gpus", "resourceClaimName": "shared"}]
    first, second = _pod("a", "uid-a", entry), _pod("b", "uid-b", entry)
    claims.write("ml", "shared", _allocation("shared", "gpu-3"), Consumer("a", "uid-a"))
    claims.write("ml", "shared", _allocation("shared", "gpu-3", new=False), Consumer("b", "uid-b"))
    claims.pod_gone(first)
    kept = _claim_in_cache(cache, "ml/shared")
    assert kept is not None
    assert [r["uid"] for r in kept["status"]["reservedFor"]] == ["uid-b"]
    assert kept["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-3"
    claims.pod_gone(second)
    released = _claim_in_cache(cache, "ml/shared")
    assert released is not None  # named by the pods, not made for them: it stays
    assert "allocation" not in released["status"] and released["status"]["reservedFor"] == []
    assert CLAIM_FINALIZER not in (released["metadata"].get("finalizers") or [])


# ------------------------------------------------------------- the writer


def _simulation(tmp_path: Path) -> Simulation:
    claim = yaml.safe_load(CLAIM.format(cls="gpu.example.com", expression="true"))
    claim["metadata"]["name"] = "shared"
    (tmp_path / "base.yaml").write_text(BASE + "---\n" + yaml.safe_dump(claim))
    return Simulation(load([tmp_path]))


def test_write_claim_allocates_reserves_and_bumps_the_version(tmp_path: Path) -> None:
    sim = _simulation(tmp_path)
    writer = SimWriter(sim)
    before = copy.deepcopy(sim.claims.claims["ml/shared"])
    result = writer.write_claim(
        "ml", "shared", _allocation("shared", "gpu-1"), Consumer("a", "uid-a")
    )
    assert result.ok
    after = sim.cache.get(RESOURCE_CLAIM, "ml/shared")
    assert after is not None
    assert after["metadata"]["finalizers"] == [CLAIM_FINALIZER]
    assert after["status"]["reservedFor"] == [{"resource": "pods", "name": "a", "uid": "uid-a"}]
    assert after["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpus", "driver": DRIVER, "pool": "h100-0", "device": "gpu-1"}
    ]
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert "ml/shared" in sim.cache.snapshot().dra.claims
    assert sim.cache.snapshot().dra.taken == {DeviceRef(DRIVER, "h100-0", "gpu-1")}


def test_allocating_an_allocated_claim_again_is_refused(tmp_path: Path) -> None:
    writer = SimWriter(sim := _simulation(tmp_path))
    assert writer.write_claim(
        "ml", "shared", _allocation("shared", "gpu-1"), Consumer("a", "uid-a")
    ).ok
    again = writer.write_claim(
        "ml", "shared", _allocation("shared", "gpu-2"), Consumer("b", "uid-b")
    )
    assert not again.ok and "allocated already" in again.message
    assert sim.claims.devices_held() == {DeviceRef(DRIVER, "h100-0", "gpu-1")}
    missing = writer.write_claim(
        "ml", "ghost", _allocation("ghost", "gpu-2"), Consumer("b", "uid-b")
    )
    assert not missing.ok and "not found" in missing.message


def test_release_claim_deallocates_when_nobody_reserves_it(tmp_path: Path) -> None:
    writer = SimWriter(sim := _simulation(tmp_path))
    writer.write_claim("ml", "shared", _allocation("shared", "gpu-1"), Consumer("a", "uid-a"))
    assert writer.release_claim("ml", "shared", "uid-a").ok
    claim = sim.cache.get(RESOURCE_CLAIM, "ml/shared")
    assert claim is not None
    assert "allocation" not in claim["status"] and "finalizers" not in claim["metadata"]
    assert sim.cache.snapshot().dra.taken == frozenset()
    assert writer.release_claim("ml", "ghost", "uid-a").ok  # gone already: nothing to free


def test_a_device_given_to_two_claims_breaks_an_invariant(tmp_path: Path) -> None:
    sim = _simulation(tmp_path)
    pod = _pod("p", "uid-p", [{"name": "gpus", "resourceClaimTemplateName": "two"}])
    sim.claims.pod_created(pod)
    sim.claims.write("ml", "shared", _allocation("shared", "gpu-1"), Consumer("a", "uid-a"))
    with pytest.raises(InvariantViolation, match="gpu-1 given to two claims"):
        sim.claims.write("ml", "p-gpus", _allocation("p-gpus", "gpu-1"), Consumer("p", "uid-p"))


def test_simulated_pods_get_uids_and_their_template_claims(tmp_path: Path) -> None:
    write_input(tmp_path, pod_doc("[{name: gpus, resourceClaimTemplateName: two}]"))
    sim = Simulation(load([tmp_path]), until=0.0)
    sim.run()
    pod = sim.pods["ml/p"]
    assert pod["metadata"]["uid"]
    claim = sim.cache.get(RESOURCE_CLAIM, "ml/p-gpus")
    assert claim is not None
    assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    cached = sim.cache.pod("ml/p")
    assert cached is not None
    assert cached["status"]["resourceClaimStatuses"] == [
        {"name": "gpus", "resourceClaimName": "p-gpus"}
    ]


def test_bad_input_is_an_invalid_object_error(tmp_path: Path) -> None:
    write_input(tmp_path, pod_doc("[{name: gpus, resourceClaimTemplateName: ghost}]"))
    with pytest.raises(InvalidObjectError, match="no ResourceClaimTemplate named 'ghost'"):
        load([tmp_path])


# ------------------------------------------------------------- over a run

TIMED_POD = dedent(
    """\
    apiVersion: v1
    kind: Pod
    metadata:
      name: p
      namespace: ml
      labels: {kai-ray.io/queue: team}
      annotations: {sim.kai-ray.io/duration: 1h}
    spec:
      schedulerName: kai-ray
      resourceClaims: [{name: gpus, resourceClaimTemplateName: two}]
      containers: [{name: c, resources: {requests: {cpu: "1"}}}]
    """
)


def test_a_finished_pod_leaves_no_claim_and_no_device_taken(tmp_path: Path) -> None:
    sim = Simulation(load([write_input(tmp_path, TIMED_POD)]), until=1800.0)
    sim.run()
    (binding,) = sim.bindings.values()
    (claim,) = binding.claims
    assert claim["name"] == "ml/p-gpus" and len(claim["devices"]) == 2
    assert len(sim.cache.snapshot().dra.taken) == 2
    sim = Simulation(load([tmp_path]))
    sim.run()
    assert sim.jobs["ml/pod-p"].record.finished_s == 3600.0
    assert sim.cache.objects().resource_claims == []
    assert sim.cache.snapshot().dra.taken == frozenset()


def test_a_failed_pod_is_made_again_with_a_new_uid_and_a_new_claim(tmp_path: Path) -> None:
    sim = Simulation(load([write_input(tmp_path, TIMED_POD)]), until=60.0)
    sim.run()
    old_uid = sim.pods["ml/p"]["metadata"]["uid"]
    old = sim.cache.get(RESOURCE_CLAIM, "ml/p-gpus")
    assert old is not None and old["status"]["reservedFor"][0]["uid"] == old_uid
    sim.fail_pod("ml/p", "failed")
    new_uid = sim.pods["ml/p"]["metadata"]["uid"]
    assert new_uid != old_uid
    made = sim.cache.get(RESOURCE_CLAIM, "ml/p-gpus")
    assert made is not None
    assert made["metadata"]["ownerReferences"][0]["uid"] == new_uid
    assert "allocation" not in (made.get("status") or {})
    assert sim.cache.snapshot().dra.taken == frozenset()
