"""Fair share: how much of each resource every queue deserves this cycle.

Per resource, top-down through the queue tree (DESIGN.md section 2). At each
level, with the parent's share as the total:
1. every queue gets `deserved = min(quota, requested, limit)`;
2. the rest goes by priority bucket, highest first, and inside a bucket by
   over-quota weight, in rounds, each round floored to the resource's unit and
   capped by the queue's request and limit;
3. what the floors left over goes out one unit at a time, to the queue least
   served for its weight, ties to the older queue;
4. the children split their parent's share the same way.
Idle quota is not held back: a queue that asks for less than its quota frees
the rest for its siblings. With time-based fairness on (k > 0), over-quota
weights are shifted by decayed usage: P = max(0, W + k*(W - U)).
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kai_ray.state.queues import QueueNode, QueueTree
from kai_ray.values.resources import CPU, MEMORY, Resources, canonical_name

#: The smallest amount handed out in the leftover round, by resource.
UNITS = {CPU: 0.001, MEMORY: 1.0}
EPSILON = 1e-9


def unit_of(resource: str) -> float:
    return UNITS.get(resource, 1.0)


@dataclass(frozen=True)
class Claim:
    """One sibling's position at one level for one resource."""

    name: str
    deserved: float
    cap: float  # min(requested, limit)
    weight: float
    priority: int
    usage: float = 0.0


def queue_resource(node: QueueNode, resource: str) -> tuple[float, float, float]:
    """(quota, limit, overQuotaWeight) of one resource of one queue."""
    for key, entry in node.spec.resources.items():
        if canonical_name(key) == resource:
            return entry.quota_amount, entry.limit_amount, entry.overQuotaWeight
    return 0.0, math.inf, 1.0


def _floor(amount: float, unit: float) -> float:
    return math.floor(amount / unit + EPSILON) * unit


def _shifted_weights(claims: Sequence[Claim], k: float) -> list[float]:
    """P = max(0, W + k*(W - U)), W and U normalised among these claims."""
    total_weight = sum(c.weight for c in claims)
    if k <= 0 or total_weight <= 0:
        return [c.weight for c in claims]
    total_usage = sum(c.usage for c in claims)
    shifted = []
    for claim in claims:
        w = claim.weight / total_weight
        u = claim.usage / total_usage if total_usage > 0 else w
        shifted.append(max(0.0, w + k * (w - u)))
    return shifted


def _rounds(
    claims: Sequence[Claim], shares: dict[str, float], left: float, unit: float, k: float
) -> float:
    """Weighted, floored rounds inside one priority bucket; returns what is left."""
    while left >= unit - EPSILON:
        open_claims = [c for c in claims if shares[c.name] < c.cap - EPSILON and c.weight > 0]
        weights = _shifted_weights(open_claims, k)
        total = sum(weights)
        if total <= 0:
            break
        given = 0.0
        for claim, weight in zip(open_claims, weights, strict=True):
            give = min(_floor(left * weight / total, unit), claim.cap - shares[claim.name])
            shares[claim.name] += give
            given += give
        left -= given
        if given <= EPSILON:
            break
    return left


def _leftover(claims: Sequence[Claim], shares: dict[str, float], left: float, unit: float) -> float:
    """One unit at a time to the least-served-for-its-weight queue, ties to the older."""
    while left > EPSILON:
        open_claims = [c for c in claims if shares[c.name] < c.cap - EPSILON and c.weight > 0]
        if not open_claims:
            break
        order = {c.name: i for i, c in enumerate(claims)}
        pick = min(
            open_claims, key=lambda c: ((shares[c.name] - c.deserved) / c.weight, order[c.name])
        )
        give = min(unit, pick.cap - shares[pick.name], left)
        shares[pick.name] += give
        left -= give
    return left


def split(claims: Sequence[Claim], total: float, unit: float, k: float = 0.0) -> dict[str, float]:
    """Divide `total` among sibling claims: deserved first, then the surplus."""
    deserved = sum(c.deserved for c in claims)
    if deserved > total + EPSILON:
        # Quotas oversubscribe the parent: scale deserved down, keep proportions.
        scale = total / deserved
        return {c.name: c.deserved * scale for c in claims}
    shares = {c.name: c.deserved for c in claims}
    left = total - deserved
    for priority in sorted({c.priority for c in claims}, reverse=True):
        bucket = [c for c in claims if c.priority == priority]
        left = _rounds(bucket, shares, left, unit, k)
        left = _leftover(bucket, shares, left, unit)
    return shares


def _claims(
    tree: QueueTree, names: Sequence[str], resource: str, requested: Mapping[str, Resources]
) -> list[Claim]:
    claims = []
    for name in names:
        node = tree[name]
        quota, limit, weight = queue_resource(node, resource)
        want = requested.get(name, Resources())[resource]
        cap = min(want, limit)
        claims.append(
            Claim(
                name,
                min(quota, cap),
                cap,
                weight,
                node.spec.priority,
                node.usage.get(resource, 0.0),
            )
        )
    return claims


def subtree_requests(
    tree: QueueTree, leaf_requests: Mapping[str, Resources]
) -> dict[str, Resources]:
    """What each queue's subtree asks for in all (allocated plus pending)."""
    totals: dict[str, Resources] = {}
    for node in reversed(list(tree.top_down())):
        own = leaf_requests.get(node.name, Resources())
        for child in node.children:
            own = own + totals[child]
        totals[node.name] = own
    return totals


def fair_shares(
    tree: QueueTree, leaf_requests: Mapping[str, Resources], capacity: Resources, k: float = 0.0
) -> dict[str, Resources]:
    """The fair share of every queue, per resource, top-down."""
    requested = subtree_requests(tree, leaf_requests)
    resources = set(capacity) | {r for v in requested.values() for r in v}
    per_queue: dict[str, dict[str, float]] = {node.name: {} for node in tree.top_down()}
    for resource in sorted(resources):
        unit = unit_of(resource)
        _descend(tree, tree.roots, capacity[resource], resource, unit, requested, k, per_queue)
    return {name: Resources(amounts) for name, amounts in per_queue.items()}


def _descend(
    tree: QueueTree,
    names: Sequence[str],
    total: float,
    resource: str,
    unit: float,
    requested: Mapping[str, Resources],
    k: float,
    out: dict[str, dict[str, float]],
) -> None:
    shares = split(_claims(tree, names, resource, requested), total, unit, k)
    for name, share in shares.items():
        out[name][resource] = share
        children = tree[name].children
        if children:
            _descend(tree, children, share, resource, unit, requested, k, out)
