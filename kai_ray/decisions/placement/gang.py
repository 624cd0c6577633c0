"""Gang placement: a group's minimum all or nothing, then elastic members one by one.

The minimum is a tree of pod sets: the group, its subgroups (nested by
`parent`), and in each set the pending pods still missing from its `minMember`.
A set is placed inside one candidate node set at a time (`domains.py`) under
a checkpoint: its child subgroups first, each inside its own domain within the
parent's (at the top, at least `minSubGroup` of them must reach their minimum;
unset means all), then its own pods, each on the node the strategy scores best.
Any failure rolls back to the checkpoint and the next candidate is tried; if
none holds, the whole gang is rolled back and the outcome says why, measured
on the cluster as it was before the attempt. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.placement import domains
from kai_ray.decisions.placement.backend import PlacementBackend
from kai_ray.decisions.placement.backend_choice import backend_for
from kai_ray.decisions.placement.claims import allocation_on, claims_reason, claims_signature
from kai_ray.decisions.placement.domains import Kind, Scope
from kai_ray.decisions.placement.filters import static_nodes
from kai_ray.decisions.placement.fit import choose_devices, choose_node, room_on
from kai_ray.decisions.placement.inter_pod import (
    first_member_domains,
    in_play,
    preferred_nodes,
    rejections,
    required_nodes,
)
from kai_ray.decisions.placement.reasons import Code, Failure, explain_pod
from kai_ray.decisions.placement.shapes import NodeSet, PodShape, shape_of
from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.dra_allocate import Allocation, ClaimAllocation, Unallocatable
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.values.api import TopologyConstraint
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.resources import GPU

Indices = npt.NDArray[np.intp]


@dataclass
class PodSet:
    """The group or one subgroup: pods to place now, and child subgroups."""

    name: str | None
    pods: list[PodState]
    constraint: TopologyConstraint | None
    children: list[PodSet] = field(default_factory=list)
    #: How many children must reach their minimum.
    needed: int = 0
    #: Nodes of members already bound or placed: a required domain must contain them.
    anchors: list[int] = field(default_factory=list)
    #: Set when the set's minimum cannot be met because its pods do not exist yet.
    waiting: str = ""

    def members(self) -> list[PodState]:
        """Every pod of the set's minimum, children included."""
        return [*self.pods, *(p for child in self.children for p in child.members())]

    def label(self) -> str:
        return f"subgroup {self.name} " if self.name else ""


@dataclass
class Context:
    tx: Transaction
    group: PodGroupState
    config: SchedulerConfigSpec

    def __post_init__(self) -> None:
        self.config = gang_config(self.config, self.group)

    @property
    def backend(self) -> PlacementBackend:
        """Made on first use: a gang without topology never needs (or starts) Ray."""
        return backend_for(self.tx, self.config)

    @property
    def topology(self) -> str | None:
        constraint = self.group.spec.topologyConstraint
        return constraint.topology if constraint else None

    def everywhere(self) -> NodeSet:
        nodes = np.arange(len(self.tx.snapshot.node_names), dtype=np.intp)
        return NodeSet(nodes, "the cluster")


def gang_config(config: SchedulerConfigSpec, group: PodGroupState) -> SchedulerConfigSpec:
    """The scheduler's configuration as this gang's placement sees it: the PodGroup's own
    `placementStrategy`, when set, replaces the global one for its node and device
    choices only (queue order, victims and consolidation keep the global one). Unset,
    the configuration is returned as it is, so nothing changes for other gangs."""
    strategy = group.spec.placementStrategy
    if strategy is None or strategy == config.placementStrategy:
        return config
    return config.model_copy(update={"placementStrategy": strategy})


def place_set(ctx: Context, pod_set: PodSet, allowed: NodeSet) -> Failure | None:
    """Place a set inside one candidate node set of `allowed`; rolled back on failure."""
    if pod_set.waiting:
        return Failure(text=f"{pod_set.label()}{pod_set.waiting}")
    scope = domains.resolve(ctx.tx, pod_set.constraint, ctx.topology)
    if isinstance(scope, str):
        return Failure(text=f"{pod_set.label()}{scope}", code=Code.ERROR)
    if scope is None:
        return _attempt(ctx, pod_set, allowed)
    allowed = domains.anchored(scope, allowed, pod_set.anchors)
    kinds = kinds_of(ctx, pod_set.members(), allowed)
    failure: Failure | None = None
    for node_set in domains.candidates(ctx.tx, ctx.backend, scope, kinds, allowed):
        failure = _attempt(ctx, pod_set, node_set)
        if failure is None:
            return None
    return failure or _no_room(ctx, scope, kinds, pod_set)


def _no_room(ctx: Context, scope: Scope, kinds: list[Kind], pod_set: PodSet) -> Failure:
    return Failure(text=domains.no_room_reason(ctx.tx, ctx.backend, scope, kinds, pod_set.label()))


def _attempt(ctx: Context, pod_set: PodSet, node_set: NodeSet) -> Failure | None:
    mark = ctx.tx.checkpoint()
    failure = _place_children(ctx, pod_set, node_set) or place_pods(ctx, pod_set.pods, node_set)
    if failure is not None:
        ctx.tx.rollback(mark)
    return failure


