"""What the operator writes in the status of PodGroups and Queues after a cycle.

Each function builds a JSON merge-patch body for a `status` subresource from
the cycle's snapshot, its result and what the binder did; the scheduling loop
writes it. Only fields the CRD schema admits are written (the API server drops
the rest without a word), and every body validates as the model's status, so
that the next snapshot reads it back: `tests/unit/test_status*.py` holds both
to the models and the generated CRDs.

- PodGroup: `phase` (the transition table of `kai_ray.state.lifecycle`),
  `pending`/`bound`/`running` pod counts, `reason` while it waits, and the
  `Scheduled` and `Stale` conditions merged into the ones it has (`Valid`
  is kept as it is).
- Queue: `allocated`, `requested`, `fairShare`, `usage`, `usageHistory`, `childQueues`,
  `pendingWorkloads`, its `Valid` condition as the queue tree judges it, and
  `QuotaOverCommitted` while it holds (a warning: its and its siblings' quotas
  add up to more than they share).
  Amounts are keyed like `spec.resources` (`gpu` for `nvidia.com/gpu`) and
  written as quantities the CRD's int-or-string schema takes (`quantity`).

A merge patch replaces lists whole but merges maps key by key, so a resource
that is no longer held is written as null (removed) when the previous status
is given. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kai_ray.decisions.cycle import CycleResult
from kai_ray.decisions.fairness import subtree_requests
from kai_ray.decisions.plan import GroupStatus
from kai_ray.decisions.stale import stale_condition
from kai_ray.decisions.totals import leaf_requests
from kai_ray.decisions.usage import to_persist
from kai_ray.effects.reporting import merge_condition, problems_condition
from kai_ray.state.groups import PodGroupState
from kai_ray.state.lifecycle import WAITING_PHASES, GroupFacts, next_phase
from kai_ray.state.queues import QUEUE, QueueNode, QueueTree, UsageInterval
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.api import Condition, Phase
from kai_ray.values.clock import rfc3339, unix_seconds
from kai_ray.values.names import ADMISSION_GATE
from kai_ray.values.resources import CORE, CPU, MEMORY, Resources, canonical_name, short_name

SCHEDULED = "Scheduled"
#: Where a recreated pod should go; see `nominated_nodes`.
NOMINATED_NODES = "nominatedNodes"
#: Decimal places of a fractional amount, and of a usage fraction (persisted history).
AMOUNT_DECIMALS = 3
USAGE_DECIMALS = 9
#: The reason while a released workload's controller has not created its pods yet.
AWAITING_PODS = "waiting for its pods to be created"
#: How the reasons of a gang that waits for its pods to exist begin (Grove's gates).
_GATED = " of its pods held by scheduling gates "

JsonObject = dict[str, Any]


# ------------------------------------------------------------------------ PodGroup


def pod_group_status(
    group: PodGroupState,
    planned: GroupStatus | None,
    evicted_reason: str | None,
    now: str,
    *,
    evicted_pods: int | None = None,
) -> JsonObject:
    """The PodGroup's status after this cycle. `planned` is what the plan said of it
    (None: nothing), `evicted_reason` why the binder evicted its pods this cycle (None:
    it did not), `evicted_pods` how many (None: every pod it held); evicting only
    elastic extras, with the minimum still held, does not make the group Evicted."""
    facts = group_facts(group, planned, evicted_reason, evicted_pods)
    previous = group.status
    phase = next_phase(previous.phase if previous is not None else None, facts)
    reason = waiting_reason(group, phase, planned, evicted_reason, facts)
    body: JsonObject = {
        "phase": phase.value,
        "pending": facts.pending,
        "bound": facts.bound,
        "running": facts.running,
        "reason": reason,
        "conditions": _group_conditions(group, phase, planned, reason, now),
    }
    nominated = nominated_nodes(planned)
    if nominated is not None:
        body[NOMINATED_NODES] = nominated
    return body


def group_facts(
    group: PodGroupState,
    planned: GroupStatus | None,
    evicted_reason: str | None,
    evicted_pods: int | None = None,
) -> GroupFacts:
    """What the lifecycle needs to know of the group this cycle."""
    facts = GroupFacts(
        min_member=group.spec.minMember,
        pending=len(group.live) - len(group.bound),
        bound=len(group.bound),
        running=sum(1 for pod in group.live if pod.phase == "Running"),
        succeeded=sum(1 for pod in group.pods if pod.phase == "Succeeded"),
        failed=sum(1 for pod in group.pods if pod.phase == "Failed"),
        admitted=None if planned is None else planned.admitted,
    )
    if evicted_reason is None:
        return facts
    left = 0 if evicted_pods is None else facts.bound - evicted_pods
    return dataclasses.replace(facts, evicted=left < facts.needed)


def waiting_reason(
    group: PodGroupState,
    phase: Phase,
    planned: GroupStatus | None,
    evicted_reason: str | None,
    facts: GroupFacts,
) -> str:
    """Why the group waits, for a person; empty when it does not wait."""
    said = planned.reason if planned is not None else ""
    before = group.status
    # A phase that stays keeps its reason when this cycle has nothing new to say.
    kept = (before.reason or "") if before is not None and before.phase is phase else ""
    if phase is Phase.EVICTED:
        if evicted_reason is None:
            return kept
        return said or f"evicted: {evicted_reason}"
    if phase is not Phase.PENDING:
        return ""
    gated = _held_by_gates(group)
    if gated:
        return gated
    if said:
        return said
    if facts.live == 0:
        return AWAITING_PODS
    return kept


def waits_for_its_pods(reason: str) -> bool:
    """Whether a waiting reason is the normal wait for a controller to create (or
    ungate) the gang's pods, not a refusal: its Event is Normal, not a Warning."""
    return reason == AWAITING_PODS or _GATED in reason


