"""Fluent builders for DRA objects in unit tests: slices, classes, claims."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from kai_ray.state.dra import Inventory, build_inventory
from kai_ray.values.dra import DeviceClass, ResourceClaim, ResourceSlice

GPU_DRIVER = "gpu.example.com"
GPU_CLASS = "gpu.example.com"
CLIQUE = "gpu.example.com/cliqueId"


def cel(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in expressions]


def device_class(
    name: str = GPU_CLASS, *selectors: str, resource: str | None = None
) -> DeviceClass:
    spec: dict[str, Any] = {"selectors": cel(*selectors)}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return DeviceClass.model_validate({"metadata": {"name": name}, "spec": spec})


class SliceBuilder:
    """`make_slice("n1").gpus(8, clique="c0").build()`: a driver's slice for one node."""

    def __init__(self, node: str | None, driver: str = GPU_DRIVER) -> None:
        self.node, self.driver = node, driver
        self.pool = node or "shared"
        self.devices: list[dict[str, Any]] = []
        self.where: dict[str, Any] = {"nodeName": node} if node else {"allNodes": True}
        self.pool_generation, self.slice_count = 0, 1
        self.name = f"{self.pool}-{driver}"

    def gpu(
        self,
        name: str,
        product: str = "H100",
        memory: str = "80Gi",
        clique: str | None = None,
        taint: str | None = None,
        **attributes: Any,
    ) -> Self:
        attrs: dict[str, Any] = {"productName": {"string": product}}
        if clique is not None:
            attrs[CLIQUE] = {"string": clique}
        attrs.update({k: _typed(v) for k, v in attributes.items()})
        device: dict[str, Any] = {
            "name": name,
            "attributes": attrs,
            "capacity": {"memory": {"value": memory}},
        }
        if taint is not None:
            device["taints"] = [{"key": taint, "effect": "NoSchedule"}]
        self.devices.append(device)
        return self

    def gpus(self, count: int, start: int = 0, **kwargs: Any) -> Self:
        for i in range(start, start + count):
            self.gpu(f"gpu-{i}", index=i, **kwargs)
        return self

    def selector(self, label: str, value: str) -> Self:
        term = {"matchExpressions": [{"key": label, "operator": "In", "values": [value]}]}
        self.where = {"nodeSelector": {"nodeSelectorTerms": [term]}}
        return self

    def in_pool(self, pool: str, generation: int = 0, slices: int = 1, name: str = "") -> Self:
        self.pool, self.pool_generation, self.slice_count = pool, generation, slices
        self.name = name or f"{pool}-{generation}-{self.driver}"
        return self

    def build(self) -> ResourceSlice:
        pool = {
            "name": self.pool,
            "generation": self.pool_generation,
            "resourceSliceCount": self.slice_count,
        }
        spec = {"driver": self.driver, "pool": pool, "devices": self.devices, **self.where}
        return ResourceSlice.model_validate({"metadata": {"name": self.name}, "spec": spec})


def make_slice(node: str | None, driver: str = GPU_DRIVER) -> SliceBuilder:
    return SliceBuilder(node, driver)


def _typed(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": str(value)}


def exact(
    name: str = "gpus",
    count: int | None = None,
    mode: str | None = None,
    selectors: Sequence[str] = (),
    device_class_name: str = GPU_CLASS,
    **extra: Any,
) -> dict[str, Any]:
    """A request `name` for `count` devices (`mode` All for all of them)."""
    body: dict[str, Any] = {"deviceClassName": device_class_name, "selectors": cel(*selectors)}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    return {"name": name, "exactly": {**body, **extra}}


def claim(
    name: str,
    *requests: Mapping[str, Any],
    constraints: Sequence[Mapping[str, Any]] = (),
    namespace: str = "team-a",
    status: Mapping[str, Any] | None = None,
) -> ResourceClaim:
    raw: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": list(requests), "constraints": list(constraints)}},
    }
    if status is not None:
        raw["status"] = dict(status)
    return ResourceClaim.model_validate(raw)


def inventory(
    *slices: ResourceSlice,
    classes: Sequence[DeviceClass] = (),
    nodes: Mapping[str, Mapping[str, str]] | None = None,
) -> Inventory:
    """The inventory of `slices`; the classes default to one GPU class, and the nodes
    to those the slices name."""
    if nodes is None:
        nodes = {s.spec.nodeName: {} for s in slices if s.spec.nodeName}
    return build_inventory(slices, classes or [device_class()], nodes)
