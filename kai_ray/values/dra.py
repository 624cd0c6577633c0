"""Dynamic Resource Allocation (`resource.k8s.io/v1`): the objects kai-ray reads.

DeviceClass, ResourceSlice, ResourceClaim and ResourceClaimTemplate as pydantic
models with the field names of `resource.k8s.io/v1`, and `DraSettings`, the part
of the scheduler's settings that maps DeviceClasses to queue resources
(docs/dra.md).

What a driver publishes (slices, classes) ignores fields this release does not
know, so a newer API server's additions do not hide devices. What a workload asks
for (a claim's requests and constraints) refuses them: an unknown field there may
change which devices are meant, and guessing would allocate the wrong ones.
Unsupported parts of a request that kai-ray can read (admin access, capacity
requests) are refused by the allocator with a reason, not here.

CEL selectors are kept as text; they are compiled and evaluated by
`kai_ray.values.device_cel`. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kai_ray.values.api import ObjectMeta, Quantity
from kai_ray.values.node_selector import NodeSelector

DRA_API_VERSION: Final = "resource.k8s.io/v1"
#: The finalizer kube-scheduler puts on a claim it allocates; kai-ray writes the same.
CLAIM_FINALIZER: Final = "resource.kubernetes.io/delete-protection"
#: Most devices one claim may be given (the API server's limit on allocation results).
MAX_ALLOCATED_DEVICES: Final = 32

_FULLY_QUALIFIED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z_][A-Za-z0-9_]*$")


class _Published(BaseModel):
    """What drivers and administrators publish: unknown fields ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class _Requested(BaseModel):
    """What workloads ask for: unknown fields refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _exactly_one(owner: str, fields: dict[str, bool]) -> None:
    chosen = [name for name, present in fields.items() if present]
    if len(chosen) != 1:
        names = ", ".join(fields)
        found = ", ".join(chosen) or "none"
        raise ValueError(f"{owner} needs exactly one of {names} (found: {found})")


# ------------------------------------------------------------------- DeviceClass


class CelSelector(_Requested):
    expression: str = Field(min_length=1, max_length=10 * 1024)


class DeviceSelector(_Requested):
    cel: CelSelector


class OpaqueDeviceConfiguration(_Published):
    driver: str = Field(min_length=1)
    parameters: dict[str, Any] = Field(default_factory=dict)


class DeviceConfiguration(_Published):
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClassSpec(_Published):
    selectors: list[DeviceSelector] = Field(default_factory=list, max_length=32)
    config: list[DeviceConfiguration] = Field(default_factory=list)
    extendedResourceName: str | None = None


class DeviceClass(_Published):
    apiVersion: Literal["resource.k8s.io/v1"] = DRA_API_VERSION
    kind: Literal["DeviceClass"] = "DeviceClass"
    metadata: ObjectMeta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)


# ------------------------------------------------------------------- ResourceSlice


ScalarAttribute = str | int | bool
#: An attribute's value with its type: ("string", "H100"), ("int", 3), ("ints", (0, 1)).
AttributeValue = tuple[str, ScalarAttribute | tuple[ScalarAttribute, ...]]


class DeviceAttribute(_Published):
    """Exactly one typed value (the list forms are the DRAListTypeAttributes gate's)."""

    int_: int | None = Field(default=None, alias="int")
    bool_: bool | None = Field(default=None, alias="bool")
    string: str | None = Field(default=None, max_length=64)
    version: str | None = Field(default=None, max_length=64)
    ints: list[int] | None = None
    bools: list[bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None

    @model_validator(mode="after")
    def _one_value(self) -> DeviceAttribute:
        _exactly_one("an attribute", {k: v is not None for k, v in self._values().items()})
        return self

    def _values(self) -> dict[str, Any]:
        return {
            "int": self.int_,
            "bool": self.bool_,
            "string": self.string,
            "version": self.version,
            "ints": self.ints,
            "bools": self.bools,
            "strings": self.strings,
            "versions": self.versions,
        }

    @property
    def typed(self) -> AttributeValue:
        """(type, value): compared whole, so the string "1" never equals the int 1."""
        for kind, value in self._values().items():
            if value is not None:
                return (kind, tuple(value) if isinstance(value, list) else value)
        raise AssertionError("validated to hold one value")


class CapacityRange(_Published):
    min: Quantity
    max: Quantity | None = None
    step: Quantity | None = None


class CapacityRequestPolicy(_Published):
    """How much of a shareable capacity one allocation consumes (KEP-5075)."""

    default: Quantity | None = None
    validValues: list[Quantity] = Field(default_factory=list)
    validRange: CapacityRange | None = None


class DeviceCapacity(_Published):
    value: Quantity
    requestPolicy: CapacityRequestPolicy | None = None


class DeviceTaint(_Published):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["None", "NoSchedule", "NoExecute"]


class Device(_Published):
    name: str = Field(min_length=1, max_length=63)
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, DeviceCapacity] = Field(default_factory=dict)
    consumesCounters: list[dict[str, Any]] = Field(default_factory=list)
    nodeName: str | None = None
    nodeSelector: NodeSelector | None = None
    allNodes: bool | None = None
    taints: list[DeviceTaint] = Field(default_factory=list)
    bindingConditions: list[str] = Field(default_factory=list)
    allowMultipleAllocations: bool | None = None


class ResourcePool(_Published):
    name: str = Field(min_length=1, max_length=253)
    generation: int = Field(ge=0)
    resourceSliceCount: int = Field(ge=1)


class ResourceSliceSpec(_Published):
    driver: str = Field(min_length=1, max_length=63)
    pool: ResourcePool
    nodeName: str | None = None
    nodeSelector: NodeSelector | None = None
    allNodes: bool | None = None
    perDeviceNodeSelection: bool | None = None
    devices: list[Device] = Field(default_factory=list, max_length=128)

    @model_validator(mode="after")
    def _one_node_selection(self) -> ResourceSliceSpec:
        _exactly_one(
            "a ResourceSlice",
            {
                "nodeName": bool(self.nodeName),
                "nodeSelector": self.nodeSelector is not None,
                "allNodes": bool(self.allNodes),
                "perDeviceNodeSelection": bool(self.perDeviceNodeSelection),
            },
        )
        for i, device in enumerate(self.devices):
            chosen = {
                "nodeName": bool(device.nodeName),
                "nodeSelector": device.nodeSelector is not None,
                "allNodes": bool(device.allNodes),
            }
            if self.perDeviceNodeSelection:
                _exactly_one(f"devices[{i}]: with perDeviceNodeSelection, a device", chosen)
            elif any(chosen.values()):
                raise ValueError(
                    f"devices[{i}]: node selection per device needs perDeviceNodeSelection"
                )
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"devices: names must be unique in a slice, got {names}")
        return self


