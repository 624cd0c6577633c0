"""Fair share: how much of each resource every queue deserves this cycle.

Per resource, top-down through the queue tree (docs/architecture.md section 2). At each
level, with the parent's share as the total:
1. every queue gets `deserved = min(quota, requested, limit)`;
2. the rest goes by priority bucket, highest first, and inside a bucket by
   over-quota weight, in rounds, each round floored to the resource's unit and
   capped by the queue's request and limit;
3. what the floors left over goes out one unit at a time, largest lost
   fraction first, ties to the older queue (KAI's order);
4. the children split their parent's share the same way.
Idle quota is not held back: a queue that asks for less than its quota frees
the rest for its siblings. Quota is guaranteed: when the deserved amounts of
a level add up to more than its total (quotas over-committed), each queue's
share is still its deserved amount, never scaled down, so the shares add up to
more than there is and a queue holding no more than its quota is never over
its share (`over_committed` names such levels for the Queue status).
With time-based fairness on (k > 0), over-quota weights are shifted by decayed
usage: P = max(0, W + k*(W - U)).
Its inputs, what the leaves ask for and what the queues share, are summed in
`totals.py` (`leaf_requests`, `cluster_capacity`); the one lookup of a queue's
bounds is here (`queue_resource`, `quota_of`, `limit_of`). Pure: no I/O.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kai_ray.state.queues import QueueNode, QueueTree
from kai_ray.values.resources import (
    CPU,
    EPSILON,
    MEMORY,
    NO_RESOURCES,
    Resources,
    canonical_name,
    parse_amount,
)

#: queue -> resource -> decayed usage as a fraction of the cluster.
Usage = Mapping[str, Mapping[str, float]]
#: The smallest amount handed out in the leftover round, by resource.
UNITS = {CPU: 0.001, MEMORY: 1.0}


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
    """(quota, limit, overQuotaWeight) of one resource of one queue: the one lookup
    of a queue's bounds (unset: no quota, no limit, weight 1), kept on the node once
    read (admission and reclaim ask it of every search)."""
    found = node.bounds.get(resource)
    if found is None:
        found = node.bounds[resource] = _queue_resource(node, resource)
    return found


def _queue_resource(node: QueueNode, resource: str) -> tuple[float, float, float]:
    for key, entry in node.spec.resources.items():
        if canonical_name(key) == resource:
            return _amount(entry.quota, 0.0), _amount(entry.limit, math.inf), entry.overQuotaWeight
    return 0.0, math.inf, 1.0


@functools.lru_cache(maxsize=4096, typed=True)
def _amount(quantity: int | str | None, unset: float) -> float:
    """A quota or limit as a number (`QueueResource.quota_amount`, `limit_amount`),
    parsed once per written value: admission and ordering read the bounds of a
    job's queues for every waiting job, and a quantity is parsed as a Decimal."""
    return unset if quantity is None else parse_amount(quantity, "quantity")


def quota_of(tree: QueueTree, name: str, resource: str) -> float:
    return queue_resource(tree[name], resource)[0]


def limit_of(tree: QueueTree, name: str, resource: str) -> float:
    return queue_resource(tree[name], resource)[1]


def _floor(amount: float, unit: float) -> float:
    # Relative slack so that 3.0 cores over 0.001 does not floor to 2999 millicores.
    return math.floor(amount / unit + 1e-6) * unit


def _open(claim: Claim, shares: Mapping[str, float]) -> bool:
    """Still wants more and may go over quota at all (weight 0 never does)."""
    return shares[claim.name] < claim.cap - EPSILON and claim.weight > 0


def _shifted_weights(claims: Sequence[Claim], k: float) -> list[float]:
    """P = max(0, W + k*(W - U)): W normalised among these (unsatisfied) claims, U the
    queue's usage as a fraction of the cluster (KAI normalises U by capacity, not
    among siblings, so a queue that used nothing gains and a heavy user loses)."""
    total_weight = sum(c.weight for c in claims)
    if k <= 0 or total_weight <= 0:
        return [c.weight for c in claims]
    shifted = []
    for claim in claims:
        w = claim.weight / total_weight
        shifted.append(max(0.0, w + k * (w - claim.usage)))
    return shifted


def _rounds(
    claims: Sequence[Claim], shares: dict[str, float], left: float, unit: float, k: float
) -> tuple[float, dict[str, float]]:
    """Weighted rounds inside one priority bucket (KAI's over-quota phase).

    A queue that wants no more than its round share gets exactly what it wants,
    which frees the rest for another round; the others get their share floored
    to the unit, and the fraction they lost is recorded for the leftover pass.
    Returns what is left and the recorded fractions.
    """
    remainders: dict[str, float] = {}
    while left > EPSILON:
        open_claims = [c for c in claims if _open(c, shares)]
        weights = _shifted_weights(open_claims, k)
        total = sum(weights)
        if total <= 0:
            break
        given, another_round = 0.0, False
        for claim, weight in zip(open_claims, weights, strict=True):
            share, want = left * weight / total, claim.cap - shares[claim.name]
            give = want if want <= share + EPSILON else _floor(share, unit)
            another_round |= give == want
            remainders[claim.name] = max(share - give, 0.0)
            shares[claim.name] += give
            given += give
        left -= given
        if not another_round:
            break
    return left, remainders


def _leftover(
    claims: Sequence[Claim],
    shares: dict[str, float],
    left: float,
    unit: float,
    remainders: Mapping[str, float],
) -> float:
    """One unit at a time, largest recorded fraction first, ties to the older queue
    (claims come in sibling order: oldest first)."""
    order = sorted(range(len(claims)), key=lambda i: (-remainders.get(claims[i].name, 0.0), i))
    while left > EPSILON:
        takers = [claims[i] for i in order if _open(claims[i], shares)]
        for claim in takers:
            give = min(unit, claim.cap - shares[claim.name], left)
            shares[claim.name] += give
            left -= give
            if left <= EPSILON:
                break
        if not takers:
            break
    return left


