"""`kai-ray explain`: why a pod, PodGroup or workload of a live cluster waits, or where it runs.

`explain(view, ...)` builds an `Explanation` value from what the API holds (the
cache of `effects.live_view`, read once): the gang and its queue; the queue's
quota, limit and weight from its spec, its fair share, allocation and request as
the operator last wrote them in its status, and what waits ahead of the gang; the
reason and the `Scheduled` condition of the last cycle, with the PodGroup's
Events; then the what-ifs of `explain_whatif.py` on the snapshot of what was
read (does the missing minimum fit now, how many members fit one by one, how
close the best topology domain comes). Nothing is written; rendering is
`explain_view.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_ray.decisions.fairness import queue_resource
from kai_ray.decisions.ordering import candidate_for, group_priority, job_key
from kai_ray.effects.live_view import LiveCluster
from kai_ray.effects.scheduling_loop import derived_group_key
from kai_ray.state.cache import POD, POD_GROUP, QUEUE
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Snapshot
from kai_ray.tools.explain_whatif import Closeness, Gang, closeness, gang_now, placed_in
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import UnavailableError
from kai_ray.values.names import POD_GROUP_ANNOTATION
from kai_ray.values.resources import CPU, GPU, parse_amount, short_name
from kai_ray.workloads.membership import owner_of_kind

Obj = Mapping[str, Any]
#: What a user may write before the slash, and the kind it means.
KINDS = {
    "pod": POD,
    "pods": POD,
    "po": POD,
    "podgroup": POD_GROUP,
    "podgroups": POD_GROUP,
    "pg": POD_GROUP,
    "raycluster": "RayCluster",
    "rayclusters": "RayCluster",
    "rayjob": "RayJob",
    "rayjobs": "RayJob",
    "job": "Job",
    "jobs": "Job",
}
#: Tried in this order for a name without a kind.
SEARCH_ORDER = (POD_GROUP, "RayJob", "RayCluster", "Job", POD)
EVENTS_SHOWN = 5


@dataclass(frozen=True)
class QueueStanding:
    """One queue on the gang's path, for one resource."""

    name: str
    quota: float
    limit: float
    weight: float
    #: As the operator last wrote them in the status ("" when never written).
    fair_share: str
    allocated: str
    requested: str
    pending_workloads: int | None


@dataclass(frozen=True)
class WaitingQueue:
    name: str
    allocated: str
    fair_share: str
    over_fair_share: bool
    gangs: int


@dataclass(frozen=True)
class Explanation:
    asked: str
    group: str
    #: The PodGroup is not in the API yet: the operator has not created it.
    pictured: bool
    phase: str
    resource: str
    queues: list[QueueStanding] = field(default_factory=list)
    ahead_in_queue: list[str] = field(default_factory=list)
    waiting_queues: list[WaitingQueue] = field(default_factory=list)
    gang: Gang | None = None
    last_reason: str = ""
    scheduled: Obj | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    topology: list[Closeness] | str | None = None
    #: Where the bound members are, at the constraint's levels: (level, domains).
    placed_in: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Why the operator leaves the group out (an invalid spec), when it does.
    problems: list[str] = field(default_factory=list)


class NotFoundError(UnavailableError):
    """The object asked about is not there, or is not kai-ray's."""


# ------------------------------------------------------------------ finding it


def find_group(view: LiveCluster, namespace: str, name: str) -> tuple[str, str]:
    """(what was asked, as `Kind namespace/name`; the key of its PodGroup)."""
    kind_text, slash, bare = name.partition("/")
    if slash and kind_text.lower() not in KINDS:
        known = ", ".join(sorted({k for k in KINDS if len(k) > 3}))
        raise NotFoundError(f"explain: unknown kind {kind_text!r} (one of {known})")
    kinds = (KINDS[kind_text.lower()],) if slash else SEARCH_ORDER
    target = bare if slash else name
    for kind in kinds:
        obj = view.cache.get(kind, f"{namespace}/{target}")
        if obj is not None:
            return f"{kind} {namespace}/{target}", _group_of(view, kind, obj, namespace, target)
    what = kinds[0] if slash else "pod, PodGroup, RayCluster, RayJob or Job"
    raise NotFoundError(f"explain: no {what} named {target!r} in namespace {namespace!r}")


def _group_of(view: LiveCluster, kind: str, obj: Obj, namespace: str, name: str) -> str:
    if kind == POD_GROUP:
        return f"{namespace}/{name}"
    if kind == POD:
        scheduler = (obj.get("spec") or {}).get("schedulerName") or "default-scheduler"
        group = ((obj.get("metadata") or {}).get("annotations") or {}).get(POD_GROUP_ANNOTATION)
        if scheduler != view.scheduler or not group:
            raise NotFoundError(
                f"explain: Pod {namespace}/{name} is not kai-ray's: {_whose(scheduler)}"
            )
        return f"{namespace}/{group}"
    owner = owner_of_kind(obj, ("RayJob",)) if kind == "RayCluster" else None
    key = (
        derived_group_key("RayJob", f"{namespace}/{owner}")
        if owner
        else derived_group_key(kind, f"{namespace}/{name}")
    )
    if view.cache.get(POD_GROUP, key) is None:
        raise NotFoundError(
            f"explain: {kind} {namespace}/{name} is no gang of kai-ray (its pods' "
            f"schedulerName is not {view.scheduler!r}, or it names no queue)"
        )
    return key