def _held_by_gates(group: PodGroupState) -> str:
    """Why a gang short of its minimum waits when others' scheduling gates hold some
    of its pods (Grove's, until the gang's pods all exist); empty otherwise."""
    held = [pod for pod in group.live if pod.held]
    if not held or len(group.pending) + len(group.bound) >= group.spec.minMember:
        return ""
    gates = sorted({g for pod in held for g in pod.scheduling_gates if g != ADMISSION_GATE})
    return f"{len(held)}{_GATED}{', '.join(gates)}"


def nominated_nodes(planned: GroupStatus | None) -> list[str] | None:
    """`status.nominatedNodes`: where the group's recreated pods should go, one node
    per pod, as the plan nominates them (an empty list clears them); None when the
    plan says nothing of them, and the status keeps what it has."""
    if planned is None or planned.nominated is None:
        return None
    return list(planned.nominated)


def _group_conditions(
    group: PodGroupState, phase: Phase, planned: GroupStatus | None, reason: str, now: str
) -> list[JsonObject]:
    conditions = _plain_conditions(group.status.conditions if group.status is not None else [])
    scheduled = scheduled_condition(phase, reason, now)
    if scheduled is not None:
        conditions = merge_condition(conditions, scheduled)
    if planned is not None and planned.staleness is not None:
        stale = stale_condition(planned.staleness, unix_seconds(now) or 0.0)
        conditions = merge_condition(conditions, stale)
    return conditions


def scheduled_condition(phase: Phase, reason: str, now: str) -> dict[str, str] | None:
    """`Scheduled`: True once the gang is admitted; False, saying why, while it waits
    or after an eviction; None (left as it is) once it has finished."""
    if phase in (Phase.ADMITTED, Phase.RUNNING):
        return _condition(SCHEDULED, "True", "Admitted", "", now)
    if phase is Phase.EVICTED:
        return _condition(SCHEDULED, "False", "Evicted", reason, now)
    if phase is Phase.PENDING:
        return _condition(SCHEDULED, "False", "Unschedulable", reason, now)
    return None


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def _plain_conditions(conditions: Sequence[Condition]) -> list[JsonObject]:
    # Unset fields stay out: a null in a list would be written as null.
    return [condition.model_dump(exclude_none=True) for condition in conditions]


# --------------------------------------------------------------------------- Queue


