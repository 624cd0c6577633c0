"""Minimum runtimes: recently started work is safe from reclaim and preemption.

A queue's `preemptMinRuntime` / `reclaimMinRuntime` protects the gangs of its
leaf queues; a queue that does not set it inherits the nearest ancestor's
value (none set: no protection). A gang is protected while
`now < started + min_runtime`, where `started` is when its minimum started:
the latest `status.startTime` among the pods of its minimum core (the oldest
`minMember` bound pods), or their creation time where no start is recorded.
Only the core is protected: elastic extras above `minMember` may always go
(KAI's rule). When a protection is what kept a job waiting, the action asks
for a cycle at its end (`Plan.wake_no_later_than`).

Times are Unix seconds, like the cycle's `now` (the simulator's virtual clock
counts from `SIM_EPOCH_S` so that its objects' timestamps agree with `now`).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kai_ray.decisions.victims import VictimUnit
from kai_ray.state.groups import PodGroupState
from kai_ray.state.queues import QueueTree
from kai_ray.values.config import duration_seconds

RuntimeField = Literal["preemptMinRuntime", "reclaimMinRuntime"]


def inherited_min_runtime(tree: QueueTree, leaf: str, which: RuntimeField) -> float:
    """The leaf's own setting, else its nearest ancestor's; 0 when none sets it."""
    for name in (leaf, *tree.ancestors(leaf)):
        value = getattr(tree[name].spec, which)
        if value is not None:
            return duration_seconds(value)
    return 0.0


def started_at(group: PodGroupState) -> str:
    """When the gang's minimum started: the latest start among its core pods (a pod's
    `status.startTime`, else its creation time when nothing recorded a start)."""
    core = group.bound[: max(group.spec.minMember, 1)]
    return max((pod.start_time or pod.creation_timestamp for pod in core), default="")


@dataclass
class Protection:
    """Which units a min-runtime keeps safe now, and the earliest such protection's end."""

    tree: QueueTree
    which: RuntimeField
    now: float
    #: The earliest end of a protection that kept a unit out (None: none did).
    earliest_end: float | None = field(default=None)
    #: Per leaf queue: its min-runtime (`inherited_min_runtime`), read once.
    _minimums: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def protects(self, unit: VictimUnit) -> bool:
        end = self.ends_at(unit)
        if end is None or end <= self.now:
            return False
        self.earliest_end = end if self.earliest_end is None else min(self.earliest_end, end)
        return True

    def minimum_of(self, leaf: str) -> float:
        """The leaf queue's min-runtime (`inherited_min_runtime`), read once."""
        minimum = self._minimums.get(leaf)
        if minimum is None:
            minimum = self._minimums[leaf] = inherited_min_runtime(self.tree, leaf, self.which)
        return minimum

    def ends_at(self, unit: VictimUnit) -> float | None:
        """When the unit's protection ends; None for extras and unprotected queues."""
        if unit.extra:
            return None
        minimum = self.minimum_of(unit.queue)
        started = unit.started_s
        if minimum <= 0 or started is None:
            return None
        return started + minimum
