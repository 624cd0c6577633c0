"""The scheduling cycle: snapshot in, plan out, and the actions it runs.

`run_cycle` computes what every queue holds and deserves, then runs the
configured actions in order over one transaction; each adds intents to the
plan. Actions are small `Action` protocols in one registry that refuses
duplicate names; `builtin_actions` lists every built-in. `spec.actions` names
them, in the order they run: an unknown name, or one listed twice, is an
error; a planned action that is not built yet (one of the default list with
nothing registered under its name) is skipped with a note in the plan. Each
action works on `ctx.transaction` as the actions before it left it. The cycle
knows nothing of kopf or of the simulator. Pure: no I/O beyond log lines, each
tagged with the cycle id.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kai_ray.decisions.admission import TypedKey, is_preemptible, typed_gpus, typed_keys
from kai_ray.decisions.allocate import AllocateAction
from kai_ray.decisions.consolidate import ConsolidateAction
from kai_ray.decisions.fairness import fair_shares
from kai_ray.decisions.ordering import QueueLedger, group_priority
from kai_ray.decisions.plan import Plan
from kai_ray.decisions.preempt import PreemptAction
from kai_ray.decisions.reclaim import ReclaimAction
from kai_ray.decisions.stale import StaleGangEvictionAction
from kai_ray.decisions.transaction import Transaction
from kai_ray.decisions.usage import UsageState, advance_usage, usage_from_queues
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import DEFAULT_ACTIONS, SchedulerConfig, SchedulerConfigSpec
from kai_ray.values.config import duration_seconds as seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.resources import GPU, Resources, add_into

LOG = logging.getLogger("kai_ray.cycle")


class CycleLog(logging.LoggerAdapter[logging.Logger]):
    """Prefixes every line with the cycle id, and carries it as `extra["cycle"]`."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = self.extra or {}
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        return f"[cycle {extra.get('cycle')}] {msg}", kwargs


@dataclass
class CycleContext:
    """What one cycle's actions share: the inputs, the what-if state, the plan."""

    snapshot: Snapshot
    config: SchedulerConfigSpec
    fair_shares: Mapping[str, Resources]
    ledger: QueueLedger
    transaction: Transaction
    plan: Plan
    log: CycleLog
    now: float
    #: What the queues share: schedulable nodes less other schedulers' pods.
    capacity: Resources


class Action(Protocol):
    """One step of the cycle (allocate, reclaim, ...): adds intents to `ctx.plan`."""

    @property
    def name(self) -> str: ...

    def run(self, ctx: CycleContext) -> None: ...


class ActionRegistry:
    """Actions by name; registering a name twice is a programming error."""

    def __init__(self) -> None:
        self._actions: dict[str, Action] = {}

    def register(self, action: Action) -> None:
        if action.name in self._actions:
            raise ValueError(f"action {action.name!r} is registered twice")
        self._actions[action.name] = action

    def get(self, name: str) -> Action | None:
        return self._actions.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(self._actions)


def builtin_actions() -> ActionRegistry:
    """Every built-in action, in one place."""
    registry = ActionRegistry()
    registry.register(AllocateAction())
    registry.register(ConsolidateAction())
    registry.register(ReclaimAction())
    registry.register(PreemptAction())
    registry.register(StaleGangEvictionAction())
    return registry


def resolve_actions(
    config: SchedulerConfig, registry: ActionRegistry
) -> tuple[list[Action], list[str]]:
    """The configured actions in order, and a note for each planned one not built yet.
    An unknown name raises `InvalidObjectError` naming `spec.actions`."""
    actions: list[Action] = []
    notes: list[str] = []
    for index, name in enumerate(config.spec.actions):
        action = registry.get(name)
        if name in config.spec.actions[:index]:
            raise InvalidObjectError([_action_problem(config, f"action {name!r} is listed twice")])
        if action is not None:
            actions.append(action)
        elif name in DEFAULT_ACTIONS:
            notes.append(f"action {name!r} is not built yet; skipped")
        else:
            known = ", ".join(DEFAULT_ACTIONS)
            message = f"unknown action {name!r} (known: {known})"
            raise InvalidObjectError([_action_problem(config, message)])
    return actions, notes


def _action_problem(config: SchedulerConfig, message: str) -> Problem:
    return Problem(ObjectRef("SchedulerConfig", config.metadata.name), "spec.actions", message)


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    fair_shares: Mapping[str, Resources]
    #: Usage after this cycle; hand it back to the next cycle (and persist its queues).
    usage: UsageState = field(default_factory=UsageState)


def leaf_requests(snapshot: Snapshot) -> dict[str, Resources]:
    """What each leaf queue's live pods ask for, bound or pending."""
    # Each group's sum (kept with its state), summed into plain dicts per queue.
    totals: dict[str, dict[str, float]] = {}
    for group in snapshot.pod_groups.values():
        if group.live:
            add_into(totals.setdefault(group.queue, {}), group.live_requests)
    return {queue: Resources.from_canonical(amounts) for queue, amounts in totals.items()}


def cluster_capacity(snapshot: Snapshot, scheduler_name: str) -> Resources:
    """Allocatable on schedulable nodes, less what other schedulers' pods hold there."""
    usable = snapshot.allocatable[snapshot.schedulable].sum(axis=0)
    total = Resources(dict(zip(snapshot.resource_names, usable.tolist(), strict=True)))
    for pod in snapshot.pods.values():
        node = snapshot.node_index.get(pod.node or "")
        foreign = pod.scheduler != scheduler_name and not pod.terminal
        if foreign and node is not None and snapshot.schedulable[node]:
            total = total - pod.effective_requests
    return total


