"""The stale-gang eviction action: a running gang left below its minimum goes, whole.

A gang is *stale* when some of its pods still hold resources but fewer than its
minimum do: fewer than `minMember` in all, or a subgroup below its own
`minMember` (at the top, fewer subgroups at their minimum than `minSubGroup`,
all of them when unset). Holding means bound and not finished, or placed earlier
in this cycle (a gang that allocate made whole again is not stale), and not
evicted earlier in this cycle. A gang with a Succeeded pod is finishing, not stale.

Since when: the PodGroup's `Stale` condition (status True, its
`lastTransitionTime`); the first cycle that sees the gang stale starts the clock
at `now`. Each cycle re-states it in the plan (`GroupStatus.staleness`) for the
binder or the simulator to keep on the PodGroup. Once the grace period
(`spec.staleGracePeriod`, else `SchedulerConfig.staleGangGracePeriod`, 60 s by
default) has passed, every pod it still holds is evicted (reason "stale-gang");
until then the plan asks for a cycle when the grace ends. A gang back at its
minimum gets the condition turned False, so a later drop starts a new grace.

Condition times are RFC 3339 renderings of the cycle clock's seconds read as
Unix time (what the wall clock gives). Meant to run last: it frees nothing in
the cycle's transaction. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kai_ray.decisions.context import CycleContext
from kai_ray.decisions.plan import Evict, GroupStatus, Staleness
from kai_ray.decisions.totals import Tally, kept_members
from kai_ray.decisions.transaction import MemoKey
from kai_ray.state.groups import PodGroupState
from kai_ray.state.pod_states import PodState
from kai_ray.values.api import PodGroupSpec, SubGroup
from kai_ray.values.clock import rfc3339, unix_seconds
from kai_ray.values.config import SchedulerConfigSpec, duration_seconds

STALE_CONDITION = "Stale"
STALE_GANG = "stale-gang"


class StaleGangEvictionAction:
    name = "stale-gang-eviction"

    def run(self, ctx: CycleContext) -> None:
        evicted = {evict.pod for evict in ctx.plan.evictions}
        # Groups no action touched this cycle hold what the snapshot says they hold.
        touched = {e.group for e in ctx.plan.evictions}
        touched.update(p.bind.group for p in ctx.transaction.placed.values())
        groups, memo = ctx.snapshot.pod_groups, ctx.transaction.memo
        # Groups neither touched nor unsettled (`_settled`, which a tally follows) are
        # passed over: the rest are looked at, in the snapshot's order.
        unsettled = kept_members(memo, UNSETTLED, groups, _unsettled)
        if not touched and not unsettled:
            return
        wanted = touched.union(unsettled)
        for key in filter(wanted.__contains__, groups):
            group = groups[key]
            if any(pod.scheduler != ctx.config.schedulerName for pod in group.pods):
                continue  # another scheduler's pods are not ours to evict
            if group.key in touched:
                holding = holding_pods(ctx, group, evicted)
            else:
                holding = list(group.bound)
            if is_stale(group, holding):
                _judge_stale(ctx, group, holding)
            elif stale_since(group) is not None:
                back = GroupStatus(group.key, True, staleness=Staleness(None))
                ctx.plan.statuses.state(back)


#: Per cycle, or kept: the groups `_settled` does not pass over.
UNSETTLED = MemoKey[Tally[bool]]("groups the stale-gang glance looks at")


def _unsettled(group: PodGroupState) -> bool | None:
    return None if _settled(group) else True


def _settled(group: PodGroupState) -> bool:
    """Cheaply seen to be neither stale nor marked stale as the snapshot holds it:
    nothing bound, or a plain gang with its minimum bound (the usual groups, which
    the full test would pass over at a higher cost)."""
    bound = group.bound
    if bound and (group.spec.subGroups or len(bound) < group.spec.minMember):
        return False
    status = group.status
    return status is None or not status.conditions or stale_since(group) is None


def _judge_stale(ctx: CycleContext, group: PodGroupState, holding: Sequence[PodState]) -> None:
    """Evict the gang once its grace is over; until then keep the clock and ask for a cycle."""
    since = stale_since(group)
    since = ctx.now if since is None else since
    deadline = since + grace_seconds(group.spec, ctx.config)
    if ctx.now < deadline:
        ctx.plan.statuses.state(GroupStatus(group.key, True, staleness=Staleness(since)))
        ctx.plan.wake_no_later_than(deadline)
        return
    bound = {pod.key for pod in group.bound}
    evicted = (pod for pod in holding if pod.key in bound)
    ctx.plan.evictions.extend(Evict(pod.key, group.key, STALE_GANG) for pod in evicted)
    reason = (
        f"stale gang: {len(holding)} pods held for longer than the grace period "
        f"while {group.spec.minMember} are needed; evicted"
    )
    ctx.plan.statuses.state(GroupStatus(group.key, False, reason, Staleness(None)))
    ctx.log.info("%s evicted: stale since %.0fs", group.key, since)


def holding_pods(
    ctx: CycleContext, group: PodGroupState, evicted: Collection[str]
) -> list[PodState]:
    """The group's pods that hold resources after the actions before this one (a pod
    evicted and placed again, as consolidation moves it, holds; one being deleted
    does not: it is going already)."""
    placed, bound = ctx.transaction.placed, {pod.key for pod in group.bound}
    return [
        pod
        for pod in group.live_pods()
        if pod.key in placed or (pod.key in bound and pod.key not in evicted and not pod.releasing)
    ]


def is_stale(group: PodGroupState, holding: Sequence[PodState]) -> bool:
    """Some pods hold, fewer than the minimum do, and none has finished."""
    if not holding or any(pod.phase == "Succeeded" for pod in group.pods):
        return False
    return not minimum_holds(group.spec, holding)


def minimum_holds(spec: PodGroupSpec, holding: Sequence[PodState]) -> bool:
    """`minMember` in all, and the subgroup tree at its minimum (as placement reads it)."""
    if len(holding) < spec.minMember:
        return False
    top = [sub for sub in spec.subGroups if sub.parent is None]
    needed = len(top) if spec.minSubGroup is None else spec.minSubGroup
    return sum(_subgroup_holds(spec, sub, holding) for sub in top) >= needed


def _subgroup_holds(spec: PodGroupSpec, sub: SubGroup, holding: Sequence[PodState]) -> bool:
    own = sum(1 for pod in holding if pod.subgroup == sub.name)
    children = [child for child in spec.subGroups if child.parent == sub.name]
    return own >= sub.minMember and all(_subgroup_holds(spec, c, holding) for c in children)


def stale_since(group: PodGroupState) -> float | None:
    """When the gang was first seen stale, from its `Stale` condition; None if it is not."""
    conditions = group.status.conditions if group.status is not None else []
    for condition in conditions:
        if condition.type == STALE_CONDITION and condition.status == "True":
            return unix_seconds(condition.lastTransitionTime)
    return None


def grace_seconds(spec: PodGroupSpec, config: SchedulerConfigSpec) -> float:
    return duration_seconds(spec.staleGracePeriod or config.staleGangGracePeriod)


def stale_condition(staleness: Staleness, now: float) -> dict[str, str]:
    """The `Stale` condition a PodGroup should carry (True: its time is when it went stale)."""
    if staleness.since is None:
        return {
            "type": STALE_CONDITION,
            "status": "False",
            "reason": "NotStale",
            "message": "",
            "lastTransitionTime": rfc3339(now),
        }
    return {
        "type": STALE_CONDITION,
        "status": "True",
        "reason": "BelowMinMember",
        "message": "fewer pods run than the gang's minimum; evicted when the grace period ends",
        "lastTransitionTime": rfc3339(staleness.since),
    }
