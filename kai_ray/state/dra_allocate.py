"""Allocate a pod's ResourceClaims to concrete devices reachable from one node.

`allocate(claims, node, inventory, taken)` gives every request of every claim
its devices: of the request's DeviceClass, passing the class's and the request's
CEL selectors, tolerating the devices' taints, ExactCount (`count`, default 1)
or All (every matching device the node reaches, none of them taken), a
`firstAvailable` request's first alternative that can be met, and the claim's
constraints (`matchAttribute`, `distinctAttribute`) across the devices they
cover. No device is given twice: not one in `taken`, not one to two requests.
A claim already allocated (a claim the pods of a gang share) is reused when its
devices are reachable from the node.

The search is depth-first, device by device, in the inventory's order (the
node's own devices first), with a bounded number of steps. "Does not fit" is an
`Unallocatable` with a reason a person can read, a malformed selector included;
nothing here raises for bad input. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from kai_ray.state.dra import DeviceRef, Inventory, InventoryDevice
from kai_ray.values.device_cel import SelectorError, compile_selector
from kai_ray.values.dra import (
    MAX_ALLOCATED_DEVICES,
    DeviceClass,
    DeviceConstraint,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)
from kai_ray.values.errors import ObjectRef
from kai_ray.values.node_selector import NodeSelector, NodeSelectorTerm, node_name_selector

#: Devices tried per claim before the search gives up (a reason, not a hang).
SEARCH_STEPS = 20_000


@dataclass(frozen=True)
class DeviceResult:
    """One device given to one request (`main` or `main/sub`) of a claim."""

    request: str
    ref: DeviceRef


@dataclass(frozen=True)
class ClaimAllocation:
    """A claim's devices, and the nodes they can be used from (None: any node)."""

    namespace: str
    name: str
    devices: tuple[DeviceResult, ...]
    node_selector: NodeSelector | None
    #: False for a claim that was allocated already: only `reservedFor` is written.
    new: bool = True


@dataclass(frozen=True)
class Allocation:
    """Every claim of a pod, allocated on one node."""

    node: str
    claims: tuple[ClaimAllocation, ...]

    @property
    def taken(self) -> frozenset[DeviceRef]:
        """The devices this allocation takes that were free before."""
        return frozenset(d.ref for c in self.claims if c.new for d in c.devices)


@dataclass(frozen=True)
class Unallocatable:
    reason: str


def allocate(
    claims: Sequence[ResourceClaim],
    node: str,
    inventory: Inventory,
    taken: AbstractSet[DeviceRef],
) -> Allocation | Unallocatable:
    """Devices for all `claims` on `node`, none of them in `taken`, or why not."""
    done: list[ClaimAllocation] = []
    mine: set[DeviceRef] = set()
    busy = Layered(taken, mine)
    seen: set[tuple[str, str]] = set()
    for claim in claims:
        key = (claim.metadata.namespace or "", claim.metadata.name)
        if key in seen:
            continue
        seen.add(key)
        result = _allocate_claim(claim, node, inventory, busy)
        if isinstance(result, Unallocatable):
            return result
        mine.update(d.ref for d in result.devices)
        done.append(result)
    return Allocation(node, tuple(done))


def claim_name(claim: ResourceClaim) -> str:
    """`ResourceClaim namespace/name`, as problems name objects."""
    return str(ObjectRef("ResourceClaim", claim.metadata.name, claim.metadata.namespace))


def _allocate_claim(
    claim: ResourceClaim, node: str, inventory: Inventory, taken: AbstractSet[DeviceRef]
) -> ClaimAllocation | Unallocatable:
    namespace, name = claim.metadata.namespace or "", claim.metadata.name
    allocated = claim.status.allocation
    if allocated is not None:
        where = allocated.nodeSelector
        if where is not None and not where.matches(node, inventory.labels_of(node)):
            return Unallocatable(f"{claim_name(claim)} is allocated to devices {node} cannot reach")
        results = tuple(
            DeviceResult(r.request, DeviceRef(r.driver, r.pool, r.device))
            for r in allocated.devices.results
        )
        return ClaimAllocation(namespace, name, results, where, new=False)
    try:
        search = _Search(claim, node, inventory, taken)
        chosen = search.run()
    except _Abort as abort:
        return Unallocatable(abort.reason)
    if chosen is None:
        return Unallocatable(search.why_not())
    devices = tuple(DeviceResult(request, d.ref) for request, d in chosen)
    return ClaimAllocation(namespace, name, devices, _node_selector([d for _, d in chosen], node))


