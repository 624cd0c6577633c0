"""The allocate action: waiting gangs onto free resources, in queue order.

1. every waiting group whose minimum does not hold yet becomes a candidate in
   its leaf queue, asking for its missing minimum;
2. the next candidate is chosen by `ordering.next_candidate` (re-ordered after
   every admitted job, since the queues' holdings change);
3. admission may refuse it with a reason (namespace, limit, non-preemptible
   over quota); otherwise its minimum is placed all-or-nothing (`booking.placeable`
   keeps it off GPU types its limits cannot take), and booked on its queues, or
   undone if the GPUs it got pass a per-GPU-type limit (`booking.book`). A
   refusal changes nothing, so the jobs that would be picked next while each
   is refused too are refused together (`WaitingJobs.take_alike`); and a job
   of a kind (`alike.alike_key`) that already waited at the same transaction
   and ledger state waits the same way, answered without a second attempt;
4. only after every minimum: elastic extras one pod at a time, in the same
   queue order, under the same limits; inside a queue a job still at its
   minimum gets an extra before one already above it (`ordering.job_key`),
   so extras spread over the elastic jobs.
Allocate never evicts and never refuses a job for being over fair share: free
resources are handed out; taking them back is reclaim's business. With a
placement budget (`CycleContext.time_up`, the operator's) it stops between two
jobs once the budget is spent and enough pods are placed (`hand_over_now`): the
cycle ends there, its binds go out, and the next cycle goes on from the state
they leave.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Hashable
from dataclasses import dataclass

from kai_ray.decisions.admission import is_preemptible, refusal
from kai_ray.decisions.alike import alike_keys, with_kinds
from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.context import CycleContext, admitted
from kai_ray.decisions.kept import PER_GROUP
from kai_ray.decisions.ordering import (
    Candidate,
    WaitingJobs,
    candidate_for,
    releasing_members,
    take_next,
)
from kai_ray.decisions.placement import GangOutcome, place_extras, place_gang
from kai_ray.decisions.placement.equivalence import KnownFailure
from kai_ray.decisions.placement.gang_tree import known_outcome
from kai_ray.decisions.plan import GroupStatus
from kai_ray.decisions.totals import Tally, kept_members
from kai_ray.decisions.transaction import MemoKey
from kai_ray.decisions.waiting import waiting_jobs
from kai_ray.state.groups import PodGroupState


@dataclass(frozen=True)
class Waited:
    """Why a job waited: refused at admission, or placement's known failure."""

    refused: str | None
    failure: KnownFailure | None
    #: The reason when it is the same for every gang of the kind (it names no pod):
    #: read without a call for each of a backlog's thousands; else None.
    every: str | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every, failure = self.refused, self.failure
        if not every and failure is not None and failure.pod_position is None:
            every = failure.reason
        object.__setattr__(self, "every", every or None)

    def reason_for(self, group: PodGroupState) -> str | None:
        """The reason as `group` waits: the refusal, else the failure rendered for its pods."""
        return self.refused or (self.failure.reason_for(group) if self.failure else None)


#: By group key: the waiting status last stated of the group, with the group's state.
WAITING_STATUSES = MemoKey[GroupStatus]("waiting statuses stated")

#: Per group: admitted, with pods to add and no bound member being deleted (`_adding`),
#: followed from cycle to cycle (`totals.kept_members`).
ADDING = MemoKey[Tally[bool]]("admitted groups with pods to add")


def _adding(group: PodGroupState) -> bool | None:
    """True for a group whose minimum holds with pending pods left, none of its bound
    members being deleted (until they are gone its pending pods wait); else None.
    Reads the group alone."""
    adding = bool(group.pending) and not group.missing and not releasing_members(group)
    return True if adding else None


#: Jobs answered by their kind's known answer at one state before the kinds left
#: are judged at once (`_Allocation.rest_wait`): the walk has then met a run of
#: repeats, the mark of a backlog that no longer fits.
JUDGE_AFTER = 8


class AllocateAction:
    name = "allocate"

    def run(self, ctx: CycleContext) -> None:
        _Allocation(ctx).run()


