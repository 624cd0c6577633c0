"""Time-based fairness: each queue's usage over a window, decayed and normalised.

A queue's usage of a resource is the resource-time it held inside the usage
window, each past second weighted by `0.5 ** (age / half_life)` (no decay
when the half-life is 0), divided by the cluster's capacity integrated over the
same seconds with the same weights: a fraction of what the cluster could have
given, between 0 and 1. It shifts only the over-quota weights (see
`fairness._shifted_weights`); quotas and priorities are untouched.

The window (KAI's `usageParams`):
- `sliding` (the default): the last `window` seconds;
- `tumbling`: from the latest reset, resets at `tumblingWindowStartTime + n * window`;
- `cron`: from the latest time `cronString` fires.
Normalisation: `elapsed` (KAI's) divides by the capacity of the recorded part of
the window only, so a queue that has held the whole cluster since the first
cycle has usage 1 at once; `steady` also counts the capacity of the part of the
window before the first record, as if the cluster had stood idle then (usage
climbs slowly from a fresh start).

The history is a value: per queue, intervals during which it held a constant
amount (`Interval`), coalesced and at most `MAX_INTERVALS` long (the shortest
neighbours are merged at their average rate). The cycle returns it and the
caller hands it back next cycle; the operator persists it in
`Queue.status.usageHistory` so that a restart loses nothing. Allocations are
taken as constant between two cycles, which makes the integral exact. What a
queue is charged for until the next cycle is what it occupies on the nodes
(`occupying`): an evicted pod until it is gone, a bind once its room is free.
`usage_until` brings a cycle's usage up to its `now`; with `k: 0` nothing is
recorded. While usage moves, or until the window starts again, fair shares drift
without any event: `drift_wake` tells the cycle when to look again (the
simulator, like the operator, runs a cycle then).
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from croniter import croniter

from kai_ray.decisions.plan import Bind
from kai_ray.state.queues import UsageInterval as Interval
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfigSpec, TimeBasedFairness, duration_seconds
from kai_ray.values.resources import GPU, NO_RESOURCES, Resources

Amounts = Mapping[str, float]
#: Intervals kept per queue; older neighbours are merged beyond this.
MAX_INTERVALS = 64


@dataclass(frozen=True)
class UsageState:
    """Usage per queue, its history, and what the next interval needs to extend it."""

    #: queue -> resource -> usage as a fraction of the capacity (what fair shares read).
    queues: Mapping[str, Amounts] = field(default_factory=dict)
    #: queue -> its intervals inside the window, oldest first.
    history: Mapping[str, tuple[Interval, ...]] = field(default_factory=dict)
    #: queue -> what it held at the end of the last cycle (the rate until the next).
    allocated: Mapping[str, Resources] = field(default_factory=dict)
    #: Virtual or wall time of the last update; None before the first cycle.
    updated_s: float | None = None
    #: What the queues shared at the last update (the capacity until the next).
    capacity: Resources = field(default_factory=Resources)
    #: queue -> what it occupies on the nodes until the next cycle (`occupying`):
    #: pods being deleted count, binds still waiting for their room do not. None:
    #: `allocated` (what the ledger says the queue holds) is the rate.
    occupied: Mapping[str, Resources] | None = None

    @property
    def rates(self) -> Mapping[str, Resources]:
        """What each queue's usage grows at until the next update."""
        return self.allocated if self.occupied is None else self.occupied


# ----------------------------------------------------------------- the window


def window_start(params: TimeBasedFairness, now: float) -> float:
    """Where the usage window begins at `now` (epoch seconds)."""
    size = duration_seconds(params.window)
    if params.windowType == "tumbling":
        start = _epoch(params.tumblingWindowStartTime) if params.tumblingWindowStartTime else now
        if start >= now or size <= 0:
            return now if start >= now else start
        return start + math.floor((now - start) / size) * size
    if params.windowType == "cron":
        moment = datetime.fromtimestamp(now, UTC)
        previous: float = croniter(params.cronString, moment).get_prev(float)
        return previous
    return now - size