def queue_statuses(
    snapshot: Snapshot,
    result: CycleResult,
    group_phases: Mapping[str, str],
    previous: Mapping[str, Mapping[str, Any] | None] | None = None,
    names: Iterable[str] | None = None,
) -> dict[str, JsonObject]:
    """The status of every Queue in `names`, the sums every queue shares computed
    once. Pass every Queue object's name so that those the tree left out get their
    `Valid=False` (the default, the tree's queues, misses them). `group_phases` is
    each PodGroup's phase (by key) as just written; `previous` each Queue's status
    as the API has it."""
    requested = requested_by_queue(snapshot, result)
    pending = pending_workloads(snapshot.queues, snapshot.pod_groups, group_phases)
    old = previous or {}
    return {
        name: queue_status(
            name,
            snapshot,
            result,
            pending.get(name, 0),
            previous=old.get(name),
            requested=requested,
        )
        for name in (snapshot.queues.nodes if names is None else names)
    }


def queue_status(
    name: str,
    snapshot: Snapshot,
    result: CycleResult,
    pending_workloads: int,
    *,
    previous: Mapping[str, Any] | None = None,
    requested: Mapping[str, Resources] | None = None,
) -> JsonObject:
    """One Queue's status after this cycle. A queue the tree left out (bad spec,
    missing parent, cycle) gets its `Valid` condition and nothing else. `previous`
    is its status as the API has it: resources no longer reported are removed and
    unchanged conditions keep their time. `requested` is `requested_by_queue`, when
    the caller computes it once for every queue."""
    now = rfc3339(result.usage.updated_s or 0.0)
    old = previous or {}
    problems = [p for p in snapshot.problems if p.obj.kind == QUEUE and p.obj.name == name]
    conditions = merge_condition(old.get("conditions"), problems_condition(problems, now))
    node = snapshot.queues.nodes.get(name)
    if node is None:
        return {"conditions": conditions}
    warning = over_commitment_condition(name, result, now)
    if warning is None:  # written only while it holds
        conditions = [c for c in conditions if c.get("type") != QUOTA_OVER_COMMITTED]
    else:
        conditions = merge_condition(conditions, warning)
    asked = (requested or requested_by_queue(snapshot, result)).get(name, Resources())
    named = _named_resources(node)
    return {
        "allocated": _amounts(result.usage.allocated.get(name), named, old.get("allocated")),
        "requested": _amounts(asked, named, old.get("requested")),
        "fairShare": _amounts(result.fair_shares.get(name), named, old.get("fairShare")),
        "usage": usage_amounts(result.usage.queues.get(name, {}), old.get("usage")),
        "usageHistory": usage_records(result.usage.history.get(name, ())),
        "childQueues": list(node.children),
        "pendingWorkloads": pending_workloads,
        "conditions": conditions,
    }


QUOTA_OVER_COMMITTED = "QuotaOverCommitted"


def over_commitment_condition(name: str, result: CycleResult, now: str) -> dict[str, str] | None:
    """`QuotaOverCommitted` True (a warning) while the queue and its siblings have
    quotas adding up to more than they share: the cluster at the top, their parent's
    quota below; absent otherwise. Each quota is still deserved (up to what the queue asks for), so
    the queues together may be promised more than there is, and a queue at its
    quota waits rather than take from another at its own."""
    found = [o for o in result.over_committed if name in o.children]
    if not found:
        return None
    parts = []
    for o in found:
        where = "the cluster has" if o.parent is None else f"parent {o.parent} has a quota of"
        siblings = "top-level queues" if o.parent is None else f"children of {o.parent}"
        quotas, there = quantity(o.resource, o.quotas), quantity(o.resource, o.available)
        key = short_name(o.resource)
        parts.append(f"the quotas of the {siblings} add up to {quotas} {key}; {where} {there}")
    message = "; ".join(parts) + (
        ": each queue is still guaranteed its quota (up to what it asks for), so a queue"
        " may wait for its quota until others' work ends"
    )
    return _quota_condition("True", "QuotasExceedCapacity", message, now)


