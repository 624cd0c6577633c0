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

import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from kai_ray.state.dra import DeviceRef, Inventory, InventoryDevice, qualified
from kai_ray.values.device_cel import SelectorError, compile_selector
from kai_ray.values.dra import (
    MAX_ALLOCATED_DEVICES,
    CapacityRequestPolicy,
    DeviceClass,
    DeviceConstraint,
    DeviceRequestAllocationResult,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaim,
)
from kai_ray.values.errors import ObjectRef
from kai_ray.values.node_selector import NodeSelector, NodeSelectorTerm, node_name_selector
from kai_ray.values.resources import parse_amount

#: Devices tried per claim before the search gives up (a reason, not a hang).
SEARCH_STEPS = 20_000


#: Capacity a shareable device has given out: device -> qualified capacity name -> amount.
Consumed = Mapping[DeviceRef, Mapping[str, float]]
NOTHING_CONSUMED: Consumed = {}


@dataclass(frozen=True)
class DeviceResult:
    """One device given to one request (`main` or `main/sub`) of a claim."""

    request: str
    ref: DeviceRef
    #: For a device several claims may share (`allowMultipleAllocations`): what this
    #: result consumes of each capacity (qualified names), and its share's id.
    consumed: tuple[tuple[str, float], ...] = ()
    share_id: str | None = None

    @property
    def shared(self) -> bool:
        return self.share_id is not None


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
        """The devices this allocation takes whole that were free before."""
        return frozenset(d.ref for c in self.claims if c.new for d in c.devices if not d.shared)


@dataclass(frozen=True)
class Unallocatable:
    reason: str


def allocate(
    claims: Sequence[ResourceClaim],
    node: str,
    inventory: Inventory,
    taken: AbstractSet[DeviceRef],
    consumed: Consumed = NOTHING_CONSUMED,
) -> Allocation | Unallocatable:
    """Devices for all `claims` on `node`, none of them in `taken`, or why not; a
    shareable device gives what of its capacity `consumed` leaves."""
    done: list[ClaimAllocation] = []
    mine: set[DeviceRef] = set()
    busy = Layered(taken, mine)
    using = _Using(consumed)
    seen: set[tuple[str, str]] = set()
    for claim in claims:
        key = (claim.metadata.namespace or "", claim.metadata.name)
        if key in seen:
            continue
        seen.add(key)
        result = _allocate_claim(claim, node, inventory, busy, using)
        if isinstance(result, Unallocatable):
            return result
        for device in result.devices:
            if device.shared:
                using.add(device.ref, device.consumed)
            else:
                mine.add(device.ref)
        done.append(result)
    return Allocation(node, tuple(done))


class _Using:
    """What shareable devices have given out: `base` plus this allocation's own."""

    def __init__(self, base: Consumed) -> None:
        self.base = base
        self.extra: dict[DeviceRef, dict[str, float]] = {}

    def of(self, ref: DeviceRef, name: str) -> float:
        return self.base.get(ref, {}).get(name, 0.0) + self.extra.get(ref, {}).get(name, 0.0)

    def add(self, ref: DeviceRef, amounts: Iterable[tuple[str, float]]) -> None:
        into = self.extra.setdefault(ref, {})
        for name, amount in amounts:
            into[name] = into.get(name, 0.0) + amount


def claim_name(claim: ResourceClaim) -> str:
    """`ResourceClaim namespace/name`, as problems name objects."""
    return str(ObjectRef("ResourceClaim", claim.metadata.name, claim.metadata.namespace))


def _allocate_claim(
    claim: ResourceClaim,
    node: str,
    inventory: Inventory,
    taken: AbstractSet[DeviceRef],
    using: _Using | None = None,
) -> ClaimAllocation | Unallocatable:
    namespace, name = claim.metadata.namespace or "", claim.metadata.name
    allocated = claim.status.allocation
    if allocated is not None:
        where = allocated.nodeSelector
        if where is not None and not where.matches(node, inventory.labels_of(node)):
            return Unallocatable(f"{claim_name(claim)} is allocated to devices {node} cannot reach")
        results = tuple(result_of(r) for r in allocated.devices.results)
        return ClaimAllocation(namespace, name, results, where, new=False)
    try:
        search = _Search(claim, node, inventory, taken, using or _Using(NOTHING_CONSUMED))
        chosen = search.run()
    except _Abort as abort:
        return Unallocatable(abort.reason)
    if chosen is None:
        return Unallocatable(search.why_not())
    devices = tuple(search.result(request, d) for request, d in chosen)
    return ClaimAllocation(namespace, name, devices, _node_selector([d for _, d in chosen], node))


