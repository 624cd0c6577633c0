"""The reclaim action: a queue below its fair share takes resources back across queues.

1. every group whose minimum is still missing after allocate is a candidate,
   taken in queue order (`ordering.take_next`, as allocate does), each kind of
   job judged first (`eviction.attempt_in_turn`: when no kind finds room the
   run ends without taking the jobs one by one);
2. admission may refuse it (namespace, limit, non-preemptible over quota),
   a limit counted with what its victims free in each queue on their paths
   (`eviction.admission_refusal`): victims inside the reclaimer's department
   make room under the department's limit. It is judged first with every
   possible victim gone, then on each set of victims tried;
3. its victims are running, preemptible gangs of other leaf queues not
   protected by `reclaimMinRuntime`, cut into units (`victims.victim_units`);
4. each victim queue is judged against the reclaimer where their paths in the
   tree diverge: every queue on either path strictly below the lowest common
   ancestor is compared (`FairShareBudget`):
   - reclaimer side: with the job added it stays within its fair share, in
     every resource the job asks for;
   - victim side: in every contested resource the job asks for (the queues
     together request more of it than the cluster has, or the queues under
     the common ancestor more than its fair share, as under a department's
     limit: what they lose does not come back to them), a queue over its
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.eviction import (
    admission_refusal,
    ask_to_wake,
    attempt_in_turn,
    evict_to_fit,
    record,
    running_units,
)
from kai_ray.decisions.fairness import quota_of
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.ordering import Candidate
from kai_ray.decisions.runtime import Protection, RuntimeField
from kai_ray.decisions.totals import Exact, as_resources, live_demand, summed
from kai_ray.decisions.victims import Budget, VictimUnit
from kai_ray.decisions.waiting import waiting_asks, waiting_jobs
from kai_ray.values.resources import EPSILON, NO_RESOURCES, Resources

T = TypeVar("T")

# ------------------------------------------------------------- fairness rules


def lowest_common_ancestor(ledger: QueueLedger, a: str, b: str) -> str | None:
    """The nearest queue both leaves sit under; None when their roots differ."""
    above_a = set(ledger.path(a))
    return next((name for name in ledger.path(b) if name in above_a), None)


def below(ledger: QueueLedger, leaf: str, ancestor: str | None) -> tuple[str, ...]:
    """The leaf's path up to, not including, `ancestor` (the whole path when None)."""
    path = ledger.path(leaf)
    return path if ancestor is None else path[: path.index(ancestor)]


@dataclass(frozen=True)
class Contested:
    """Resources asked for more than there is: in the whole cluster, and under each
    queue whose subtree asks more than its fair share (a department at its limit)."""

    cluster: frozenset[str]
    under: Mapping[str, frozenset[str]]

    def at(self, ancestor: str | None) -> frozenset[str]:
        """Contested between two queues whose paths meet at `ancestor` (None: the root)."""
        return self.cluster if ancestor is None else self.cluster | self.under.get(ancestor, NONE)


NONE: frozenset[str] = frozenset()


def contested_resources(
    demand: Mapping[str, Exact], capacity: Resources, ledger: QueueLedger
) -> Contested:
    """What the live pods of the queues, bound or pending, ask more of than there is,
    in the cluster and under each queue (more than the queue's fair share). `demand`:
    each leaf's exact sum (`totals.live_demand`, kept from cycle to cycle), so the
    sums are rounded once, as fair share's demand is."""
    asked = as_resources(summed(demand.values()))
    cluster = frozenset(r for r, amount in asked.items() if amount > capacity[r] + EPSILON)
    return Contested(cluster, _over_share(ledger, demand))


def _over_share(ledger: QueueLedger, demand: Mapping[str, Exact]) -> dict[str, frozenset[str]]:
    subtree: dict[str, list[Exact]] = {}
    for leaf, amounts in demand.items():
        if leaf in ledger.tree:
            for name in ledger.path(leaf)[1:]:
                subtree.setdefault(name, []).append(amounts)
    under = {}
    for name, parts in subtree.items():
        share = ledger.fair_share.get(name, NO_RESOURCES)
        asked = as_resources(summed(parts))
        under[name] = frozenset(r for r, a in asked.items() if a > share[r] + EPSILON)
    return under


def within_share(ledger: QueueLedger, leaf: str, job: Resources) -> bool:
    """With the job added, the leaf stays within its fair share in every resource
    the job asks for."""
    held, share = ledger.held(leaf), ledger.fair_share.get(leaf, NO_RESOURCES)
    asked = [r for r, amount in job.items() if amount > EPSILON]
    return all(held[r] + job[r] <= share[r] + EPSILON for r in asked)


