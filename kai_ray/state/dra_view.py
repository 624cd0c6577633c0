"""What one cycle knows of DRA: the inventory, the claims, and what each pod's claims ask.

`build_dra_view` reads the cluster's DeviceClasses, ResourceSlices, ResourceClaims
and ResourceClaimTemplates once (bad objects become problems naming the field)
and gives the snapshot one `DraView`:
- the device **inventory** (`state/dra.py`) and the devices allocated claims hold
  (`taken`);
- per node, its **own devices of mapped classes** as queue resources
  (`node_resources`), which the snapshot adds to the node's allocatable, so a node
  with eight DRA GPUs offers eight `nvidia.com/gpu` exactly as a device plugin's
  node does, and a pod whose claims hold or ask for eight takes them;
- per node, the **NVLink domain** its devices name (`node_labels`, the label
  `NVLINK_DOMAIN_LABEL`), so a Topology level or a gang's required level can name it;
- `pod_claims`: a pod's claims resolved, the queue resources they ask for (or
  hold), and why the pod cannot be placed yet when a claim is missing or malformed.

A claim shared by several pods (one `resourceClaimName` named by every pod of a
gang) counts once: in the first of its live users by key. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_ray.state.dra import (
    DeviceRef,
    Inventory,
    allocated_resources,
    build_inventory,
    class_resource,
    nvlink_domains,
    requested_resources,
)
from kai_ray.state.dra_allocate import class_members, result_of
from kai_ray.state.nodes import NodeFacts
from kai_ray.state.pod_states import PodState
from kai_ray.values.device_cel import selector_problems
from kai_ray.values.dra import (
    DeviceClass,
    DraSettings,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from kai_ray.values.errors import InvalidObjectError, Problem
from kai_ray.values.resources import GPU, Resources, parse_amount
from kai_ray.values.validation import parse_model
from kai_ray.workloads.pod_claims import PodClaim
from kai_ray.workloads.pod_fields import GpuShare

Obj = Mapping[str, Any]
#: The node label carrying the NVLink domain (`DraSettings.nvlinkDomainAttribute`)
#: of the node's own devices, for Topology levels and required levels.
NVLINK_DOMAIN_LABEL = "kai-ray.io/nvlink-domain"


@dataclass(frozen=True)
class PodClaims:
    """A pod's claims as this cycle sees them."""

    #: `namespace/name` of each claim that exists, in the pod's order.
    keys: tuple[str, ...] = ()
    #: Queue resources the claims ask for or hold (a shared claim: its first user only).
    resources: Resources = field(default_factory=Resources)
    #: Why the pod cannot be placed yet ("" when it can): a claim not made yet,
    #: a claim or template that does not exist or cannot be read.
    wait: str = ""
    #: Part of one GPU the claims take on a shareable device (0: none), packed as
    #: a fractional GPU is.
    gpu_share: float = 0.0