def next_reset(params: TimeBasedFairness, now: float) -> float | None:
    """When the window next starts again after `now` (a tumbling window's first
    start, when it is still ahead); None for a sliding window, which never does."""
    if params.windowType == "tumbling" and params.tumblingWindowStartTime is not None:
        start, size = _epoch(params.tumblingWindowStartTime), duration_seconds(params.window)
        if start > now or size <= 0:
            return start if start > now else None
        return start + (math.floor((now - start) / size) + 1) * size
    if params.windowType == "cron":
        moment = datetime.fromtimestamp(now, UTC)
        following: float = croniter(params.cronString, moment).get_next(float)
        return following
    return None


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _weight(start: float, end: float, now: float, half_life_s: float) -> float:
    """The decayed length of [start, end] seen from `now`."""
    if end <= start:
        return 0.0
    if half_life_s <= 0:
        return end - start
    tau = half_life_s / math.log(2)
    newest, oldest = (now - end) / half_life_s, (now - start) / half_life_s
    return tau * (math.pow(0.5, newest) - math.pow(0.5, oldest))


# ---------------------------------------------------------------- the history


def extended(history: Sequence[Interval], interval: Interval, since: float) -> tuple[Interval, ...]:
    """`history` with `interval` added (joined to the last one when they held the
    same), less what ended before `since`, at most `MAX_INTERVALS` long."""
    kept = [i for i in history if i.end_s > since]
    if interval.length > 0:
        last = kept[-1] if kept else None
        if last and last.end_s == interval.start_s and _same_rates(last, interval):
            kept[-1] = dataclasses.replace(last, end_s=interval.end_s)
        else:
            kept.append(interval)
    while len(kept) > MAX_INTERVALS:
        kept = _merge_shortest(kept)
    return tuple(kept)


def _same_rates(a: Interval, b: Interval) -> bool:
    return a.held == b.held and a.capacity == b.capacity


def _merge_shortest(history: list[Interval]) -> list[Interval]:
    """The two neighbours that together last the least, as one at their average rates."""
    at = min(range(len(history) - 1), key=lambda i: history[i].length + history[i + 1].length)
    a, b = history[at], history[at + 1]
    total = a.length + b.length
    held = a.held.scaled(a.length / total) + b.held.scaled(b.length / total)
    capacity = a.capacity.scaled(a.length / total) + b.capacity.scaled(b.length / total)
    return [*history[:at], Interval(a.start_s, b.end_s, held, capacity), *history[at + 2 :]]


#: Persisted history: whole minutes, at most this many intervals per queue.
PERSISTED_RESOLUTION_S = 60.0
MAX_PERSISTED = 64


def to_persist(history: Sequence[Interval]) -> tuple[Interval, ...]:
    """The history as a status keeps it: only whole minutes that are over, each at
    its average rates, equal neighbours joined, at most `MAX_PERSISTED` intervals
    (so a queue's status changes at most once a minute)."""
    step = PERSISTED_RESOLUTION_S
    if not history:
        return ()
    until = math.floor(history[-1].end_s / step) * step
    minutes: list[Interval] = []
    for interval in history:
        start = math.floor(interval.start_s / step) * step
        while start < min(interval.end_s, until):
            end = start + step
            part = (min(interval.end_s, end) - max(interval.start_s, start)) / step
            piece = Interval(start, end, interval.held.scaled(part), interval.capacity.scaled(part))
            minutes.append(_added(minutes, piece))
            start = end
    joined: list[Interval] = []
    for minute in minutes:
        joined = list(extended(joined, minute, -math.inf))
    while len(joined) > MAX_PERSISTED:
        joined = _merge_shortest(joined)
    return tuple(joined)


def _added(minutes: list[Interval], piece: Interval) -> Interval:
    """`piece`, plus what an interval before it put into the same minute (taken out)."""
    if minutes and minutes[-1].start_s == piece.start_s:
        before = minutes.pop()
        return Interval(
            piece.start_s, piece.end_s, before.held + piece.held, before.capacity + piece.capacity
        )
    return piece


def queue_usage(
    history: Sequence[Interval], now: float, since: float, params: TimeBasedFairness
) -> dict[str, float]:
    """One queue's usage at `now` of the window that began at `since`."""
    half_life = duration_seconds(params.halfLife)
    used: dict[str, float] = {}
    capacity: dict[str, float] = {}
    for interval in history:
        weight = _weight(max(interval.start_s, since), interval.end_s, now, half_life)
        for name, amount in interval.held.items():
            used[name] = used.get(name, 0.0) + amount * weight
        for name, amount in interval.capacity.items():
            capacity[name] = capacity.get(name, 0.0) + amount * weight
    if params.normalization == "steady" and history:
        first = history[0]
        before = _weight(since, max(first.start_s, since), now, half_life)
        for name, amount in first.capacity.items():
            capacity[name] = capacity.get(name, 0.0) + amount * before
    return {
        name: min(amount / capacity[name], 1.0)
        for name, amount in sorted(used.items())
        if amount > 0 and capacity.get(name, 0.0) > 0
    }


