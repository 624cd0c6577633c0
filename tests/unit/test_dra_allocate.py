"""The DRA allocator: devices for a pod's claims on one node, or a reason."""

from __future__ import annotations

import pickle
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.state.dra import (
    DeviceRef,
    allocated_resources,
    nvlink_domains,
    requested_resources,
)
from kai_ray.state.dra_allocate import Allocation, Unallocatable, allocate
from kai_ray.values.dra import DraSettings, ResourceClaim, ResourceSlice
from kai_ray.values.node_selector import node_name_selector
from kai_ray.values.resources import GPU
from tests.unit.dra_builders import (
    CLIQUE,
    GPU_CLASS,
    claim,
    device_class,
    exact,
    inventory,
    make_slice,
)

H100 = 'device.attributes["gpu.example.com"].productName == "H100"'


def ok(result: Allocation | Unallocatable) -> Allocation:
    assert isinstance(result, Allocation), result
    return result


def refused(result: Allocation | Unallocatable) -> str:
    assert isinstance(result, Unallocatable), result
    return result.reason


def names(allocation: Allocation) -> list[str]:
    return [d.ref.device for c in allocation.claims for d in c.devices]


def test_exact_count_takes_the_first_matching_free_devices() -> None:
    inv = inventory(make_slice("n1").gpus(4).build())
    taken = {DeviceRef("gpu.example.com", "n1", "gpu-0")}
    allocation = ok(allocate([claim("c", exact(count=2))], "n1", inv, taken))
    assert names(allocation) == ["gpu-1", "gpu-2"]
    assert allocation.claims[0].node_selector == node_name_selector("n1")
    assert allocation.taken == {DeviceRef("gpu.example.com", "n1", f"gpu-{i}") for i in (1, 2)}


def test_count_defaults_to_one() -> None:
    inv = inventory(make_slice("n1").gpus(2).build())
    assert names(ok(allocate([claim("c", exact())], "n1", inv, set()))) == ["gpu-0"]


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        pytest.param([H100], ["gpu-2"], id="a claim that fits one device model only"),
        pytest.param(
            ['device.capacity["gpu.example.com"].memory.compareTo(quantity("100Gi")) >= 0'],
            ["gpu-0"],
            id="by memory capacity",
        ),
    ],
)
def test_claim_selectors_choose_the_model(selectors: list[str], expected: list[str]) -> None:
    slice_ = (
        make_slice("n1")
        .gpu("gpu-0", product="H200", memory="141Gi")
        .gpu("gpu-1", product="A100", memory="40Gi")
        .gpu("gpu-2", product="H100")
        .build()
    )
    inv = inventory(slice_)
    assert (
        names(ok(allocate([claim("c", exact(selectors=selectors))], "n1", inv, set()))) == expected
    )


def test_the_device_class_selects_too() -> None:
    gpus = make_slice("n1").gpus(2).build()
    nics = make_slice("n1", driver="nic.example.com").gpu("nic-0").build()
    classes = [device_class("nic.example.com", 'device.driver == "nic.example.com"')]
    inv = inventory(gpus, nics, classes=classes)
    request = exact(device_class_name="nic.example.com")
    assert names(ok(allocate([claim("c", request)], "n1", inv, set()))) == ["nic-0"]


def test_all_takes_every_matching_device_and_waits_while_one_is_taken() -> None:
    inv = inventory(make_slice("n1").gpus(3).gpu("gpu-a", product="A100").build())
    request = exact(mode="All", selectors=[H100])
    assert names(ok(allocate([claim("c", request)], "n1", inv, set()))) == [
        "gpu-0",
        "gpu-1",
        "gpu-2",
    ]
    busy = {DeviceRef("gpu.example.com", "n1", "gpu-1")}
    assert "1 are taken" in refused(allocate([claim("c", request)], "n1", inv, busy))


def test_all_with_no_device_is_refused() -> None:
    inv = inventory(make_slice("n1").gpus(2, product="A100").build())
    reason = refused(allocate([claim("c", exact(mode="All", selectors=[H100]))], "n1", inv, set()))
    assert "there are none" in reason


