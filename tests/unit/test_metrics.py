"""Prometheus metrics after a cycle: what a scrape shows for queues, gangs and writes."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.plan import Bind, Evict
from kai_ray.effects.binder import DONE, ApplyReport, Outcome, WriteResult
from kai_ray.effects.metrics import (
    NOT_TRIED,
    OTHER_REASON,
    SchedulerMetrics,
    wait_reason,
)
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue

GPU = "nvidia.com/gpu"
Labels = tuple[tuple[str, str], ...]


def scrape(registry: CollectorRegistry) -> dict[tuple[str, Labels], float]:
    """Every sample of a scrape, by name and sorted labels."""
    text = generate_latest(registry).decode()
    samples: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def gpu(queue: str) -> Labels:
    return (("queue", queue), ("resource", GPU), ("unit", "gpu"))


@dataclass
class Cluster:
    snapshot: Snapshot
    result: CycleResult


def two_teams(gang_b: int = 4) -> Cluster:
    """One 8-GPU node; team-a (quota 4, limit 6) runs 4 GPUs and asks for 2 more;
    team-b (quota 4) sends a gang of `gang_b` single-GPU pods."""
    pods = [make_pod(f"a-{i}").group("a").gpus(1).on("n0").build() for i in range(4)]
    pods += [make_pod(f"a-extra-{i}").group("a-extra").gpus(1).build() for i in range(2)]
    pods += [make_pod(f"b-{i}").group("b").gpus(1).build() for i in range(gang_b)]
    objects = ClusterObjects(
        nodes=[make_node("n0").gpus(8).build()],
        queues=[
            make_queue("dept").gpu(quota=8).build(),
            make_queue("team-a").parent("dept").gpu(quota=4, limit=6).build(),
            make_queue("team-b").parent("dept").gpu(quota=4).build(),
        ],
        pod_groups=[
            make_pod_group("a").queue("team-a").min_member(4).build(),
            make_pod_group("a-extra").queue("team-a").min_member(2).build(),
            make_pod_group("b").queue("team-b").min_member(gang_b).build(),
        ],
        pods=pods,
    )
    snapshot = build_snapshot(objects)
    config = SchedulerConfig.model_validate({"spec": {"actions": ["allocate"]}})
    return Cluster(snapshot, run_cycle(snapshot, config, 1, 100.0))


def applied(result: CycleResult) -> ApplyReport:
    """Every planned bind made, as the binder reports it."""
    return ApplyReport(bound=list(result.plan.binds))


def test_queue_gauges_show_quota_limit_fair_share_allocated_and_requested() -> None:
    cluster = two_teams()
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    metrics.record_cycle(cluster.snapshot, cluster.result, applied(cluster.result), 0.02, True)
    got = scrape(registry)
    assert got[("kai_ray_queue_quota", gpu("team-a"))] == 4
    assert got[("kai_ray_queue_limit", gpu("team-a"))] == 6
    assert ("kai_ray_queue_limit", gpu("team-b")) not in got, "no limit: no series"
    assert got[("kai_ray_queue_requested", gpu("team-a"))] == 6
    assert got[("kai_ray_queue_requested", gpu("dept"))] == 10, "parents sum their children"
    # team-b's gang of 4 fits beside team-a's 4; team-a's extra 2 do not fit any more
    assert got[("kai_ray_queue_allocated", gpu("team-b"))] == 4
    assert got[("kai_ray_queue_allocated", gpu("dept"))] == 8
    assert got[("kai_ray_queue_fair_share", gpu("team-b"))] == 4
    assert got[("kai_ray_queue_info", (("parent", "dept"), ("queue", "team-a")))] == 1
    cpu = (("queue", "team-a"), ("resource", "cpu"), ("unit", "core"))
    assert got[("kai_ray_queue_quota", cpu)] == 0, "core resources always have a series"


def test_pending_pods_and_waiting_gangs_after_the_cycle() -> None:
    cluster = two_teams()
    registry = CollectorRegistry()
    SchedulerMetrics(registry).record_cycle(
        cluster.snapshot, cluster.result, applied(cluster.result), 0.02, True
    )
    got = scrape(registry)
    assert got[("kai_ray_pods_pending", (("queue", "team-a"),))] == 2
    assert ("kai_ray_pods_pending", (("queue", "team-b"),)) not in got, "its gang was bound"
    waiting = [(labels, value) for (name, labels), value in got.items() if name.endswith("waiting")]
    assert len(waiting) == 1, waiting
    assert dict(waiting[0][0])["queue"] == "team-a"
    assert dict(waiting[0][0])["reason"] in ("no-fit", "queue-limit")


def test_binds_failures_and_evictions_are_counted_by_outcome_and_reason() -> None:
    cluster = two_teams()
    bind = Bind("default/b-0", "default/b", "n0")
    report = ApplyReport(
        bound=[bind, bind],
        evicted=[Evict("default/a-0", "default/a", "reclaim")],
        failed=[(bind, WriteResult(Outcome.RETRY, "409")), (bind, WriteResult(Outcome.PERMANENT))],
        failed_evictions=[
            (Evict("default/a-1", "default/a", "preempt"), WriteResult(Outcome.RETRY))
        ],
    )
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    for _ in range(2):
        # binds are counted as each ends (in the cycle or in the back), not per report
        failures = (WriteResult(Outcome.RETRY, "409"), WriteResult(Outcome.PERMANENT))
        for outcome in (DONE, DONE, *failures):
            metrics.count_bind(outcome)
    metrics.record_cycle(cluster.snapshot, cluster.result, report, 0.5, True)
    metrics.record_cycle(cluster.snapshot, cluster.result, report, 0.003, False, now=1234.0)
    got = scrape(registry)
    assert got[("kai_ray_binds_total", ())] == 4
    assert got[("kai_ray_bind_failures_total", (("outcome", "retry"),))] == 2
    assert got[("kai_ray_bind_failures_total", (("outcome", "permanent"),))] == 2
    assert got[("kai_ray_evictions_total", (("reason", "reclaim"),))] == 2
    assert got[("kai_ray_eviction_failures_total", (("reason", "preempt"),))] == 2
    assert got[("kai_ray_cycles_total", ())] == 2
    assert got[("kai_ray_cycle_duration_seconds_count", ())] == 2
    assert got[("kai_ray_cycle_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("kai_ray_last_cycle_timestamp_seconds", ())] == 1234.0
    assert got[("kai_ray_leader", ())] == 0, "the last cycle's flag"


def test_leader_flag_and_action_and_step_durations() -> None:
    cluster = two_teams()
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    assert scrape(registry)[("kai_ray_leader", ())] == 0, "a follower until it wins the Lease"
    metrics.set_leader(True)
    assert scrape(registry)[("kai_ray_leader", ())] == 1
    report = applied(cluster.result)
    seconds = {"allocate": 0.01, "reclaim": 0.2}
    steps = [("snapshot", 0.02), ("decide", 0.25)]
    metrics.record_cycle(
        cluster.snapshot,
        cluster.result,
        report,
        0.3,
        True,
        action_seconds=seconds,
        step_seconds=steps,
    )
    got = scrape(registry)
    assert got[("kai_ray_action_duration_seconds_count", (("action", "reclaim"),))] == 1
    assert got[("kai_ray_action_duration_seconds_sum", (("action", "allocate"),))] == 0.01
    assert got[("kai_ray_cycle_step_duration_seconds_sum", (("step", "decide"),))] == 0.25
    assert got[("kai_ray_cycle_step_duration_seconds_count", (("step", "snapshot"),))] == 1


def test_a_deleted_queue_loses_its_series_at_the_next_cycle() -> None:
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry)
    cluster = two_teams()
    metrics.record_cycle(cluster.snapshot, cluster.result, ApplyReport(), 0.01, True)
    assert ("kai_ray_queue_quota", gpu("team-b")) in scrape(registry)
    lone = ClusterObjects(
        nodes=[make_node("n0").gpus(8).build()], queues=[make_queue("solo").build()]
    )
    snapshot = build_snapshot(lone)
    result = run_cycle(snapshot, SchedulerConfig(), 2, 101.0)
    metrics.record_cycle(snapshot, result, ApplyReport(), 0.01, True)
    got = scrape(registry)
    assert ("kai_ray_queue_quota", gpu("team-b")) not in got
    assert ("kai_ray_queue_quota", gpu("solo")) in got


def test_two_instances_on_one_registry_are_refused() -> None:
    registry = CollectorRegistry()
    SchedulerMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated"):
        SchedulerMetrics(registry)


REASONS = [
    pytest.param(
        "queue team-a is at its limit of 6 GPUs: it holds 4 and the job asks for 4",
        "queue-limit",
        id="a queue at its limit",
    ),
    pytest.param(
        "queue team-a would go over its quota of 4 GPUs with this non-preemptible job",
        "queue-quota",
        id="non-preemptible work over quota",
    ),
    pytest.param(
        "namespace ml may not use queue team-a (allowed: research)",
        "namespace",
        id="a namespace the queue does not admit",
    ),
    pytest.param(
        "gang of 4 does not fit: no rack has 8 free GPUs on 4 nodes; best rack has 6",
        "no-fit",
        id="a gang that does not fit",
    ),
    pytest.param("topology 'dc' does not exist", "topology", id="a missing topology"),
    pytest.param(
        "stale gang: 1 pods held for longer than the grace period while 2 are needed; evicted",
        "stale-gang",
        id="a stale gang",
    ),
    pytest.param("something new", OTHER_REASON, id="anything else is other"),
]


@pytest.mark.parametrize(("reason", "label"), REASONS)
def test_wait_reasons_become_a_few_label_values(reason: str, label: str) -> None:
    assert wait_reason(reason) == label


def test_a_gang_the_cycle_did_not_try_waits_as_not_tried() -> None:
    cluster = two_teams()
    result = CycleResult(
        plan=type(cluster.result.plan)(cycle=1), fair_shares=cluster.result.fair_shares
    )
    registry = CollectorRegistry()
    SchedulerMetrics(registry).record_cycle(cluster.snapshot, result, ApplyReport(), 0.01, True)
    got = scrape(registry)
    assert got[("kai_ray_gangs_waiting", (("queue", "team-b"), ("reason", NOT_TRIED)))] == 1
