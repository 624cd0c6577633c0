"""What the binder writes to a ResourceClaim: its allocation, and who uses it.

Before a pod with claims is bound, each of its claims gets kube-scheduler's
finalizer, then `status.allocation` (the devices, and the nodes they can be used
from) and the pod in `status.reservedFor`. A claim the pods of a gang share is
allocated once; later pods only join `reservedFor`. When a pod goes, it leaves
`reservedFor`; a claim no pod reserves any longer loses its allocation and the
finalizer (the controller-manager's resource claim controller does the same in
a cluster; the simulator relies on this). Writes carry the claim's
resourceVersion, so a claim changed meanwhile is a conflict, not an overwrite
(`ClaimWrite.patches`).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kai_ray.state.dra_allocate import ClaimAllocation, DeviceResult
from kai_ray.values.dra import CLAIM_FINALIZER, ResourceClaim

#: Most consumers one claim may list (the API server's limit).
MAX_RESERVED_FOR = 256


@dataclass(frozen=True)
class Consumer:
    """A pod that uses a claim."""

    name: str
    uid: str

    def reference(self) -> dict[str, str]:
        # apiGroup is omitted: pods are in the core group ("").
        return {"resource": "pods", "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class ClaimWrite:
    """A claim's finalizers after the write, and the status fields it changes
    (`allocation` only when it is written or removed: None removes it)."""

    namespace: str
    name: str
    resource_version: str | None
    finalizers: tuple[str, ...]
    status: dict[str, Any]
    #: The finalizers were changed (else only the status is written).
    finalizers_changed: bool = True
    #: A release: the status goes first, so the finalizer never leaves an allocated claim.
    releasing: bool = False

    def patches(self) -> list[tuple[str, dict[str, Any]]]:
        """The merge patches to send, in order, as (subresource, body); "" is the claim
        itself, where finalizers live. The first carries the claim's resourceVersion,
        so a claim changed meanwhile (another pod of the gang reserving it) is a
        conflict to retry, never an overwrite; each later patch must carry the
        version the previous answer gave. `reservedFor` is sent whole."""
        status = ("status", {"status": self.status})
        finalizers = ("", {"metadata": {"finalizers": list(self.finalizers)}})
        order = [status] if not self.finalizers_changed else [finalizers, status]
        if self.releasing:
            order.reverse()
        first_sub, first = order[0]
        if self.resource_version is not None:
            meta = {**first.get("metadata", {}), "resourceVersion": self.resource_version}
            order[0] = (first_sub, {**first, "metadata": meta})
        return order


def allocation_body(allocation: ClaimAllocation) -> dict[str, Any]:
    """`status.allocation` for these devices (resource.k8s.io/v1 AllocationResult)."""
    results = [_result(d) for d in allocation.devices]
    body: dict[str, Any] = {"devices": {"results": results}}
    if allocation.node_selector is not None:
        body["nodeSelector"] = allocation.node_selector.model_dump(
            mode="json", exclude_defaults=True
        )
    return body


def _result(device: DeviceResult) -> dict[str, Any]:
    ref = device.ref
    result: dict[str, Any] = {
        "request": device.request,
        "driver": ref.driver,
        "pool": ref.pool,
        "device": ref.device,
    }
    if device.shared:
        own = f"{ref.driver}/"
        result["consumedCapacity"] = {
            name.removeprefix(own): _quantity(amount) for name, amount in device.consumed
        }
        result["shareID"] = device.share_id
    return result


def _quantity(amount: float) -> str:
    """A quantity string for an amount (whole numbers exactly, else in milli-units)."""
    if float(amount).is_integer():
        return str(int(amount))
    return f"{round(amount * 1000)}m"


def allocation_write(
    claim: ResourceClaim, allocation: ClaimAllocation, pod: Consumer
) -> ClaimWrite:
    """The claim allocated (unless it was already) and reserved for `pod` as well."""
    status: dict[str, Any] = {}
    if allocation.new:
        status["allocation"] = allocation_body(allocation)
    reserved = [r for r in _reserved(claim) if r["uid"] != pod.uid]
    if len(reserved) >= MAX_RESERVED_FOR:
        raise ValueError(f"{claim.metadata.name}: already reserved for {len(reserved)} pods")
    status["reservedFor"] = [*reserved, pod.reference()]
    finalizers = _finalizers(claim)
    if CLAIM_FINALIZER not in finalizers:
        finalizers = (*finalizers, CLAIM_FINALIZER)
    return _write(claim, finalizers, status, releasing=False)


def release_write(claim: ResourceClaim, pod_uid: str) -> ClaimWrite:
    """The claim once `pod_uid` no longer uses it: deallocated when nobody does."""
    reserved = [r for r in _reserved(claim) if r["uid"] != pod_uid]
    status: dict[str, Any] = {"reservedFor": reserved}
    finalizers = _finalizers(claim)
    if not reserved:
        status["allocation"] = None
        finalizers = tuple(f for f in finalizers if f != CLAIM_FINALIZER)
    return _write(claim, finalizers, status, releasing=True)


def _reserved(claim: ResourceClaim) -> list[dict[str, str]]:
    return [r.model_dump(mode="json", exclude_defaults=True) for r in claim.status.reservedFor]


def _finalizers(claim: ResourceClaim) -> tuple[str, ...]:
    extra = claim.metadata.model_extra or {}
    return tuple(str(f) for f in extra.get("finalizers") or ())


def _write(
    claim: ResourceClaim, finalizers: tuple[str, ...], status: dict[str, Any], releasing: bool
) -> ClaimWrite:
    meta = claim.metadata
    version = (meta.model_extra or {}).get("resourceVersion")
    return ClaimWrite(
        namespace=meta.namespace or "",
        name=meta.name,
        resource_version=None if version is None else str(version),
        finalizers=finalizers,
        status=status,
        finalizers_changed=finalizers != _finalizers(claim),
        releasing=releasing,
    )