def test_match_attribute_keeps_the_devices_in_one_clique() -> None:
    slice_ = make_slice("n1").gpus(3, clique="c0").gpus(4, start=3, clique="c1").build()
    inv = inventory(slice_)
    gang = claim("c", exact(count=4), constraints=[{"matchAttribute": CLIQUE}])
    assert names(ok(allocate([gang], "n1", inv, set()))) == ["gpu-3", "gpu-4", "gpu-5", "gpu-6"]
    busy = {DeviceRef("gpu.example.com", "n1", "gpu-6")}
    reason = refused(allocate([gang], "n1", inv, busy))
    assert "constraints" in reason and CLIQUE in reason


def test_match_attribute_across_two_requests() -> None:
    slice_ = make_slice("n1").gpus(2, clique="c0").gpus(2, start=2, clique="c1").build()
    inv = inventory(slice_)
    busy = {DeviceRef("gpu.example.com", "n1", "gpu-1")}
    two = claim(
        "c",
        exact("a"),
        exact("b"),
        constraints=[{"requests": ["a", "b"], "matchAttribute": CLIQUE}],
    )
    allocation = ok(allocate([two], "n1", inv, busy))
    assert [(d.request, d.ref.device) for d in allocation.claims[0].devices] == [
        ("a", "gpu-2"),
        ("b", "gpu-3"),
    ]


def test_a_device_without_the_matched_attribute_is_not_chosen() -> None:
    inv = inventory(make_slice("n1").gpu("gpu-0").gpu("gpu-1", clique="c0").build())
    one = claim("c", exact(), constraints=[{"matchAttribute": CLIQUE}])
    assert names(ok(allocate([one], "n1", inv, set()))) == ["gpu-1"]


def test_distinct_attribute_spreads_over_cliques() -> None:
    slice_ = make_slice("n1").gpus(2, clique="c0").gpus(2, start=2, clique="c1").build()
    two = claim("c", exact(count=2), constraints=[{"distinctAttribute": CLIQUE}])
    assert names(ok(allocate([two], "n1", inventory(slice_), set()))) == ["gpu-0", "gpu-2"]


def test_first_available_falls_back_to_the_next_choice() -> None:
    inv = inventory(make_slice("n1").gpus(2, product="A100").build())
    request = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "h100",
                "deviceClassName": GPU_CLASS,
                "selectors": [{"cel": {"expression": H100}}],
            },
            {"name": "any", "deviceClassName": GPU_CLASS, "count": 2},
        ],
    }
    allocation = ok(allocate([claim("c", request)], "n1", inv, set()))
    assert [d.request for d in allocation.claims[0].devices] == ["gpu/any", "gpu/any"]


def test_two_claims_of_one_pod_never_share_a_device() -> None:
    inv = inventory(make_slice("n1").gpus(3).build())
    allocation = ok(allocate([claim("a", exact(count=2)), claim("b", exact())], "n1", inv, set()))
    assert names(allocation) == ["gpu-0", "gpu-1", "gpu-2"]
    assert "needs 2" in refused(
        allocate([claim("a", exact(count=2)), claim("b", exact(count=2))], "n1", inv, set())
    )


def test_a_shared_claim_already_allocated_is_reused_where_reachable() -> None:
    inv = inventory(make_slice("n1").gpus(1).build(), make_slice("n2").gpus(1).build())
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpus",
                        "driver": "gpu.example.com",
                        "pool": "n1",
                        "device": "gpu-0",
                    }
                ]
            },
            "nodeSelector": node_name_selector("n1").model_dump(exclude_defaults=True),
        }
    }
    shared = claim("gang", exact(), status=status)
    again = ok(allocate([shared], "n1", inv, {DeviceRef("gpu.example.com", "n1", "gpu-0")}))
    assert not again.claims[0].new and again.taken == frozenset()
    assert "cannot reach" in refused(allocate([shared], "n2", inv, set()))


def test_pool_devices_reach_the_nodes_their_selector_names() -> None:
    nics = make_slice(None, driver="nic.example.com").selector("rack", "r1").gpu("nic-0").build()
    classes = [device_class(), device_class("nic.example.com")]
    nodes = {"n1": {"rack": "r1"}, "n2": {"rack": "r2"}}
    inv = inventory(nics, classes=classes, nodes=nodes)
    request = exact(device_class_name="nic.example.com")
    allocation = ok(allocate([claim("c", request)], "n1", inv, set()))
    assert allocation.claims[0].node_selector == nics.spec.nodeSelector
    assert "0 free of 0" in refused(allocate([claim("c", request)], "n2", inv, set()))


