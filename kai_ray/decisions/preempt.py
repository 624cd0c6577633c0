"""The preempt action: inside one queue, higher priority evicts strictly lower priority.

1. every group whose minimum is still missing after allocate (and reclaim)
   is a candidate, taken in queue order, as allocate takes them;
2. admission may refuse it: namespace, a limit (counted with the victims
   gone, the one rule reclaim follows: `eviction.admission_refusal`),
   non-preemptible over quota;
3. its victims are running, preemptible gangs of the same leaf queue with a
   strictly lower priority, not protected by `preemptMinRuntime`; elastic
   extras go one by one before any whole gang (`victims.victim_units`);
4. victims are chosen, evicted and the job placed through the one
   transaction exactly as reclaim does (`eviction.evict_to_fit`), and booked
   on the queue as every action books (`booking.book`, per-GPU-type limits
   included); the evictions (reason `preempt`) and the job's binds go into
   the same plan.
The queue's holdings do not grow by more than the free room the job also
uses, so preemption never moves resources between queues. When no waiting
gang's queue runs a possible victim of lower priority, the action does
nothing and is skipped whole (`victims_below_anyone`). Pure: no I/O.
"""

from __future__ import annotations

import functools

from kai_ray.decisions.booking import book, placeable
from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.eviction import (
    admission_refusal,
    ask_to_wake,
    attempt_in_turn,
    evict_to_fit,
    record,
    running_units,
    victim_groups,
)
from kai_ray.decisions.ordering import Candidate, group_priority
from kai_ray.decisions.runtime import Protection, RuntimeField
from kai_ray.decisions.totals import Tally, kept_tally
from kai_ray.decisions.transaction import MemoKey
from kai_ray.decisions.victims import Budget
from kai_ray.decisions.waiting import waiting_asks, waiting_jobs
from kai_ray.state.groups import PodGroupState


class PreemptAction:
    name = "preempt"
    which: RuntimeField = "preemptMinRuntime"

    def run(self, ctx: CycleContext) -> None:
        if not victims_below_anyone(ctx):
            return  # every attempt would find no victim and change nothing
        attempt_in_turn(ctx, waiting_jobs(ctx.transaction), functools.partial(self.attempt, ctx))

    def attempt(self, ctx: CycleContext, candidate: Candidate, speculative: bool) -> bool:
        """Make room for the candidate (`eviction.Attempt`): whether victims were found."""
        queue, priority = candidate.queue, candidate.priority
        protection = Protection(ctx.snapshot.queues, self.which, ctx.now)
        units = running_units(ctx, lambda q: q == queue, protection, below=priority)
        if not units or admission_refusal(ctx, candidate, units):
            ask_to_wake(ctx, protection)
            return False
        admits = lambda victims: admission_refusal(ctx, candidate, victims) is None  # noqa: E731
        with ctx.transaction.attempt() as step:
            victims = evict_to_fit(ctx, placeable(ctx, candidate.group), units, Budget, admits)
            if victims is None:
                ask_to_wake(ctx, protection)
                return False
            if not speculative and book(ctx, step) is None:
                record(ctx, candidate, victims, self.name)
            return True


#: Per cycle, or kept: the leaf queue and priority of every group with bound pods.
RUNNING_PRIORITIES = MemoKey[Tally[tuple[str, int]]]("queue and priority of groups with bound pods")


def _running_priority(group: PodGroupState) -> tuple[str, int] | None:
    return (group.queue, group_priority(group)) if group.bound else None


def victims_below_anyone(ctx: CycleContext) -> bool:
    """Whether some waiting gang's queue runs a group that may give victims at a lower
    priority than the gang's. Without one, every attempt finds no victim unit (none
    is looked at, so no protection asks for a wake-up) and changes nothing: with a
    deep backlog of equal priorities the action is then skipped whole, the waiting
    gangs neither sorted nor picked. The waiting groups of the snapshot hold every
    gang the action could try. Every group that may give victims runs (has bound
    members), so a glance at each group's priority first spares cutting the victim
    units of every running group when none runs below a waiting gang of its queue."""
    asks = waiting_asks(ctx.transaction)
    highest: dict[str, int] = {}
    for ask in asks:
        if ask.priority > highest.get(ask.queue, ask.priority - 1):
            highest[ask.queue] = ask.priority
    if not highest:
        return False  # nothing waits (a quiet cycle): no group is looked at
    running = kept_tally(
        ctx.transaction.memo, RUNNING_PRIORITIES, ctx.snapshot.pod_groups, _running_priority
    )
    if not any(queue in highest and priority < highest[queue] for queue, priority in running):
        return False  # no running group below any: cutting victim units would find none
    lowest = victim_groups(ctx).lowest
    return any(ask.queue in lowest and lowest[ask.queue] < ask.priority for ask in asks)
