"""DRA claims through the whole cycle: the devices a pod gets, where, and what they count as."""

from __future__ import annotations

from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.state.cache import ClusterCache
from kai_ray.state.dra_view import NVLINK_DOMAIN_LABEL
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.dra import DraSettings
from tests.builders import make_node, make_pod, make_pod_group, make_queue
from tests.unit.dra_builders import GPU_CLASS, device_class, exact, make_slice

NS = "team-a"
MAPPED = DraSettings(deviceClasses={GPU_CLASS: "gpu"}, nvlinkDomainAttribute=None)


def dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True, by_alias=True)
    return out


def raw_claim(
    name: str,
    *requests: dict[str, Any],
    status: dict[str, Any] | None = None,
    constraints: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": list(requests), "constraints": constraints or []}},
    }
    if status is not None:
        claim["status"] = status
    return claim


def claim_pod(
    name: str, group: str, *claims: str, template: str | None = None, node: str | None = None
) -> dict[str, Any]:
    builder = make_pod(name, NS).group(group).cpu(1)
    if node is not None:
        builder = builder.on(node).phase("Running")
    pod = builder.build()
    entries: list[dict[str, Any]] = [
        {"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)
    ]
    if template is not None:
        entries.append({"name": "t", "resourceClaimTemplateName": template})
    pod["spec"]["resourceClaims"] = entries
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def group(name: str, members: int, queue: str = "team") -> dict[str, Any]:
    built: dict[str, Any] = make_pod_group(name, NS).queue(queue).min_member(members).build()
    return built


def two_models() -> list[dict[str, Any]]:
    return [
        dump(make_slice("n0").gpus(8, product="H100").build()),
        dump(make_slice("n1").gpus(8, product="A100").build()),
    ]


def cluster(
    pods: list[dict[str, Any]],
    groups: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    slices: list[dict[str, Any]] | None = None,
    nodes: int = 2,
    settings: DraSettings = MAPPED,
    queue_gpu_limit: int | None = None,
) -> ClusterObjects:
    team = make_queue("team")
    if queue_gpu_limit is not None:
        team = team.gpu(limit=queue_gpu_limit)
    return ClusterObjects(
        nodes=[make_node(f"n{i}").cpu(64).build() for i in range(nodes)],
        pods=pods,
        pod_groups=groups,
        queues=[team.build()],
        device_classes=[dump(device_class())],
        resource_slices=slices if slices is not None else two_models(),
        resource_claims=claims,
        dra=settings,
    )


def cycle(objects: ClusterObjects, strategy: str = "binpack") -> tuple[Snapshot, CycleResult]:
    snapshot = build_snapshot(objects)
    spec = {"actions": ["allocate"], "placementStrategy": strategy}
    config = SchedulerConfig.model_validate({"spec": spec})
    return snapshot, run_cycle(snapshot, config, 1, 100.0)


def test_a_claim_for_one_model_gets_devices_of_that_model_on_its_node() -> None:
    claim = raw_claim(
        "c-a100",
        exact(count=4, selectors=['device.attributes["gpu.example.com"].productName == "A100"']),
    )
    objects = cluster([claim_pod("p", "g", "c-a100")], [group("g", 1)], [claim])
    snapshot, result = cycle(objects)
    assert snapshot.allocatable[snapshot.node_index["n1"], snapshot.column("gpu")] == 8
    (bind,) = result.plan.binds
    assert bind.node == "n1"
    (allocation,) = bind.claims
    assert allocation.new
    assert len(allocation.devices) == 4
    assert {d.ref.pool for d in allocation.devices} == {"n1"}


def test_the_pods_of_a_gang_get_distinct_devices() -> None:
    claims = [raw_claim(f"c{i}", exact(count=6)) for i in range(3)]
    pods = [claim_pod(f"p{i}", "g", f"c{i}") for i in range(3)]
    objects = cluster(
        pods,
        [group("g", 3)],
        claims,
        nodes=3,
        slices=[dump(make_slice(f"n{i}").gpus(8).build()) for i in range(3)],
    )
    _, result = cycle(objects)
    assert len(result.plan.binds) == 3
    devices = [d.ref for b in result.plan.binds for c in b.claims for d in c.devices]
    assert len(devices) == len(set(devices)) == 18
    assert len({b.node for b in result.plan.binds}) == 3  # 6 + 6 does not fit 8 devices


def test_devices_held_by_allocated_claims_are_not_given_again() -> None:
    held = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": "gpu.example.com",
                        "pool": "n1",
                        "device": f"gpu-{i}",
                    }
                    for i in range(6)
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "busy", "uid": "uid-busy"}],
    }
    claims = [raw_claim("held", exact(count=6), status=held), raw_claim("want", exact(count=4))]
    pods = [claim_pod("busy", "b", "held", node="n1"), claim_pod("p", "g", "want")]
    slices = [dump(make_slice("n1").gpus(8).build())]
    objects = cluster(pods, [group("b", 1), group("g", 1)], claims, slices=slices)
    snapshot, result = cycle(objects)
    n1 = snapshot.node_index["n1"]
    assert snapshot.used[n1, snapshot.column("gpu")] == 6
    assert result.plan.binds == []  # 2 devices left on the only node with any
    reason = result.plan.status_of(f"{NS}/g").reason
    assert "lacks free nvidia.com/gpu" in reason, reason


