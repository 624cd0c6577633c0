"""The scheduling cycle: snapshot in, plan out.

1. fair shares per queue (reported; the first-fit allocation does not use them yet);
2. pending pod groups, oldest first;
3. each group's minimum placed all-or-nothing in the transaction, first fit;
4. members above the minimum placed one by one (elastic);
5. the plan: binds with node and devices, and a status with a reason per group.
The cycle knows nothing of kopf or of the simulator. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kai_ray.decisions.fairness import fair_shares
from kai_ray.decisions.placement import place_extras, place_gang
from kai_ray.decisions.plan import GroupStatus, Plan
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import Resources


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    fair_shares: Mapping[str, Resources]


def leaf_requests(snapshot: Snapshot) -> dict[str, Resources]:
    """What each leaf queue's live pods ask for, bound or pending."""
    totals: dict[str, Resources] = {}
    for group in snapshot.pod_groups.values():
        for pod in group.live_pods():
            totals[group.queue] = totals.get(group.queue, Resources()) + pod.effective_requests
    return totals


def cluster_capacity(snapshot: Snapshot) -> Resources:
    usable = snapshot.allocatable[snapshot.schedulable].sum(axis=0)
    return Resources(dict(zip(snapshot.resource_names, usable.tolist(), strict=True)))


def _waiting(snapshot: Snapshot) -> list[PodGroupState]:
    groups = [g for g in snapshot.pod_groups.values() if any(p.node is None for p in g.live_pods())]
    return sorted(groups, key=lambda g: (g.creation_timestamp, g.key))


def run_cycle(snapshot: Snapshot, config: SchedulerConfig, cycle: int, now: float) -> CycleResult:
    # 1. Fair shares, per resource, top-down.
    k = config.spec.timeBasedFairness.k
    shares = fair_shares(snapshot.queues, leaf_requests(snapshot), cluster_capacity(snapshot), k)
    plan = Plan(cycle=cycle)
    transaction = Transaction(snapshot)
    # 2-4. Every waiting group, oldest first: the minimum all-or-nothing, then extras.
    waiting = _waiting(snapshot)
    for group in waiting:
        outcome = place_gang(transaction, group, config.spec)
        plan.statuses.append(GroupStatus(group.key, outcome.admitted, outcome.reason))
    for group in waiting:
        status = plan.status_of(group.key)
        if status is not None and status.admitted:
            place_extras(transaction, group, config.spec)
    # 5. The plan holds what the transaction committed.
    plan.binds.extend(transaction.binds())
    return CycleResult(plan, shares)