class ResourceSlice(_Published):
    apiVersion: Literal["resource.k8s.io/v1"] = DRA_API_VERSION
    kind: Literal["ResourceSlice"] = "ResourceSlice"
    metadata: ObjectMeta
    spec: ResourceSliceSpec


# ------------------------------------------------------------------- claims


class DeviceToleration(_Requested):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "None", "NoSchedule", "NoExecute"] = ""
    tolerationSeconds: int | None = None

    def tolerates(self, taint: DeviceTaint) -> bool:
        """Kubernetes' rule: the effect matches (or is empty), then key and value."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


class CapacityRequirements(_Requested):
    requests: dict[str, Quantity] = Field(default_factory=dict)


class ExactDeviceRequest(_Requested):
    deviceClassName: str = Field(min_length=1)
    selectors: list[DeviceSelector] = Field(default_factory=list, max_length=32)
    allocationMode: Literal["ExactCount", "All"] = "ExactCount"
    count: int | None = Field(default=None, ge=1)
    adminAccess: bool | None = None
    tolerations: list[DeviceToleration] = Field(default_factory=list, max_length=16)
    capacity: CapacityRequirements | None = None

    @model_validator(mode="after")
    def _count_with_exact_count(self) -> ExactDeviceRequest:
        if self.allocationMode == "All" and self.count is not None:
            raise ValueError("count: must not be set when allocationMode is All")
        return self

    @property
    def device_count(self) -> int:
        """How many devices ExactCount asks for (1 when count is unset)."""
        return self.count or 1


class DeviceSubRequest(ExactDeviceRequest):
    name: str = Field(min_length=1, max_length=63)


class DeviceRequest(_Requested):
    name: str = Field(min_length=1, max_length=63)
    exactly: ExactDeviceRequest | None = None
    firstAvailable: list[DeviceSubRequest] = Field(default_factory=list, max_length=8)

    @model_validator(mode="after")
    def _one_kind(self) -> DeviceRequest:
        _exactly_one(
            "a request",
            {"exactly": self.exactly is not None, "firstAvailable": bool(self.firstAvailable)},
        )
        return self

    def alternatives(self) -> list[tuple[str, ExactDeviceRequest]]:
        """What may satisfy it, in order of preference, each with the name its result
        carries (`main` or `main/sub`)."""
        if self.exactly is not None:
            return [(self.name, self.exactly)]
        return [(f"{self.name}/{sub.name}", sub) for sub in self.firstAvailable]


class DeviceConstraint(_Requested):
    requests: list[str] = Field(default_factory=list)
    matchAttribute: str | None = None
    distinctAttribute: str | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> DeviceConstraint:
        _exactly_one(
            "a constraint",
            {
                "matchAttribute": self.matchAttribute is not None,
                "distinctAttribute": self.distinctAttribute is not None,
            },
        )
        name = self.attribute
        if not _FULLY_QUALIFIED.match(name):
            field = "matchAttribute" if self.matchAttribute is not None else "distinctAttribute"
            raise ValueError(
                f"{field}: {name!r} must be <domain>/<name>, e.g. gpu.example.com/numa"
            )
        return self

    @property
    def attribute(self) -> str:
        return (
            self.matchAttribute if self.matchAttribute is not None else str(self.distinctAttribute)
        )

    def applies_to(self, result_name: str) -> bool:
        """Whether devices given under `result_name` (`main` or `main/sub`) are bound by it."""
        main = result_name.split("/", 1)[0]
        return not self.requests or result_name in self.requests or main in self.requests


class DeviceClaimConfiguration(_Requested):
    requests: list[str] = Field(default_factory=list)
    opaque: OpaqueDeviceConfiguration | None = None


class DeviceClaim(_Requested):
    requests: list[DeviceRequest] = Field(min_length=1, max_length=32)
    constraints: list[DeviceConstraint] = Field(default_factory=list, max_length=32)
    config: list[DeviceClaimConfiguration] = Field(default_factory=list, max_length=32)

    @model_validator(mode="after")
    def _references_resolve(self) -> DeviceClaim:
        names = [r.name for r in self.requests]
        if len(set(names)) != len(names):
            raise ValueError(f"requests: names must be unique, got {names}")
        known = set(names) | {n for r in self.requests for n, _ in r.alternatives()}
        for i, constraint in enumerate(self.constraints):
            for name in constraint.requests:
                if name not in known:
                    raise ValueError(f"constraints[{i}].requests: no request named {name!r}")
        return self


class ResourceClaimSpec(_Requested):
    devices: DeviceClaim


class DeviceRequestAllocationResult(_Published):
    request: str
    driver: str
    pool: str
    device: str
    #: For a device allocated to several claims at once: what this one consumes,
    #: and which share of the device it is.
    consumedCapacity: dict[str, Quantity] | None = None
    shareID: str | None = None


class DeviceAllocationResult(_Published):
    results: list[DeviceRequestAllocationResult] = Field(default_factory=list)


class AllocationResult(_Published):
    devices: DeviceAllocationResult = Field(default_factory=DeviceAllocationResult)
    nodeSelector: NodeSelector | None = None


class ResourceClaimConsumerReference(_Published):
    apiGroup: str = ""
    resource: str = Field(min_length=1)
    name: str = Field(min_length=1)
    uid: str = Field(min_length=1)


class ResourceClaimStatus(_Published):
    allocation: AllocationResult | None = None
    reservedFor: list[ResourceClaimConsumerReference] = Field(default_factory=list)


class ResourceClaim(_Published):
    apiVersion: Literal["resource.k8s.io/v1"] = DRA_API_VERSION
    kind: Literal["ResourceClaim"] = "ResourceClaim"
    metadata: ObjectMeta
    spec: ResourceClaimSpec
    status: ResourceClaimStatus = Field(default_factory=ResourceClaimStatus)


class TemplateMeta(_Published):
    """The metadata a template gives the claims made from it (no name of its own)."""

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ResourceClaimTemplateSpec(_Published):
    metadata: TemplateMeta = Field(default_factory=TemplateMeta)
    spec: ResourceClaimSpec


class ResourceClaimTemplate(_Published):
    apiVersion: Literal["resource.k8s.io/v1"] = DRA_API_VERSION
    kind: Literal["ResourceClaimTemplate"] = "ResourceClaimTemplate"
    metadata: ObjectMeta
    spec: ResourceClaimTemplateSpec


# ------------------------------------------------------------------- pods


class PodResourceClaim(_Requested):
    """One entry of a pod's `spec.resourceClaims`."""

    name: str = Field(min_length=1, max_length=63)
    resourceClaimName: str | None = None
    resourceClaimTemplateName: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> PodResourceClaim:
        _exactly_one(
            "a pod's resource claim",
            {
                "resourceClaimName": bool(self.resourceClaimName),
                "resourceClaimTemplateName": bool(self.resourceClaimTemplateName),
            },
        )
        return self


# ------------------------------------------------------------------- settings


class DraSettings(BaseModel):
    """How DRA devices count in queues (SchedulerConfig `spec.dra`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    deviceClasses: dict[str, str] = Field(
        default_factory=dict,
        description="DeviceClass name -> the queue resource each allocated device counts as "
        "(gpu or nvidia.com/gpu, amd.com/gpu, ...). A class not named here counts as its "
        "spec.extendedResourceName when it has one, else towards no queue resource.",
    )
    nvlinkDomainAttribute: str | None = Field(
        default=None,
        pattern=_FULLY_QUALIFIED.pattern,
        description="The device attribute (<domain>/<name>) whose value names a device's "
        "NVLink domain: nodes whose devices share a value form one domain.",
    )