def test_a_claim_shared_by_a_gang_is_allocated_once_and_reused() -> None:
    claims = [raw_claim("shared", exact(count=2))]
    pods = [claim_pod("p0", "g", "shared"), claim_pod("p1", "g", "shared")]
    objects = cluster(pods, [group("g", 2)], claims)
    snapshot, result = cycle(objects)
    binds = sorted(result.plan.binds, key=lambda b: b.pod)
    assert len(binds) == 2
    assert binds[0].node == binds[1].node
    flags = sorted(c.new for b in binds for c in b.claims)
    assert flags == [False, True]
    # counted once, in its first user
    assert snapshot.pods[f"{NS}/p0"].requests["gpu"] == 2
    assert snapshot.pods[f"{NS}/p1"].requests["gpu"] == 0


def test_devices_of_a_mapped_class_count_towards_the_queue_limit() -> None:
    claims = [raw_claim(f"c{i}", exact(count=8)) for i in range(2)]
    pods = [claim_pod(f"p{i}", f"g{i}", f"c{i}") for i in range(2)]
    slices = [dump(make_slice(f"n{i}").gpus(8).build()) for i in range(2)]
    objects = cluster(
        pods, [group("g0", 1), group("g1", 1)], claims, slices=slices, queue_gpu_limit=8
    )
    _, result = cycle(objects)
    assert len(result.plan.binds) == 1


def test_a_pod_whose_template_claim_is_not_made_waits_and_says_so() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tpl", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [exact(count=2)]}}},
    }
    objects = cluster([claim_pod("p", "g", template="tpl")], [group("g", 1)], [])
    objects = ClusterObjects(**{**objects.__dict__, "claim_templates": [template]})
    snapshot, result = cycle(objects)
    assert snapshot.pods[f"{NS}/p"].requests["gpu"] == 2  # asked for, from the template
    assert result.plan.binds == []
    reason = result.plan.status_of(f"{NS}/g").reason
    assert "not made yet" in reason and "tpl" in reason


def test_a_malformed_selector_is_a_problem_naming_the_claim_and_field() -> None:
    claims = [raw_claim("bad", exact(count=1, selectors=["device.attributes[ nope"]))]
    objects = cluster([claim_pod("p", "g", "bad")], [group("g", 1)], claims)
    snapshot, result = cycle(objects)
    found = [str(p) for p in snapshot.problems if "bad" in str(p)]
    assert any("spec.devices.requests[0].exactly.selectors[0].cel.expression" in p for p in found)
    assert result.plan.binds == []
    assert "ResourceClaim team-a/bad" in result.plan.status_of(f"{NS}/g").reason


def test_the_cache_reads_claims_as_a_fresh_build_does() -> None:
    claims = [raw_claim("c0", exact(count=4)), raw_claim("shared", exact(count=2))]
    pods = [
        claim_pod("p0", "g", "c0"),
        claim_pod("p1", "g", "shared"),
        claim_pod("p2", "g", "shared"),
    ]
    objects = cluster(pods, [group("g", 3)], claims)
    cache = ClusterCache(dra=MAPPED)
    for kind, objs in (
        ("Node", objects.nodes),
        ("Queue", objects.queues),
        ("DeviceClass", objects.device_classes),
        ("ResourceSlice", objects.resource_slices),
        ("ResourceClaim", objects.resource_claims),
        ("PodGroup", objects.pod_groups),
        ("Pod", objects.pods),
    ):
        for obj in objs:
            cache.upsert(obj, kind)
    kept, fresh = cache.snapshot(), build_snapshot(cache.objects())
    assert kept.resource_names == fresh.resource_names
    assert (kept.allocatable == fresh.allocatable).all()
    assert {k: p.requests for k, p in kept.pods.items()} == {
        k: p.requests for k, p in fresh.pods.items()
    }
    assert kept.dra.taken == fresh.dra.taken
    # an allocation arriving on the watch: the claim's user is read again
    allocated = raw_claim(
        "c0",
        exact(count=4),
        status={
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpus",
                            "driver": "gpu.example.com",
                            "pool": "n0",
                            "device": f"gpu-{i}",
                        }
                        for i in range(4)
                    ]
                }
            }
        },
    )
    cache.upsert(allocated, "ResourceClaim")
    kept = cache.snapshot()
    assert len(kept.dra.taken) == 4
    assert kept.dra.taken == build_snapshot(cache.objects()).dra.taken


