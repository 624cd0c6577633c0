"""The DRA device inventory: which devices each node can reach, and what they count as.

Built from the cluster's ResourceSlices and DeviceClasses (docs/dra.md): only the
newest generation of each pool counts; a device is local to one node (its slice's
or its own `nodeName`) or reachable from every node a selector matches (or from
all nodes). Devices kai-ray cannot allocate yet (partitionable devices that
consume shared counters, devices with binding conditions) are left out and
listed as problems, so they are never handed out half understood.

Also here: the DeviceClass-to-queue-resource mapping (how many GPUs a claim
holds for fair share and quotas), and NVLink domains (which nodes' devices share
a clique attribute). Allocation itself is `kai_ray.state.dra_allocate`.
Pure: no I/O, no decisions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kai_ray.values.device_cel import DeviceView
from kai_ray.values.dra import (
    AttributeValue,
    CapacityRequestPolicy,
    Device,
    DeviceClass,
    DeviceTaint,
    DraSettings,
    ResourceClaim,
    ResourceSlice,
)
from kai_ray.values.errors import ObjectRef, Problem
from kai_ray.values.node_selector import NodeSelector
from kai_ray.values.resources import Resources, canonical_name, parse_amount


@dataclass(frozen=True, order=True)
class DeviceRef:
    """A device's identity, as allocation results name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class InventoryDevice:
    """One device and where it can be used from."""

    ref: DeviceRef
    view: DeviceView = field(compare=False)
    taints: tuple[DeviceTaint, ...] = ()
    #: Local to this node; None: reachable per `node_selector`, or from all nodes.
    node: str | None = None
    node_selector: NodeSelector | None = field(default=None, compare=False)
    #: Qualified capacity name -> how one allocation may consume it (shareable devices).
    policies: Mapping[str, CapacityRequestPolicy] = field(default_factory=dict, compare=False)

    @property
    def attributes(self) -> Mapping[str, AttributeValue]:
        """Fully qualified names (`<domain>/<name>`) to typed values."""
        return self.view.attributes


@dataclass(frozen=True)
class Inventory:
    """The cluster's DRA devices and classes, as one cycle sees them."""

    classes: Mapping[str, DeviceClass]
    #: Node name -> the devices it can reach: its own first, then shared ones.
    by_node: Mapping[str, tuple[InventoryDevice, ...]]
    node_labels: Mapping[str, Mapping[str, str]]
    #: (driver, pool) of pools with fewer slices than they announce.
    incomplete_pools: frozenset[tuple[str, str]] = frozenset()
    problems: tuple[Problem, ...] = ()

    def devices_on(self, node: str) -> tuple[InventoryDevice, ...]:
        return self.by_node.get(node, ())

    def labels_of(self, node: str) -> dict[str, str]:
        return dict(self.node_labels.get(node, {}))


def build_inventory(
    slices: Iterable[ResourceSlice],
    classes: Iterable[DeviceClass],
    node_labels: Mapping[str, Mapping[str, str]],
) -> Inventory:
    """The inventory of these slices for these nodes (name -> labels)."""
    current, incomplete = _newest_generations(list(slices))
    problems: list[Problem] = []
    local: dict[str, list[InventoryDevice]] = defaultdict(list)
    shared: list[InventoryDevice] = []
    devices = _devices(current, problems)
    domains = frozenset(_domains(devices))
    for item, device in devices:
        built = _inventory_device(item, device, domains)
        if built.node is not None:
            local[built.node].append(built)
        else:
            shared.append(built)
    by_node = {
        node: (*local.get(node, ()), *_reachable(shared, node, dict(labels)))
        for node, labels in node_labels.items()
    }
    for node, own in local.items():
        by_node.setdefault(node, tuple(own))
    return Inventory(
        classes={c.metadata.name: c for c in classes},
        by_node=by_node,
        node_labels=node_labels,
        incomplete_pools=frozenset(incomplete),
        problems=tuple(problems),
    )


def _newest_generations(
    slices: Sequence[ResourceSlice],
) -> tuple[list[ResourceSlice], set[tuple[str, str]]]:
    """The slices of each pool's newest generation, and the pools missing slices."""
    newest: dict[tuple[str, str], int] = {}
    for item in slices:
        key = (item.spec.driver, item.spec.pool.name)
        newest[key] = max(newest.get(key, -1), item.spec.pool.generation)
    current = [
        s for s in slices if s.spec.pool.generation == newest[(s.spec.driver, s.spec.pool.name)]
    ]
    seen: dict[tuple[str, str], int] = defaultdict(int)
    announced: dict[tuple[str, str], int] = {}
    for item in current:
        key = (item.spec.driver, item.spec.pool.name)
        seen[key] += 1
        announced[key] = item.spec.pool.resourceSliceCount
    return current, {key for key, count in seen.items() if count < announced[key]}


