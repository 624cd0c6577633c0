"""The PodGroup phase: a transition table, with the cause of every edge.

Pending waits for its queue and for room; Admitted is placed, its pods being
bound or starting; Running has its minimum running; Evicted had its gang taken
by this cycle's plan and stays so until the pods are gone; Succeeded and Failed
are finished (a workload that makes pods again brings the group back to Pending).

A phase is worked out once per cycle from the previous one and `GroupFacts`:
what the group's pods are doing and what this cycle's plan said of it. Edges
are taken until none applies (at most one visit per phase), so a group that
the plan admits right after its pods came back goes Failed -> Pending ->
Admitted in one cycle instead of lagging a cycle per step. Rows are tried in
order; the first that applies from the current phase wins. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kai_ray.values.api import Phase

PENDING, ADMITTED, RUNNING = Phase.PENDING, Phase.ADMITTED, Phase.RUNNING
SUCCEEDED, FAILED, EVICTED = Phase.SUCCEEDED, Phase.FAILED, Phase.EVICTED

#: Phases in which a workload waits for its gang to run (the Queue's `pendingWorkloads`).
WAITING_PHASES = frozenset({PENDING, ADMITTED, EVICTED})


@dataclass(frozen=True)
class GroupFacts:
    """What one cycle knows of a PodGroup. Counts are of its pods in the snapshot
    (before this cycle's plan is applied); terminal pods count only as finished."""

    min_member: int
    #: Live pods not bound to a node (created, or about to be, and waiting).
    pending: int = 0
    #: Live pods bound to a node, running ones included.
    bound: int = 0
    #: Pods in phase Running.
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    #: What this cycle's plan said: True admitted (its minimum holds or was placed),
    #: False refused (it waits, with a reason), None nothing (not looked at).
    admitted: bool | None = None
    #: This cycle's plan evicted the gang (its minimum, not only elastic extras).
    evicted: bool = False

    @property
    def needed(self) -> int:
        """How many pods make the gang (a minimum of 0 still needs one pod to run)."""
        return max(self.min_member, 1)

    @property
    def live(self) -> int:
        return self.pending + self.bound


@dataclass(frozen=True)
class Edge:
    source: Phase
    target: Phase
    applies: Callable[[GroupFacts], bool]
    #: Why the group moves, for a person (an Event's message).
    cause: str


def _finished_well(f: GroupFacts) -> bool:
    return f.live == 0 and f.succeeded >= f.needed


def _finished_badly(f: GroupFacts) -> bool:
    return f.live == 0 and f.failed > 0 and f.succeeded < f.needed


def _minimum_runs(f: GroupFacts) -> bool:
    return f.running >= f.needed


def _admitted(f: GroupFacts) -> bool:
    return f.admitted is True


def _admitted_or_bound(f: GroupFacts) -> bool:
    """Admitted by this cycle's plan, or, the plan silent, its minimum already bound
    (the status that said Admitted was overtaken by the binds, or a restart came
    between): bound pods that do not run yet are starting, not waiting."""
    return f.admitted is True or (f.admitted is None and f.bound >= f.needed)


def _refused(f: GroupFacts) -> bool:
    return f.admitted is False


def _evicted(f: GroupFacts) -> bool:
    return f.evicted


def _lost_member_readmitted(f: GroupFacts) -> bool:
    return not _minimum_runs(f) and f.admitted is True


def _lost_member_refused(f: GroupFacts) -> bool:
    """Its missing members do not fit, or every pod went (deleted, none finished: a
    RayJob's cluster torn down, say) and the plan admitted nothing in their place."""
    if _minimum_runs(f):
        return False
    return f.admitted is False or (f.live == 0 and f.admitted is not True)


def _eviction_done(f: GroupFacts) -> bool:
    return f.bound == 0 and not f.evicted and f.admitted is not True


def _pods_again(f: GroupFacts) -> bool:
    return f.live > 0


_FINISHED_WELL = "every pod has finished and at least minMember succeeded"
_FINISHED_BADLY = "every pod has finished, a pod failed and fewer than minMember succeeded"
_EVICTED = "this cycle's plan evicted the gang (reclaim, preemption, consolidation or stale gang)"
_RUNS = "at least minMember pods are running"

TRANSITIONS: tuple[Edge, ...] = (
    # ---- Pending: waiting for its queue and for room.
    Edge(PENDING, SUCCEEDED, _finished_well, _FINISHED_WELL),
    Edge(PENDING, FAILED, _finished_badly, _FINISHED_BADLY),
    Edge(PENDING, EVICTED, _evicted, _EVICTED),
    # Its pods run without an admission seen: after a restart, say.
    Edge(PENDING, RUNNING, _minimum_runs, _RUNS),
    Edge(
        PENDING,
        ADMITTED,
        _admitted_or_bound,
        "the queue took the gang and there is room for minMember (or minMember is bound)",
    ),
    # ---- Admitted: placed, its pods being bound or starting.
    Edge(ADMITTED, SUCCEEDED, _finished_well, _FINISHED_WELL),
    Edge(ADMITTED, FAILED, _finished_badly, _FINISHED_BADLY),
    Edge(ADMITTED, EVICTED, _evicted, _EVICTED),
    Edge(ADMITTED, RUNNING, _minimum_runs, _RUNS),
    # Binds failed or pods went before they ran, and the plan no longer finds room.
    Edge(ADMITTED, PENDING, _refused, "the gang no longer fits and waits again"),
    # ---- Running: its minimum runs.
    Edge(RUNNING, SUCCEEDED, _finished_well, _FINISHED_WELL),
    Edge(RUNNING, FAILED, _finished_badly, _FINISHED_BADLY),
    Edge(RUNNING, EVICTED, _evicted, _EVICTED),
    # A member went; its replacement is placed, or the stale-gang grace runs.
    Edge(
        RUNNING,
        ADMITTED,
        _lost_member_readmitted,
        "fewer than minMember pods run; the gang keeps its admission while they are replaced",
    ),
    Edge(
        RUNNING,
        PENDING,
        _lost_member_refused,
        "fewer than minMember pods run and the missing ones do not fit (or every pod is gone)",
    ),
    # ---- Evicted: its pods are being taken; it stays so until they are gone.
    Edge(EVICTED, ADMITTED, _admitted, "the evicted gang fits again and is re-admitted"),
    Edge(EVICTED, PENDING, _eviction_done, "the evicted pods are gone; the gang waits again"),
    # ---- Succeeded, Failed: finished, unless its workload makes pods again (a retry).
    Edge(SUCCEEDED, PENDING, _pods_again, "new pods joined the finished group"),
    Edge(FAILED, PENDING, _pods_again, "new pods joined the failed group (its workload retries)"),
)


def transitions(previous: Phase | None, facts: GroupFacts) -> tuple[Edge, ...]:
    """The edges taken this cycle, in order (empty: the phase stays). A group
    without a phase yet starts Pending."""
    phase = PENDING if previous is None else previous
    taken: list[Edge] = []
    visited = {phase}
    while (edge := _first_edge(phase, facts)) is not None and edge.target not in visited:
        taken.append(edge)
        phase = edge.target
        visited.add(phase)
    return tuple(taken)


def next_phase(previous: Phase | None, facts: GroupFacts) -> Phase:
    """The phase after this cycle."""
    taken = transitions(previous, facts)
    if taken:
        return taken[-1].target
    return PENDING if previous is None else previous


def _first_edge(phase: Phase, facts: GroupFacts) -> Edge | None:
    for edge in TRANSITIONS:
        if edge.source is phase and edge.applies(facts):
            return edge
    return None
