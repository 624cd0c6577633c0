"""The reclaim action: a queue below its fair share takes resources back across queues.

1. every group whose minimum is still missing after allocate is a candidate,
   taken in queue order (`ordering.take_next`, as allocate does);
2. admission may refuse it (namespace, limit, non-preemptible over quota);
3. its victims are running, preemptible gangs of other leaf queues not
   protected by `reclaimMinRuntime`, cut into units (`victims.victim_units`);
4. each victim queue is judged against the reclaimer where their paths in the
   tree diverge: every queue on either path strictly below the lowest common
   ancestor is compared (`FairShareBudget`):
   - reclaimer side: with the job added it stays within its fair share, in
     every resource the job asks for;
   - victim side: in every contested resource the job asks for (the queues
     together request more of it than the cluster has), a queue over its
     fair share may lose only what it holds above it, and one at or below its
     share loses nothing. A queue at or below quota is then never reclaimed
     from, since a contested resource's fair share is at least the quota (or
     the whole request). Resources nobody lacks may go: they come straight back.
   The full fair share is restored between siblings, not only the quota.
5. the steps preempt shares (`eviction.py`): victims chosen greedily,
   evicted in the transaction and the job placed (`eviction.evict_to_fit`).
   The job is placed as `booking.placeable` shows it, and the
   whole step booked on the queues by `booking.book` (undone when the job's
   GPUs would pass a per-GPU-type limit). The evictions and the job's binds
   go into the same plan.
Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

from kai_ray.decisions.admission import is_preemptible, refusal
from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.eviction import (
    ask_to_wake,
    evict_to_fit,
    record,
    running_units,
    waiting_candidates,
)
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import Candidate, take_next
from kai_ray.decisions.runtime import Protection, RuntimeField
from kai_ray.decisions.victims import Budget, VictimUnit
from kai_ray.state.groups import PodGroupState
from kai_ray.values.resources import EPSILON, Resources, add_into

# ------------------------------------------------------------- fairness rules


def lowest_common_ancestor(ledger: QueueLedger, a: str, b: str) -> str | None:
    """The nearest queue both leaves sit under; None when their roots differ."""
    above_a = set(ledger.path(a))
    return next((name for name in ledger.path(b) if name in above_a), None)


def below(ledger: QueueLedger, leaf: str, ancestor: str | None) -> tuple[str, ...]:
    """The leaf's path up to, not including, `ancestor` (the whole path when None)."""
    path = ledger.path(leaf)
    return path if ancestor is None else path[: path.index(ancestor)]


def contested_resources(groups: Mapping[str, PodGroupState], capacity: Resources) -> set[str]:
    """Resources the live pods of all queues, bound or pending, ask more of than there is."""
    # Each group's total is summed first, then added: the order the floats always had.
    asked: dict[str, float] = {}
    for group in groups.values():
        add_into(asked, group.live_requests)
    summed = Resources.from_canonical(asked)  # drops zeros, as the vector sum did
    return {r for r, amount in summed.items() if amount > capacity[r] + EPSILON}


class FairShareBudget(Budget):
    """Reclaim's rules (module docstring, step 4) for one reclaimer and one job."""

    def __init__(
        self, ledger: QueueLedger, contested: Iterable[str], leaf: str, job: Resources
    ) -> None:
        self.ledger, self.leaf = ledger, leaf
        self.asked = [r for r, amount in job.items() if amount > EPSILON]
        self.contested = [r for r in self.asked if r in set(contested)]
        self.job = job
        #: Per queue, the contested amounts taken so far (nothing else is judged).
        self.taken: dict[str, dict[str, float]] = {}
        self._below: dict[str, tuple[str, ...]] = {}

    def reclaimer_within_share(self) -> bool:
        """With the job added, the reclaimer's leaf stays within its fair share. Every
        victim's test includes the leaf, so without this none can be taken from."""
        held, share = self.ledger.held(self.leaf), self._share(self.leaf)
        return all(held[r] + self.job[r] <= share[r] + EPSILON for r in self.asked)

    def reclaimer_may_take_from(self, victim_leaf: str) -> bool:
        """With the job added, the reclaimer's side stays within its fair share."""
        if victim_leaf == self.leaf:
            return False
        lca = lowest_common_ancestor(self.ledger, self.leaf, victim_leaf)
        return all(
            self.ledger.held(q)[r] + self.job[r] <= self._share(q)[r] + EPSILON
            for q in below(self.ledger, self.leaf, lca)
            for r in self.asked
        )

    def take(self, units: Sequence[VictimUnit]) -> bool:
        if not self.contested:
            return True  # nothing is judged: every unit may go
        taking: dict[str, dict[str, float]] = {}
        for unit in units:
            for q in self._victim_side(unit.queue):
                amounts = taking.setdefault(q, {})
                for r in self.contested:
                    amounts[r] = amounts.get(r, 0.0) + unit.requests[r]
        if not all(self._may_lose(q, amounts) for q, amounts in taking.items()):
            return False
        for q, amounts in taking.items():
            taken = self.taken.setdefault(q, {})
            for r, amount in amounts.items():
                taken[r] = taken.get(r, 0.0) + amount
        return True

    def _victim_side(self, victim_leaf: str) -> tuple[str, ...]:
        """The victim's queues judged against this reclaimer (below their common ancestor)."""
        if victim_leaf not in self._below:
            lca = lowest_common_ancestor(self.ledger, self.leaf, victim_leaf)
            self._below[victim_leaf] = below(self.ledger, victim_leaf, lca)
        return self._below[victim_leaf]

    def _may_lose(self, queue: str, amounts: Mapping[str, float]) -> bool:
        held, share = self.ledger.held(queue), self._share(queue)
        taken = self.taken.get(queue, {})
        return all(
            amounts[r] <= EPSILON
            or (
                held[r] > share[r] + EPSILON
                and (held[r] - taken.get(r, 0.0)) - amounts[r] >= share[r] - EPSILON
            )
            for r in self.contested
        )

    def _share(self, queue: str) -> Resources:
        return self.ledger.fair_share.get(queue, Resources())


# ------------------------------------------------- simulate and roll back


# ------------------------------------------------------------------- action


class ReclaimAction:
    name = "reclaim"
    which: RuntimeField = "reclaimMinRuntime"

    def run(self, ctx: CycleContext) -> None:
        waiting = waiting_candidates(ctx)
        if waiting.empty():
            return  # no job to reclaim for: skip summing every live pod
        contested = contested_resources(ctx.snapshot.pod_groups, ctx.capacity)
        while (candidate := take_next(ctx.ledger, waiting)) is not None:
            self.attempt(ctx, candidate, contested)

    def attempt(self, ctx: CycleContext, candidate: Candidate, contested: set[str]) -> None:
        group = candidate.group
        if refusal(ctx.ledger, group, candidate.request, is_preemptible(group, candidate.priority)):
            return
        budget = FairShareBudget(ctx.ledger, contested, group.queue, candidate.request)
        if not budget.reclaimer_within_share():
            return  # no queue may be reclaimed from (and no runtime protection was met)
        protection = Protection(ctx.snapshot.queues, self.which, ctx.now)
        may_take = functools.cache(budget.reclaimer_may_take_from)
        units = running_units(ctx, may_take, protection)
        new_budget = lambda: FairShareBudget(ctx.ledger, contested, group.queue, candidate.request)  # noqa: E731
        with ctx.transaction.attempt() as step:
            victims = evict_to_fit(ctx, placeable(ctx, group), units, new_budget)
            if victims is None:
                ask_to_wake(ctx, protection)
            elif book(ctx, step) is None:
                record(ctx, candidate, victims, self.name)
