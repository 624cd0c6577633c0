"""The cycle's sums over every group, kept from snapshot to snapshot, are exact.

`GroupTotals` follows the cache's snapshots by the groups that changed. After
any sequence of the cache's events (the kept-snapshot test's), the kept sums
must equal a fresh `GroupTotals` on the same snapshot, and both must be the
correctly rounded sums of the pods' requests (`math.fsum`, whatever the order).
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.booking import held_ledger
from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.totals import (
    GroupTotals,
    cluster_capacity,
    exact,
    leaf_requests,
    nearest,
)
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, ClusterCache
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.resources import Resources
from tests.builders import make_node, make_pod, make_pod_group, make_queue
from tests.unit.test_incremental_snapshot import (
    GROUPS,
    SCHEDULER,
    apply,
    events,
    group_events,
    started,
)


def reference_demand(snapshot: Snapshot) -> dict[str, dict[str, float]]:
    """Per leaf and resource, `math.fsum` of every live pod's requests."""
    amounts: dict[str, dict[str, list[float]]] = {}
    for group in snapshot.pod_groups.values():
        for pod in group.live:  # a leaf with live pods is there, even asking nothing
            per = amounts.setdefault(group.queue, {})
            for name, amount in pod.effective_requests.items():
                per.setdefault(name, []).append(amount)
    return {
        leaf: {name: math.fsum(values) for name, values in per.items() if math.fsum(values)}
        for leaf, per in amounts.items()
    }


def reference_capacity(snapshot: Snapshot) -> dict[str, float]:
    """Allocatable on schedulable nodes less `math.fsum` of other schedulers' live
    pods there."""
    usable = snapshot.allocatable[snapshot.schedulable].sum(axis=0)
    total = dict(zip(snapshot.resource_names, usable.tolist(), strict=True))
    taken: dict[str, list[float]] = {}
    for pod in snapshot.pods.values():
        node = snapshot.node_index.get(pod.node or "")
        foreign = pod.scheduler != SCHEDULER and not pod.terminal
        if foreign and node is not None and snapshot.schedulable[node]:
            for name, amount in pod.effective_requests.items():
                taken.setdefault(name, []).append(amount)
    left = {name: total.get(name, 0.0) - math.fsum(values) for name, values in taken.items()}
    return {name: amount for name, amount in (total | left).items() if amount != 0.0}


def as_plain(vectors: dict[str, Resources]) -> dict[str, dict[str, float]]:
    return {name: dict(vector.items()) for name, vector in vectors.items()}


#: The snapshot's events, with more of the PodGroups coming and going.
EVENTS = st.one_of(
    events, group_events, st.tuples(st.just("delete group"), st.integers(0, GROUPS - 1))
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(EVENTS, min_size=1, max_size=40))
def test_kept_sums_equal_fresh_ones_and_the_exact_sums_after_every_event(
    steps: list[tuple[Any, ...]],
) -> None:
    cache, clock = started()
    kept = GroupTotals()
    for step in steps:
        apply(cache, clock, step)
        snapshot = cache.snapshot()
        demand = leaf_requests(snapshot, kept)
        assert demand == leaf_requests(snapshot)
        assert as_plain(demand) == reference_demand(snapshot)
        capacity = cluster_capacity(snapshot, SCHEDULER, kept)
        assert capacity == cluster_capacity(snapshot, SCHEDULER)
        assert dict(capacity.items()) == reference_capacity(snapshot)
        ledger = held_ledger(snapshot, {}, kept)
        fresh = held_ledger(snapshot, {})
        assert ledger.allocated == fresh.allocated
        assert ledger.non_preemptible == fresh.non_preemptible
        assert ledger.typed == fresh.typed


def test_amounts_that_round_in_a_running_sum_are_summed_exactly() -> None:
    """0.1 + 0.2 + 0.3 as floats, one after another, is 0.6000000000000001; the
    queue holds the float nearest the exact sum of the three floats, 0.6, in any
    order, and taking one pod away leaves exactly the sum of the other two."""
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team").build(), QUEUE)
    cache.upsert(make_node("n0").gpus(8).build(), NODE)
    for i, cpu in enumerate(("100m", "200m", "300m")):
        cache.upsert(make_pod_group(f"g{i}").queue("team").build(), POD_GROUP)
        pod = make_pod(f"p{i}").group(f"g{i}").cpu(cpu).on("n0").phase("Running")
        cache.upsert(pod.build(), POD)
    kept = GroupTotals()
    assert leaf_requests(cache.snapshot(), kept)["team"]["cpu"] == math.fsum([0.1, 0.2, 0.3])
    assert held_ledger(cache.snapshot(), {}, kept).held("team")["cpu"] == 0.6
    cache.delete(POD, "default/p1")
    assert leaf_requests(cache.snapshot(), kept)["team"]["cpu"] == math.fsum([0.1, 0.3])
    assert nearest(exact(0.1) + exact(0.2)) == math.fsum([0.1, 0.2])


def test_a_cycle_with_kept_sums_decides_as_one_without() -> None:
    cache, clock = started()
    groups = [("group", i, {"queue": "team-a", "min_member": 1}) for i in range(4)]
    for step in [*groups, *(("pod", i, _pending(i)) for i in range(6))]:
        apply(cache, clock, step)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    kept = GroupTotals()
    snapshot = cache.snapshot()
    with_kept = run_cycle(snapshot, config, 1, 0.0, totals=kept)
    without = run_cycle(snapshot, config, 1, 0.0)
    assert with_kept.plan.binds and with_kept.plan.binds == without.plan.binds
    assert with_kept.fair_shares == without.fair_shares
    assert with_kept.leaf_requests == without.leaf_requests


def _pending(index: int) -> dict[str, Any]:
    return {
        "gpus": "1",
        "node": None,
        "phase": "Running",
        "group": f"g{index % 4}",
        "scheduler": SCHEDULER,
        "created": index,
        "extra": None,
        "gate": False,
        "devices": None,
        "leaving": 5,
    }
