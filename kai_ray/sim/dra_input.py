"""The simulator's DRA input: DeviceClasses, ResourceSlices, ResourceClaims and
ResourceClaimTemplates (`resource.k8s.io/v1`), and what pods' `spec.resourceClaims`
refer to.

Each object is checked with the model kai-ray reads it with (a problem names the
field) and its CEL selectors are compiled (a malformed one is a problem naming the
object and the selector's field, never a crash). Across objects: no name twice, a
pod's claim or template exists in its namespace, a request's DeviceClass exists,
a node-local slice's node exists. What NodePools publish (`spec.dra`) joins the
input here, a DeviceClass two pools both publish once. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from kai_ray.values.device_cel import selector_problems
from kai_ray.values.dra import (
    DRA_API_VERSION,
    DeviceClass,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
    ResourceSlice,
)
from kai_ray.values.errors import InvalidFieldError, InvalidObjectError, ObjectRef, Problem
from kai_ray.values.validation import object_ref, parse_model
from kai_ray.workloads.pod_claims import FIELD as CLAIMS_FIELD
from kai_ray.workloads.pod_claims import pod_resource_claims

#: The four kinds, by kind, with the model each is read with.
DRA_KINDS: dict[str, type[BaseModel]] = {
    "DeviceClass": DeviceClass,
    "ResourceSlice": ResourceSlice,
    "ResourceClaim": ResourceClaim,
    "ResourceClaimTemplate": ResourceClaimTemplate,
}
NAMESPACED = frozenset({"ResourceClaim", "ResourceClaimTemplate"})


@dataclass
class DraObjects:
    """The input's DRA objects as the API would serve them (plain dicts), by kind."""

    device_classes: list[dict[str, Any]] = field(default_factory=list)
    resource_slices: list[dict[str, Any]] = field(default_factory=list)
    resource_claims: list[dict[str, Any]] = field(default_factory=list)
    claim_templates: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return {
            "DeviceClass": self.device_classes,
            "ResourceSlice": self.resource_slices,
            "ResourceClaim": self.resource_claims,
            "ResourceClaimTemplate": self.claim_templates,
        }[kind]

    def all(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for kind in DRA_KINDS:
            for obj in self.of_kind(kind):
                yield kind, obj


def is_dra_kind(api_version: Any, kind: Any) -> bool:
    return api_version == DRA_API_VERSION and kind in DRA_KINDS


def read_dra_object(raw: Mapping[str, Any], source: str, into: DraObjects) -> None:
    """Check one DRA object and keep it (namespaced kinds in `default` unless they say)."""
    kind = str(raw["kind"])
    model = parse_model(DRA_KINDS[kind], raw, source)
    if isinstance(model, DeviceClass | ResourceClaim | ResourceClaimTemplate):
        problems = selector_problems(model)
        if problems:
            ref = object_ref(raw, source)
            raise InvalidObjectError([Problem(ref, p.field, p.message) for p in problems])
    obj = dict(raw)
    if kind in NAMESPACED:
        meta = dict(obj["metadata"])
        meta["namespace"] = meta.get("namespace") or "default"
        obj["metadata"] = meta
    into.of_kind(kind).append(obj)


def add_published(
    into: DraObjects, slices: list[dict[str, Any]], classes: list[dict[str, Any]]
) -> None:
    """What a NodePool publishes; a DeviceClass already published the same way is kept once."""
    into.resource_slices.extend(slices)
    for cls in classes:
        if cls not in into.device_classes:
            into.device_classes.append(cls)


def pod_claim_refs(pod: Mapping[str, Any], ref: ObjectRef, prefix: str = "") -> None:
    """The pod's `spec.resourceClaims` can be read; else a problem naming the entry."""
    try:
        pod_resource_claims(pod)
    except InvalidFieldError as err:
        raise InvalidObjectError([Problem(ref, prefix + err.field, err.message)]) from None


# ------------------------------------------------------------------ across objects


def _key(obj: Mapping[str, Any]) -> tuple[str | None, str]:
    meta = obj["metadata"]
    return meta.get("namespace"), str(meta["name"])


def _ref(kind: str, obj: Mapping[str, Any]) -> ObjectRef:
    namespace, name = _key(obj)
    return ObjectRef(kind, name, namespace)


def check_dra_references(dra: DraObjects, nodes: set[str]) -> None:
    """No object twice; every request's DeviceClass exists; node-local slices name a Node."""
    for kind in DRA_KINDS:
        seen: set[tuple[str | None, str]] = set()
        for obj in dra.of_kind(kind):
            if _key(obj) in seen:
                raise _fail(_ref(kind, obj), "metadata.name", f"another {kind} has the same name")
            seen.add(_key(obj))
    classes = {str(c["metadata"]["name"]) for c in dra.device_classes}
    holders: dict[tuple[str, str, str], str] = {}
    for claim in dra.resource_claims:
        model = ResourceClaim.model_validate(claim)
        _check_classes(model.spec, classes, claim, "spec")
        _check_allocated_once(model, holders)
    for template in dra.claim_templates:
        spec = ResourceClaimTemplate.model_validate(template).spec.spec
        _check_classes(spec, classes, template, "spec.spec")
    for obj in dra.resource_slices:
        node = (obj.get("spec") or {}).get("nodeName")
        if node and node not in nodes:
            raise _fail(_ref("ResourceSlice", obj), "spec.nodeName", f"no Node named {node!r}")


def _check_allocated_once(claim: ResourceClaim, holders: dict[tuple[str, str, str], str]) -> None:
    """No device is allocated to two of the input's claims."""
    allocation = claim.status.allocation
    name = f"{claim.metadata.namespace}/{claim.metadata.name}"
    for i, result in enumerate(allocation.devices.results if allocation is not None else ()):
        device = (result.driver, result.pool, result.device)
        other = holders.setdefault(device, name)
        if other != name:
            field = f"status.allocation.devices.results[{i}]"
            message = f"device {'/'.join(device)} is allocated to ResourceClaim {other} too"
            raise _fail(
                ObjectRef("ResourceClaim", claim.metadata.name, claim.metadata.namespace),
                field,
                message,
            )


def _check_classes(
    spec: ResourceClaimSpec, classes: set[str], obj: Mapping[str, Any], prefix: str
) -> None:
    for i, request in enumerate(spec.devices.requests):
        alternatives = (
            [("exactly", request.exactly)]
            if request.exactly is not None
            else [(f"firstAvailable[{j}]", sub) for j, sub in enumerate(request.firstAvailable)]
        )
        for where, exact in alternatives:
            if exact.deviceClassName not in classes:
                field = f"{prefix}.devices.requests[{i}].{where}.deviceClassName"
                message = f"no DeviceClass named {exact.deviceClassName!r}"
                raise _fail(_ref(str(obj["kind"]), obj), field, message)


def check_pod_claims(
    dra: DraObjects, pods: Iterator[tuple[Mapping[str, Any], ObjectRef, str]]
) -> None:
    """Every claim and template a pod names exists in the pod's namespace."""
    claims = {_key(c) for c in dra.resource_claims}
    templates = {_key(t) for t in dra.claim_templates}
    for pod, ref, prefix in pods:
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        for i, entry in enumerate(pod_resource_claims(pod)):
            where = f"{prefix}{CLAIMS_FIELD}[{i}]"
            if entry.resourceClaimName and (namespace, entry.resourceClaimName) not in claims:
                message = f"no ResourceClaim named {entry.resourceClaimName!r} in {namespace!r}"
                raise _fail(ref, f"{where}.resourceClaimName", message)
            template = entry.resourceClaimTemplateName
            if template and (namespace, template) not in templates:
                message = f"no ResourceClaimTemplate named {template!r} in {namespace!r}"
                raise _fail(ref, f"{where}.resourceClaimTemplateName", message)


def _fail(obj: ObjectRef, field: str, message: str) -> InvalidObjectError:
    return InvalidObjectError([Problem(obj, field, message)])
