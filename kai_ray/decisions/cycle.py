"""The scheduling cycle: snapshot in, plan out, and the actions it runs.

`run_cycle` only orchestrates: it computes what every queue holds and
deserves, then runs the configured actions in order over one transaction;
each adds intents to the plan. `builtin_actions` lists every built-in action
in one registry (`context.ActionRegistry`, which refuses duplicate names).
`spec.actions` names them, in the order they run: an unknown name, or one
listed twice, is an error. Each action works on `ctx.transaction` as the
actions before it left it. The cycle knows nothing of kopf or of the
simulator. Pure: no I/O beyond log lines, each tagged with the cycle id.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kai_ray.decisions.allocate import AllocateAction
from kai_ray.decisions.booking import held_ledger
from kai_ray.decisions.consolidate import ConsolidateAction
from kai_ray.decisions.context import Action, ActionRegistry, CycleContext, CycleLog
from kai_ray.decisions.eviction import VICTIM_OPTIONS, release_terminating
from kai_ray.decisions.fairness import OverCommitment, over_committed
from kai_ray.decisions.kept import PER_GROUP
from kai_ray.decisions.ordering import waiting_gangs
from kai_ray.decisions.placement.inter_pod import WITH_TERMS
from kai_ray.decisions.placement.mix import CLASS_COUNTS
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES
from kai_ray.decisions.plan import Plan
from kai_ray.decisions.preempt import PreemptAction
from kai_ray.decisions.reclaim import ReclaimAction
from kai_ray.decisions.stale import StaleGangEvictionAction
from kai_ray.decisions.totals import (
    LIVE_DEMAND,
    PER_WAITING,
    TALLIES,
    GroupTotals,
    cluster_capacity,
    leaf_requests,
)
from kai_ray.decisions.transaction import Transaction
from kai_ray.decisions.usage import UsageState, drift_wake, occupying, usage_until
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.resources import Resources

LOG = logging.getLogger("kai_ray.cycle")


def builtin_actions() -> ActionRegistry:
    """Every built-in action, in one place."""
    registry = ActionRegistry()
    registry.register(AllocateAction())
    registry.register(ConsolidateAction())
    registry.register(ReclaimAction())
    registry.register(PreemptAction())
    registry.register(StaleGangEvictionAction())
    return registry


def resolve_actions(config: SchedulerConfig, registry: ActionRegistry) -> list[Action]:
    """The configured actions in order. A name the registry does not hold, or one
    listed twice, raises `InvalidObjectError` naming `spec.actions`."""
    actions: list[Action] = []
    for index, name in enumerate(config.spec.actions):
        action = registry.get(name)
        if name in config.spec.actions[:index]:
            raise InvalidObjectError([_action_problem(config, f"action {name!r} is listed twice")])
        if action is None:
            known = ", ".join(registry.names())
            message = f"unknown action {name!r} (known: {known})"
            raise InvalidObjectError([_action_problem(config, message)])
        actions.append(action)
    return actions


def _action_problem(config: SchedulerConfig, message: str) -> Problem:
    return Problem(ObjectRef("SchedulerConfig", config.metadata.name), "spec.actions", message)


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    fair_shares: Mapping[str, Resources]
    #: Usage after this cycle; hand it back to the next cycle (and persist its queues).
    usage: UsageState = field(default_factory=UsageState)
    #: Sibling queues whose quotas add up to more than they share (a warning).
    over_committed: tuple[OverCommitment, ...] = ()
    #: What each leaf queue's live pods asked for (the fair shares' demand); None
    #: when the result was not made by `run_cycle`.
    leaf_requests: Mapping[str, Resources] | None = None
    #: The placement budget ended the cycle early: groups the plan says nothing of
    #: were not tried (their statuses stand), and the next cycle should start now.
    cut_short: bool = False


def run_cycle(
    snapshot: Snapshot,
    config: SchedulerConfig,
    cycle: int,
    now: float,
    usage: UsageState | None = None,
    registry: ActionRegistry | None = None,
    totals: GroupTotals | None = None,
    time_up: Callable[[], bool] | None = None,
) -> CycleResult:
    """One cycle. `usage` is the previous cycle's `CycleResult.usage` (None after a
    restart: the usage persisted on the queues is used and the interval restarts).
    `totals` is kept by a caller that runs cycle after cycle on snapshots of one
    cache: the sums over every group then cost what changed (`totals.GroupTotals`).
    `time_up` is a placement budget (`CycleContext.time_up`): once it says so,
    allocate stops after the job it is placing, the actions after it do not run
    (`CycleResult.cut_short`), and the caller starts the next cycle at once."""
    log = CycleLog(LOG, {"cycle": cycle})
    actions = resolve_actions(config, registry or builtin_actions())
    spec = config.spec
    # 1. Usage up to now, then fair shares per resource, top-down.
    totals = (totals or GroupTotals()).update(snapshot)
    capacity = cluster_capacity(snapshot, spec.schedulerName, totals)
    before, usage = usage, usage_until(snapshot, spec, usage, now, capacity)
    k = spec.timeBasedFairness.k
    demand = leaf_requests(snapshot, totals)
    shares = totals.shares.get(snapshot.queues, demand, capacity, k, usage.queues)
    # 2. What every queue holds now; the actions grow it as they place jobs.
    ledger = held_ledger(snapshot, shares, totals)
    opening = dict(ledger.allocated)
    plan = Plan(cycle=cycle)
    tx = Transaction(snapshot)
    tx.memo.keep(CLASS_COUNTS, None, totals.class_counts)
    tx.memo.keep(PER_GROUP, None, totals.per_group)
    tx.memo.keep(PER_WAITING, None, totals.per_waiting)
    tx.memo.keep(TALLIES, None, totals.tallies)
    tx.memo.keep(ACROSS_CYCLES, None, totals.per_node)
    tx.memo.keep(WITH_TERMS, None, totals.with_terms)
    tx.memo.keep(VICTIM_OPTIONS, None, totals.victim_options)
    tx.memo.keep(LIVE_DEMAND, None, totals.live_exact())
    ctx = CycleContext(snapshot, spec, shares, ledger, tx, plan, log, now, capacity, time_up)
    #    Pods being deleted release their room: the actions place onto it (pipelining).
    release_terminating(ctx)
    # 3. The actions, in the configured order, least disruptive first.
    for action in actions:
        action.run(ctx)
        if ctx.cut_short:
            log.debug("placement budget spent after %s", action.name)
            break
    # 4. The plan binds what the transaction committed, less the pods it evicts (a
    #    moved pod is made again under another name: its new place is nominated).
    #    The queues hold what this one left them (the ledger); until the next cycle
    #    they occupy what they held, evicted and deleting pods included, and the
    #    binds that fit beside them: the rate usage grows at (binds onto room
    #    still held wait for it and are not charged yet).
    evicted = {evict.pod for evict in plan.evictions}
    plan.binds.extend(b for b in ctx.transaction.binds() if b.pod not in evicted)
    # 5. With time-based fairness, fair shares drift while usage moves and when the
    #    window starts again: a gang still waiting may get its turn though nothing
    #    else happens, so look again then.
    occupied = occupying(snapshot, opening, plan.binds) if k > 0 else None
    held = dataclasses.replace(usage, allocated=dict(ledger.allocated), occupied=occupied)
    drift = drift_wake(spec, before, held, now)
    if drift is not None and waiting_gangs(snapshot.waiting_groups, tx):
        plan.wake_no_later_than(drift)
    log.debug("%d binds, %d statuses", len(plan.binds), len(plan.statuses))
    over = tuple(over_committed(snapshot.queues, capacity))
    return CycleResult(plan, shares, held, over, demand, ctx.cut_short)