def test_unmapped_devices_are_never_given_twice_in_one_cycle() -> None:
    """No queue resource tracks an unmapped class: the transaction's devices do."""
    claims = [raw_claim(f"c{i}", exact(count=6)) for i in range(2)]
    pods = [claim_pod(f"p{i}", f"g{i}", f"c{i}") for i in range(2)]
    slices = [dump(make_slice("n0").gpus(8).build())]
    objects = cluster(
        pods,
        [group("g0", 1), group("g1", 1)],
        claims,
        slices=slices,
        nodes=1,
        settings=DraSettings(),
    )
    snapshot, result = cycle(objects)
    assert snapshot.allocatable[0, snapshot.column("gpu")] == 0
    (bind,) = result.plan.binds
    reason = result.plan.status_of(f"{NS}/g1" if bind.pod.endswith("p0") else f"{NS}/g0").reason
    assert "needs 6 devices of class gpu.example.com on n0; 2 free of 8" in reason, reason


def test_evicting_the_last_user_of_a_claim_frees_its_devices() -> None:
    from kai_ray.decisions.placement.claims import allocation_on
    from kai_ray.decisions.transaction import Transaction
    from kai_ray.state.dra_allocate import Allocation, Unallocatable

    held = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": "gpu.example.com",
                        "pool": "n0",
                        "device": f"gpu-{i}",
                    }
                    for i in range(8)
                ]
            }
        }
    }
    claims = [raw_claim("held", exact(count=8), status=held), raw_claim("want", exact(count=8))]
    pods = [claim_pod("busy", "b", "held", node="n0"), claim_pod("p", "g", "want")]
    slices = [dump(make_slice("n0").gpus(8).build())]
    objects = cluster(pods, [group("b", 1), group("g", 1)], claims, slices=slices, nodes=1)
    snapshot = build_snapshot(objects)
    tx = Transaction(snapshot)
    waiting = snapshot.pods[f"{NS}/p"]
    assert isinstance(allocation_on(tx, waiting, 0), Unallocatable)
    mark = tx.checkpoint()
    tx.evict(snapshot.pods[f"{NS}/busy"], f"{NS}/b")
    assert isinstance(allocation_on(tx, waiting, 0), Allocation)
    tx.rollback(mark)
    assert isinstance(allocation_on(tx, waiting, 0), Unallocatable)


def test_a_gang_required_in_one_nvlink_domain_is_placed_inside_one() -> None:
    from tests.builders import make_topology
    from tests.unit.dra_builders import CLIQUE

    settings = DraSettings(deviceClasses={GPU_CLASS: "gpu"}, nvlinkDomainAttribute=CLIQUE)
    cliques = {"n0": "c0", "n1": "c0", "n2": "c1", "n3": "c1"}
    slices = [dump(make_slice(n).gpus(8, clique=c).build()) for n, c in cliques.items()]
    held = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": "gpu.example.com",
                        "pool": "n0",
                        "device": f"gpu-{i}",
                    }
                    for i in range(6)
                ]
            }
        }
    }
    claims = [raw_claim("held", exact(count=6), status=held)]
    claims += [raw_claim(f"c{i}", exact(count=8)) for i in range(2)]
    pods = [claim_pod("busy", "b", "held", node="n0")]
    pods += [claim_pod(f"p{i}", "g", f"c{i}") for i in range(2)]
    gang = make_pod_group("g", NS).queue("team").min_member(2)
    gang = gang.topology("nvlink", required=NVLINK_DOMAIN_LABEL)
    objects = cluster(
        pods, [group("b", 1), gang.build()], claims, slices=slices, nodes=4, settings=settings
    )
    objects = ClusterObjects(
        **{
            **objects.__dict__,
            "topologies": [make_topology("nvlink", NVLINK_DOMAIN_LABEL).hostname().build()],
        }
    )
    snapshot, result = cycle(objects)
    assert snapshot.labels[snapshot.node_index["n2"]][NVLINK_DOMAIN_LABEL] == "c1"
    assert sorted(b.node for b in result.plan.binds) == ["n2", "n3"]
    assert {d.ref.pool for b in result.plan.binds for c in b.claims for d in c.devices} == {
        "n2",
        "n3",
    }