def result_of(result: DeviceRequestAllocationResult) -> DeviceResult:
    """An allocation result as read from a claim's status."""
    ref = DeviceRef(result.driver, result.pool, result.device)
    consumed = tuple(
        (qualified(k, result.driver), parse_amount(v, f"consumedCapacity.{k}"))
        for k, v in (result.consumedCapacity or {}).items()
    )
    return DeviceResult(result.request, ref, consumed, result.shareID)


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
        self,
        claim: ResourceClaim,
        node: str,
        inventory: Inventory,
        taken: AbstractSet[DeviceRef],
        using: _Using | None = None,
    ) -> None:
        self.claim, self.node, self.inventory, self.taken = claim, node, inventory, taken
        self.using = using or _Using(NOTHING_CONSUMED)
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
        if request.capacity is not None and request.allocationMode == "All":
            raise _Abort(
                f"{where}.capacity: capacity requests with allocationMode All are not supported"
            )
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
            and need_of(request, device) is not None
            and _passes(device, device_class.spec.selectors, class_where)
            and _passes(device, request.selectors, claim_where)
        ]

    def _free(self, device: InventoryDevice, request: ExactDeviceRequest) -> bool:
        """Not given to anyone (a device taken whole), or with room for the request
        left of each capacity (a shareable device)."""
        if not device.view.allow_multiple_allocations:
            return device.ref not in self.taken
        if device.ref in self.taken:
            return False
        need = need_of(request, device) or {}
        capacity = device.view.capacity
        return all(
            self.using.of(device.ref, name) + amount <= capacity[name] * (1 + 1e-9)
            for name, amount in need.items()
        )

    def result(self, request: str, device: InventoryDevice) -> DeviceResult:
        if not device.view.allow_multiple_allocations:
            return DeviceResult(request, device.ref)
        alternative = next(a for alts in self.requests for a in alts if a.name == request)
        need = need_of(alternative.request, device) or {}
        claim = f"{self.claim.metadata.namespace}/{self.claim.metadata.name}"
        share = uuid.uuid5(uuid.NAMESPACE_URL, f"kai-ray:{claim}/{request}/{device.ref}")
        return DeviceResult(request, device.ref, tuple(sorted(need.items())), str(share))

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
        free = [
            d
            for d in alternative.matching
            if d.ref not in used and self._free(d, alternative.request)
        ]
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
        free = [d for d in matching if self._free(d, request)]
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
                f"{where} needs {request.device_count} {what}; {len(free)} free of "
                f"{len(matching)}{self._left_out(request, matching)}"
            )
        return None

    def _left_out(self, request: ExactDeviceRequest, matching: list[InventoryDevice]) -> str:
        """What kept the class's other devices out: the request's selectors or capacity."""
        device_class = self.inventory.classes[request.deviceClassName]
        of_class = class_members(self.inventory.devices_on(self.node), device_class)
        if of_class <= len(matching):
            return ""
        kept = []
        if request.selectors:
            expressions = " and ".join(s.cel.expression for s in request.selectors)
            kept.append(f"its selectors ({expressions})")
        if request.capacity is not None and request.capacity.requests:
            kept.append("its capacity requests")
        if any(d.taints for d in self.inventory.devices_on(self.node)):
            kept.append("their taints")
        by = " or ".join(kept) or "the request"
        return f"; {of_class - len(matching)} of the class left out by {by}"


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


def need_of(request: ExactDeviceRequest, device: InventoryDevice) -> dict[str, float] | None:
    """What one allocation of `device` for `request` consumes of each of its
    capacities (qualified names); None when the device cannot serve the request's
    capacity requests. A device taken whole consumes nothing countable ({}): it is
    given to one claim. For a shareable device (KEP-5075): what is requested,
    rounded up to what its `requestPolicy` allows; for a capacity not requested,
    the policy's default, else all of it."""
    driver = device.ref.driver
    wanted = {
        qualified(k, driver): parse_amount(v, f"capacity.requests.{k}")
        for k, v in (request.capacity.requests if request.capacity is not None else {}).items()
    }
    capacity = device.view.capacity
    if any(name not in capacity or amount > capacity[name] for name, amount in wanted.items()):
        return None
    if not device.view.allow_multiple_allocations:
        return {}
    need: dict[str, float] = {}
    for name, total in capacity.items():
        policy = device.policies.get(name)
        if name in wanted:
            amount = _allowed_amount(wanted[name], policy)
            if amount is None or amount > total:
                return None
        elif policy is not None and policy.default is not None:
            amount = parse_amount(policy.default, f"capacity.{name}.requestPolicy.default")
        else:
            amount = total
        need[name] = amount
    return need


def _allowed_amount(wanted: float, policy: CapacityRequestPolicy | None) -> float | None:
    """The least amount the policy allows that covers `wanted`; None if none does."""
    if policy is None:
        return wanted
    if policy.validValues:
        values = sorted(parse_amount(v, "requestPolicy.validValues") for v in policy.validValues)
        return next((v for v in values if v >= wanted), None)
    bounds = policy.validRange
    if bounds is None:
        return wanted
    low = parse_amount(bounds.min, "requestPolicy.validRange.min")
    amount = max(wanted, low)
    if bounds.step is not None:
        step = parse_amount(bounds.step, "requestPolicy.validRange.step")
        if step > 0:
            amount = low + math.ceil((amount - low) / step - 1e-9) * step
    if bounds.max is not None and amount > parse_amount(bounds.max, "requestPolicy.validRange.max"):
        return None
    return amount


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
