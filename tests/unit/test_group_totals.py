"""The cycle's sums over every group, kept from snapshot to snapshot, are exact.

`GroupTotals` follows the cache's snapshots by the groups that changed. After
any sequence of the cache's events (the kept-snapshot test's), the kept sums
must equal a fresh `GroupTotals` on the same snapshot, and both must be the
correctly rounded sums of the pods' requests (`math.fsum`, whatever the order).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.admission import is_preemptible
from kai_ray.decisions.allocate import ADDING, _adding
from kai_ray.decisions.booking import held_ledger
from kai_ray.decisions.consolidate import MOVERS, _mover
from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.eviction import (
    GIVERS,
    RELEASING,
    UNITS_AND_ENDS,
    VICTIM_UNITS,
    _giver,
    _holds_releasing,
)
from kai_ray.decisions.kept import KeptPerGroup
from kai_ray.decisions.ordering import group_priority
from kai_ray.decisions.plan import GroupStatus, Plan
from kai_ray.decisions.preempt import RUNNING_PRIORITIES, _running_priority
from kai_ray.decisions.runtime import started_at
from kai_ray.decisions.stale import UNSETTLED, _unsettled
from kai_ray.decisions.totals import (
    GroupTotals,
    Tally,
    cluster_capacity,
    exact,
    leaf_requests,
    nearest,
)
from kai_ray.decisions.transaction import MemoKey
from kai_ray.decisions.victims import victim_units
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, ClusterCache
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.clock import unix_seconds
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


def _queue_and_bound(group: PodGroupState) -> tuple[str, int] | None:
    return (group.queue, len(group.bound)) if group.live else None


LATE = MemoKey[Tally[tuple[str, int]]]("a tally first asked for late")
TALLIED: list[tuple[MemoKey[Any], Callable[[PodGroupState], Any]]] = [
    (RUNNING_PRIORITIES, _running_priority),
    (RELEASING, _holds_releasing),
    (GIVERS, _giver),
    (UNSETTLED, _unsettled),
    (MemoKey[Tally[tuple[str, int]]]("queue and bound pods"), _queue_and_bound),
    (LATE, _queue_and_bound),
    (ADDING, _adding),
]


def counted(snapshot: Snapshot, value: Callable[[PodGroupState], Any]) -> Counter[Any]:
    """What a tally holds, counted afresh."""
    found = (value(group) for group in snapshot.pod_groups.values())
    return Counter(v for v in found if v is not None)


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
    # Following every snapshot (told what changed since the last), and one in two (what
    # changed then spans a snapshot it did not see: it compares every entry).
    kept, skipping = GroupTotals(), GroupTotals()
    for number, step in enumerate(steps):
        apply(cache, clock, step)
        snapshot = cache.snapshot()
        for totals in (kept, skipping) if number % 2 else (kept,):
            demand = leaf_requests(snapshot, totals)
            assert demand == leaf_requests(snapshot)
            assert as_plain(demand) == reference_demand(snapshot)
            capacity = cluster_capacity(snapshot, SCHEDULER, totals)
            assert capacity == cluster_capacity(snapshot, SCHEDULER)
            assert dict(capacity.items()) == reference_capacity(snapshot)
            ledger = held_ledger(snapshot, {}, totals)
            fresh = held_ledger(snapshot, {})
            assert ledger.allocated == fresh.allocated
            assert ledger.non_preemptible == fresh.non_preemptible
            assert ledger.typed == fresh.typed
            # Tallies kept over the groups (asked for from the first step on, or only now).
            for slot, value in TALLIED:
                if number == 0 or slot is not LATE:
                    counts = totals.tallies.get(slot, snapshot.pod_groups, value).counts
                    assert counts == counted(snapshot, value)


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


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(EVENTS, min_size=1, max_size=30))
def test_victim_units_kept_across_cycles_are_those_their_group_is_cut_into(
    steps: list[tuple[Any, ...]],
) -> None:
    """The actions keep values of each group (victim units; whether consolidation
    may move it) in `GroupTotals` while the cache keeps the group's state: after
    any events, every kept entry is of the snapshot's very group and equals the
    value derived afresh, and a cycle with them decides as one without."""
    cache, clock = started()
    kept = GroupTotals()
    actions = {"spec": {"actions": ["allocate", "reclaim", "preempt", "consolidate"]}}
    config = SchedulerConfig.model_validate(actions)
    for cycle, step in enumerate(steps, start=1):
        apply(cache, clock, step)
        snapshot = cache.snapshot()
        with_kept = run_cycle(snapshot, config, cycle, 0.0, totals=kept)
        without = run_cycle(snapshot, config, cycle, 0.0)
        assert with_kept.plan.evictions == without.plan.evictions
        assert with_kept.plan.binds == without.plan.binds
        # Waiting statuses restated from the last cycle's say what fresh ones say.
        assert statuses(with_kept.plan) == statuses(without.plan)
        for key, group, units in kept.per_group.entries(VICTIM_UNITS):
            assert snapshot.pod_groups.get(key) is group, key
            assert units == victim_units(group, group_priority(group), started_at(group))
        for key, group, (units, ends) in kept.per_group.entries(UNITS_AND_ENDS):
            assert snapshot.pod_groups.get(key) is group, key
            assert units == victim_units(group, group_priority(group), started_at(group))
            assert len(ends) == len(units)
        movers = kept.tallies.get(MOVERS, snapshot.pod_groups, _mover).members
        read = {key: (mover.scheduler, mover.started, mover.pods) for key, mover in movers.items()}
        assert read == {
            key: (
                group.live[0].scheduler,
                unix_seconds(started_at(group)),
                frozenset(pod.key for pod in group.live),
            )
            for key, group in snapshot.pod_groups.items()
            if may_be_moved(group)
        }


def statuses(plan: Plan) -> dict[str, GroupStatus]:
    return {status.group: status for status in plan.statuses}


def test_a_backlog_waiting_as_before_is_stated_with_the_statuses_stated_before() -> None:
    """A gang that waits for the same reason as in the cycle before, its state
    unchanged, is stated with the very status object stated then (statuses are
    immutable); once its reason changes (another group's pod left the node), a new
    status says so, as a cycle that keeps nothing says."""
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team-a").gpu(quota=16).build(), QUEUE)
    cache.upsert(make_node("n0").gpus(8).build(), NODE)
    cache.upsert(make_pod_group("r").queue("team-a").build(), POD_GROUP)
    running = make_pod("r-0").group("r").gpus(8).on("n0").phase("Running")
    cache.upsert(running.scheduler(SCHEDULER).build(), POD)
    for name in ("big", "bigger"):
        cache.upsert(make_pod_group(name).queue("team-a").min_member(2).build(), POD_GROUP)
        for index in range(2):
            pod = make_pod(f"{name}-{index}").group(name).gpus(8).scheduler(SCHEDULER)
            cache.upsert(pod.build(), POD)
    kept = GroupTotals()
    first = run_cycle(cache.snapshot(), SchedulerConfig(), 1, 0.0, totals=kept)
    second = run_cycle(cache.snapshot(), SchedulerConfig(), 2, 0.0, totals=kept)
    waiting = [s for s in first.plan.statuses if not s.admitted]
    assert len(waiting) == 2, "both gangs must wait for this test to say anything"
    for status in waiting:
        assert second.plan.statuses[status.group] is status
    cache.delete(POD, "default/r-0")
    third = run_cycle(cache.snapshot(), SchedulerConfig(), 3, 0.0, totals=kept)
    fresh = run_cycle(cache.snapshot(), SchedulerConfig(), 3, 0.0)
    assert statuses(third.plan) == statuses(fresh.plan)
    for status in waiting:
        assert third.plan.statuses[status.group].reason != status.reason


def may_be_moved(group: PodGroupState) -> bool:
    """What consolidation asks of a group alone, spelled out: some live pod, all of
    one scheduler and made again by a controller; seen whole, at its minimum,
    preemptible."""
    live = group.live
    return (
        bool(live)
        and all(pod.scheduler == live[0].scheduler and pod.controlled for pod in live)
        and group.seen_whole
        and len(group.bound) >= max(group.spec.minMember, 1)
        and is_preemptible(group, group_priority(group))
    )


def test_a_group_that_changed_is_cut_into_victim_units_afresh() -> None:
    """Team a's two 8-GPU gangs run; team b waits for 8 GPUs of its quota: reclaim
    takes a0. The plan is not applied, but a0's pod finishes and its controller
    starts another on the same node before the next cycle: a0 is a new state, cut
    into units afresh, so the new pod is evicted, not the finished one. (Two guards
    make it so: `GroupTotals` drops a changed group's units, and the evicting
    actions use kept units only of the very same state; the test fails without
    both.)"""
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team-a").gpu(quota=0).build(), QUEUE)
    cache.upsert(make_queue("team-b").gpu(quota=8).build(), QUEUE)

    def running(name: str, group: str, node: str, phase: str = "Running") -> dict[str, Any]:
        pod = make_pod(name).group(group).gpus(8).on(node).phase(phase)
        return pod.scheduler(SCHEDULER).build()

    for name, node in (("a0", "n0"), ("a1", "n1")):
        cache.upsert(make_node(node).gpus(8).build(), NODE)
        cache.upsert(make_pod_group(name).queue("team-a").build(), POD_GROUP)
        cache.upsert(running(f"{name}-0", name, node), POD)
    cache.upsert(make_pod_group("b").queue("team-b").build(), POD_GROUP)
    cache.upsert(make_pod("b-0").group("b").gpus(8).scheduler(SCHEDULER).build(), POD)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["reclaim"]}})
    kept = GroupTotals()
    first = run_cycle(cache.snapshot(), config, 1, 0.0, totals=kept)
    assert [e.pod for e in first.plan.evictions] == ["default/a0-0"]
    assert {"default/a0", "default/a1"} <= {k for k, _, _ in kept.per_group.entries(VICTIM_UNITS)}
    cache.upsert(running("a0-0", "a0", "n0", "Succeeded"), POD)
    cache.upsert(running("a0-1", "a0", "n0"), POD)
    snapshot = cache.snapshot()
    second = run_cycle(snapshot, config, 2, 0.0, totals=kept)
    assert [e.pod for e in second.plan.evictions] == ["default/a0-1"]
    assert second.plan.evictions == run_cycle(snapshot, config, 2, 0.0).plan.evictions
    kept_a0 = [g for k, g, _ in kept.per_group.entries(VICTIM_UNITS) if k == "default/a0"]
    assert kept_a0 == [snapshot.pod_groups["default/a0"]]
    assert kept_a0[0] is snapshot.pod_groups["default/a0"]


def test_a_value_kept_per_group_is_used_only_for_its_very_state_and_settings() -> None:
    cache, _ = started()
    cache.upsert(make_pod_group("g", "ns").queue("team-a").build(), POD_GROUP)
    group = cache.snapshot().pod_groups["ns/g"]
    slot = MemoKey[int]("a value")
    kept, built = KeptPerGroup(), []

    def build() -> int:
        built.append(1)
        return len(built)

    assert kept.get(slot, "a", group, build) == 1
    assert kept.get(slot, "a", group, build) == 1  # kept: the very same state
    assert kept.get(slot, "b", group, build) == 2  # another setting
    cache.upsert(make_pod_group("g", "ns").queue("team-a").min_member(2).build(), POD_GROUP)
    changed = cache.snapshot().pod_groups["ns/g"]
    assert changed is not group
    assert kept.get(slot, "a", changed, build) == 3  # a new state of the group
    kept.drop("ns/g")
    assert kept.get(slot, "a", changed, build) == 4
    assert [(k, v) for k, _, v in kept.entries(slot)] == [("ns/g", 4)]


def test_a_tally_follows_groups_that_change_and_go() -> None:
    """A tally kept over the groups (here: which hold a pod being deleted) counts a
    group while it holds one, stops when the pod is gone, and forgets a group that
    went with its pods still deleting; a fresh tally agrees at every step."""
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("team").build(), QUEUE)
    cache.upsert(make_node("n0").gpus(8).build(), NODE)
    kept = GroupTotals()

    def tally() -> Counter[bool]:
        snapshot = cache.snapshot()
        kept.update(snapshot)
        counts = kept.tallies.get(RELEASING, snapshot.pod_groups, _holds_releasing).counts
        assert counts == counted(snapshot, _holds_releasing)
        return counts

    def pod(name: str, group: str, leaving: bool) -> dict[str, Any]:
        obj = make_pod(name).group(group).gpus(1).on("n0").scheduler(SCHEDULER).build()
        if leaving:
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
        return obj

    for name in ("a", "b"):
        cache.upsert(make_pod_group(name).queue("team").build(), POD_GROUP)
        cache.upsert(pod(f"{name}-0", name, leaving=False), POD)
    assert tally() == Counter()
    cache.upsert(pod("a-0", "a", leaving=True), POD)
    cache.upsert(pod("b-0", "b", leaving=True), POD)
    assert tally() == Counter({True: 2})
    cache.delete(POD, "default/a-0")
    assert tally() == Counter({True: 1})
    cache.delete(POD_GROUP, "default/b")  # its pod, still deleting, stands alone
    tally()  # equal to a fresh count, whatever the snapshot makes of the pod
    cache.delete(POD, "default/b-0")
    assert tally() == Counter()