def test_devices_for_all_nodes_need_no_node_selector() -> None:
    inv = inventory(make_slice(None).gpus(1).build(), nodes={"n1": {}})
    assert ok(allocate([claim("c", exact())], "n1", inv, set())).claims[0].node_selector is None


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = make_slice("n1").gpus(4).in_pool("n1", generation=1).build()
    new = make_slice("n1").gpus(2).in_pool("n1", generation=2).build()
    inv = inventory(old, new)
    assert "needs 3" in refused(allocate([claim("c", exact(count=3))], "n1", inv, set()))


def test_a_tainted_device_only_for_requests_that_tolerate_it() -> None:
    inv = inventory(make_slice("n1").gpu("gpu-0", taint="example.com/ecc").gpu("gpu-1").build())
    assert names(ok(allocate([claim("c", exact())], "n1", inv, set()))) == ["gpu-1"]
    tolerant = exact(tolerations=[{"key": "example.com/ecc", "operator": "Exists"}], count=2)
    assert names(ok(allocate([claim("c", tolerant)], "n1", inv, set()))) == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    ("claims_selectors", "class_selectors", "words"),
    [
        pytest.param(
            ['device.attributes["gpu.example.com"'],
            [],
            "ResourceClaim team-a/c: spec.devices.requests[0].exactly.selectors[0].cel.expression:",
            id="a malformed claim selector names the claim and the field",
        ),
        pytest.param(
            [],
            ["device.driver =="],
            "DeviceClass gpu.example.com: spec.selectors[0].cel.expression:",
            id="a malformed class selector names the class and the field",
        ),
        pytest.param(
            ['device.attributes["gpu.example.com"].nope == 1'],
            [],
            "selectors[0].cel.expression: on device gpu.example.com/n1/gpu-0:",
            id="a selector failing on a device names the device",
        ),
    ],
)
def test_malformed_selectors_are_reasons_not_crashes(
    claims_selectors: list[str], class_selectors: list[str], words: str
) -> None:
    inv = inventory(
        make_slice("n1").gpus(1).build(), classes=[device_class(GPU_CLASS, *class_selectors)]
    )
    reason = refused(allocate([claim("c", exact(selectors=claims_selectors))], "n1", inv, set()))
    assert words in reason


@pytest.mark.parametrize(
    ("request_body", "words"),
    [
        pytest.param(exact(device_class_name="nope"), "no DeviceClass 'nope'", id="unknown class"),
        pytest.param(exact(adminAccess=True), "admin access is not supported", id="admin access"),
        pytest.param(
            exact(capacity={"requests": {"memory": "100Gi"}}),
            "0 free of 0",
            id="a capacity request larger than any device",
        ),
        pytest.param(
            exact(mode="All", capacity={"requests": {"memory": "10Gi"}}),
            "capacity requests with allocationMode All are not supported",
            id="capacity requests for All",
        ),
    ],
)
def test_what_is_not_supported_is_refused_by_name(
    request_body: dict[str, object], words: str
) -> None:
    inv = inventory(make_slice("n1").gpus(1).build())
    assert words in refused(allocate([claim("c", request_body)], "n1", inv, set()))


def test_partitionable_devices_are_left_out_as_problems() -> None:
    slice_ = make_slice("n1").gpus(1).build()
    raw = slice_.model_dump(mode="json", by_alias=True, exclude_unset=True)
    raw["spec"]["devices"][0]["consumesCounters"] = [{"counterSet": "mem", "counters": {}}]
    inv = inventory(type(slice_).model_validate(raw))
    assert inv.devices_on("n1") == ()
    assert "shared counters" in inv.problems[0].message


def test_gpu_class_devices_count_as_gpus() -> None:
    inv = inventory(
        make_slice("n1").gpus(2).build(),
        classes=[device_class(), device_class("amd.example.com", resource="amd.com/gpu")],
    )
    mapping = DraSettings(deviceClasses={GPU_CLASS: "gpu"})
    eight = claim("c", exact(count=8), exact("amd", device_class_name="amd.example.com"))
    requested = requested_resources(eight, inv, mapping)
    assert requested[GPU] == 8 and requested["amd.com/gpu"] == 1
    assert allocated_resources(eight, ["gpus", "gpus", "amd"], inv, mapping)[GPU] == 2
    assert requested_resources(eight, inv, DraSettings())[GPU] == 0


