"""The plan: what one scheduling cycle decided, as intents for someone else to apply.

The cycle never talks to a cluster. It returns a `Plan`; the binder (in a
cluster) or the simulator (in memory) applies it. Every intent carries what
is needed to apply it idempotently: binding a pod that is already bound to the
same node is a no-op. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bind:
    """Bind one pod to one node, on these GPU devices (empty for non-GPU pods)."""

    pod: str  # namespace/name
    group: str  # namespace/name of its PodGroup
    node: str
    gpu_devices: tuple[int, ...] = ()
    #: For a GPU-sharing pod: the fraction of its one device it takes.
    gpu_fraction: float = 0.0


@dataclass(frozen=True)
class Evict:
    """Evict one pod, saying why (reclaim, preempt, consolidation, stale-gang)."""

    pod: str
    group: str
    reason: str


@dataclass(frozen=True)
class Staleness:
    """A running gang's standing against its minimum, for its `Stale` condition.

    `since` is when the gang was first seen below `minMember` (cycle clock
    seconds); None means it is at its minimum again (or was evicted), so the
    condition turns False and a later drop starts a new grace period."""

    since: float | None


@dataclass(frozen=True)
class GroupStatus:
    """What a PodGroup's status should say after this cycle."""

    group: str
    admitted: bool
    reason: str = ""
    #: Set by stale-gang eviction; None: this status says nothing about staleness.
    staleness: Staleness | None = None


@dataclass
class Plan:
    cycle: int
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    statuses: list[GroupStatus] = field(default_factory=list)
    #: Run again at this time even if nothing changes (a grace period or min runtime ends).
    wake_at: float | None = None

    def wake_no_later_than(self, t: float) -> None:
        """Ask for a cycle at `t` at the latest (timers of several actions combine)."""
        self.wake_at = t if self.wake_at is None else min(self.wake_at, t)

    def status_of(self, group: str) -> GroupStatus | None:
        for status in self.statuses:
            if status.group == group:
                return status
        return None