@dataclass(frozen=True)
class DraView:
    settings: DraSettings = field(default_factory=DraSettings)
    inventory: Inventory = field(
        default_factory=lambda: Inventory(classes={}, by_node={}, node_labels={})
    )
    #: Readable claims by `namespace/name`.
    claims: Mapping[str, ResourceClaim] = field(default_factory=dict)
    templates: Mapping[str, ResourceClaimTemplate] = field(default_factory=dict)
    #: Devices held whole by allocated claims.
    taken: frozenset[DeviceRef] = frozenset()
    #: What allocated claims consume of shareable devices (qualified capacity names).
    consumed: Mapping[DeviceRef, Mapping[str, float]] = field(default_factory=dict)
    #: Claim key -> the keys of live pods naming it, sorted (the first one counts it).
    users: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Node -> its own devices of mapped classes, as queue resources.
    node_resources: Mapping[str, Resources] = field(default_factory=dict)
    #: Node -> labels the devices give it (the NVLink domain).
    node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: Mapped class -> the capacities (qualified) of one of its shareable devices:
    #: what a share is measured against.
    share_capacity: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: Mapped classes with devices reachable from several nodes, and those devices:
    #: they count as no node's room, so a claim on them counts in no queue resource.
    pooled: frozenset[str] = frozenset()
    pooled_devices: frozenset[DeviceRef] = frozenset()
    problems: tuple[Problem, ...] = ()
    #: Bad claims by key: the problem a pod using them waits on.
    broken: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.claims or self.templates or self.inventory.by_node)

    def pod_claims(
        self, pod_key: str, namespace: str, entries: Sequence[PodClaim], stand_in: bool = False
    ) -> PodClaims:
        """The pod's claims resolved; `entries` as `pod_claims` read them from the pod.
        A stand-in (a suspended workload's placeholder) counts its templates and
        waits for no claim: its claims are made once its real pods exist."""
        if not entries:
            return NO_CLAIMS
        keys: list[str] = []
        counts = _Counts()
        waits: list[str] = []
        for entry in entries:
            if entry.claim is None:
                template = self.templates.get(f"{namespace}/{entry.template}")
                if template is None:
                    waits.append(
                        f"ResourceClaimTemplate {namespace}/{entry.template} (claim "
                        f"{entry.entry!r}) does not exist or cannot be read"
                    )
                    continue
                if not stand_in:
                    waits.append(
                        f"the ResourceClaim of {entry.entry!r} (template {entry.template}) "
                        "is not made yet"
                    )
                claim = ResourceClaim.model_validate(
                    {"metadata": {"name": "-", "namespace": namespace}, "spec": template.spec.spec}
                )
                self._count(claim, counts)
                continue
            key = f"{namespace}/{entry.claim}"
            if key in self.broken:
                waits.append(self.broken[key])
                continue
            found = self.claims.get(key)
            if found is None:
                waits.append(f"ResourceClaim {key} (claim {entry.entry!r}) does not exist")
                continue
            keys.append(key)
            if self.users.get(key, (pod_key,))[0] == pod_key:
                self._count(found, counts)
        share = counts.shares.pop(GPU, 0.0)
        if share > 1.0 + 1e-9:
            waits.append(f"its claims take {share:g} of one GPU's capacity in shares; at most 1")
        resources = Resources(dict(counts.whole)) + dict(counts.shares)
        return PodClaims(tuple(keys), resources, "; ".join(waits), share)

    def _count(self, claim: ResourceClaim, counts: _Counts) -> None:
        """Add what a claim holds (allocated) or asks for (pending) in queue resources:
        a device given whole as one unit of its class's resource; a share of a
        shareable device as the part of the device's capacity it consumes."""
        classes = {
            name: exact.deviceClassName
            for request in claim.spec.devices.requests
            for name, exact in request.alternatives()
        }
        allocation = claim.status.allocation
        if allocation is not None:
            for result in map(result_of, allocation.devices.results):
                if result.ref not in self.pooled_devices:
                    self._add(classes.get(result.request, ""), 1, dict(result.consumed), counts)
            return
        for request in claim.spec.devices.requests:
            _, exact = request.alternatives()[0]
            if exact.deviceClassName in self.pooled:
                continue
            count = exact.device_count if exact.allocationMode == "ExactCount" else 1
            driver_of = self.share_capacity.get(exact.deviceClassName, {})
            wanted = {}
            if exact.capacity is not None:
                for name, amount in exact.capacity.requests.items():
                    full = next((k for k in driver_of if k.split("/", 1)[-1] == name), name)
                    wanted[full] = parse_amount(amount, f"capacity.requests.{name}")
            self._add(exact.deviceClassName, count, wanted, counts)

    def _add(
        self, class_name: str, count: int, consumed: Mapping[str, float], counts: _Counts
    ) -> None:
        resource = class_resource(class_name, self.inventory, self.settings)
        if resource is None:
            return
        capacity = self.share_capacity.get(class_name, {})
        part = next((consumed[k] / capacity[k] for k in consumed if capacity.get(k)), None)
        if part is None:
            counts.whole[resource] = counts.whole.get(resource, 0.0) + count
        else:
            counts.shares[resource] = counts.shares.get(resource, 0.0) + part * count


@dataclass
class _Counts:
    whole: dict[str, float] = field(default_factory=dict)
    shares: dict[str, float] = field(default_factory=dict)


NO_CLAIMS = PodClaims()
EMPTY = DraView()


def claim_resources(claim: ResourceClaim, inventory: Inventory, settings: DraSettings) -> Resources:
    """What a claim counts as in queue resources: its devices once allocated, else its requests."""
    allocation = claim.status.allocation
    if allocation is not None:
        results = [r.request for r in allocation.devices.results]
        return allocated_resources(claim, results, inventory, settings)
    return requested_resources(claim, inventory, settings)


