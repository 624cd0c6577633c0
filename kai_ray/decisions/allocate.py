"""The allocate action: waiting gangs onto free resources, in queue order.

1. every waiting group whose minimum does not hold yet becomes a candidate in
   its leaf queue, asking for its missing minimum;
2. the next candidate is chosen by `ordering.next_candidate` (re-ordered after
   every admitted job, since the queues' holdings change);
3. admission may refuse it with a reason (namespace, limit, non-preemptible
   over quota); otherwise its minimum is placed all-or-nothing, and undone if
   the GPUs it got pass a per-GPU-type limit;
4. only after every minimum: elastic extras one pod at a time, in the same
   queue order, under the same limits.
Allocate never evicts and never refuses a job for being over fair share: free
resources are handed out; taking them back is reclaim's business.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kai_ray.decisions.admission import (
    TypedKey,
    avoiding,
    exhausted_types,
    is_preemptible,
    refusal,
    typed_gpus,
    typed_keys,
    typed_limit_refusal,
)
from kai_ray.decisions.ordering import Candidate, WaitingJobs, group_priority, take_next
from kai_ray.decisions.placement import place_extras, place_gang
from kai_ray.decisions.plan import GroupStatus
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState, total_requests
from kai_ray.values.resources import GPU, Resources

if TYPE_CHECKING:
    from kai_ray.decisions.cycle import CycleContext


def pending_pods(group: PodGroupState) -> list[PodState]:
    return [pod for pod in group.live_pods() if pod.node is None]


def missing_minimum(group: PodGroupState) -> list[PodState]:
    """The pending pods that would complete the group's minimum (as placement picks them)."""
    return list(group.missing)


class AllocateAction:
    name = "allocate"

    def run(self, ctx: CycleContext) -> None:
        _Allocation(ctx).run()


class _Allocation:
    """One run of the action; remembers which pods it placed, per group."""

    def __init__(self, ctx: CycleContext) -> None:
        self.ctx = ctx
        #: group -> pod -> node, for the pods this run placed.
        self.placed: dict[str, dict[str, str]] = {}

    def run(self) -> None:
        minimums, extras = WaitingJobs(), list[Candidate]()
        for group in self.ctx.snapshot.pod_groups.values():
            if pending_pods(group):
                missing = missing_minimum(group)
                candidate = Candidate(group, total_requests(missing), group_priority(group))
                if missing:
                    minimums.add(candidate)
                else:  # its minimum already holds: admitted, extras may follow
                    self.ctx.plan.statuses.append(GroupStatus(group.key, True))
                    extras.append(candidate)
        self.minimums(minimums, extras)
        self.extras(extras)

    def minimums(self, waiting: WaitingJobs, extras: list[Candidate]) -> None:
        while (candidate := take_next(self.ctx.ledger, waiting)) is not None:
            reason = self.admit_minimum(candidate)
            key = candidate.group.key
            self.ctx.plan.statuses.append(GroupStatus(key, not reason, reason or ""))
            if reason:
                self.ctx.log.debug("%s waits: %s", key, reason)
            else:
                extras.append(candidate)

    def admit_minimum(self, candidate: Candidate) -> str | None:
        """None when the minimum now holds; otherwise why not, for a person."""
        group, ctx = candidate.group, self.ctx
        preemptible = is_preemptible(group, candidate.priority)
        refused = refusal(ctx.ledger, group, candidate.request, preemptible)
        if refused:
            return refused
        mark = ctx.transaction.checkpoint()
        outcome = place_gang(ctx.transaction, self.placeable(group), ctx.config)
        if not outcome.admitted:
            return outcome.reason
        return self.account(group, mark, preemptible)

    def extras(self, candidates: list[Candidate]) -> None:
        """One extra pod per turn, re-ordering after each, until none fits."""
        waiting = WaitingJobs(c for c in map(self.next_extra, candidates) if c is not None)
        while (candidate := take_next(self.ctx.ledger, waiting)) is not None:
            group, ctx = candidate.group, self.ctx
            preemptible = is_preemptible(group, candidate.priority)
            if refusal(ctx.ledger, group, candidate.request, preemptible):
                continue
            mark = ctx.transaction.checkpoint()
            if place_extras(ctx.transaction, self.placeable(group), ctx.config, limit=1) == 0:
                continue
            if self.account(group, mark, preemptible) is None:
                following = self.next_extra(candidate)
                if following is not None:
                    waiting.add(following)

    def account(self, group: PodGroupState, mark: int, preemptible: bool) -> str | None:
        """Book what was placed since `mark` on the queues, unless it passes a
        per-GPU-type limit, in which case it is undone and the reason returned."""
        ctx = self.ctx
        tx, keys = ctx.transaction, typed_keys(ctx.snapshot.queues, group.queue)
        typed = _typed_placed(tx, mark, keys)
        refused = typed_limit_refusal(ctx.ledger, group.queue, typed) if keys else None
        if refused:
            tx.revert(mark)
            return refused
        ctx.ledger.add(group.queue, _placed(tx, mark), preemptible)
        ctx.ledger.add_typed(group.queue, typed)
        placed = self.placed.setdefault(group.key, {})
        placed.update((p.bind.pod, p.bind.node) for p in tx.placements[mark:])
        return None

    def unplaced(self, group: PodGroupState) -> list[PodState]:
        placed = self.placed.get(group.key, {})
        return [pod for pod in pending_pods(group) if pod.key not in placed]

    def next_extra(self, candidate: Candidate) -> Candidate | None:
        """The candidate asking for its next extra pod, None when none is left."""
        unplaced = self.unplaced(candidate.group)
        if not unplaced:
            return None
        return Candidate(candidate.group, unplaced[0].effective_requests, candidate.priority)

    def placeable(self, group: PodGroupState) -> PodGroupState:
        """The group as placement should see it: pods placed this cycle shown as
        bound (counted in the minimum, not placed again), and pending pods kept
        off GPU types whose per-type limit cannot take even one of them."""
        placed = self.placed.get(group.key, {})
        avoid = self.exhausted(group)
        pods = tuple(
            dataclasses.replace(pod, node=placed[pod.key])
            if pod.key in placed
            else (avoiding(pod, avoid) if avoid and pod.node is None else pod)
            for pod in group.pods
        )
        return dataclasses.replace(group, pods=pods)

    def exhausted(self, group: PodGroupState) -> list[TypedKey]:
        keys = typed_keys(self.ctx.snapshot.queues, group.queue)
        gpus = [pod.effective_requests[GPU] for pod in self.unplaced(group)]
        if not keys or not gpus:
            return []
        return exhausted_types(self.ctx.ledger, group.queue, keys, min(gpus))


def _placed(tx: Transaction, mark: int) -> Resources:
    """What the placements since `mark` hold, GPU shares as parts of a GPU."""
    amount = Resources()
    for placement in tx.placements[mark:]:
        pod = tx.snapshot.pods[placement.bind.pod]
        amount = amount + pod.requests + {GPU: placement.bind.gpu_fraction}
    return amount


def _typed_placed(tx: Transaction, mark: int, keys: Sequence[TypedKey]) -> Resources:
    labels = tx.snapshot.labels
    placed = [
        (labels[p.node], tx.snapshot.pods[p.bind.pod].requests[GPU] + p.bind.gpu_fraction)
        for p in tx.placements[mark:]
    ]
    return typed_gpus(keys, placed)
