"""The plan: what one scheduling cycle decided, as intents for someone else to apply.

The cycle never talks to a cluster. It returns a `Plan`; the binder (in a
cluster, or over the simulator's cluster in memory) applies it. A plan says
only what a cluster can do:
- `Bind`: a pod that exists, pending, onto a node;
- `Evict`: a bound pod, saying why;
- `Nominate`: where a group's pod evicted to be moved should go once its
  controller has made it again (the replacement has a new name, and a pod's
  `nodeName` cannot change, so it cannot be bound in the same plan); kept on
  the PodGroup's status, honoured by the next cycle;
- `GroupStatus`: what each group's status should say, one per group (the last
  one an action states wins).
Every intent carries what is needed to apply it idempotently: binding a pod
that is already bound to the same node is a no-op. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kai_ray.state.dra_allocate import ClaimAllocation


@dataclass(frozen=True)
class Bind:
    """Bind one pod to one node, on these GPU devices (empty for non-GPU pods)."""

    pod: str  # namespace/name
    group: str  # namespace/name of its PodGroup
    node: str
    gpu_devices: tuple[int, ...] = ()
    #: For a GPU-sharing pod: the fraction of its one device it takes.
    gpu_fraction: float = 0.0
    #: The pod's DRA claims with their devices, written before the bind (docs/dra.md).
    claims: tuple[ClaimAllocation, ...] = ()


@dataclass(frozen=True)
class Evict:
    """Evict one pod, saying why (reclaim, preempt, consolidation, stale-gang)."""

    pod: str
    group: str
    reason: str
    #: The queue the room was made for (reclaim, preempt: the waiting job's queue);
    #: None when no queue gains (consolidation moves the pod, stale-gang frees it).
    for_queue: str | None = None
    #: Reclaim: what the pod's queue keeps once the step's victims are gone, as the
    #: cycle counted it ("team-a keeps nvidia.com/gpu 160 (quota 160, fair share
    #: 150)"): why it could be taken from, in the pod's condition and Event.
    standing: str = ""


@dataclass(frozen=True)
class Nominate:
    """Where one pod of `group`, evicted to be moved, should go when it is made again."""

    group: str
    node: str
    gpu_devices: tuple[int, ...] = ()
    gpu_fraction: float = 0.0
    #: The evicted pod it stands for (its replacement has another name).
    pod: str = ""


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
    #: Nodes for the group's recreated pods (`PodGroupStatus.nominatedNodes`), one
    #: per pod; () clears them; None: this status says nothing about nominations.
    nominated: tuple[str, ...] | None = None


class GroupStatuses:
    """Each group's status after the cycle, keyed by group: stating a group again
    replaces what was said of it before (last write wins), except that a status
    saying nothing of staleness or nominations (None) keeps what was said of them.
    Iterating gives the statuses, in the order their groups were first stated."""

    def __init__(self) -> None:
        self._by_group: dict[str, GroupStatus] = {}

    def state(self, status: GroupStatus) -> None:
        before = self._by_group.get(status.group)
        if before is not None:
            status = dataclasses.replace(
                status,
                staleness=before.staleness if status.staleness is None else status.staleness,
                nominated=before.nominated if status.nominated is None else status.nominated,
            )
        self._by_group[status.group] = status

    def state_all(self, statuses: Iterable[GroupStatus]) -> None:
        """`state` each of `statuses` in order; a group not stated before is set at
        once (nothing said of it to keep), without a call each (a backlog's thousands
        of waiting statuses)."""
        by_group, state = self._by_group, self.state
        for status in statuses:
            if status.group in by_group:
                state(status)
            else:
                by_group[status.group] = status

    def get(self, group: str) -> GroupStatus | None:
        return self._by_group.get(group)

    def __getitem__(self, group: str) -> GroupStatus:
        return self._by_group[group]

    def __contains__(self, group: object) -> bool:
        return group in self._by_group

    def __iter__(self) -> Iterator[GroupStatus]:
        return iter(self._by_group.values())

    def __len__(self) -> int:
        return len(self._by_group)


@dataclass
class Plan:
    cycle: int
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    nominations: list[Nominate] = field(default_factory=list)
    statuses: GroupStatuses = field(default_factory=GroupStatuses)
    #: Run again at this time even if nothing changes (a grace period or min runtime ends).
    wake_at: float | None = None

    def wake_no_later_than(self, t: float) -> None:
        """Ask for a cycle at `t` at the latest (timers of several actions combine)."""
        self.wake_at = t if self.wake_at is None else min(self.wake_at, t)

    def status_of(self, group: str) -> GroupStatus | None:
        """What the plan last stated of the group."""
        return self.statuses.get(group)