def advance_usage(previous: UsageState, now: float, params: TimeBasedFairness) -> UsageState:
    """The usage at `now`: the interval since the last update, during which each
    queue held what `previous.rates` says of the cluster `previous.capacity`,
    added to each queue's history, and every usage taken again over the window."""
    since = window_start(params, now)
    start = previous.updated_s if previous.updated_s is not None else now
    rates = previous.rates
    names = sorted(set(previous.history) | set(rates))
    idle = _idle(previous.history)
    history = {}
    for name in names:
        held = rates.get(name, NO_RESOURCES)
        interval = Interval(max(start, since), now, held, previous.capacity)
        kept = extended(previous.history.get(name, idle), interval, since)
        if kept:
            history[name] = kept
    queues = {name: queue_usage(kept, now, since, params) for name, kept in history.items()}
    queues = {name: amounts for name, amounts in queues.items() if amounts}
    return dataclasses.replace(previous, queues=queues, history=history, updated_s=now)


def _idle(history: Mapping[str, Sequence[Interval]]) -> tuple[Interval, ...]:
    """The longest history held at zero: a queue that starts to hold something
    is normalised by the same capacity as the others (the cluster's, not its own)."""
    longest = max(history.values(), key=len, default=())
    return tuple(dataclasses.replace(i, held=Resources()) for i in longest)


def usage_from_queues(
    snapshot: Snapshot, history: Mapping[str, tuple[Interval, ...]]
) -> UsageState:
    """The state after a restart: each queue's history as persisted (its usage is
    taken again over the window at once); a queue persisted with usage fractions
    and no history keeps those fractions."""
    fractions = {name: dict(node.usage) for name, node in snapshot.queues.nodes.items()}
    return UsageState(queues=fractions, history=dict(history))


def usage_until(
    snapshot: Snapshot,
    spec: SchedulerConfigSpec,
    previous: UsageState | None,
    now: float,
    capacity: Resources,
) -> UsageState:
    """Usage brought up to `now`: the interval since the last cycle integrated at the
    rate the queues held since then (after a restart: the persisted history);
    `capacity` is what the queues share now (`totals.cluster_capacity`), the
    rate of the cluster until the next cycle."""
    state = previous or usage_from_queues(snapshot, persisted_history(snapshot))
    params = spec.timeBasedFairness
    if params.k == 0 or (state.updated_s is None and not state.history):
        # Off: no decision reads usage, so none is recorded (what was persisted stays).
        advanced = dataclasses.replace(state, updated_s=now)
    else:
        advanced = advance_usage(state, now, params)
        if not advanced.history and not state.history:
            # Fractions persisted without a history: kept until there is one. A
            # history the window left entirely (a reset) leaves no usage at all.
            advanced = dataclasses.replace(advanced, queues=state.queues)
    return dataclasses.replace(advanced, capacity=capacity)


def occupying(
    snapshot: Snapshot, opening: Mapping[str, Resources], binds: Sequence[Bind]
) -> dict[str, Resources]:
    """What each queue (and ancestor) occupies on the nodes until the next cycle, the
    rate its usage grows at: what it held as the cycle opened (`opening`), pods
    being deleted and pods this cycle evicts included, since they keep their node
    until they are gone; plus this cycle's binds that fit beside them. A group's
    binds onto room that leaving pods still hold wait for it (pipelined), so the
    queue that will get the room is not charged for it before it has it, nor the
    queue still on it let off: charging the wrong one makes the fair shares swing
    every cycle of a termination grace, and the room goes to whichever queue the
    last swing favoured (issue 19: the oscillating example missed its first
    hand-over with a grace of 2, 4 or 6 s, not 1, 3 or 5)."""
    rates = dict(opening)
    room: dict[str, Resources] = {}
    by_group: dict[str, list[Bind]] = {}
    for bind in binds:
        by_group.setdefault(bind.group, []).append(bind)
    for group, members in by_group.items():
        needs: dict[str, Resources] = {}
        for bind in members:
            needs[bind.node] = needs.get(bind.node, NO_RESOURCES) + _holds(snapshot, bind)
        free = {node: room[node] if node in room else _free(snapshot, node) for node in needs}
        if not all(need.fits_in(free[node]) for node, need in needs.items()):
            continue  # pipelined: it waits for the room of pods still on the node
        room.update({node: free[node] - need for node, need in needs.items()})
        leaf = snapshot.pod_groups[group].queue
        for name in (leaf, *snapshot.queues.ancestors(leaf)):
            for need in needs.values():
                rates[name] = rates.get(name, NO_RESOURCES) + need
    return rates