def test_a_placeholder_counts_its_claim_templates_and_does_not_wait_for_claims() -> None:
    from kai_ray.values.names import PLACEHOLDER_ANNOTATION

    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tpl", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [exact(count=4)]}}},
    }
    pod = claim_pod("p", "g", template="tpl")
    pod["metadata"].setdefault("annotations", {})[PLACEHOLDER_ANNOTATION] = "true"
    objects = cluster([pod], [group("g", 1)], [])
    objects = ClusterObjects(**{**objects.__dict__, "claim_templates": [template]})
    snapshot, result = cycle(objects)
    placeholder = snapshot.pods[f"{NS}/p"]
    assert placeholder.requests["gpu"] == 4
    assert placeholder.claim_wait == ""
    (bind,) = result.plan.binds
    assert bind.claims == ()


def shareable_slice(node: str, devices: int) -> dict[str, Any]:
    raw = dump(make_slice(node).gpus(devices, memory="80Gi").build())
    for device in raw["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
    return raw


def test_claims_for_part_of_a_device_are_packed_as_fractional_gpus() -> None:
    claims = [
        raw_claim(f"c{i}", exact(capacity={"requests": {"memory": "30Gi"}})) for i in range(3)
    ]
    pods = [claim_pod(f"p{i}", f"g{i}", f"c{i}") for i in range(3)]
    slices = [shareable_slice(n, 2) for n in ("n0", "n1")]
    objects = cluster(pods, [group(f"g{i}", 1) for i in range(3)], claims, slices=slices)
    snapshot, result = cycle(objects)
    pod = snapshot.pods[f"{NS}/p0"]
    assert pod.gpu_fraction == 30 / 80 and pod.requests["gpu"] == 0
    binds = sorted(result.plan.binds, key=lambda b: b.pod)
    assert len(binds) == 3 and len({b.node for b in binds}) == 1  # packed on one node
    assert all(b.gpu_fraction == 30 / 80 for b in binds)
    shares = [b.claims[0].devices[0] for b in binds]
    assert all(d.shared for d in shares)
    assert sorted(d.ref.device for d in shares) == ["gpu-0", "gpu-0", "gpu-1"]


def test_an_allocated_share_counts_what_it_consumes_and_leaves_the_rest() -> None:
    held = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": "gpu.example.com",
                        "pool": "n0",
                        "device": "gpu-0",
                        "consumedCapacity": {"memory": "60Gi"},
                        "shareID": "6f1f5f64-0000-4000-8000-000000000001",
                    }
                ]
            }
        },
    }
    claims = [
        raw_claim("held", exact(capacity={"requests": {"memory": "60Gi"}}), status=held),
        raw_claim("want", exact(capacity={"requests": {"memory": "30Gi"}})),
    ]
    pods = [claim_pod("busy", "b", "held", node="n0"), claim_pod("p", "g", "want")]
    objects = cluster(
        pods, [group("b", 1), group("g", 1)], claims, slices=[shareable_slice("n0", 1)], nodes=1
    )
    snapshot, result = cycle(objects)
    assert snapshot.pods[f"{NS}/busy"].gpu_fraction == 60 / 80
    assert result.plan.binds == []  # 20Gi of the one device left
    reason = result.plan.status_of(f"{NS}/g").reason
    assert "has no GPU device with room for the share" in reason, reason


def test_a_claim_on_a_pooled_device_of_a_mapped_class_fits_and_counts_in_no_queue() -> None:
    pool = make_slice(None).gpus(1, product="switch").build()
    slices = [dump(make_slice("n0").gpus(8).build()), dump(pool)]
    selector = 'device.attributes["gpu.example.com"].productName == "switch"'
    claims = [raw_claim("sw", exact(count=1, selectors=[selector]))]
    objects = cluster([claim_pod("p", "g", "sw")], [group("g", 1)], claims, slices=slices, nodes=1)
    snapshot, result = cycle(objects)
    assert snapshot.pods[f"{NS}/p"].requests["gpu"] == 0
    (bind,) = result.plan.binds
    assert [d.ref.pool for d in bind.claims[0].devices] == ["shared"]
