"""The claim writes before a bind: status.allocation, reservedFor, the finalizer."""

from __future__ import annotations

from typing import Any

from kai_ray.state.dra_allocate import Allocation, allocate
from kai_ray.state.dra_status import Consumer, allocation_body, allocation_write, release_write
from kai_ray.values.dra import CLAIM_FINALIZER, AllocationResult, ResourceClaim
from tests.unit.dra_builders import CLIQUE, claim, exact, inventory, make_slice

TRAINER_0 = Consumer("trainer-0", "uid-0")
TRAINER_1 = Consumer("trainer-1", "uid-1")


def _allocated(body: ResourceClaim) -> Allocation:
    inv = inventory(make_slice("n1").gpus(4, clique="c0").build())
    result = allocate([body], "n1", inv, set())
    assert isinstance(result, Allocation)
    return result


def _applied(
    body: ResourceClaim, status: dict[str, Any], finalizers: tuple[str, ...]
) -> ResourceClaim:
    """The claim as a merge patch of the status (and new finalizers) leaves it."""
    raw = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
    merged = {**raw.get("status", {}), **status}
    raw["status"] = {k: v for k, v in merged.items() if v is not None}
    raw["metadata"]["finalizers"] = list(finalizers)
    return ResourceClaim.model_validate(raw)


def test_the_allocation_body_is_a_v1_allocation_result() -> None:
    two = claim("c", exact(count=2), constraints=[{"matchAttribute": CLIQUE}])
    body = allocation_body(_allocated(two).claims[0])
    assert body == {
        "devices": {
            "results": [
                {"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"},
                {"request": "gpus", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-1"},
            ]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]
        },
    }
    assert (
        AllocationResult.model_validate(body).model_dump(mode="json", exclude_defaults=True) == body
    )


def test_the_first_pod_allocates_and_reserves_and_protects_the_claim() -> None:
    fresh = ResourceClaim.model_validate(
        {
            **claim("c", exact()).model_dump(by_alias=True),
            "metadata": {"name": "c", "namespace": "team-a", "resourceVersion": "41"},
        }
    )
    write = allocation_write(fresh, _allocated(fresh).claims[0], TRAINER_0)
    assert write.finalizers == (CLAIM_FINALIZER,)
    assert write.status["reservedFor"] == [
        {"resource": "pods", "name": "trainer-0", "uid": "uid-0"}
    ]
    assert write.patches() == [
        ("", {"metadata": {"finalizers": [CLAIM_FINALIZER], "resourceVersion": "41"}}),
        ("status", {"status": write.status}),
    ]


def test_a_shared_claim_is_allocated_once_and_reserved_for_each_pod() -> None:
    shared = claim("gang", exact(count=2))
    first = allocation_write(shared, _allocated(shared).claims[0], TRAINER_0)
    after_first = _applied(shared, first.status, first.finalizers)
    again = _allocated(after_first).claims[0]
    assert not again.new
    second = allocation_write(after_first, again, TRAINER_1)
    assert "allocation" not in second.status, "an allocated claim is not rewritten"
    assert [r["name"] for r in second.status["reservedFor"]] == ["trainer-0", "trainer-1"]
    assert second.finalizers == (CLAIM_FINALIZER,)
    assert [sub for sub, _ in second.patches()] == ["status"], "the finalizer is there already"
    repeated = allocation_write(after_first, again, TRAINER_0)
    assert [r["name"] for r in repeated.status["reservedFor"]] == ["trainer-0"]


def test_the_last_pod_going_deallocates_the_claim() -> None:
    shared = claim("gang", exact())
    first = allocation_write(shared, _allocated(shared).claims[0], TRAINER_0)
    held = _applied(shared, first.status, first.finalizers)
    both = allocation_write(held, _allocated(held).claims[0], TRAINER_1)
    held = _applied(held, both.status, both.finalizers)
    one_left = release_write(held, "uid-0")
    assert "allocation" not in one_left.status and one_left.finalizers == (CLAIM_FINALIZER,)
    held = _applied(held, one_left.status, one_left.finalizers)
    none_left = release_write(held, "uid-1")
    assert none_left.status == {"reservedFor": [], "allocation": None}
    assert none_left.finalizers == ()
    assert [sub for sub, _ in none_left.patches()] == ["status", ""], (
        "deallocated, then unprotected"
    )
    assert _applied(held, none_left.status, none_left.finalizers).status.allocation is None