def _place_children(ctx: Context, pod_set: PodSet, node_set: NodeSet) -> Failure | None:
    """At least `needed` children reach their minimum; the others are left to elastic growth."""
    reached, first_failure = 0, None
    for position, child in enumerate(pod_set.children):
        if reached + len(pod_set.children) - position < pod_set.needed:
            break
        failure = place_set(ctx, child, node_set)
        reached += failure is None
        first_failure = first_failure or failure
    if reached >= pod_set.needed:
        return None
    return Failure(
        text=f"only {reached} of {len(pod_set.children)} subgroups can reach their minimum "
        f"({pod_set.needed} needed)",
        cause=first_failure,
        code=first_failure.code if first_failure else Code.UNSCHEDULABLE,
    )


def place_pods(ctx: Context, pods: list[PodState], node_set: NodeSet) -> Failure | None:
    """The pods on nodes of `node_set` (`_place_each`); when they do not fit and one of
    them is the first of a series of pods affine to each other, each domain that first
    member could open is tried in turn (`inter_pod.first_member_domains`). On failure
    nothing they placed stays."""
    mark = ctx.tx.checkpoint()
    failure = _place_each(ctx, pods, node_set)
    if failure is None:
        return None
    ctx.tx.rollback(mark)
    for domain in first_member_domains(ctx.tx, pods, node_set):
        if _place_each(ctx, pods, domain) is None:
            return None
        ctx.tx.rollback(mark)
    return failure


def _place_each(ctx: Context, pods: list[PodState], node_set: NodeSet) -> Failure | None:
    """Each pod, largest first, on the best node of `node_set` its inter-pod rules allow
    (`inter_pod.py`, counting the members placed before it): a nominated node of its
    group first when one still fits (`PodGroupStatus.nominatedNodes`, where consolidation
    moved the group's pods), else the strategy's choice among the nodes its preferred
    inter-pod terms score best; stops at a pod that fits none."""
    allowed_by_signature: dict[object, Indices] = {}
    counted = _counted_failure(ctx, pods, node_set, allowed_by_signature)
    if counted is not None:
        return counted
    for pod in sorted(pods, key=_size, reverse=True):
        shape = shape_of(ctx.tx, pod)
        nodes = required_nodes(ctx.tx, pod, _allowed(ctx, pod, node_set, allowed_by_signature))
        node = _nominated_node(ctx, shape, nodes)
        if node is None:
            node = choose_node(
                ctx.tx, shape, preferred_nodes(ctx.tx, pod, shape, nodes), ctx.config
            )
        claims: tuple[ClaimAllocation, ...] = ()
        if node is not None and pod.claim_entries:
            served = _with_claims(ctx, pod, shape, nodes, node)
            if isinstance(served, Unallocatable):
                return Failure(text=f"pod {pod.key}: {served.reason}")
            node, claims = served
        if node is None:
            return Failure(pod=pod, node_set=node_set, count=_same_kind(pods, pod))
        place_on(ctx, pod, node, claims)
    return None


def _counted_failure(
    ctx: Context, pods: list[PodState], node_set: NodeSet, cache: dict[object, Indices]
) -> Failure | None:
    """How `_place_each` fails, known by counting, for pods it would place only to
    roll them back; None when it cannot be known so (or they fit).

    When the pods are alike (requests, node filters), ask for whole numbers of
    everything and no GPU share, claim no devices, and nothing but room decides
    (no inter-pod rules in play, no nominated nodes), every pod placed takes
    exactly one from the room (`fit.room`) of the node it goes to, on nodes whose
    free amounts are whole numbers too (the arithmetic is then exact): the loop
    places exactly as many pods as the rooms add up to, wherever the strategy
    puts them, and stops at the next one. Exact: `tests/unit/test_equivalence.py`
    holds cycles with it to cycles without it."""
    nominated = ctx.group.status.nominatedNodes if ctx.group.status is not None else None
    if len(pods) < 2 or in_play(ctx.tx) or nominated:
        return None
    first = pods[0]
    alike = (first.requests, first.node_selector, first.node_affinity, first.tolerations)
    for pod in pods:
        if pod.claim_entries or pod.gpu_share is not None or pod.gpu_fraction:
            return None
        if (pod.requests, pod.node_selector, pod.node_affinity, pod.tolerations) != alike:
            return None
    shape = shape_of(ctx.tx, first)
    need = shape.need[shape.columns]
    if shape.shares_gpu or not np.array_equal(need, np.floor(need)):
        return None
    nodes = _allowed(ctx, first, node_set, cache)
    free = ctx.tx.free[np.ix_(nodes, shape.columns)]
    if not np.array_equal(free, np.floor(free)):
        return None
    rooms = int(room_on(ctx.tx, shape, nodes).sum())
    if rooms >= len(pods):
        return None
    stops_at = sorted(pods, key=_size, reverse=True)[rooms]
    return Failure(pod=stops_at, node_set=node_set, count=_same_kind(pods, stops_at))