def anyone_within_share(ctx: CycleContext) -> bool:
    """Whether some waiting gang's queue stays within its fair share with the gang
    added (`within_share`). Without one, every attempt stops at that first test,
    changing nothing and asking for no wake-up: with every team at its share the
    action is then skipped whole, the waiting gangs neither sorted nor picked and
    the live pods not summed. The waiting groups of the snapshot hold every gang
    the action could try; each is judged once per (queue, request)
    (`waiting.waiting_asks`, through `queues_within_share`)."""
    return bool(queues_within_share(ctx))


def queues_within_share(ctx: CycleContext) -> frozenset[str]:
    """The leaf queues some waiting gang keeps within their fair share with the gang
    added (`within_share`), at the ledger as it is: a gang of any other queue stops
    at its attempt's first test (`eviction.attempt_in_turn`'s `hopeful`). Judged
    once per (queue, request) of the snapshot's waiting groups, which hold every
    gang the action tries, and each queue only until one of its requests passes."""
    ledger, found = ctx.ledger, set()
    for queue, request in {(ask.queue, ask.request) for ask in waiting_asks(ctx.transaction)}:
        if queue not in found and within_share(ledger, queue, request):
            found.add(queue)
    return frozenset(found)


@dataclass
class SharedAnswers:
    """What one run's budgets at one ledger version, asking the same resources, share."""

    #: `FairShareBudget.takes_alone`'s answers, by what the answer reads of the
    #: reclaimer (the victim's queues judged and the resources contested where the
    #: two paths meet) and of the unit (its leaf and amounts), whichever queue reclaims.
    alone: dict[tuple[object, ...], bool] = field(default_factory=dict)
    #: `FairShareBudget.shared`'s values, per (reclaimer's leaf, id of the anchor):
    #: the anchor (kept alive, so that its id names it) and the value.
    derived: dict[tuple[str, int], tuple[object, object]] = field(default_factory=dict)


#: Per (ledger version, resources asked): what the run's budgets share there.
AloneAnswers = dict[tuple[int, tuple[str, ...]], SharedAnswers]