def _holds(snapshot: Snapshot, bind: Bind) -> Resources:
    """What a bound pod holds, a GPU share as a part of a GPU (as `used` counts it)."""
    return snapshot.pods[bind.pod].requests + {GPU: bind.gpu_fraction}


def _free(snapshot: Snapshot, node: str) -> Resources:
    """The node's free room as the snapshot read it: pods being deleted still hold theirs."""
    row = snapshot.free[snapshot.node_index[node]]
    return Resources(dict(zip(snapshot.resource_names, map(float, row), strict=True)))


def persisted_history(snapshot: Snapshot) -> dict[str, tuple[Interval, ...]]:
    """Each queue's history as its status last persisted it."""
    return {
        name: node.usage_history
        for name, node in snapshot.queues.nodes.items()
        if node.usage_history
    }


# ------------------------------------------------------- when to look again

#: Usage that moved less than this since the last cycle is taken as settled.
SETTLED = 1e-6
#: Fair shares are looked at again this many times per half-life (or window).
STEPS_PER_HALF_LIFE = 128


def drift_step(spec: SchedulerConfigSpec) -> float:
    """How long after a cycle usage may have moved enough to change a fair share:
    a fraction of the half-life (of the window without decay), never less than
    the cycle period."""
    params = spec.timeBasedFairness
    half_life = duration_seconds(params.halfLife)
    span = half_life if half_life > 0 else duration_seconds(params.window)
    return max(duration_seconds(spec.cyclePeriod), span / STEPS_PER_HALF_LIFE)


def drift_wake(
    spec: SchedulerConfigSpec, before: UsageState | None, after: UsageState, now: float
) -> float | None:
    """When fair shares may have drifted enough to change a decision: a `drift_step`
    on while usage moves, and at the latest when the window starts again (a reset
    forgets usage at once, though nothing moved before it); None with `k: 0`, or
    when usage has settled in a sliding window."""
    params = spec.timeBasedFairness
    if params.k == 0:
        return None
    moving = still_moving(before, after) or _reset_since(params, before, now)
    drifted = now + drift_step(spec) if moving else None
    reset = next_reset(params, now)
    times = [t for t in (drifted, reset) if t is not None]
    return min(times) if times else None


def _reset_since(params: TimeBasedFairness, before: UsageState | None, now: float) -> bool:
    """Whether the window started again since the last cycle: usage is all 0 at the
    reset and moves from there, though it has not moved yet."""
    last = before.updated_s if before is not None else None
    reset = next_reset(params, last) if last is not None else None
    return reset is not None and reset <= now


def still_moving(before: UsageState | None, after: UsageState) -> bool:
    """Whether some queue's usage moved since the last cycle (always, after a start),
    or will: a queue whose rate changed moves from now on, though its usage may not
    have moved yet (a queue that keeps its node one more cycle, its pod being evicted,
    has usage 1 at both cycles; if nothing looked again it would keep the
    fair share of a queue that has used everything)."""
    if before is None or before.updated_s is None:
        return True
    if _nonzero(before.rates) != _nonzero(after.rates):
        return True
    names = set(before.queues) | set(after.queues)
    for name in names:
        old, new = before.queues.get(name, {}), after.queues.get(name, {})
        if any(abs(new.get(r, 0.0) - old.get(r, 0.0)) > SETTLED for r in set(old) | set(new)):
            return True
    return False


def _nonzero(allocated: Mapping[str, Resources]) -> dict[str, Resources]:
    """The rates queues hold, queues holding nothing left out (absent and zero agree)."""
    return {name: amount for name, amount in allocated.items() if any(amount.values())}