def _whose(scheduler: str) -> str:
    return f"its schedulerName is {scheduler!r}"


# ------------------------------------------------------------------ explaining


EventsOf = Callable[[str, str, str], Sequence[Obj]]


def explain(
    view: LiveCluster, config: SchedulerConfig, namespace: str, name: str, events_of: EventsOf
) -> Explanation:
    """Everything `kai-ray explain` shows; `events_of(namespace, kind, name)` reads Events."""
    asked, key = find_group(view, namespace, name)
    snapshot = view.cache.snapshot()
    obj = view.cache.get(POD_GROUP, key) or {}
    status = obj.get("status") or {}
    group = snapshot.pod_groups.get(key)
    base = Explanation(
        asked=asked,
        group=key,
        pictured=key in view.pictured,
        phase=str(status.get("phase") or "Pending"),
        resource=GPU,
        last_reason=str(status.get("reason") or ""),
        scheduled=_condition(status, "Scheduled"),
        events=_events(events_of, key),
    )
    if not obj:
        return dataclasses.replace(base, problems=[f"there is no PodGroup {key}"])
    if group is None:
        return _left_out(base, snapshot, key)
    resource = GPU if group.live_requests[GPU] > 0 else CPU
    return dataclasses.replace(
        base,
        resource=resource,
        queues=_queue_path(view, snapshot, group.queue, resource),
        ahead_in_queue=_ahead(snapshot, group),
        waiting_queues=_waiting_queues(view, snapshot, resource),
        gang=gang_now(snapshot, group, config),
        topology=closeness(snapshot, group, config),
        placed_in=placed_in(snapshot, group, config),
    )


def _left_out(base: Explanation, snapshot: Snapshot, key: str) -> Explanation:
    namespace, _, name = key.partition("/")
    problems = [
        f"{p.field}: {p.message}"
        for p in snapshot.problems
        if p.obj.kind == POD_GROUP and p.obj.name == name and p.obj.namespace == namespace
    ]
    return dataclasses.replace(base, problems=problems or ["left out of the cycle"])


def _condition(status: Obj, kind: str) -> Obj | None:
    return next((c for c in status.get("conditions") or () if c.get("type") == kind), None)


def _events(events_of: EventsOf, key: str) -> list[tuple[str, str, str]]:
    namespace, _, name = key.partition("/")
    events = events_of(namespace, POD_GROUP, name)[-EVENTS_SHOWN:]
    return [
        (
            str(e.get("lastTimestamp") or e.get("eventTime") or ""),
            str(e.get("reason") or ""),
            str(e.get("message") or ""),
        )
        for e in events
    ]


def _queue_path(
    view: LiveCluster, snapshot: Snapshot, leaf: str, resource: str
) -> list[QueueStanding]:
    standings = []
    for name in (leaf, *snapshot.queues.ancestors(leaf)):
        quota, limit, weight = queue_resource(snapshot.queues[name], resource)
        status = (view.cache.get(QUEUE, name) or {}).get("status") or {}
        standings.append(
            QueueStanding(
                name=name,
                quota=quota,
                limit=limit,
                weight=weight,
                fair_share=_amount(status, "fairShare", resource),
                allocated=_amount(status, "allocated", resource),
                requested=_amount(status, "requested", resource),
                pending_workloads=status.get("pendingWorkloads"),
            )
        )
    return standings


def _amount(status: Obj, key: str, resource: str) -> str:
    value = (status.get(key) or {}).get(short_name(resource))
    return "" if value is None else str(value)


def _ahead(snapshot: Snapshot, group: PodGroupState) -> list[str]:
    """Waiting gangs of its own queue that the next cycle tries before it."""
    if not group.waiting:
        return []
    mine = job_key(candidate_for(group))
    ahead = [
        other
        for other in snapshot.pod_groups.values()
        if other.queue == group.queue
        and other.waiting
        and other.key != group.key
        and job_key(candidate_for(other)) < mine
    ]
    ahead.sort(key=lambda other: job_key(candidate_for(other)))
    return [
        f"{other.key} (priority {group_priority(other)}, created {other.creation_timestamp})"
        for other in ahead
    ]


def _waiting_queues(view: LiveCluster, snapshot: Snapshot, resource: str) -> list[WaitingQueue]:
    """Leaf queues with waiting gangs; a queue below its fair share is served first."""
    counts: dict[str, int] = {}
    for group in snapshot.pod_groups.values():
        if group.waiting:
            counts[group.queue] = counts.get(group.queue, 0) + 1
    found = []
    for name, gangs in counts.items():
        status = (view.cache.get(QUEUE, name) or {}).get("status") or {}
        allocated = _amount(status, "allocated", resource)
        share = _amount(status, "fairShare", resource)
        over = _number(allocated) > _number(share) if share else False
        found.append(WaitingQueue(name, allocated, share, over, gangs))
    return sorted(found, key=lambda q: (q.over_fair_share, q.name))


def _number(text: str) -> float:
    return parse_amount(text or "0", "amount")