#: The empty vector, shared (vectors are immutable).
NOTHING = Resources()


def held_ledger(snapshot: Snapshot, shares: Mapping[str, Resources]) -> QueueLedger:
    """What every queue holds at the start of the cycle (bound live pods), GPUs
    of the types its queues limit included."""
    ledger = QueueLedger(snapshot.queues, shares)
    sums = _HeldSums()
    keys_of: dict[str, tuple[TypedKey, ...]] = {}
    # Groups without typed limits above their queue and with every pod on a known
    # node are summed per leaf first (from each group's own sum), then rolled up.
    per_leaf: dict[tuple[str, bool], dict[str, float]] = {}
    for group in snapshot.pod_groups.values():
        preemptible = is_preemptible(group, group_priority(group))
        keys = keys_of.get(group.queue)
        if keys is None:
            keys = keys_of[group.queue] = typed_keys(snapshot.queues, group.queue)
        if not keys and all(pod.node in snapshot.node_index for pod in group.bound):
            if group.bound:
                add_into(per_leaf.setdefault((group.queue, preemptible), {}), group.bound_requests)
            continue
        path = ledger.path(group.queue)
        for requests, labels in _bound_requests(snapshot, group):
            # No typed limit above the queue: the typed tally is empty for every pod.
            typed = typed_gpus(keys, [(labels, requests[GPU])]) if keys else NOTHING
            sums.add(path, requests, typed, preemptible)
    for (leaf, preemptible), amounts in per_leaf.items():
        sums.add(ledger.path(leaf), Resources.from_canonical(amounts), NOTHING, preemptible)
    sums.fill(ledger)
    return ledger


def _bound_requests(
    snapshot: Snapshot, group: PodGroupState
) -> Iterator[tuple[Resources, Mapping[str, str]]]:
    """What each live pod of the group bound to a known node asks, with that node's labels."""
    for pod in group.live_pods():
        node = snapshot.node_index.get(pod.node or "")
        if node is not None:
            yield pod.effective_requests, snapshot.labels[node]


@dataclass
class _HeldSums:
    """The ledger's three tallies as plain dicts, made into vectors once, in `fill`."""

    allocated: dict[str, dict[str, float]] = field(default_factory=dict)
    non_preemptible: dict[str, dict[str, float]] = field(default_factory=dict)
    typed: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(
        self, path: tuple[str, ...], requests: Resources, typed: Resources, preemptible: bool
    ) -> None:
        for name in path:
            add_into(self.allocated.setdefault(name, {}), requests)
            if not preemptible:
                add_into(self.non_preemptible.setdefault(name, {}), requests)
        for name in path:
            add_into(self.typed.setdefault(name, {}), typed)

    def fill(self, ledger: QueueLedger) -> None:
        ledger.allocated = _vectors(self.allocated)
        ledger.non_preemptible = _vectors(self.non_preemptible)
        ledger.typed = _vectors(self.typed)


def _vectors(sums: dict[str, dict[str, float]]) -> dict[str, Resources]:
    return {name: Resources.from_canonical(amounts) for name, amounts in sums.items()}


def usage_until(
    snapshot: Snapshot,
    spec: SchedulerConfigSpec,
    previous: UsageState | None,
    now: float,
    capacity: Resources | None = None,
) -> UsageState:
    """Usage brought up to `now`: the interval since the last cycle integrated at
    the rate the queues held since then (nothing to integrate after a restart).
    `capacity` is `cluster_capacity` when the caller has it already."""
    state = previous or usage_from_queues(
        {name: node.usage for name, node in snapshot.queues.nodes.items()}
    )
    elapsed = 0.0 if state.updated_s is None else now - state.updated_s
    if capacity is None:
        capacity = cluster_capacity(snapshot, spec.schedulerName)
    half_life = seconds(spec.timeBasedFairness.halfLife)
    advanced = advance_usage(state, state.allocated, capacity, elapsed, half_life)
    return dataclasses.replace(advanced, updated_s=now)


def run_cycle(
    snapshot: Snapshot,
    config: SchedulerConfig,
    cycle: int,
    now: float,
    usage: UsageState | None = None,
    registry: ActionRegistry | None = None,
) -> CycleResult:
    """One cycle. `usage` is the previous cycle's `CycleResult.usage` (None after a
    restart: the usage persisted on the queues is used and the interval restarts)."""
    log = CycleLog(LOG, {"cycle": cycle})
    actions, notes = resolve_actions(config, registry or builtin_actions())
    spec = config.spec
    # 1. Usage up to now, then fair shares per resource, top-down.
    capacity = cluster_capacity(snapshot, spec.schedulerName)
    usage = usage_until(snapshot, spec, usage, now, capacity)
    k = spec.timeBasedFairness.k
    shares = fair_shares(snapshot.queues, leaf_requests(snapshot), capacity, k, usage.queues)
    # 2. What every queue holds now; the actions grow it as they place jobs.
    ledger = held_ledger(snapshot, shares)
    plan = Plan(cycle=cycle, notes=notes)
    tx = Transaction(snapshot)
    ctx = CycleContext(snapshot, spec, shares, ledger, tx, plan, log, now, capacity)
    # 3. The actions, in the configured order, least disruptive first.
    for action in actions:
        action.run(ctx)
    # 4. The plan holds what the transaction committed; until the next cycle the
    #    queues hold what this one left them, which is the rate usage grows at.
    plan.binds.extend(ctx.transaction.binds())
    log.debug("%d binds, %d statuses", len(plan.binds), len(plan.statuses))
    return CycleResult(plan, shares, dataclasses.replace(usage, allocated=dict(ledger.allocated)))
