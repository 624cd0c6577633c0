"""Whether a queue may take a job at all, and why not, in words for a person.

A job is refused when
- its namespace may not use the queue (`spec.namespaces`; empty means any; the
  `namespaceSelector` needs namespace labels, which the snapshot does not hold,
  so the operator's webhook enforces it at the door);
- its queue or any ancestor would pass its limit (KAI's `OverLimit`), counted
  with what the victims an evicting action takes for it give back in that
  queue (`freed_in_queues`): victims inside a department free room in it;
- it is non-preemptible (`spec.preemptible: false`, or unset with priority
  >= 100) and its queue or any ancestor would go over quota with it (KAI's
  `NonPreemptibleOverQuota`): work that cannot be taken back runs only in quota;
- after placement, the GPUs it got on nodes of a labelled type pass a per-type
  limit (`nvidia.com/gpu.product=H100: {limit: 8}`); see `typed_gpus`. Before
  placement, types on which not even one more pod fits are taken out of the
  pods' choice (`exhausted_types`, `avoiding`), so the gang lands elsewhere.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kai_ray.decisions.fairness import limit_of, quota_of
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.state.queues import QueueNode, QueueTree
from kai_ray.values.resources import (
    CPU,
    EPSILON,
    GPU,
    MEMORY,
    Resources,
    add_into,
    format_amount,
)
from kai_ray.workloads.pod_fields import NodeRequirement

#: Preemptibility follows priority when a group does not say (KAI's rule).
NON_PREEMPTIBLE_FROM = 100


def is_preemptible(group: PodGroupState, priority: int) -> bool:
    if group.spec.preemptible is not None:
        return group.spec.preemptible
    return priority < NON_PREEMPTIBLE_FROM


def describe(resource: str, amount: float) -> str:
    """'16 GPUs', '64 cpu', '512Gi memory', '4 nvidia.com/gpu.product=H100 GPUs'."""
    text = format_amount(resource, amount)
    if resource == GPU:
        return f"{text} GPU" if amount == 1 else f"{text} GPUs"
    if resource in (CPU, MEMORY):
        return f"{text} {resource}"
    return f"{text} {resource} GPUs" if "=" in resource else f"{text} {resource}"


def namespace_refusal(node: QueueNode, namespace: str) -> str | None:
    allowed = node.spec.namespaces
    if not allowed or namespace in allowed:
        return None
    return f"namespace {namespace} may not use queue {node.name} (allowed: {', '.join(allowed)})"


@dataclass(frozen=True)
class Breach:
    """The first bound a request would pass: which queue, resource, bound, holding."""

    queue: str
    resource: str
    bound: float
    held: float
    asked: float


def first_breach(
    ledger: QueueLedger,
    leaf: str,
    request: Resources,
    held: Callable[[str], Resources],
    bound: Callable[[QueueTree, str, str], float],
) -> Breach | None:
    """The first queue from the leaf up where `held + request` passes `bound`. What
    a queue holds is read only where some resource asked has a finite bound (no
    holding passes an infinite one): an evicting action asks this of every search,
    with what its victims would give back in each queue (`FreedWhenRead`)."""
    asked = sorted(request.items())
    for name in ledger.path(leaf):
        bounds = [bound(ledger.tree, name, resource) for resource, _ in asked]
        if all(limit == math.inf for limit in bounds):
            continue
        holding = held(name)
        for (resource, amount), limit in zip(asked, bounds, strict=True):
            if holding[resource] + amount > limit + EPSILON:
                return Breach(name, resource, limit, holding[resource], amount)
    return None


def _over_limit(breach: Breach | None) -> str | None:
    if breach is None:
        return None
    resource = breach.resource
    return (
        f"queue {breach.queue} is at its limit of {describe(resource, breach.bound)}: "
        f"it holds {format_amount(resource, breach.held)} and the job asks for "
        f"{format_amount(resource, breach.asked)}"
    )


#: What a step's victims give back, per queue (the leaves and every ancestor).
Freed = Mapping[str, Resources]
NOTHING_FREED: Freed = {}


class HeldBack(Protocol):
    """A victim as `FreedWhenRead` reads it: its leaf queue and what it holds."""

    @property
    def queue(self) -> str: ...

    @property
    def requests(self) -> Resources: ...


class FreedWhenRead(Mapping[str, Resources]):
    """`freed_in_queues` of `victims`, each queue's amounts added up when first read:
    over the victims on whose path the queue lies, in order, as `freed_in_queues`
    adds them (the same amounts). An evicting action asks it only of the queues on
    its job's path that bound what the job asks (`first_breach`), for every list of
    possible victims it judges: without limits, nothing is added up."""

    def __init__(self, ledger: QueueLedger, victims: Sequence[HeldBack]) -> None:
        self._ledger, self._victims = ledger, victims
        self._amounts: dict[str, Resources] = {}
        self._names: dict[str, None] | None = None
        self._leaf_order: dict[str, None] | None = None

    def _every_name(self) -> dict[str, None]:
        """The queues on some victim's path, in `freed_in_queues`' order."""
        if self._names is None:
            path = self._ledger.path
            self._names = {name: None for leaf in self._leaves() for name in path(leaf)}
        return self._names

    def _leaves(self) -> dict[str, None]:
        """The victims' leaf queues, in the order they first come."""
        if self._leaf_order is None:
            self._leaf_order = dict.fromkeys(victim.queue for victim in self._victims)
        return self._leaf_order

    def __getitem__(self, name: str) -> Resources:
        found = self._amounts.get(name)
        if found is None:
            if name not in self._every_name():
                raise KeyError(name)
            path, amounts = self._ledger.path, dict[str, float]()
            under = {leaf for leaf in self._leaves() if name in path(leaf)}
            for victim in self._victims:
                if victim.queue in under:
                    add_into(amounts, victim.requests)
            found = self._amounts[name] = Resources.from_canonical(amounts)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._every_name())

    def __len__(self) -> int:
        return len(self._every_name())

    def __bool__(self) -> bool:
        return bool(self._victims)  # each victim frees room in its own leaf at least