def test_nvlink_domains_group_nodes_by_clique() -> None:
    inv = inventory(
        make_slice("n1").gpus(2, clique="c0").build(),
        make_slice("n2").gpus(2, clique="c0").build(),
        make_slice("n3").gpus(2, clique="c1").build(),
        make_slice("n4").gpus(2).build(),
    )
    assert nvlink_domains(inv, CLIQUE) == {
        "c0": frozenset({"n1", "n2"}),
        "c1": frozenset({"n3"}),
    }


# ------------------------------------------------------------------ properties


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, list[str], set[int], list[int], bool]:
    count = draw(st.integers(0, 10))
    cliques = draw(st.lists(st.sampled_from(["c0", "c1", "c2"]), min_size=count, max_size=count))
    taken = draw(st.sets(st.integers(0, max(count - 1, 0)), max_size=count))
    wants = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return count, cliques, taken, wants, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(worlds())
def test_never_a_device_twice_never_a_taken_one_never_more_than_there_are(
    world: tuple[int, list[str], set[int], list[int], bool],
) -> None:
    count, cliques, taken_indices, wants, same_clique = world
    builder = make_slice("n1")
    for i, clique in enumerate(cliques):
        builder.gpu(f"gpu-{i}", clique=clique)
    inv = inventory(builder.build())
    taken = {DeviceRef("gpu.example.com", "n1", f"gpu-{i}") for i in taken_indices if i < count}
    constraints = [{"matchAttribute": CLIQUE}] if same_clique else []
    claims = [claim(f"c{k}", exact(count=n), constraints=constraints) for k, n in enumerate(wants)]
    result = allocate(claims, "n1", inv, taken)
    free = count - len(taken)
    if isinstance(result, Unallocatable):
        # Without a constraint, refusing means there was not enough.
        assert same_clique or free < sum(wants)
        return
    given_out = [d.ref for c in result.claims for d in c.devices]
    assert len(given_out) == len(set(given_out)) == sum(wants) <= free
    assert not set(given_out) & taken
    for allocated, n in zip(result.claims, wants, strict=True):
        assert len(allocated.devices) == n
        if same_clique:
            values = Counter(cliques[int(d.ref.device.split("-")[1])] for d in allocated.devices)
            assert len(values) == 1


def test_a_search_too_large_stops_with_a_reason() -> None:
    builder = make_slice("n1")
    for i in range(30):
        builder.gpu(f"gpu-{i}", clique=f"c{i // 2}")
    distinct = claim("c", exact(count=16), constraints=[{"distinctAttribute": CLIQUE}])
    assert "tries" in refused(allocate([distinct], "n1", inventory(builder.build()), set()))


def test_all_never_draws_from_a_pool_missing_slices() -> None:
    half = make_slice("n1").gpus(2).in_pool("n1", generation=1, slices=2).build()
    inv = inventory(half)
    reason = refused(allocate([claim("c", exact(mode="All"))], "n1", inv, set()))
    assert "not every slice of pool gpu.example.com/n1" in reason
    assert names(ok(allocate([claim("c", exact(count=2))], "n1", inv, set()))) == ["gpu-0", "gpu-1"]


def test_an_inventory_survives_a_pickle_after_selectors_ran() -> None:
    inv = inventory(make_slice("n1").gpus(2).build())
    first = ok(allocate([claim("c", exact(selectors=[H100]))], "n1", inv, set()))
    copy = pickle.loads(pickle.dumps(inv))
    assert ok(allocate([claim("c", exact(selectors=[H100]))], "n1", copy, set())) == first


@settings(max_examples=60, deadline=None)
@given(
    racks=st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=5),
    shared_rack=st.sampled_from(["r1", "r2"]),
    node=st.integers(0, 4),
)
def test_a_node_is_only_given_devices_it_reaches(
    racks: list[str], shared_rack: str, node: int
) -> None:
    nodes = {f"n{i}": {"rack": rack} for i, rack in enumerate(racks)}
    name = f"n{node % len(racks)}"
    slices = [make_slice(n).gpus(1).build() for n in nodes]
    slices.append(make_slice(None).selector("rack", shared_rack).in_pool("rack").gpus(2).build())
    inv = inventory(*slices, nodes=nodes)
    result = allocate([claim("c", exact(mode="All"))], name, inv, set())
    pools = sorted(d.ref.pool for c in ok(result).claims for d in c.devices)
    assert pools == sorted([name] + ["rack", "rack"] * (nodes[name]["rack"] == shared_rack))


