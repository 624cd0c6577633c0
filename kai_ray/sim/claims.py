"""The simulation's ResourceClaims, kept as the API server and kube-controller-manager
keep them.

The simulator plays the resource claim controller (`resourceclaim-controller`): a
pod created with `spec.resourceClaims[].resourceClaimTemplateName` gets its
ResourceClaim `<pod>-<entry>`, made from the template (its spec copied, the pod its
owner), named in the pod's `status.resourceClaimStatuses`; when the pod finishes,
is evicted or fails, it leaves its claims' `status.reservedFor` (a claim nobody
reserves loses its allocation and finalizer), and the claims made for it are
deleted. The binder's claim writes (`write_claim`, `release_claim`) change the
claims as the status subresource would, through `allocation_write` and
`release_write`, with a new resourceVersion each time. Every change is fed to the
cache, so the next snapshot sees it.

A device given to two claims at once is a scheduler bug: `write` raises
`InvariantViolation` (exit status 3). No I/O.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kai_ray.effects.binder import DONE, Outcome, WriteResult
from kai_ray.sim.dra_input import DraObjects
from kai_ray.sim.invariants import InvariantViolation
from kai_ray.state.cache import (
    CLAIM_TEMPLATE,
    DEVICE_CLASS,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    ClusterCache,
)
from kai_ray.state.dra import DeviceRef, Inventory, allocated_resources
from kai_ray.state.dra_allocate import ClaimAllocation
from kai_ray.state.dra_status import ClaimWrite, Consumer, allocation_write, release_write
from kai_ray.state.dra_view import claim_resources
from kai_ray.values.dra import DeviceClass, DraSettings, ResourceClaim
from kai_ray.values.node_selector import NodeSelector
from kai_ray.values.resources import Resources
from kai_ray.workloads.pod_claims import pod_claims, pod_resource_claims

Obj = dict[str, Any]
#: The annotation the resource claim controller puts on a claim it makes: the pod's entry.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace') or 'default'}/{meta['name']}"


def _namespace(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


class ClaimController:
    """The in-memory claims (by `namespace/name`) and templates, fed to `cache`."""

    def __init__(
        self,
        dra: DraObjects,
        cache: ClusterCache,
        settings: DraSettings,
        cycle: Callable[[], int] = lambda: 0,
    ) -> None:
        self._cache = cache
        self._settings = settings
        self._cycle = cycle
        self._versions = itertools.count(1)
        self.claims: dict[str, Obj] = {}
        #: Which claim holds each allocated device (kept with every store and delete).
        self._holders: dict[DeviceRef, str] = {}
        self.templates: dict[str, Obj] = {_key(t): t for t in dra.claim_templates}
        classes = [DeviceClass.model_validate(c) for c in dra.device_classes]
        #: Only the classes: enough to tell which queue resource a device counts as.
        self._inventory = Inventory(
            classes={c.metadata.name: c for c in classes}, by_node={}, node_labels={}
        )
        for kind, objects in (
            (DEVICE_CLASS, dra.device_classes),
            (RESOURCE_SLICE, dra.resource_slices),
            (CLAIM_TEMPLATE, dra.claim_templates),
        ):
            for obj in objects:
                cache.upsert(obj, kind)
        for claim in dra.resource_claims:
            self._store(copy.deepcopy(claim))

    # ---------------------------------------------------- the claim controller

    def pod_created(self, pod: dict[str, Any]) -> None:
        """Make the claims of the pod's template entries and name them in its status
        (before the pod is fed to the cache)."""
        statuses = []
        for entry in pod_resource_claims(pod):
            template = entry.resourceClaimTemplateName
            if template:
                name = self._make_claim(
                    pod, entry.name, self.templates[f"{_namespace(pod)}/{template}"]
                )
                statuses.append({"name": entry.name, "resourceClaimName": name})
        if statuses:
            pod.setdefault("status", {})["resourceClaimStatuses"] = statuses

    def _make_claim(self, pod: Mapping[str, Any], entry: str, template: Mapping[str, Any]) -> str:
        meta, namespace = pod["metadata"], _namespace(pod)
        name = f"{meta['name']}-{entry}"
        for n in itertools.count(2):
            if f"{namespace}/{name}" not in self.claims:
                break
            name = f"{meta['name']}-{entry}-{n}"  # the controller's names are unique too
        made = template["spec"].get("metadata") or {}
        claim = {
            "apiVersion": template["apiVersion"],
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(made.get("labels") or {}),
                "annotations": {
                    **(made.get("annotations") or {}),
                    POD_CLAIM_NAME_ANNOTATION: entry,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": _uid(pod),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]["spec"]),
        }
        self._store(claim)
        return name

    def pod_gone(self, pod: dict[str, Any]) -> None:
        """The pod finished, failed, or was deleted: it leaves its claims' `reservedFor`
        (the last one deallocates), the claims made for it go, its status forgets them."""
        uid, namespace = _uid(pod), _namespace(pod)
        for entry in pod_claims(pod):
            key = f"{namespace}/{entry.claim}"
            claim = self.claims.get(key)
            if entry.claim is None or claim is None:
                continue
            if any(
                r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or ()
            ):
                self.release(namespace, entry.claim, uid)
            owners = claim["metadata"].get("ownerReferences") or ()
            if uid and any(o.get("uid") == uid for o in owners):
                self._forget(key)
                self._cache.delete(RESOURCE_CLAIM, key)
        (pod.get("status") or {}).pop("resourceClaimStatuses", None)

    # ------------------------------------------------------- the binder's writes

    def write(
        self, namespace: str, name: str, allocation: ClaimAllocation, consumer: Consumer
    ) -> WriteResult:
        """Allocate (unless it is) and reserve the claim for `consumer`."""
        key = f"{namespace}/{name}"
        raw = self.claims.get(key)
        if raw is None:
            return WriteResult(Outcome.PERMANENT, f"ResourceClaim {key} not found")
        claim = ResourceClaim.model_validate(raw)
        if allocation.new and claim.status.allocation is not None:
            return WriteResult(Outcome.RETRY, f"ResourceClaim {key} is allocated already")
        if allocation.new:
            self._check_free(key, {d.ref for d in allocation.devices})
        try:
            write = allocation_write(claim, allocation, consumer)
        except ValueError as err:
            return WriteResult(Outcome.PERMANENT, str(err))
        self._apply(raw, write)
        return DONE

    def release(self, namespace: str, name: str, pod_uid: str) -> WriteResult:
        """The pod no longer uses the claim; deallocated when nobody does."""
        raw = self.claims.get(f"{namespace}/{name}")
        if raw is None:
            return DONE  # gone already: nothing holds its devices
        self._apply(raw, release_write(ResourceClaim.model_validate(raw), pod_uid))
        return DONE

    def _check_free(self, key: str, wanted: set[DeviceRef]) -> None:
        for device in sorted(wanted):
            other = self._holders.get(device)
            if other is not None and other != key:
                rule = f"device {device} given to two claims (also ResourceClaim {other})"
                raise InvariantViolation(self._cycle(), f"ResourceClaim {key}", rule)

    def _apply(self, raw: Obj, write: ClaimWrite) -> None:
        claim = copy.deepcopy(raw)
        if write.finalizers:
            claim["metadata"]["finalizers"] = list(write.finalizers)
        else:
            claim["metadata"].pop("finalizers", None)
        status = claim.setdefault("status", {})
        for field, value in write.status.items():
            if value is None:
                status.pop(field, None)
            else:
                status[field] = copy.deepcopy(value)
        self._store(claim)

    def _store(self, claim: Obj) -> None:
        """Keep the claim with a new resourceVersion and feed it to the cache."""
        meta = claim["metadata"]
        meta["namespace"] = meta.get("namespace") or "default"
        meta.setdefault("uid", f"claim-{meta['namespace']}-{meta['name']}")
        meta["resourceVersion"] = str(next(self._versions))
        key = _key(claim)
        self._forget(key)
        self.claims[key] = claim
        for device in devices_of(claim):
            self._holders.setdefault(device, key)  # a second holder is `_check_free`'s
        self._cache.upsert(claim, RESOURCE_CLAIM)

    def _forget(self, key: str) -> None:
        for device in devices_of(self.claims.pop(key, {})):
            if self._holders.get(device) == key:
                del self._holders[device]

    # ---------------------------------------------------------------- reading

    def pod_claim_keys(self, pod: Mapping[str, Any]) -> list[str]:
        """The keys of the claims the pod uses that exist."""
        namespace = _namespace(pod)
        keys = [f"{namespace}/{e.claim}" for e in pod_claims(pod) if e.claim is not None]
        return [key for key in keys if key in self.claims]

    def resources(self, keys: Iterable[str]) -> Resources:
        """What the claims count as in queue resources: their devices once allocated,
        else what they ask for (the snapshot's `claim_resources`)."""
        total = Resources()
        for key in keys:
            claim = ResourceClaim.model_validate(self.claims[key])
            total = total + claim_resources(claim, self._inventory, self._settings)
        return total

    def allocation_resources(self, allocations: Iterable[ClaimAllocation]) -> Resources:
        """What newly allocated claims hold in queue resources (a claim already
        allocated is counted where it was allocated)."""
        total = Resources()
        for allocation in allocations:
            raw = self.claims.get(f"{allocation.namespace}/{allocation.name}")
            if allocation.new and raw is not None:
                results = [d.request for d in allocation.devices]
                claim = ResourceClaim.model_validate(raw)
                total = total + allocated_resources(claim, results, self._inventory, self._settings)
        return total

    def is_allocated(self, key: str) -> bool:
        return bool((self.claims[key].get("status") or {}).get("allocation"))

    def devices_reserved_by(self, uids: set[str]) -> set[DeviceRef]:
        """The devices of the allocated claims any of these pods reserves."""
        found: set[DeviceRef] = set()
        for raw in self.claims.values():
            reserved = (raw.get("status") or {}).get("reservedFor") or ()
            if any(r.get("uid") in uids for r in reserved):
                found |= devices_of(raw)
        return found

    def devices_held(self, excluding: Iterable[str] = ()) -> set[DeviceRef]:
        """The devices of every allocated claim but those of `excluding` (keys)."""
        skip = set(excluding)
        return {device for device, key in self._holders.items() if key not in skip}

    def node_selector(self, key: str) -> NodeSelector | None:
        """Where the claim's devices can be used (None: anywhere, or not allocated)."""
        allocation = ResourceClaim.model_validate(self.claims[key]).status.allocation
        return allocation.nodeSelector if allocation is not None else None


def devices_of(raw: Mapping[str, Any]) -> set[DeviceRef]:
    """The devices an allocated claim holds (none when it is not allocated)."""
    allocation = (raw.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return {DeviceRef(r["driver"], r["pool"], r["device"]) for r in results}


def device_names(raw: Mapping[str, Any]) -> list[str]:
    """`driver/pool/device` of each device of the claim, in its allocation's order."""
    allocation = (raw.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]