def freed_in_queues(ledger: QueueLedger, victims: Iterable[tuple[str, Resources]]) -> Freed:
    """What evicting `victims` (leaf queue, what it holds) gives back in every queue
    on their paths: a victim under a shared ancestor frees room in it too."""
    freed: dict[str, dict[str, float]] = {}
    for leaf, holds in victims:
        for name in ledger.path(leaf):
            add_into(freed.setdefault(name, {}), holds)
    return {name: Resources.from_canonical(amounts) for name, amounts in freed.items()}


def limit_refusal(
    ledger: QueueLedger, leaf: str, request: Resources, freed: Freed = NOTHING_FREED
) -> str | None:
    """The first queue from the leaf up whose limit the request would pass, once
    what the step's victims hold in it is given back (the one limit rule of every
    action, evicting or not)."""

    def holding(name: str) -> Resources:
        gone = freed.get(name)
        return ledger.held(name) if gone is None else ledger.held(name) - gone

    return _over_limit(first_breach(ledger, leaf, request, holding, limit_of))


def typed_limit_refusal(ledger: QueueLedger, leaf: str, placed: Resources) -> str | None:
    """The same for GPUs of a type (`placed` is keyed by per-type keys)."""
    return _over_limit(first_breach(ledger, leaf, placed, ledger.held_typed, limit_of))


def quota_refusal(ledger: QueueLedger, leaf: str, request: Resources) -> str | None:
    """For a non-preemptible job: the first queue it would take over quota."""
    breach = first_breach(ledger, leaf, request, ledger.held_non_preemptible, quota_of)
    if breach is None:
        return None
    resource = breach.resource
    return (
        f"queue {breach.queue} would go over its quota of {describe(resource, breach.bound)} "
        f"with this non-preemptible job (non-preemptible work runs only within quota; "
        f"it holds {format_amount(resource, breach.held)} of such work and the job asks "
        f"for {format_amount(resource, breach.asked)})"
    )


def refusal(
    ledger: QueueLedger,
    group: PodGroupState,
    request: Resources,
    preemptible: bool,
    freed: Freed = NOTHING_FREED,
) -> str | None:
    """Why the job may not be admitted now, or None when its queues can take it;
    `freed`: what the victims evicted for it give back (`freed_in_queues`). The
    quota of non-preemptible work is judged without them: victims are preemptible.
    With nothing freed, the answer reads only the holdings, the tree, the job's
    queue and namespace, its request and whether it is preemptible: it is kept
    until the holdings change (`QueueLedger.answer`)."""
    if not freed:
        key = (REFUSAL, group.queue, group.namespace, request, preemptible)
        return ledger.answer(key, lambda: _refusal(ledger, group, request, preemptible, freed))
    return _refusal(ledger, group, request, preemptible, freed)


#: Names `refusal`'s answers among those the ledger keeps.
REFUSAL = "admission refusal"


def _refusal(
    ledger: QueueLedger,
    group: PodGroupState,
    request: Resources,
    preemptible: bool,
    freed: Freed,
) -> str | None:
    refused = namespace_refusal(ledger.tree[group.queue], group.namespace)
    refused = refused or limit_refusal(ledger, group.queue, request, freed)
    if refused is None and not preemptible:
        refused = quota_refusal(ledger, group.queue, request)
    return refused


# ------------------------------------------------------------ per-GPU-type quotas


@dataclass(frozen=True)
class TypedKey:
    """A queue resource `label=value`: GPUs on nodes whose `label` is `value`."""

    key: str
    label: str
    value: str


def typed_keys(tree: QueueTree, leaf: str) -> tuple[TypedKey, ...]:
    """Every per-type key named by the leaf or an ancestor."""
    return tuple(TypedKey(k, *k.split("=", 1)) for k in tree.typed_names(leaf))


def typed_gpus(
    keys: Sequence[TypedKey], placed: Iterable[tuple[Mapping[str, str], float]]
) -> Resources:
    """GPUs of each typed key among `placed` (node labels, GPUs taken there)."""
    totals = {key.key: 0.0 for key in keys}
    for labels, gpus in placed:
        for key in keys:
            if labels.get(key.label) == key.value:
                totals[key.key] += gpus
    return Resources(totals)


def exhausted_types(
    ledger: QueueLedger, leaf: str, keys: Sequence[TypedKey], gpus_per_pod: float
) -> list[TypedKey]:
    """Types of which not even one more pod of `gpus_per_pod` GPUs fits the limits."""
    one_pod = [(key, Resources({key.key: gpus_per_pod})) for key in keys]
    return [
        key
        for key, amount in one_pod
        if gpus_per_pod > 0
        and first_breach(ledger, leaf, amount, ledger.held_typed, limit_of) is not None
    ]


def avoiding(pod: PodState, types: Sequence[TypedKey]) -> PodState:
    """The pod with a required node affinity that keeps it off nodes of `types`
    (added to every term it has, since any one term may hold)."""
    keep_off = tuple(NodeRequirement(t.label, "NotIn", (t.value,)) for t in types)
    terms = pod.node_affinity or ((),)
    return dataclasses.replace(pod, node_affinity=tuple((*term, *keep_off) for term in terms))
