"""What the waiting gangs ask, followed from cycle to cycle by what changed.

Several actions first glance over every waiting gang to learn whether any
attempt could come to something (`consolidate.some_could_be_tried`,
`reclaim.anyone_within_share`, `preempt.victims_below_anyone`), and allocate
orders them all by queue. Those glances read only a gang's queue, namespace,
missing request, priority and whether it is preemptible, and the order only
its candidate (`ordering.candidate_for`). Both are kept for the snapshot's
tuple of waiting groups (`totals.KeptForWaiting`) and follow a new tuple by the
groups that changed since they last looked, as the snapshot names them
(`Snapshot.groups_changed`; the cache keeps a group's state while nothing of it
changed), else by comparing each waiting group with the one seen last: a cycle
over a backlog that did not change reads a handful of asks and copies sorted
lists, and one into which a hundred gangs came works out those hundred, without
a glance at the thousands beside them. Pure: no I/O.
"""

from __future__ import annotations

import abc
import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kai_ray.decisions.admission import is_preemptible
from kai_ray.decisions.ordering import (
    Candidate,
    WaitingJobs,
    candidate_for,
    job_key,
    releasing_members,
)
from kai_ray.decisions.totals import kept_for_waiting
from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Changed, changed_keys
from kai_ray.values.resources import Resources

AskKey = tuple[str, str, Resources, int, bool]
#: Past this share of the groups changed, a follower starts afresh (sorting once
#: costs less than inserting that many one by one).
AFRESH_FROM = 0.25


@dataclass(frozen=True)
class Ask:
    """What some waiting gangs have alike, with one of them (admission reads only
    a gang's queue and namespace, which are the ask's)."""

    queue: str
    namespace: str
    request: Resources
    priority: int
    preemptible: bool
    group: PodGroupState


def ask_of(group: PodGroupState) -> AskKey:
    candidate = candidate_for(group)
    preemptible = is_preemptible(group, candidate.priority)
    return (group.queue, group.namespace, candidate.request, candidate.priority, preemptible)


class _Seen:
    """The waiting groups a follower last saw, by key, and the snapshot's groups they
    were read from (when given)."""

    def __init__(self) -> None:
        self.by_key: dict[str, PodGroupState] = {}
        self.groups: Mapping[str, PodGroupState] | None = None

    def changes(
        self,
        waiting: tuple[PodGroupState, ...],
        groups: Mapping[str, PodGroupState] | None = None,
        changed: Changed | None = None,
    ) -> tuple[list[PodGroupState], list[PodGroupState]]:
        """(came, went): the groups of `waiting` that are not the very objects seen
        last (new, or changed), and the states seen last that are gone or changed.
        Remembers `waiting` as seen. Given the snapshot's groups (`waiting` is those
        of them that wait, in order) and what changed since the groups seen last
        (`Snapshot.groups_changed`), only the changed keys are looked at: every
        other group is the very object seen, and waits as it did; else every
        waiting group is compared."""
        seen, self.groups = self.groups, groups
        keys = None if groups is None else changed_keys(seen, groups, changed)
        if groups is None or keys is None:
            return self._compared(waiting)
        before = self.by_key
        came: list[PodGroupState] = []
        went: list[PodGroupState] = []
        for key in keys:
            old = before.get(key)
            group = groups.get(key)
            if group is not None and not group.waiting:
                group = None
            if group is old:
                continue
            if old is not None:
                went.append(old)
                del before[key]
            if group is not None:
                came.append(group)
                before[key] = group
        return came, went

    def _compared(
        self, waiting: tuple[PodGroupState, ...]
    ) -> tuple[list[PodGroupState], list[PodGroupState]]:
        """`changes` by comparing every waiting group with the one seen last."""
        before = self.by_key
        came: list[PodGroupState] = []
        went: list[PodGroupState] = []
        for group in waiting:
            old = before.get(group.key)
            if old is not group:
                came.append(group)
                if old is not None:
                    went.append(old)
        still_there = len(waiting) - len(came) + len(went)
        if still_there != len(before):
            present = {group.key for group in waiting}
            gone = [old for key, old in before.items() if key not in present]
            for old in gone:
                del before[old.key]
            went.extend(gone)
        for group in came:
            before[group.key] = group
        return came, went


class _Follower(abc.ABC):
    """A value that follows the waiting groups by what came and went (`_Seen`)."""

    def __init__(self) -> None:
        self.seen = _Seen()

    def follow(
        self,
        waiting: tuple[PodGroupState, ...],
        groups: Mapping[str, PodGroupState] | None = None,
        changed: Changed | None = None,
    ) -> None:
        """Follow `waiting` (see `_Seen.changes` for `groups` and `changed`)."""
        came, went = self.seen.changes(waiting, groups, changed)
        self.moved(waiting, came, went)

    def same(self, groups: Mapping[str, PodGroupState]) -> None:
        """The waiting groups are the very tuple followed last: the groups seen are
        `groups` now (the next change the snapshot names starts from them)."""
        self.seen.groups = groups

    @abc.abstractmethod
    def moved(
        self,
        waiting: tuple[PodGroupState, ...],
        came: list[PodGroupState],
        went: list[PodGroupState],
    ) -> None:
        """Take in the groups that came (new or changed) and went (gone or changed)."""