@dataclass(frozen=True)
class DeviceSide:
    """What the slices and classes give, for these nodes: built again only when
    slices, classes or node labels change (building it costs about a second per
    thousands of nodes; claims change with every bind and do not rebuild it)."""

    inventory: Inventory
    node_resources: Mapping[str, Resources]
    node_labels: Mapping[str, Mapping[str, str]]
    problems: tuple[Problem, ...]
    share_capacity: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: Mapped classes with devices reachable from several nodes (a pool's).
    pooled: frozenset[str] = frozenset()
    #: Devices reachable from several nodes.
    pooled_devices: frozenset[DeviceRef] = frozenset()


def build_device_side(
    *,
    classes: Iterable[Obj],
    slices: Iterable[Obj],
    node_labels: Mapping[str, Mapping[str, str]],
    settings: DraSettings,
) -> DeviceSide:
    problems: list[Problem] = []
    read_classes = [c for c in _parsed(DeviceClass, classes, problems) if _compiles(c, problems)]
    read_slices = _parsed(ResourceSlice, slices, problems)
    inventory = build_inventory(read_slices, read_classes, node_labels)
    problems.extend(inventory.problems)
    return DeviceSide(
        inventory,
        _node_resources(inventory, settings),
        _domain_labels(inventory, settings),
        tuple(problems),
        _share_capacity(inventory, settings),
        *_pooled(inventory, settings),
    )


def build_dra_view(
    devices: DeviceSide,
    *,
    claims: Iterable[Obj],
    templates: Iterable[Obj],
    users: Mapping[str, tuple[str, ...]],
    settings: DraSettings,
) -> DraView:
    """The view of these claims and templates over `devices`; `users`: claim key ->
    the keys of the live pods naming it."""
    problems: list[Problem] = list(devices.problems)
    broken: dict[str, str] = {}
    read_claims: dict[str, ResourceClaim] = {}
    for raw in claims:
        key = _key(raw)
        try:
            claim = parse_model(ResourceClaim, raw)
        except InvalidObjectError as err:
            problems.extend(err.problems)
            broken[key] = "; ".join(str(p) for p in err.problems)
            continue
        found = selector_problems(claim)
        if found:
            problems.extend(found)
            broken[key] = "; ".join(str(p) for p in found)
            continue
        read_claims[key] = claim
    read_templates: dict[str, ResourceClaimTemplate] = {}
    for template in _parsed(ResourceClaimTemplate, templates, problems):
        if _compiles(template, problems):
            meta = template.metadata
            read_templates[f"{meta.namespace}/{meta.name}"] = template
    taken: set[DeviceRef] = set()
    consumed: dict[DeviceRef, dict[str, float]] = {}
    for claim in read_claims.values():
        if claim.status.allocation is None:
            continue
        for result in map(result_of, claim.status.allocation.devices.results):
            if not result.shared:
                taken.add(result.ref)
                continue
            into = consumed.setdefault(result.ref, {})
            for name, amount in result.consumed:
                into[name] = into.get(name, 0.0) + amount
    return DraView(
        settings=settings,
        inventory=devices.inventory,
        claims=read_claims,
        templates=read_templates,
        taken=frozenset(taken),
        consumed=consumed,
        users=users,
        node_resources=devices.node_resources,
        node_labels=devices.node_labels,
        share_capacity=devices.share_capacity,
        pooled=devices.pooled,
        pooled_devices=devices.pooled_devices,
        problems=tuple(problems),
        broken=broken,
    )


def claim_users(pods: Iterable[PodState]) -> dict[str, tuple[str, ...]]:
    """Claim key -> the keys of the live pods naming it, sorted."""
    users: dict[str, list[str]] = defaultdict(list)
    for pod in pods:
        if pod.terminal:
            continue
        for entry in pod.claim_entries:
            if entry.claim is not None:
                users[f"{pod.namespace}/{entry.claim}"].append(pod.key)
    return {key: tuple(sorted(keys)) for key, keys in users.items()}


def with_claims(pod: PodState, view: DraView) -> PodState:
    """The pod with its claims found and what they count as added to its requests."""
    if not pod.claim_entries:
        return pod
    found = view.pod_claims(pod.key, pod.namespace, pod.claim_entries, pod.stand_in)
    wait, share, fraction = found.wait, pod.gpu_share, pod.gpu_fraction
    if found.gpu_share > 0:
        if pod.gpu_share is not None or pod.requests[GPU] > 0 or found.resources[GPU] > 0:
            wait = wait or (
                "a pod takes either one GPU share or whole GPUs; its claims and requests "
                "ask for both"
            )
        else:
            fraction = min(found.gpu_share, 1.0)
            share = GpuShare(fraction=fraction)
    return dataclasses.replace(
        pod,
        requests=pod.requests + found.resources,
        claims=found.keys,
        claim_wait=wait,
        gpu_share=share,
        gpu_fraction=fraction,
    )


def with_devices(node: NodeFacts, view: DraView) -> NodeFacts:
    """The node offering its own DRA devices of mapped classes, labelled with its NVLink domain."""
    extra = view.node_resources.get(node.name)
    labels = view.node_labels.get(node.name)
    if extra is None and labels is None:
        return node
    return dataclasses.replace(
        node,
        capacity=node.capacity + extra if extra else node.capacity,
        allocatable=node.allocatable + extra if extra else node.allocatable,
        labels={**node.labels, **labels} if labels else node.labels,
    )


def _key(raw: Obj) -> str:
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _parsed(model: type[Any], objects: Iterable[Obj], problems: list[Problem]) -> list[Any]:
    read = []
    for raw in objects:
        try:
            read.append(parse_model(model, raw))
        except InvalidObjectError as err:
            problems.extend(err.problems)
    return read


def _compiles(obj: DeviceClass | ResourceClaimTemplate, problems: list[Problem]) -> bool:
    found = selector_problems(obj)
    problems.extend(found)
    return not found


def _node_resources(inventory: Inventory, settings: DraSettings) -> dict[str, Resources]:
    """Each node's own devices of mapped classes, counted as the classes they match."""
    mapped = {
        name: resource
        for name in inventory.classes
        if (resource := class_resource(name, inventory, settings)) is not None
    }
    if not mapped:
        return {}
    counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for node, devices in inventory.by_node.items():
        own = [d for d in devices if d.node == node]
        for class_name, resource in mapped.items():
            members = class_members(own, inventory.classes[class_name])
            if members:
                counts[node][resource] = max(counts[node][resource], float(members))
    return {node: Resources(dict(amounts)) for node, amounts in counts.items()}


def _share_capacity(inventory: Inventory, settings: DraSettings) -> dict[str, dict[str, float]]:
    """Mapped class -> the capacities of the first shareable device of it (devices of
    one class are taken to be alike; a share is measured against them)."""
    found: dict[str, dict[str, float]] = {}
    for class_name, device_class in inventory.classes.items():
        if class_resource(class_name, inventory, settings) is None:
            continue
        for node, devices in inventory.by_node.items():
            shareable = [d for d in devices if d.node == node and d.view.allow_multiple_allocations]
            member = next((d for d in shareable if class_members([d], device_class)), None)
            if member is not None:
                found[class_name] = dict(member.view.capacity)
                break
    return found


def _pooled(
    inventory: Inventory, settings: DraSettings
) -> tuple[frozenset[str], frozenset[DeviceRef]]:
    """Mapped classes that have devices reachable from several nodes, and every such
    device. Node room counts a node's own devices only, so a claim on a pooled
    device counts in no queue resource (docs/dra.md)."""
    devices = {d.ref: d for own in inventory.by_node.values() for d in own if d.node is None}
    classes = frozenset(
        name
        for name, device_class in inventory.classes.items()
        if class_resource(name, inventory, settings) is not None
        and class_members(list(devices.values()), device_class)
    )
    return classes, frozenset(devices)


def _domain_labels(inventory: Inventory, settings: DraSettings) -> dict[str, dict[str, str]]:
    attribute = settings.nvlinkDomainAttribute
    if attribute is None:
        return {}
    labels: dict[str, dict[str, str]] = {}
    for value, nodes in nvlink_domains(inventory, attribute).items():
        for node in nodes:
            labels.setdefault(node, {NVLINK_DOMAIN_LABEL: value})
    return labels