class FairShareBudget(Budget):
    """Reclaim's rules (module docstring, step 4) for one reclaimer and one job."""

    def __init__(
        self,
        ledger: QueueLedger,
        contested: Contested,
        leaf: str,
        job: Resources,
        answers: AloneAnswers | None = None,
    ) -> None:
        self.ledger, self.leaf = ledger, leaf
        self.asked = [r for r, amount in job.items() if amount > EPSILON]
        self.contested = contested
        self.job = job
        #: Per queue, the contested amounts taken so far (nothing else is judged).
        self.taken: dict[str, dict[str, float]] = {}
        self._below: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        #: Per victim-side queue, the resources contested where it meets the reclaimer.
        self._contested_for: dict[str, tuple[str, ...]] = {}
        #: What `take` refused since it last took (it refuses the same again: a refusal
        #: changes nothing), by the amounts it judged per queue.
        self._refused: set[tuple[tuple[object, ...], ...]] = set()
        #: `takes_alone`'s answers: shared by the budgets of one run (`answers`, one
        #: `contested`) with the same ledger and resources asked, keyed by the rest
        #: the answer reads (`takes_alone`).
        shared = {} if answers is None else answers
        self._shared = shared.setdefault((ledger.version, tuple(self.asked)), SharedAnswers())
        self._alone = self._shared.alone

    def reclaimer_within_share(self) -> bool:
        """With the job added, the reclaimer's leaf stays within its fair share. Every
        victim's test includes the leaf, so without this none can be taken from."""
        return within_share(self.ledger, self.leaf, self.job)

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
        taking: dict[str, dict[str, float]] = {}
        for unit in units:
            side, _ = self._victim_side(unit.queue)
            for q in side:
                amounts = taking.setdefault(q, {})
                for r in self.asked:
                    amounts[r] = amounts.get(r, 0.0) + unit.requests[r]
        judged = self.judged_key(taking)
        if judged is not None and judged in self._refused:
            return False
        if not all(self._may_lose(q, amounts) for q, amounts in taking.items()):
            if judged is not None:
                self._refused.add(judged)
            return False
        for q, amounts in taking.items():
            taken = self.taken.setdefault(q, {})
            for r, amount in amounts.items():
                taken[r] = taken.get(r, 0.0) + amount
        self._refused.clear()
        return True

    def take_each(self, units: Sequence[VictimUnit]) -> list[VictimUnit]:
        """`Budget.take_each`: a unit alike to one refused since the budget last took
        (the same leaf and requests: all `take` reads of a unit) is refused without
        being judged again, since a refusal changes nothing."""
        kept: list[VictimUnit] = []
        refused: set[tuple[str, Resources]] = set()
        for unit in units:
            kind = (unit.queue, unit.requests)
            if kind in refused:
                continue
            if self.take([unit]):
                kept.append(unit)
                refused.clear()
            else:
                refused.add(kind)
        return kept

    def judged_key(
        self, taking: Mapping[str, Mapping[str, float]]
    ) -> tuple[tuple[object, ...], ...] | None:
        """What `take` judges: the amounts taken from each queue (everything else it
        reads, the ledger and what was taken before, stays the same until it takes)."""
        return tuple((q, *amounts.values()) for q, amounts in taking.items())

    def takes_alone(self, unit: VictimUnit) -> bool:
        if self.taken:
            raise ValueError("takes_alone asked of a budget that has taken units already")
        # Of the reclaimer, the answer reads only the victim's queues judged and the
        # resources contested where the paths meet (`_victim_side`): reclaimers whose
        # paths meet the victim's at the same queue share it (sibling teams all do).
        # Of the unit, keyed by all it asks (its vector's hash is kept): units alike
        # in what is judged but not in the rest only cost one more answer each.
        key = (*self._victim_side(unit.queue), unit.queue, unit.requests)
        answer = self._alone.get(key)
        if answer is None:
            answer = self._alone[key] = self._may_lose_alone(unit.queue, unit.requests)
        return answer

    def shared(self, anchor: object, build: Callable[[], T]) -> T:
        """`Budget.shared`, kept for the run's budgets at this ledger version that ask
        the same resources for the same reclaimer's leaf: `takes_alone` reads of the
        reclaimer its leaf alone (through `_victim_side`), of the job only which
        resources it asks, and the run's contested resources, one for the run."""
        if self.taken:
            raise ValueError("shared asked of a budget that has taken units already")
        key = (self.leaf, id(anchor))
        found = self._shared.derived.get(key)
        if found is None or found[0] is not anchor:
            found = self._shared.derived[key] = (anchor, build())
        return cast(T, found[1])

    def most_taken(self, leaf: str) -> dict[str, float]:
        """`Budget.most_taken`: what `_may_lose` of the leaf and of each queue on its
        side, with nothing taken, accepts of one resource at most (a take accepted
        takes from the leaf's side at least what it takes from the leaf, and each
        test only refuses more as an amount grows, so the leaf's amount of each
        resource, alone, passes them all). The fair-share floor bounds a contested
        resource by what the queue holds above its share; the quota guarantee
        refuses any amount when no resource with a quota is over it, else bounds
        each one over by what is held above the quota. EPSILON over, as the tests
        allow."""
        if self.taken:
            raise ValueError("most_taken asked of a budget that has taken units already")
        side, _ = self._victim_side(leaf)
        caps: dict[str, float] = {}

        def bound(resource: str, amount: float) -> None:
            caps[resource] = min(caps.get(resource, amount), amount)

        for queue in side:
            held, share = self.ledger.held(queue), self._share(queue)
            for r in self._contested_for.get(queue, ()):
                bound(r, (held[r] - share[r] if held[r] > share[r] + EPSILON else 0.0) + EPSILON)
            quotas = {r: quota_of(self.ledger.tree, queue, r) for r in self.asked}
            guaranteed = [r for r in self.asked if quotas[r] > EPSILON]
            over = [r for r in guaranteed if held[r] > quotas[r] + EPSILON]
            if guaranteed and not over:
                for r in self.asked:
                    bound(r, EPSILON)
            for r in over:
                bound(r, held[r] - quotas[r] + EPSILON)
        return caps

    def refuses_every(self, units: Sequence[VictimUnit]) -> bool:
        """Nothing taken yet, and every unit refused on its own: then every set of
        them is refused, and nothing is ever taken. Exact: with nothing taken,
        `_may_lose` only refuses more as the amount grows (each of its tests bounds
        the amount, or what is left once it is gone, from one side), and a set
        takes from each queue at least what any one of its units takes (requests
        are never negative); so the first `take` is refused, nothing is counted as
        taken, and every later one is refused alike. Judged per victim leaf on the
        least any of its units asks in each resource (a bound from below); unit
        by unit only where that bound does not settle it."""
        if self.taken:
            return False
        by_leaf: dict[str, list[VictimUnit]] = {}
        for unit in units:
            by_leaf.setdefault(unit.queue, []).append(unit)
        return all(self._refuses_each(leaf, found) for leaf, found in by_leaf.items())

    def _refuses_each(self, leaf: str, units: Sequence[VictimUnit]) -> bool:
        """Each of the leaf's units refused on its own, with nothing taken."""
        least = {r: min(unit.requests[r] for unit in units) for r in self.asked}
        if not self._may_lose_alone(leaf, least):
            return True
        return all(not self._may_lose_alone(leaf, unit.requests) for unit in units)

    def _may_lose_alone(self, leaf: str, requests: Mapping[str, float]) -> bool:
        """What `take` judges of one unit of the leaf asking `requests`."""
        side, _ = self._victim_side(leaf)
        amounts = {r: 0.0 + requests[r] for r in self.asked}
        return all(self._may_lose(q, amounts) for q in side)

    def _victim_side(self, victim_leaf: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The victim's queues judged against this reclaimer (below their common
        ancestor), and the resources contested where the two paths meet among
        those the job asks for."""
        if victim_leaf not in self._below:
            lca = lowest_common_ancestor(self.ledger, self.leaf, victim_leaf)
            contested = self.contested.at(lca)
            judged = tuple(r for r in self.asked if r in contested)
            self._below[victim_leaf] = (below(self.ledger, victim_leaf, lca), judged)
            for queue in self._below[victim_leaf][0]:
                self._contested_for[queue] = judged
        return self._below[victim_leaf]

    def _may_lose(self, queue: str, amounts: Mapping[str, float]) -> bool:
        """The fair-share floor in contested resources, and the quota guarantee."""
        held, share = self.ledger.held(queue), self._share(queue)
        taken = self.taken.get(queue, {})
        left = {r: held[r] - taken.get(r, 0.0) for r in amounts}
        within_share = all(
            amounts[r] <= EPSILON
            or (held[r] > share[r] + EPSILON and left[r] - amounts[r] >= share[r] - EPSILON)
            for r in self._contested_for.get(queue, ())
        )
        return within_share and self._keeps_quota(queue, amounts, left)

    def _keeps_quota(
        self, queue: str, amounts: Mapping[str, float], left: Mapping[str, float]
    ) -> bool:
        """A queue holding no more than its quota (in every resource the job asks for
        that it has a quota of) loses nothing; one over quota loses, in each such
        resource it is over in, at most what it holds above the quota. A queue with no
        quota of any of them has no guarantee here (the fair-share floor still holds).
        Whether the resource is contested or not: room the job needs in one rack or
        on one device may be short while the cluster has plenty."""
        if all(amounts[r] <= EPSILON for r in amounts):
            return True
        quotas = {r: quota_of(self.ledger.tree, queue, r) for r in amounts}
        guaranteed = [r for r in amounts if quotas[r] > EPSILON]
        over = [r for r in guaranteed if left[r] > quotas[r] + EPSILON]
        if guaranteed and not over:
            return False
        return all(left[r] - amounts[r] >= quotas[r] - EPSILON for r in over)

    def _share(self, queue: str) -> Resources:
        return self.ledger.fair_share.get(queue, NO_RESOURCES)


# ------------------------------------------------- simulate and roll back


# ------------------------------------------------------------------- action


class ReclaimAction:
    name = "reclaim"
    which: RuntimeField = "reclaimMinRuntime"

    def run(self, ctx: CycleContext) -> None:
        if not anyone_within_share(ctx):
            return  # every attempt would stop at its first test, changing nothing
        waiting = waiting_jobs(ctx.transaction)
        if waiting.empty():
            return  # no job to reclaim for: skip summing every live pod
        demand = live_demand(ctx.transaction.memo, ctx.snapshot)
        contested = contested_resources(demand, ctx.capacity, ctx.ledger)
        answers: AloneAnswers = {}
        attempt = functools.partial(self.attempt, ctx, contested, answers)
        attempt_in_turn(ctx, waiting, attempt, queues_within_share)

    def attempt(
        self,
        ctx: CycleContext,
        contested: Contested,
        answers: AloneAnswers,
        candidate: Candidate,
        speculative: bool,
    ) -> bool:
        """Make room for the candidate (`eviction.Attempt`): whether victims were found."""
        group = candidate.group

        def new_budget() -> FairShareBudget:
            return FairShareBudget(ctx.ledger, contested, group.queue, candidate.request, answers)

        budget = new_budget()
        if not budget.reclaimer_within_share():
            return False  # no queue may be reclaimed from (and no runtime protection was met)
        protection = Protection(ctx.snapshot.queues, self.which, ctx.now)
        may_take = functools.cache(budget.reclaimer_may_take_from)
        units = running_units(ctx, may_take, protection)
        if admission_refusal(ctx, candidate, units):
            return False  # refused even were every possible victim gone
        admits = lambda victims: admission_refusal(ctx, candidate, victims) is None  # noqa: E731
        with ctx.transaction.attempt() as step:
            victims = evict_to_fit(ctx, placeable(ctx, group), units, new_budget, admits)
            if victims is None:
                ask_to_wake(ctx, protection)
                return False
            if not speculative and book(ctx, step) is None:
                record(ctx, candidate, victims, self.name)
            return True