class WaitingAsks(_Follower):
    """Each distinct ask of the waiting groups (`asks`), with how many ask it."""

    def __init__(self) -> None:
        super().__init__()
        self._count: dict[AskKey, int] = {}
        self._one: dict[AskKey, PodGroupState] = {}
        self.asks: tuple[Ask, ...] = ()

    def moved(
        self,
        waiting: tuple[PodGroupState, ...],
        came: list[PodGroupState],
        went: list[PodGroupState],
    ) -> None:
        count, one = self._count, self._one
        for group in went:
            key = ask_of(group)
            count[key] -= 1
            if not count[key]:
                del count[key], one[key]
        for group in came:
            key = ask_of(group)
            count[key] = count.get(key, 0) + 1
            one.setdefault(key, group)
        if came or went:
            self.asks = tuple(Ask(*key, group) for key, group in one.items())


class WaitingCandidates(_Follower):
    """Per leaf queue, the candidates of the waiting groups none of whose bound
    members is being deleted (`ordering.releasing_members`), best first
    (`ordering.job_key`, a total order: the lists are what sorting them afresh
    gives, however they were followed); and every queue's in one list, best
    first (`in_turn`: what merging the queues' lists gives)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_queue: dict[str, list[Candidate]] = {}
        self.in_turn: list[Candidate] = []

    def moved(
        self,
        waiting: tuple[PodGroupState, ...],
        came: list[PodGroupState],
        went: list[PodGroupState],
    ) -> None:
        if len(came) > AFRESH_FROM * len(waiting):
            self._afresh(waiting)
            return
        if went:
            gone = {group.key for group in went}
            for queue in {group.queue for group in went}:
                jobs = self.by_queue.get(queue)
                if jobs is not None:
                    self.by_queue[queue] = [c for c in jobs if c.group.key not in gone]
            self.in_turn = [c for c in self.in_turn if c.group.key not in gone]
        for group in came:
            if not releasing_members(group):
                candidate = candidate_for(group)
                jobs = self.by_queue.setdefault(group.queue, [])
                bisect.insort(jobs, candidate, key=job_key)
                bisect.insort(self.in_turn, candidate, key=job_key)
        for queue in [queue for queue, jobs in self.by_queue.items() if not jobs]:
            del self.by_queue[queue]

    def _afresh(self, groups: tuple[PodGroupState, ...]) -> None:
        every = [candidate_for(group) for group in groups if not releasing_members(group)]
        every.sort(key=job_key)
        self.in_turn = every
        self.by_queue = {}
        for candidate in every:
            self.by_queue.setdefault(candidate.queue, []).append(candidate)


ASKS = MemoKey[WaitingAsks]("what the waiting gangs ask")
CANDIDATES = MemoKey[WaitingCandidates]("waiting candidates per queue")


def waiting_asks(tx: Transaction) -> tuple[Ask, ...]:
    """Each distinct ask of the snapshot's waiting groups (`Snapshot.waiting_groups`)."""
    return kept_for_waiting(tx.memo, ASKS, tx.snapshot, WaitingAsks).asks


def waiting_candidates(tx: Transaction) -> Mapping[str, Sequence[Candidate]]:
    """Per leaf queue, the waiting candidates in order (`WaitingCandidates`):
    `ordering.waits`, so less the gangs the transaction placed pods of. Read only:
    copy to change."""
    by_queue = kept_for_waiting(tx.memo, CANDIDATES, tx.snapshot, WaitingCandidates).by_queue
    if not tx.placed:
        return by_queue
    placed = tx.groups_placed_pending
    return {
        queue: [c for c in jobs if c.group.key not in placed] for queue, jobs in by_queue.items()
    }


def waiting_in_turn(tx: Transaction) -> list[PodGroupState]:
    """The waiting groups of `waiting_candidates`, every queue's together, best first
    (`ordering.job_key`): its lists merged (`WaitingCandidates.in_turn`). A new
    list: the caller may keep it."""
    every = kept_for_waiting(tx.memo, CANDIDATES, tx.snapshot, WaitingCandidates).in_turn
    if not tx.placed:
        return [candidate.group for candidate in every]
    placed = tx.groups_placed_pending
    return [c.group for c in every if c.group.key not in placed]


def waiting_jobs(tx: Transaction) -> WaitingJobs:
    """`waiting_candidates` to take from in turn (`ordering.take_next`)."""
    return WaitingJobs.of_sorted(waiting_candidates(tx))