def test_what_a_pending_claim_asks_for_in_queue_resources() -> None:
    inv = inventory(make_slice("n1").gpus(2).build())
    mapping = DraSettings(deviceClasses={GPU_CLASS: "gpu"})
    first_choice = {
        "name": "pick",
        "firstAvailable": [
            {"name": "big", "deviceClassName": GPU_CLASS, "count": 4},
            {"name": "small", "deviceClassName": GPU_CLASS, "count": 1},
        ],
    }
    asked = requested_resources(claim("c", exact(mode="All"), first_choice), inv, mapping)
    assert asked[GPU] == 1 + 4, "All at least one device; firstAvailable its first choice"
    held = allocated_resources(claim("c", first_choice), ["pick/small"], inv, mapping)
    assert held[GPU] == 1


def shareable(
    node: str, devices: int, memory: str = "80Gi", policy: dict[str, Any] | None = None
) -> ResourceSlice:
    """A slice whose devices several claims may share, by memory."""
    built = make_slice(node).gpus(devices, memory=memory).build()
    raw = built.model_dump(mode="json", by_alias=True, exclude_unset=True)
    for device in raw["spec"]["devices"]:
        device["allowMultipleAllocations"] = True
        if policy is not None:
            device["capacity"]["memory"]["requestPolicy"] = policy
    return type(built).model_validate(raw)


def share(name: str, memory: str) -> ResourceClaim:
    return claim(name, exact(capacity={"requests": {"memory": memory}}))


def test_shareable_devices_are_packed_by_the_capacity_claims_consume() -> None:
    inv = inventory(shareable("n1", 2))
    first = allocate([share("a", "30Gi"), share("b", "30Gi"), share("c", "30Gi")], "n1", inv, set())
    assert isinstance(first, Allocation)
    devices = [c.devices[0] for c in first.claims]
    assert [d.ref.device for d in devices] == ["gpu-0", "gpu-0", "gpu-1"]  # 30 + 30 <= 80
    assert all(d.shared for d in devices)
    assert len({d.share_id for d in devices}) == 3
    assert devices[0].consumed == (("gpu.example.com/memory", 30 * 2**30),)
    assert first.taken == frozenset()  # nobody holds a shared device whole
    consumed = {devices[0].ref: {"gpu.example.com/memory": 60 * 2**30}}
    again = allocate([share("d", "30Gi")], "n1", inv, set(), consumed)
    assert isinstance(again, Allocation)
    assert again.claims[0].devices[0].ref.device == "gpu-1"  # 20Gi left on gpu-0
    full = {d.ref: {"gpu.example.com/memory": 60 * 2**30} for d in inv.devices_on("n1")}
    assert "0 free of 2" in refused(allocate([share("e", "30Gi")], "n1", inv, set(), full))


def test_a_request_policy_rounds_what_a_claim_consumes() -> None:
    policy = {"default": "10Gi", "validRange": {"min": "10Gi", "max": "40Gi", "step": "10Gi"}}
    inv = inventory(shareable("n1", 1, policy=policy))
    result = allocate([share("a", "12Gi"), claim("b", exact())], "n1", inv, set())
    assert isinstance(result, Allocation)
    a, b = (c.devices[0] for c in result.claims)
    assert a.consumed == (("gpu.example.com/memory", 20 * 2**30),)  # rounded up a step
    assert b.consumed == (("gpu.example.com/memory", 10 * 2**30),)  # the default
    assert "0 free of 0" in refused(allocate([share("c", "50Gi")], "n1", inv, set()))


def test_the_allocation_written_names_what_a_share_consumes() -> None:
    from kai_ray.state.dra_status import allocation_body

    inv = inventory(shareable("n1", 1))
    result = allocate([share("a", "30Gi")], "n1", inv, set())
    assert isinstance(result, Allocation)
    (written,) = allocation_body(result.claims[0])["devices"]["results"]
    assert written["consumedCapacity"] == {"memory": str(30 * 2**30)}
    assert written["shareID"] == result.claims[0].devices[0].share_id
