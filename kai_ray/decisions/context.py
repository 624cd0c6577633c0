"""What one cycle's actions share, and the one protocol every action follows.

`CycleContext` holds a cycle's inputs (snapshot, config, fair shares), its
what-if state (the queue ledger and the transaction) and its output (the
plan). An `Action` is one step of the cycle that adds intents to the plan;
`ActionRegistry` lists actions by name and refuses a name twice. Which
actions are built in, and the order they run in, is `cycle.py`'s business.
Pure: no I/O beyond log lines, each tagged with the cycle id.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from kai_ray.decisions.ledger import QueueLedger
from kai_ray.decisions.plan import GroupStatus, Plan
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfigSpec
from kai_ray.values.resources import Resources

#: Pods placed before a cycle may stop on its budget.
HAND_OVER_AT = 64


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
    #: The caller's placement budget (the operator's; None: no budget, as in the
    #: simulator): True once the cycle should hand over what it has placed.
    time_up: Callable[[], bool] | None = None
    #: Set by an action that stopped on `time_up`: the cycle ends after it, and
    #: the groups it did not try keep what they were last told.
    cut_short: bool = False

    def hand_over_now(self) -> bool:
        """Whether to stop placing and hand the binds made so far to the binder:
        the budget is spent and at least `HAND_OVER_AT` pods were placed (a cycle
        that places little never stops early, so reclaim and the rest still run
        behind a backlog that does not fit)."""
        if self.time_up is None or len(self.transaction.placed) < HAND_OVER_AT:
            return False
        if self.time_up():
            self.cut_short = True
        return self.cut_short


def admitted(group: PodGroupState) -> GroupStatus:
    """A group's status once its minimum is placed: admitted, and the nodes it was
    nominated (if any) used, so cleared."""
    nominated = group.status is not None and bool(group.status.nominatedNodes)
    return GroupStatus(group.key, True, nominated=() if nominated else None)


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
