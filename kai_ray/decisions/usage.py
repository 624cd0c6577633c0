"""Time-based fairness: each queue's usage, decayed over time and normalised.

Usage of a resource is the resource-time a queue held, integrated with an
exponential decay (weight `0.5 ** (age / half_life)`), divided by the cluster's
capacity integrated the same way: a fraction of what the cluster could have
given, between 0 and 1. It shifts only the over-quota weights (see
`fairness._shifted_weights`); quotas and priorities are untouched.

The state is a value the cycle returns and the caller hands back next cycle
(the simulator keeps it in memory; the operator also persists the normalised
part in `Queue.status.usage`, so a restart loses nothing). Allocations are
treated as constant between two cycles, which makes the integral exact:
an amount `a` held for `t` seconds adds `a * tau * (1 - 0.5 ** (t / h))`,
with `tau = h / ln 2`, to a total that itself decays by `0.5 ** (t / h)`.
`usage_until` brings a cycle's usage up to its `now`. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfigSpec, duration_seconds
from kai_ray.values.resources import Resources

Amounts = Mapping[str, float]


@dataclass(frozen=True)
class UsageState:
    """Decayed usage per queue and what the next interval needs to extend it."""

    #: queue -> resource -> decayed usage as a fraction of decayed capacity.
    queues: Mapping[str, Amounts] = field(default_factory=dict)
    #: resource -> decayed capacity integral in resource-seconds; empty after a
    #: restart, when the capacity is taken as steady (its integral is c * tau).
    capacity: Amounts = field(default_factory=dict)
    #: queue -> what it held at the end of the last cycle (the rate until the next).
    allocated: Mapping[str, Resources] = field(default_factory=dict)
    #: Virtual or wall time of the last update; None before the first cycle.
    updated_s: float | None = None


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """How much of a past amount survives `elapsed_s` (0 when there is no half-life)."""
    if half_life_s <= 0:
        return 0.0
    return float(0.5 ** (max(elapsed_s, 0.0) / half_life_s))


def _integral(rate: float, elapsed_s: float, half_life_s: float) -> float:
    """Decayed integral of a constant `rate` over the last `elapsed_s` seconds."""
    if half_life_s <= 0:
        return rate * max(elapsed_s, 0.0)
    tau = half_life_s / math.log(2)
    return rate * tau * (1.0 - decay_factor(elapsed_s, half_life_s))


def _steady_capacity(amount: float, half_life_s: float) -> float:
    """The decayed integral of a capacity that has always been `amount`."""
    return amount * half_life_s / math.log(2) if half_life_s > 0 else 0.0


def advance_usage(
    previous: UsageState,
    allocated_by_queue: Mapping[str, Resources],
    capacity: Resources,
    elapsed_s: float,
    half_life_s: float,
) -> UsageState:
    """The usage after `elapsed_s` more seconds during which each queue held
    `allocated_by_queue` (every queue, parents included) of a cluster of `capacity`."""
    keep = decay_factor(elapsed_s, half_life_s)
    old_capacity = {
        name: previous.capacity.get(name, _steady_capacity(capacity[name], half_life_s))
        for name in capacity
    }
    new_capacity = {
        name: old_capacity[name] * keep + _integral(capacity[name], elapsed_s, half_life_s)
        for name in capacity
    }
    names = set(previous.queues) | set(allocated_by_queue)
    queues = {
        queue: _queue_usage(
            previous.queues.get(queue, {}),
            allocated_by_queue.get(queue, Resources()),
            old_capacity,
            new_capacity,
            (keep, elapsed_s, half_life_s),
        )
        for queue in sorted(names)
    }
    return UsageState(queues, new_capacity, previous.allocated, previous.updated_s)


def _queue_usage(
    fractions: Amounts,
    held: Resources,
    old_capacity: Amounts,
    new_capacity: Amounts,
    timing: tuple[float, float, float],
) -> dict[str, float]:
    """One queue: back from fractions to resource-seconds, decay, add, divide again."""
    keep, elapsed_s, half_life_s = timing
    usage: dict[str, float] = {}
    for name, total in new_capacity.items():
        before = fractions.get(name, 0.0) * old_capacity.get(name, 0.0)
        after = before * keep + _integral(held[name], elapsed_s, half_life_s)
        if total > 0 and after > 0:
            usage[name] = min(after / total, 1.0)
    return usage


def usage_from_queues(queues: Mapping[str, Amounts]) -> UsageState:
    """The state after a restart: fractions as persisted, capacity taken as steady."""
    return UsageState(queues={name: dict(amounts) for name, amounts in queues.items()})


def usage_until(
    snapshot: Snapshot,
    spec: SchedulerConfigSpec,
    previous: UsageState | None,
    now: float,
    capacity: Resources,
) -> UsageState:
    """Usage brought up to `now`: the interval since the last cycle integrated at
    the rate the queues held since then (nothing to integrate after a restart);
    `capacity` is what the queues share (`fairness.cluster_capacity`)."""
    state = previous or usage_from_queues(
        {name: node.usage for name, node in snapshot.queues.nodes.items()}
    )
    elapsed = 0.0 if state.updated_s is None else now - state.updated_s
    half_life = duration_seconds(spec.timeBasedFairness.halfLife)
    advanced = advance_usage(state, state.allocated, capacity, elapsed, half_life)
    return dataclasses.replace(advanced, updated_s=now)