class _Allocation:
    """One run of the action."""

    def __init__(self, ctx: CycleContext) -> None:
        self.ctx = ctx
        self.debug = ctx.log.isEnabledFor(logging.DEBUG)
        #: The waiting statuses stated last, kept from cycle to cycle with the groups
        #: (`KeptPerGroup.flat`; None when the caller keeps nothing).
        kept = ctx.transaction.memo.find(PER_GROUP, None)
        self.last_statuses = None if kept is None else kept.flat(WAITING_STATUSES, None)

    def run(self) -> None:
        extras = list[Candidate]()
        # Admitted with pods to add: extras may follow. (Waiting groups below.) The
        # few such groups are followed from cycle to cycle (`totals.kept_members`),
        # not found by a walk over every group; extras are taken in `job_key` order.
        groups = self.ctx.snapshot.pod_groups
        adding = kept_members(self.ctx.transaction.memo, ADDING, groups, _adding)
        for key in adding:
            group = groups[key]
            self.ctx.plan.statuses.state(admitted(group))
            extras.append(candidate_for(group))
        # The waiting gangs (`ordering.waits`), each queue's in order, kept while
        # the backlog stays as it was; less those an action before placed pods of.
        self.minimums(waiting_jobs(self.ctx.transaction), extras)
        self.extras(extras)

    def minimums(self, waiting: WaitingJobs, extras: list[Candidate]) -> None:
        ctx, tx = self.ctx, self.ctx.transaction
        #: The state last seen (transaction and ledger versions), how a job of each
        #: kind (`alike_key`) waited at it, how many jobs were answered from that at
        #: it, and whether the kinds left were judged at it.
        at, known, repeats, judged = (-1, -1), dict[Hashable, Waited](), 0, False
        key_of = alike_keys(ctx)
        while not ctx.hand_over_now() and (candidate := take_next(ctx.ledger, waiting)) is not None:
            alike = key_of(candidate.group)
            state = (tx.version, ctx.ledger.version)
            if state != at:
                at, known, repeats, judged = state, {}, 0, False
            waited = known.get(alike) if alike is not None else None
            if waited is None:
                refused = self.refusal_of(candidate)
                reason, failure = (refused, None) if refused else self.place_minimum(candidate)
                if reason and alike is not None and (refused or failure is not None):
                    known[alike] = Waited(refused, failure)
            else:
                # A job judged alike to one that waited at this very state waits the
                # same way: the attempt would read the same and change nothing.
                refused, reason = waited.refused, waited.reason_for(candidate.group)
                repeats += 1
            if not reason:
                ctx.plan.statuses.state(admitted(candidate.group))
                extras.append(candidate)
                continue
            self.wait(candidate, reason)
            if refused:
                # A refusal changes nothing: the jobs picked next, while refused alike,
                # are refused together (a deep backlog of one queue at its limit).
                for other, why in waiting.take_alike(ctx.ledger, self.refusal_of):
                    self.wait(other, why)
            if repeats >= JUDGE_AFTER and not judged:
                judged = True
                if self.rest_wait(waiting, known):
                    return

    def rest_wait(self, waiting: WaitingJobs, known: dict[Hashable, Waited]) -> bool:
        """Every job left waits, stated as its kind waits, when each kind left waits
        at this very state (`known`: how each kind met at it waited): those not met
        yet at it are judged once each, out of turn (`waits_at`, which changes
        nothing). A job's turn changes nothing while its kind waits, and the state
        does not move, so neither the order nor the queues' keys matter: the rest of
        a deep backlog, once nothing more fits, costs one attempt per kind and a
        look-up per job, not a turn per job. A job of no kind (a gang whose pods
        are nominated to nodes, say) is judged on its own, as its turn would judge
        it (`alone_waits`). False, with nothing stated, as soon as some job would
        not wait with a known answer (it fits, or its kind's failure holds for it
        alone), which the walk in turn then meets; or when the placement budget
        says to hand over now."""
        ctx = self.ctx
        if ctx.hand_over_now():
            return False
        reasons: list[tuple[PodGroupState, str]] = []
        # Judging changes nothing: the jobs' kinds are read many at once (`with_kinds`).
        for candidate, alike in with_kinds(ctx, waiting.remaining()):
            group = candidate.group
            if alike is None:
                # No kind: judged on its own, out of turn (its turn would meet this
                # very state, nothing placed before it).
                alone = self.alone_waits(candidate)
                if alone is None:
                    return False
                reasons.append((group, alone))
                continue
            waited = known.get(alike)
            if waited is None:
                waited = self.waits_at(candidate)
                if waited is None:
                    return False
                known[alike] = waited
            reason = waited.every or waited.reason_for(group)
            if not reason:
                return False
            reasons.append((group, reason))
        ctx.plan.statuses.state_all(self.waiting_statuses(reasons))
        if self.debug:
            for group, reason in reasons:
                ctx.log.debug("%s waits: %s", group.key, reason)
        return True

    def waits_at(self, candidate: Candidate) -> Waited | None:
        """How the job would wait now, when its turn's attempt would wait with an
        answer that holds for its kind (refused at admission, or placement's known
        failure: what `minimums` keeps); None when it would fit or fail otherwise.
        Changes nothing: a placement found is rolled back, nothing is booked."""
        refused, outcome = self.judged_now(candidate)
        if refused:
            return Waited(refused, None)
        if outcome is None or outcome.admitted or not outcome.reason or outcome.known is None:
            return None
        return Waited(None, outcome.known)

    def alone_waits(self, candidate: Candidate) -> str | None:
        """Why the job would wait now, as its turn's attempt would say (a refusal at
        admission, or placement's reason); None when it would fit. Changes nothing."""
        refused, outcome = self.judged_now(candidate)
        if refused or outcome is None:
            return refused
        return None if outcome.admitted else outcome.reason or None

    def judged_now(self, candidate: Candidate) -> tuple[str | None, GangOutcome | None]:
        """The job's refusal at admission, else how placing its minimum would go now
        (rolled back: nothing changes)."""
        refused = self.refusal_of(candidate)
        if refused:
            return refused, None
        ctx = self.ctx
        view = placeable(ctx, candidate.group)
        # A gang equivalent to one that failed at the transaction as it is is answered
        # from that failure, as `place_gang` would, without entering an attempt.
        known = known_outcome(ctx.transaction, view)
        if known is not None:
            return None, known
        with ctx.transaction.attempt():
            return None, place_gang(ctx.transaction, view, ctx.config)

    def wait(self, candidate: Candidate, reason: str) -> None:
        group = candidate.group
        self.ctx.plan.statuses.state(self.waiting_status(group, reason))
        if self.debug:
            self.ctx.log.debug("%s waits: %s", group.key, reason)

    def waiting_status(self, group: PodGroupState, reason: str) -> GroupStatus:
        """The group's status waiting for `reason`: the very status stated of it last
        time, when that said the same of the same state (statuses are immutable, and
        a backlog waits cycle after cycle for the same reasons), else a new one."""
        last = self.last_statuses
        if last is None:
            return GroupStatus(group.key, False, reason)
        found = last.get(group.key)
        if found is not None and found[0] is group and found[1].reason == reason:
            return found[1]
        status = GroupStatus(group.key, False, reason)
        last[group.key] = (group, status)
        return status

    def waiting_statuses(self, reasons: list[tuple[PodGroupState, str]]) -> list[GroupStatus]:
        """`waiting_status` of each group for its reason, the statuses stated last of
        the very states for the same reasons looked up without a call each."""
        last, waits = self.last_statuses, self.waiting_status
        if last is None:
            return [waits(group, reason) for group, reason in reasons]
        return [
            found[1]
            if (found := last.get(group.key)) is not None
            and found[0] is group
            and found[1].reason == reason
            else waits(group, reason)
            for group, reason in reasons
        ]

    def refusal_of(self, candidate: Candidate) -> str | None:
        """Why admission refuses the job's minimum now (`admission.refusal`), or None."""
        group = candidate.group
        preemptible = is_preemptible(group, candidate.priority)
        return refusal(self.ctx.ledger, group, candidate.request, preemptible)

    def place_minimum(self, candidate: Candidate) -> tuple[str | None, KnownFailure | None]:
        """(None, None) when the minimum now holds (placed and booked); otherwise why
        not, with how placement failed when that holds for any equivalent gang at the
        same state (`GangOutcome.known`)."""
        ctx = self.ctx
        with ctx.transaction.attempt() as step:
            outcome = place_gang(ctx.transaction, placeable(ctx, candidate.group), ctx.config)
            if outcome.admitted:
                return book(ctx, step), None
            return outcome.reason, outcome.known

    def extras(self, candidates: list[Candidate]) -> None:
        """One extra pod per turn, re-ordering after each, until none fits."""
        if self.ctx.cut_short:
            return
        waiting = WaitingJobs(c for c in map(self.next_extra, candidates) if c is not None)
        while (
            not self.ctx.hand_over_now()
            and (candidate := take_next(self.ctx.ledger, waiting)) is not None
        ):
            group, ctx = candidate.group, self.ctx
            preemptible = is_preemptible(group, candidate.priority)
            if refusal(ctx.ledger, group, candidate.request, preemptible):
                continue
            with ctx.transaction.attempt() as step:
                placed = place_extras(ctx.transaction, placeable(ctx, group), ctx.config, limit=1)
                if not placed or book(ctx, step) is not None:
                    continue
            following = self.next_extra(candidate)
            if following is not None:
                waiting.add(following)

    def next_extra(self, candidate: Candidate) -> Candidate | None:
        """The candidate asking for its next extra pod, None when none is left; marked
        when the group already holds more than its minimum."""
        tx, group = self.ctx.transaction, candidate.group
        unplaced = [pod for pod in group.pending if pod.key not in tx.placed]
        if not unplaced:
            return None
        holding = sum(1 for pod in group.bound if pod.key not in tx.removed)
        holding += sum(1 for pod in group.pending if pod.key in tx.placed)
        above = holding > group.spec.minMember
        return Candidate(group, unplaced[0].effective_requests, candidate.priority, above)
