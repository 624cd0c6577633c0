"""What the waiting gangs ask, worked out once while they wait unchanged.

Several actions first glance over every waiting gang to learn whether any
attempt could come to something (`consolidate.some_could_be_tried`,
`reclaim.anyone_within_share`, `preempt.victims_below_anyone`), and allocate
orders them all by queue. Those glances read only a gang's queue, namespace,
missing request, priority and whether it is preemptible, and the order only
its candidate (`ordering.candidate_for`). Both are kept for the snapshot's
tuple of waiting groups (`totals.KeptForWaiting`), so a cycle over a backlog
that did not change reads a handful of asks and copies sorted lists instead of
visiting thousands of gangs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kai_ray.decisions.admission import is_preemptible
from kai_ray.decisions.ordering import Candidate, candidate_for, job_key, releasing_members
from kai_ray.decisions.totals import kept_for_waiting
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.values.resources import Resources


@dataclass(frozen=True)
class Ask:
    """What some waiting gangs have alike, with the first of them (admission reads
    a gang's queue and namespace only)."""

    queue: str
    namespace: str
    request: Resources
    priority: int
    preemptible: bool
    group: PodGroupState


ASKS = MemoKey[tuple[Ask, ...]]("what the waiting gangs ask")
CANDIDATES = MemoKey[Mapping[str, tuple[Candidate, ...]]]("waiting candidates per queue")


def waiting_asks(tx: Transaction) -> tuple[Ask, ...]:
    """Each distinct ask of the snapshot's waiting groups (`Snapshot.waiting_groups`),
    in the order first met."""
    waiting = tx.snapshot.waiting_groups
    return kept_for_waiting(tx.memo, ASKS, waiting, lambda: _asks(waiting))


def _asks(groups: tuple[PodGroupState, ...]) -> tuple[Ask, ...]:
    found: dict[tuple[str, str, Resources, int, bool], Ask] = {}
    for group in groups:
        candidate = candidate_for(group)
        preemptible = is_preemptible(group, candidate.priority)
        key = (group.queue, group.namespace, candidate.request, candidate.priority, preemptible)
        if key not in found:
            found[key] = Ask(*key, group)
    return tuple(found.values())


def waiting_candidates(tx: Transaction) -> Mapping[str, tuple[Candidate, ...]]:
    """Per leaf queue, the candidates of the snapshot's waiting groups none of whose
    bound members is being deleted (`ordering.releasing_members`), best first
    (`ordering.job_key`): `ordering.waits` less what the transaction placed."""
    waiting = tx.snapshot.waiting_groups
    return kept_for_waiting(tx.memo, CANDIDATES, waiting, lambda: _candidates(waiting))


def _candidates(groups: tuple[PodGroupState, ...]) -> Mapping[str, tuple[Candidate, ...]]:
    by_queue: dict[str, list[Candidate]] = {}
    for group in groups:
        if not releasing_members(group):
            by_queue.setdefault(group.queue, []).append(candidate_for(group))
    return {queue: tuple(sorted(jobs, key=job_key)) for queue, jobs in by_queue.items()}
