"""`NodePool` (`sim.kai-ray.io/v1alpha1`): many simulated nodes from one object.

`count` nodes named `<namePrefix>-<i>` are split evenly and in order over the
topology domains. Each level of `spec.topology` gives the number of domains
under each domain of the wider level; a node's label value for a level is
`<last segment of the label>-<index within the parent>` joined to the wider
levels' values with `-` (`block-0`, then `block-0-rack-3`).

With `spec.dra`, the pool also publishes what a DRA driver would: one
ResourceSlice per node (its own pool, named after the node) of `devices`
devices `gpu-<i>` with the given attributes and capacities, an optional
`cliqueId` attribute shared by each run of `nvlinkDomainSize` consecutive
nodes, and optionally the DeviceClass that selects the driver's devices.
Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from kai_ray.values.api import HOSTNAME_LABEL, ApiModel, ObjectMeta, Quantity
from kai_ray.values.dra import DRA_API_VERSION

SIM_API_VERSION: Final = "sim.kai-ray.io/v1alpha1"
#: Most devices one ResourceSlice may list (the API server's limit).
MAX_SLICE_DEVICES: Final = 128
#: A DNS subdomain (a driver's or a DeviceClass's name).
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: An attribute or capacity name, bare (in the driver's domain) or `<domain>/<name>`.
_DEVICE_FIELD = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]*$"


class PoolTaint(ApiModel):
    key: str = Field(min_length=1)
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class PoolLevel(ApiModel):
    label: str = Field(min_length=1, description="Node label of this level.")
    domains: int = Field(ge=1, description="Domains under each domain of the wider level.")


class PoolDra(ApiModel):
    """The devices a DRA driver publishes for each node of the pool."""

    driver: str = Field(min_length=1, max_length=63, pattern=_SUBDOMAIN)
    devices: int = Field(ge=1, le=MAX_SLICE_DEVICES, description="Devices per node.")
    deviceClass: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=_SUBDOMAIN,
        description="Also publish a DeviceClass of this name selecting the driver's devices.",
    )
    attributes: dict[str, str | bool | int] = Field(default_factory=dict)
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    nvlinkDomainSize: int | None = Field(
        default=None, ge=1, description="Consecutive nodes sharing one cliqueId attribute."
    )
    nvlinkDomainAttribute: str = Field(default="cliqueId", pattern=_DEVICE_FIELD)

    @field_validator("attributes", "capacity")
    @classmethod
    def _qualified_names(cls, values: dict[str, Any]) -> dict[str, Any]:
        for name in values:
            if not re.match(_DEVICE_FIELD, name):
                raise ValueError(f"[{name}]: must be a name or <domain>/<name>, e.g. productName")
        return values

    @model_validator(mode="after")
    def _domain_attribute_is_not_given(self) -> PoolDra:
        if self.nvlinkDomainSize is not None and self.nvlinkDomainAttribute in self.attributes:
            raise ValueError(
                f"attributes[{self.nvlinkDomainAttribute}]: set per domain by nvlinkDomainSize"
            )
        return self

    def qualified(self, name: str) -> str:
        return name if "/" in name else f"{self.driver}/{name}"


class NodePoolSpec(ApiModel):
    count: int = Field(ge=1, le=100_000)
    namePrefix: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    capacity: dict[str, Quantity] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[PoolTaint] = Field(default_factory=list)
    topology: list[PoolLevel] = Field(default_factory=list)
    dra: PoolDra | None = None

    @field_validator("topology")
    @classmethod
    def _unique_labels(cls, levels: list[PoolLevel]) -> list[PoolLevel]:
        labels = [level.label for level in levels]
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise ValueError(f"[{i}].label: {label!r} is used twice")
        return levels

    @model_validator(mode="after")
    def _enough_nodes(self) -> NodePoolSpec:
        total = math.prod(level.domains for level in self.topology)
        if total > self.count:
            raise ValueError(f"topology: {total} domains in all but only {self.count} nodes")
        size = self.dra.nvlinkDomainSize if self.dra is not None else None
        if size is not None and size > self.count:
            raise ValueError(f"dra.nvlinkDomainSize: {size} is more than the {self.count} nodes")
        return self


class NodePool(ApiModel):
    apiVersion: Literal["sim.kai-ray.io/v1alpha1"] = SIM_API_VERSION
    kind: Literal["NodePool"] = "NodePool"
    metadata: ObjectMeta
    spec: NodePoolSpec


def _segment(label: str) -> str:
    return label.rsplit("/", 1)[-1]


def topology_labels(spec: NodePoolSpec, index: int) -> dict[str, str]:
    """The topology labels of node `index` of the pool."""
    labels: dict[str, str] = {}
    value = ""
    total = 1
    for level in spec.topology:
        total *= level.domains
        local = (index * total // spec.count) % level.domains
        part = f"{_segment(level.label)}-{local}"
        value = f"{value}-{part}" if value else part
        labels[level.label] = value
    return labels


def expand(pool: NodePool) -> list[dict[str, Any]]:
    """The Node objects of a pool, in order."""
    spec = pool.spec
    capacity = {name: str(amount) for name, amount in spec.capacity.items()}
    nodes = []
    for i in range(spec.count):
        name = f"{spec.namePrefix}-{i}"
        labels = {**spec.labels, **topology_labels(spec, i), HOSTNAME_LABEL: name}
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": [t.model_dump(exclude_none=True) for t in spec.taints]},
                "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
            }
        )
    return nodes


# ------------------------------------------------------------------ DRA


def _attribute(value: str | bool | int) -> dict[str, str | bool | int]:
    """A typed DRA attribute (bool is checked first: it is an int in Python)."""
    if isinstance(value, bool):
        return {"bool": value}
    return {"int": value} if isinstance(value, int) else {"string": value}


def nvlink_domain(pool: NodePool, index: int) -> str | None:
    """The clique id node `index` publishes: `<namePrefix>-nvl-<k>` for the k-th run of
    `nvlinkDomainSize` nodes (the last run may be shorter)."""
    dra = pool.spec.dra
    if dra is None or dra.nvlinkDomainSize is None:
        return None
    return f"{pool.spec.namePrefix}-nvl-{index // dra.nvlinkDomainSize}"


def _device(dra: PoolDra, index: int, clique: str | None) -> dict[str, Any]:
    attributes = {name: _attribute(value) for name, value in dra.attributes.items()}
    if clique is not None:
        attributes[dra.nvlinkDomainAttribute] = {"string": clique}
    device: dict[str, Any] = {"name": f"gpu-{index}", "attributes": attributes}
    if dra.capacity:
        device["capacity"] = {name: {"value": str(q)} for name, q in dra.capacity.items()}
    return device


def resource_slices(pool: NodePool) -> list[dict[str, Any]]:
    """One ResourceSlice per node of the pool (none without `spec.dra`): the node's own
    pool, as a node-local driver publishes it."""
    dra = pool.spec.dra
    if dra is None:
        return []
    slices = []
    for i in range(pool.spec.count):
        node = f"{pool.spec.namePrefix}-{i}"
        clique = nvlink_domain(pool, i)
        slices.append(
            {
                "apiVersion": DRA_API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{dra.driver}"},
                "spec": {
                    "driver": dra.driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                    "devices": [_device(dra, d, clique) for d in range(dra.devices)],
                },
            }
        )
    return slices


def device_classes(pool: NodePool) -> list[dict[str, Any]]:
    """The DeviceClass `spec.dra.deviceClass` names (selecting the driver's devices), or none."""
    dra = pool.spec.dra
    if dra is None or dra.deviceClass is None:
        return []
    expression = f"device.driver == {json.dumps(dra.driver)}"
    return [
        {
            "apiVersion": DRA_API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": dra.deviceClass},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
    ]