class Layered(AbstractSet[DeviceRef]):
    """`base` and `extra` as one set, without copying either (membership is all the
    search asks of it; iterating walks both, `base` first)."""

    def __init__(self, base: AbstractSet[DeviceRef], extra: AbstractSet[DeviceRef]) -> None:
        self.base, self.extra = base, extra

    def __contains__(self, item: object) -> bool:
        return item in self.extra or item in self.base

    def __iter__(self) -> Iterator[DeviceRef]:
        yield from self.base
        yield from (d for d in self.extra if d not in self.base)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Abort(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Alternative:
    """One way to meet one request: its result name, what it asks, what matches."""

    name: str
    where: str
    request: ExactDeviceRequest
    matching: list[InventoryDevice] = field(default_factory=list)


Chosen = list[tuple[str, InventoryDevice]]


class _Search:
    """The depth-first search for one claim."""

    def __init__(
        self, claim: ResourceClaim, node: str, inventory: Inventory, taken: AbstractSet[DeviceRef]
    ) -> None:
        self.claim, self.node, self.inventory, self.taken = claim, node, inventory, taken
        self.constraints = claim.spec.devices.constraints
        self.steps = 0
        self.requests = [
            [self._alternative(i, j, n, r) for j, (n, r) in enumerate(request.alternatives())]
            for i, request in enumerate(claim.spec.devices.requests)
        ]

    def _alternative(self, i: int, j: int, name: str, request: ExactDeviceRequest) -> _Alternative:
        kind = "exactly" if "/" not in name else f"firstAvailable[{j}]"
        alternative = _Alternative(name, f"spec.devices.requests[{i}].{kind}", request)
        self._refuse_unsupported(alternative)
        alternative.matching = self._matching(alternative)
        return alternative

    def _refuse_unsupported(self, alternative: _Alternative) -> None:
        request, where = alternative.request, f"{claim_name(self.claim)}: {alternative.where}"
        if request.adminAccess:
            raise _Abort(f"{where}.adminAccess: admin access is not supported yet")
        if request.capacity is not None and request.capacity.requests:
            raise _Abort(f"{where}.capacity: capacity requests are not supported yet")
        if request.deviceClassName not in self.inventory.classes:
            raise _Abort(f"{where}.deviceClassName: no DeviceClass {request.deviceClassName!r}")

    def _matching(self, alternative: _Alternative) -> list[InventoryDevice]:
        request = alternative.request
        device_class = self.inventory.classes[request.deviceClassName]
        class_where = f"DeviceClass {request.deviceClassName}: spec.selectors"
        claim_where = f"{claim_name(self.claim)}: {alternative.where}.selectors"
        return [
            device
            for device in self.inventory.devices_on(self.node)
            if self._tolerated(device, request)
            and _passes(device, device_class.spec.selectors, class_where)
            and _passes(device, request.selectors, claim_where)
        ]

    @staticmethod
    def _tolerated(device: InventoryDevice, request: ExactDeviceRequest) -> bool:
        return all(
            taint.effect == "None" or any(t.tolerates(taint) for t in request.tolerations)
            for taint in device.taints
        )

    # -------------------------------------------------------------- the search

    def run(self) -> Chosen | None:
        chosen = self._from(0, [])
        if chosen is not None and len(chosen) > MAX_ALLOCATED_DEVICES:
            raise _Abort(
                f"{claim_name(self.claim)}: needs {len(chosen)} devices, more than the "
                f"{MAX_ALLOCATED_DEVICES} one claim may hold"
            )
        return chosen

    def _from(self, index: int, chosen: Chosen) -> Chosen | None:
        if index == len(self.requests):
            return chosen
        for alternative in self.requests[index]:
            for picked in self._picks(alternative, chosen):
                found = self._from(index + 1, chosen + picked)
                if found is not None:
                    return found
        return None

    def _picks(self, alternative: _Alternative, chosen: Chosen) -> Iterator[Chosen]:
        used = {d.ref for _, d in chosen}
        if alternative.request.allocationMode == "All":
            yield from self._all(alternative, chosen, used)
            return
        free = [d for d in alternative.matching if d.ref not in self.taken and d.ref not in used]
        yield from self._combinations(alternative, free, 0, chosen, [])

    def _all(
        self, alternative: _Alternative, chosen: Chosen, used: set[DeviceRef]
    ) -> Iterator[Chosen]:
        devices = alternative.matching
        if not devices or any(d.ref in self.taken or d.ref in used for d in devices):
            return
        pools = {(d.ref.driver, d.ref.pool) for d in devices}
        if pools & self.inventory.incomplete_pools:
            return
        picked: Chosen = []
        for device in devices:
            if not self._admits(alternative.name, device, chosen + picked):
                return
            picked.append((alternative.name, device))
        yield picked

    def _combinations(
        self,
        alternative: _Alternative,
        free: list[InventoryDevice],
        start: int,
        chosen: Chosen,
        picked: Chosen,
    ) -> Iterator[Chosen]:
        if len(picked) == alternative.request.device_count:
            yield picked
            return
        for k in range(start, len(free)):
            self._step()
            device = free[k]
            if self._admits(alternative.name, device, chosen + picked):
                yield from self._combinations(
                    alternative, free, k + 1, chosen, [*picked, (alternative.name, device)]
                )

    def _step(self) -> None:
        self.steps += 1
        if self.steps > SEARCH_STEPS:
            raise _Abort(
                f"{claim_name(self.claim)}: no devices found on {self.node} within "
                f"{SEARCH_STEPS} tries of its constraints"
            )

    def _admits(self, result: str, device: InventoryDevice, chosen: Chosen) -> bool:
        """Whether `device`, given under `result`, keeps every constraint with `chosen`."""
        return all(
            _keeps(constraint, device, [d for r, d in chosen if constraint.applies_to(r)])
            for constraint in self.constraints
            if constraint.applies_to(result)
        )

    def why_not(self) -> str:
        """The first request that cannot be met alone, else the constraints."""
        for alternatives in self.requests:
            reasons = [self._shortfall(a) for a in alternatives]
            if all(reasons):
                return "; ".join(r for r in reasons if r)
        rules = ", ".join(f"{c.attribute}" for c in self.constraints) or "none"
        return (
            f"{claim_name(self.claim)}: no devices on {self.node} meet all requests "
            f"together with the claim's constraints ({rules})"
        )

    def _shortfall(self, alternative: _Alternative) -> str | None:
        request, matching = alternative.request, alternative.matching
        free = [d for d in matching if d.ref not in self.taken]
        where = f"{claim_name(self.claim)}: request {alternative.name}"
        what = f"devices of class {request.deviceClassName} on {self.node}"
        if request.allocationMode == "All":
            if not matching:
                return f"{where} wants all {what}; there are none"
            if len(free) < len(matching):
                return f"{where} wants all {what}; {len(matching) - len(free)} are taken"
            incomplete = {(d.ref.driver, d.ref.pool) for d in matching}
            incomplete &= self.inventory.incomplete_pools
            if incomplete:
                pools = ", ".join(sorted(f"{driver}/{pool}" for driver, pool in incomplete))
                return f"{where} wants all {what}; not every slice of pool {pools} is published"
            return None
        if len(free) < request.device_count:
            return (
                f"{where} needs {request.device_count} {what}; {len(free)} free of {len(matching)}"
            )
        return None


def _passes(device: InventoryDevice, selectors: Sequence[DeviceSelector], where: str) -> bool:
    for k, selector in enumerate(selectors):
        compiled = compile_selector(selector.cel.expression)
        field_name = f"{where}[{k}].cel.expression"
        if compiled.program is None:
            raise _Abort(f"{field_name}: {compiled.error}")
        try:
            if not device.view.matches(compiled):
                return False
        except SelectorError as err:
            raise _Abort(f"{field_name}: on device {device.ref}: {err.message}") from None
    return True


def _keeps(
    constraint: DeviceConstraint, device: InventoryDevice, others: list[InventoryDevice]
) -> bool:
    value = device.attributes.get(constraint.attribute)
    if value is None:
        return False
    values = [d.attributes.get(constraint.attribute) for d in others]
    if constraint.matchAttribute is not None:
        return all(v == value for v in values)
    return all(v != value for v in values)


def _node_selector(devices: Sequence[InventoryDevice], node: str) -> NodeSelector | None:
    """Where the devices can be used: the node, for any local device; else the
    intersection of the devices' selectors; None when all reach every node."""
    if any(d.node is not None for d in devices):
        return node_name_selector(node)
    selectors = {s.model_dump_json(): s for d in devices if (s := d.node_selector) is not None}
    result: NodeSelector | None = None
    for selector in selectors.values():
        result = selector if result is None else _intersection(result, selector)
    return result


def _intersection(a: NodeSelector, b: NodeSelector) -> NodeSelector:
    """Terms are ORed and requirements ANDed: every pair of terms, ANDed."""
    terms = [
        NodeSelectorTerm(
            matchExpressions=[*s.matchExpressions, *t.matchExpressions],
            matchFields=[*s.matchFields, *t.matchFields],
        )
        for s in a.nodeSelectorTerms
        for t in b.nodeSelectorTerms
    ]
    return NodeSelector(nodeSelectorTerms=terms)


def class_members(devices: Sequence[InventoryDevice], device_class: DeviceClass) -> int:
    """How many of `devices` pass the class's selectors (a selector that fails to
    compile or to evaluate counts the device out; the allocator reports it)."""
    where = f"DeviceClass {device_class.metadata.name}: spec.selectors"
    count = 0
    for device in devices:
        try:
            count += _passes(device, device_class.spec.selectors, where)
        except _Abort:
            continue
    return count


def could_serve(claims: Sequence[ResourceClaim], node: str, inventory: Inventory) -> bool:
    """Whether `node` reaches enough devices for every request of every claim when
    nothing is taken (counts, classes, selectors, tolerations; not the constraints,
    which need the search): the filter before `allocate`. A claim already allocated
    must be usable from the node. A malformed selector serves nowhere."""
    for claim in claims:
        allocated = claim.status.allocation
        if allocated is not None:
            where = allocated.nodeSelector
            if where is not None and not where.matches(node, inventory.labels_of(node)):
                return False
            continue
        try:
            search = _Search(claim, node, inventory, frozenset())
        except _Abort:
            return False
        for alternatives in search.requests:
            if not any(_enough(a) for a in alternatives):
                return False
    return True


def _enough(alternative: _Alternative) -> bool:
    request = alternative.request
    if request.allocationMode == "All":
        return bool(alternative.matching)
    return len(alternative.matching) >= request.device_count