def _quota_condition(status: str, reason: str, message: str, now: str) -> dict[str, str]:
    return {
        "type": QUOTA_OVER_COMMITTED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def requested_by_queue(snapshot: Snapshot, result: CycleResult) -> dict[str, Resources]:
    """What each queue's live pods ask for, bound or pending, children included (the
    cycle's own sums when it kept them)."""
    demand = result.leaf_requests
    return subtree_requests(snapshot.queues, leaf_requests(snapshot) if demand is None else demand)


def pending_workloads(
    tree: QueueTree, groups: Mapping[str, PodGroupState], phases: Mapping[str, str]
) -> dict[str, int]:
    """PodGroups waiting for their gang to run (Pending, Admitted, Evicted) per
    queue, counted in every ancestor too; a group without a phase waits. A Pending
    group without a live pod is not counted: its controller has yet to make them,
    or never will (a failed RayJob whose cluster was torn down), and nothing of it
    waits for the queue."""
    counts: dict[str, int] = {}
    for key, group in groups.items():
        phase = phases.get(key, Phase.PENDING)
        if phase not in WAITING_PHASES or group.queue not in tree:
            continue
        if phase == Phase.PENDING and not group.live:
            continue
        for queue in (group.queue, *tree.ancestors(group.queue)):
            counts[queue] = counts.get(queue, 0) + 1
    return counts


def _named_resources(node: QueueNode) -> list[str]:
    """Reported even at zero: cpu, memory, GPUs, and what the queue's spec names
    (per-GPU-type keys aside: their amounts are not summed per queue)."""
    named = [canonical_name(key) for key in node.spec.resources if "=" not in key]
    return list(dict.fromkeys([*CORE, *named]))


def _amounts(
    vector: Resources | None, named: Sequence[str], before: Mapping[str, Any] | None
) -> dict[str, int | str | None]:
    amounts = vector or Resources()
    names = dict.fromkeys([*named, *amounts])
    written: dict[str, int | str | None] = {
        short_name(name): quantity(name, amounts[name]) for name in names
    }
    return _with_removals(written, before)


def usage_amounts(
    fractions: Mapping[str, float], before: Mapping[str, Any] | None = None
) -> dict[str, int | str | None]:
    """Decayed usage as persisted: fractions of capacity, keyed like the amounts;
    `kai_ray.state.queues` reads them back after a restart."""
    written: dict[str, int | str | None] = {
        short_name(name): _decimal(fraction, USAGE_DECIMALS)
        for name, fraction in sorted(fractions.items())
    }
    return _with_removals(written, before)


def usage_records(history: Sequence[UsageInterval]) -> list[JsonObject]:
    """A queue's usage history as persisted (`usage.to_persist`: whole minutes over);
    `kai_ray.state.queues` reads it back after a restart."""
    return [
        {
            "start": rfc3339(interval.start_s),
            "end": rfc3339(interval.end_s),
            "held": _quantities(interval.held),
            "capacity": _quantities(interval.capacity),
        }
        for interval in to_persist(history)
    ]


def _quantities(amounts: Resources) -> dict[str, int | str]:
    return {short_name(name): quantity(name, amount) for name, amount in sorted(amounts.items())}


def quantity(name: str, amount: float) -> int | str:
    """An amount as the CRD's int-or-string quantity: whole numbers as integers,
    memory in binary units when exact, cpu fractions in millicores, other
    fractions (GPUs) as decimal strings such as "2.5"."""
    if name == MEMORY:
        whole = round(amount)
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if whole >= size and whole % size == 0:
                return f"{whole // size}{unit}"
        return whole
    if name == CPU and round(amount, 3) != round(amount):
        return f"{round(amount * 1000)}m"
    return _decimal(amount, AMOUNT_DECIMALS)


def _decimal(amount: float, places: int) -> int | str:
    # Fixed-point: the quantity pattern refuses negative exponents such as 1e-07.
    text = f"{max(amount, 0.0):.{places}f}".rstrip("0").rstrip(".")
    return int(text) if text.isdigit() else text


def _with_removals(
    written: dict[str, int | str | None], before: Mapping[str, Any] | None
) -> dict[str, int | str | None]:
    """A map for a merge patch: keys the previous status had and this one lacks go."""
    for name in before or {}:
        written.setdefault(name, None)
    return written