def _devices(
    slices: Sequence[ResourceSlice], problems: list[Problem]
) -> list[tuple[ResourceSlice, Device]]:
    """Every device kai-ray can allocate, each (driver, pool, name) once."""
    kept: list[tuple[ResourceSlice, Device]] = []
    names: set[DeviceRef] = set()
    for item in sorted(slices, key=lambda s: s.metadata.name):
        for i, device in enumerate(item.spec.devices):
            ref = DeviceRef(item.spec.driver, item.spec.pool.name, device.name)
            why = _unsupported(device) or ("published twice in its pool" if ref in names else None)
            if why is not None:
                obj = ObjectRef("ResourceSlice", item.metadata.name)
                problems.append(Problem(obj, f"spec.devices[{i}]", f"{device.name}: {why}"))
                continue
            names.add(ref)
            kept.append((item, device))
    return kept


def _unsupported(device: Device) -> str | None:
    if device.consumesCounters:
        return "consumes shared counters (partitionable devices are not supported yet)"
    if device.bindingConditions:
        return "has binding conditions (not supported yet)"
    return None


def qualified(name: str, driver: str) -> str:
    """An attribute or capacity name with its domain (the driver's when it has none)."""
    return name if "/" in name else f"{driver}/{name}"


def _domains(devices: Iterable[tuple[ResourceSlice, Device]]) -> set[str]:
    domains: set[str] = set()
    for item, device in devices:
        domains.add(item.spec.driver)
        for name in (*device.attributes, *device.capacity):
            domains.add(qualified(name, item.spec.driver).rpartition("/")[0])
    return domains


def _inventory_device(
    item: ResourceSlice, device: Device, domains: frozenset[str]
) -> InventoryDevice:
    driver = item.spec.driver
    view = DeviceView(
        driver=driver,
        attributes={qualified(k, driver): v.typed for k, v in device.attributes.items()},
        capacity={
            qualified(k, driver): parse_amount(v.value, f"capacity.{k}")
            for k, v in device.capacity.items()
        },
        domains=domains,
        allow_multiple_allocations=bool(device.allowMultipleAllocations),
    )
    return InventoryDevice(
        ref=DeviceRef(driver, item.spec.pool.name, device.name),
        view=view,
        taints=tuple(device.taints),
        node=item.spec.nodeName or device.nodeName,
        node_selector=item.spec.nodeSelector or device.nodeSelector,
        policies={
            qualified(k, driver): v.requestPolicy
            for k, v in device.capacity.items()
            if v.requestPolicy is not None
        },
    )


def _reachable(
    shared: Iterable[InventoryDevice], node: str, labels: dict[str, str]
) -> tuple[InventoryDevice, ...]:
    return tuple(
        d for d in shared if d.node_selector is None or d.node_selector.matches(node, labels)
    )


# ------------------------------------------------------------------ queue resources


def class_resource(class_name: str, inventory: Inventory, settings: DraSettings) -> str | None:
    """The queue resource a device of this class counts as, or None (counted nowhere)."""
    name = settings.deviceClasses.get(class_name)
    if name is None and class_name in inventory.classes:
        name = inventory.classes[class_name].spec.extendedResourceName
    return canonical_name(name) if name else None


def _request_classes(claim: ResourceClaim) -> dict[str, str]:
    """Result name (`main` or `main/sub`) -> the DeviceClass it asks for."""
    return {
        name: exact.deviceClassName
        for request in claim.spec.devices.requests
        for name, exact in request.alternatives()
    }


def allocated_resources(
    claim: ResourceClaim, results: Iterable[str], inventory: Inventory, settings: DraSettings
) -> Resources:
    """What a claim holds in queue resources: one unit per device given under each of
    `results` (the request names of its allocation results)."""
    classes = _request_classes(claim)
    amounts: dict[str, float] = defaultdict(float)
    for result in results:
        resource = class_resource(classes.get(result, ""), inventory, settings)
        if resource is not None:
            amounts[resource] += 1.0
    return Resources(amounts)


def requested_resources(
    claim: ResourceClaim, inventory: Inventory, settings: DraSettings
) -> Resources:
    """What a claim not yet allocated asks for: ExactCount's count, All's least (one
    device; exact once allocated), a firstAvailable request's first choice."""
    amounts: dict[str, float] = defaultdict(float)
    for request in claim.spec.devices.requests:
        _, exact = request.alternatives()[0]
        resource = class_resource(exact.deviceClassName, inventory, settings)
        if resource is not None:
            count = exact.device_count if exact.allocationMode == "ExactCount" else 1
            amounts[resource] += float(count)
    return Resources(amounts)


# ------------------------------------------------------------------ NVLink domains


def nvlink_domains(inventory: Inventory, attribute: str) -> dict[str, frozenset[str]]:
    """Domain value -> the nodes with a local device carrying it (`attribute` fully
    qualified, e.g. the driver's clique id). A node whose devices carry several values
    is in each of those domains; a node with none is in no domain."""
    domains: dict[str, set[str]] = defaultdict(set)
    for node, devices in inventory.by_node.items():
        for device in devices:
            value = device.attributes.get(attribute)
            if device.node == node and value is not None and not isinstance(value[1], tuple):
                domains[str(value[1])].add(node)
    return {value: frozenset(nodes) for value, nodes in sorted(domains.items())}