def split(claims: Sequence[Claim], total: float, unit: float, k: float = 0.0) -> dict[str, float]:
    """Divide `total` among sibling claims: deserved first, then the surplus."""
    deserved = sum(c.deserved for c in claims)
    shares = {c.name: c.deserved for c in claims}
    if deserved > total + EPSILON:
        # Quotas over-commit the parent: each queue still deserves its quota (up to its
        # request), as in KAI; nothing is left for anyone over quota (`over_committed`).
        return shares
    left = total - deserved
    for priority in sorted({c.priority for c in claims}, reverse=True):
        bucket = [c for c in claims if c.priority == priority]
        left, remainders = _rounds(bucket, shares, left, unit, k)
        left = _leftover(bucket, shares, left, unit, remainders)
    return shares


def _claims(
    tree: QueueTree,
    names: Sequence[str],
    resource: str,
    requested: Mapping[str, Resources],
    usage: Usage,
) -> list[Claim]:
    claims = []
    for name in names:
        node = tree[name]
        quota, limit, weight = queue_resource(node, resource)
        want = requested.get(name, NO_RESOURCES)[resource]
        cap = min(want, limit)
        claims.append(
            Claim(
                name,
                min(quota, cap),
                cap,
                weight,
                node.spec.priority,
                usage.get(name, node.usage).get(resource, 0.0),
            )
        )
    return claims


def subtree_requests(
    tree: QueueTree, leaf_requests: Mapping[str, Resources]
) -> dict[str, Resources]:
    """What each queue's subtree asks for in all (allocated plus pending)."""
    totals: dict[str, Resources] = {}
    for node in reversed(list(tree.top_down())):
        own = leaf_requests.get(node.name, NO_RESOURCES)
        for child in node.children:
            own = own + totals[child]
        totals[node.name] = own
    return totals


@dataclass(frozen=True)
class _Division:
    """What stays fixed while one resource is divided down the tree."""

    tree: QueueTree
    resource: str
    requested: Mapping[str, Resources]
    k: float
    usage: Usage


def fair_shares(
    tree: QueueTree,
    leaf_requests: Mapping[str, Resources],
    capacity: Resources,
    k: float = 0.0,
    usage: Usage | None = None,
) -> dict[str, Resources]:
    """The fair share of every queue, per resource, top-down. `usage` (queue ->
    resource -> fraction) overrides the usage the queues carry in the snapshot."""
    requested = subtree_requests(tree, leaf_requests)
    resources = set(capacity) | {r for v in requested.values() for r in v}
    per_queue: dict[str, dict[str, float]] = {node.name: {} for node in tree.top_down()}
    for resource in sorted(resources):
        division = _Division(tree, resource, requested, k, usage or {})
        _descend(division, tree.roots, capacity[resource], per_queue)
    return {name: Resources(amounts) for name, amounts in per_queue.items()}


class KeptShares:
    """The last fair shares and what they were worked out from. `fair_shares` is a
    function of its arguments alone, so the very same queue tree with equal leaf
    requests, capacity, k and usage gives the same shares: a cycle in which none of
    them changed (one that only follows binds, say) does not divide again. Each
    caller gets its own copy of the mapping."""

    def __init__(self) -> None:
        self._last: tuple[QueueTree, tuple[object, ...], dict[str, Resources]] | None = None

    def get(
        self,
        tree: QueueTree,
        leaf_requests: Mapping[str, Resources],
        capacity: Resources,
        k: float,
        usage: Usage | None,
    ) -> dict[str, Resources]:
        inputs = (dict(leaf_requests), capacity, k, _copied(usage))
        last = self._last
        if last is not None and last[0] is tree and last[1] == inputs:
            return dict(last[2])
        shares = fair_shares(tree, leaf_requests, capacity, k, usage)
        self._last = (tree, inputs, shares)
        return dict(shares)


def _copied(usage: Usage | None) -> dict[str, dict[str, float]] | None:
    return None if usage is None else {name: dict(amounts) for name, amounts in usage.items()}


def _descend(
    division: _Division, names: Sequence[str], total: float, out: dict[str, dict[str, float]]
) -> None:
    tree, resource = division.tree, division.resource
    claims = _claims(tree, names, resource, division.requested, division.usage)
    for name, share in split(claims, total, unit_of(resource), division.k).items():
        out[name][resource] = share
        if tree[name].children:
            _descend(division, tree[name].children, share, out)


@dataclass(frozen=True)
class OverCommitment:
    """Sibling queues whose quotas of one resource add up to more than there is:
    the cluster for the top level (`parent` None), the parent's own quota below it."""

    parent: str | None
    children: tuple[str, ...]
    resource: str
    quotas: float
    available: float


def over_committed(tree: QueueTree, capacity: Resources) -> list[OverCommitment]:
    """Every level whose quotas over-commit what it has (a warning for the person who
    set them: quotas, not what the queues ask for now). Below the top, a parent
    without a quota of the resource promises its children nothing to over-commit."""
    found = []
    levels = [(None, tree.roots), *((n.name, n.children) for n in tree.top_down())]
    for parent, children in levels:
        for resource in sorted(set(capacity)):
            if not children:
                break
            quotas = sum(quota_of(tree, c, resource) for c in children)
            there = capacity[resource] if parent is None else quota_of(tree, parent, resource)
            if quotas > there + EPSILON and (parent is None or there > 0):
                found.append(OverCommitment(parent, tuple(children), resource, quotas, there))
    return found