#: Nodes tried one by one for a pod's DRA claims before every candidate is checked.
CLAIM_TRIES = 8


def _with_claims(
    ctx: Context, pod: PodState, shape: PodShape, nodes: Indices, node: int
) -> tuple[int, tuple[ClaimAllocation, ...]] | Unallocatable:
    """The node the strategy chose, or its next choices, on which the pod's claims
    get devices; after `CLAIM_TRIES` refusals, the best of the candidates left on
    which they do. When no candidate serves them: why not on the first choice."""
    tx = ctx.tx
    tried: list[int] = []
    choice: int | None = node
    first: Unallocatable | None = None
    while choice is not None:
        result = allocation_on(tx, pod, choice)
        if isinstance(result, Allocation):
            return choice, result.claims
        first = first or result
        tried.append(choice)
        left = np.setdiff1d(nodes, np.array(tried, dtype=np.intp), assume_unique=True)
        if len(tried) >= CLAIM_TRIES:
            served = {
                n: r for n in left if isinstance(r := allocation_on(tx, pod, int(n)), Allocation)
            }
            left = np.array(sorted(served), dtype=np.intp)
            choice = choose_node(tx, shape, preferred_nodes(tx, pod, shape, left), ctx.config)
            return first if choice is None else (choice, served[choice].claims)
        choice = choose_node(tx, shape, preferred_nodes(tx, pod, shape, left), ctx.config)
    return first or Unallocatable("no node serves its ResourceClaims")


def _nominated_node(ctx: Context, shape: PodShape, nodes: Indices) -> int | None:
    """The best of the group's nominated nodes among `nodes` that still has a
    nomination left (not yet taken by a member placed in this transaction) and
    room for the pod; None when there is none."""
    nominated = ctx.group.status.nominatedNodes if ctx.group.status is not None else None
    if not nominated:
        return None
    index = ctx.tx.snapshot.node_index
    left = Counter(index[name] for name in nominated if name in index)
    left.subtract(p.node for p in ctx.tx.placed.values() if p.bind.group == ctx.group.key)
    candidates = np.array([n for n in nodes if left[int(n)] > 0], dtype=np.intp)
    return choose_node(ctx.tx, shape, candidates, ctx.config) if candidates.size else None


def place_on(
    ctx: Context, pod: PodState, node: int, claims: tuple[ClaimAllocation, ...] = ()
) -> None:
    tx = ctx.tx
    shape = shape_of(tx, pod)
    devices = choose_devices(tx, shape, node, ctx.config)
    fraction = float(shape.fraction[node]) if shape.shares_gpu else 0.0
    bind = Bind(pod.key, ctx.group.key, tx.snapshot.node_names[node], devices, fraction, claims)
    took = frozenset(d.ref for c in claims if c.new for d in c.devices if not d.shared)
    taken = shape.taken(node, tx.snapshot.column(GPU))
    tx.place(Placement(bind, node, taken, fraction, dra_devices=took))


def _size(pod: PodState) -> tuple[float, float, float]:
    return (pod.requests[GPU], pod.gpu_fraction, pod.requests["cpu"])


def _same_kind(pods: list[PodState], pod: PodState) -> int:
    return sum(1 for p in pods if p.requests == pod.requests and p.gpu_share == pod.gpu_share)


def _allowed(
    ctx: Context, pod: PodState, node_set: NodeSet, cache: dict[object, Indices]
) -> Indices:
    """Nodes of `node_set` that pass the pod's static filters (once per signature per call)."""
    key = (pod.node_selector, pod.node_affinity, pod.tolerations, claims_signature(ctx.tx, pod))
    if key not in cache:
        static = static_nodes(ctx.tx, pod)
        whole = len(node_set.nodes) == len(ctx.tx.snapshot.node_names)
        cache[key] = static if whole else np.intersect1d(node_set.nodes, static, assume_unique=True)
    return cache[key]


def kinds_of(ctx: Context, pods: list[PodState], allowed: NodeSet) -> list[Kind]:
    """Pods grouped by shape and filter signature, each with the nodes it may use."""
    counts: dict[object, tuple[PodState, int]] = {}
    for pod in pods:
        key = (
            pod.requests,
            pod.gpu_share,
            pod.node_selector,
            pod.node_affinity,
            pod.tolerations,
            claims_signature(ctx.tx, pod),
        )
        first, count = counts.get(key, (pod, 0))
        counts[key] = (first, count + 1)
    cache: dict[object, Indices] = {}
    return [
        Kind(shape_of(ctx.tx, pod), _allowed(ctx, pod, allowed, cache), count)
        for pod, count in counts.values()
    ]


def explain(ctx: Context, failure: Failure) -> str:
    """The failure for a person, measured on the transaction's current state."""

    def pod_reason(pod: PodState, node_set: NodeSet, count: int) -> str:
        if pod.claim_wait:
            return claims_reason(ctx.tx, pod)
        static = _allowed(ctx, pod, node_set, {})
        allowed = required_nodes(ctx.tx, pod, static)
        refused = rejections(ctx.tx, pod, static)
        return explain_pod(ctx.tx, pod, node_set, count, allowed, refused)

    return failure.render(pod_reason)
