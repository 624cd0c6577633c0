"""Prometheus metrics of the scheduler, recorded once per cycle (docs/metrics.md).

`SchedulerMetrics.record_cycle` takes what one cycle saw, decided and did (the
snapshot, the `CycleResult`, the binder's `ApplyReport`, how long it took) and
updates every metric: per-queue gauges (fair share, quota, limit, allocated,
requested, per resource), pods pending and gangs waiting, the cycle duration
histogram, counters of evictions, and the leader flag. Binds end in the back
as often as in the cycle: `count_bind` counts each as it ends. `set_leader`
keeps the flag true to life between cycles (a follower runs none).
`set_ray_backend` follows the Ray placement backend (connected or fallen back
to the local one: docs/placement.md). Per-queue
and per-reason gauges are rebuilt whole each cycle, so a deleted queue's
series go with it.

`process_metrics()` is the one instance on prometheus-client's default
registry (what the operator's metrics port serves); tests make their own on a
fresh `CollectorRegistry`. No I/O besides prometheus-client's own
bookkeeping (the HTTP server is started by the controller); the clock is read
only when the caller does not hand `now` in.
"""

from __future__ import annotations

import functools
import threading
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kai_ray.decisions.cycle import CycleResult
from kai_ray.decisions.fairness import limit_of, quota_of
from kai_ray.decisions.placement.ray_link import RayStatus
from kai_ray.decisions.plan import GroupStatus
from kai_ray.decisions.totals import leaf_requests
from kai_ray.effects.binder import ApplyReport, WriteResult
from kai_ray.state.queues import QueueTree
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.resources import CPU, GPU, MEMORY, Resources, canonical_name

PREFIX = "kai_ray"
#: The `unit` label of each resource (kube-state-metrics' convention); others: "integer".
UNITS = {CPU: "core", MEMORY: "byte", GPU: "gpu"}

#: Why a gang waits, as a small fixed set of label values (the full sentence is on
#: the PodGroup): the first class whose marker the reason contains.
WAIT_REASONS: tuple[tuple[str, str], ...] = (
    ("is at its limit of", "queue-limit"),
    ("would go over its quota", "queue-quota"),
    ("may not use queue", "namespace"),
    ("stale gang", "stale-gang"),
    ("topology", "topology"),
    ("does not fit", "no-fit"),
    ("fits pod", "no-fit"),
)
OTHER_REASON = "other"
#: A gang with members missing and no status from this cycle (it was not tried).
NOT_TRIED = "not-tried"

CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def wait_reason(reason: str) -> str:
    """The label value for a waiting gang's reason (see WAIT_REASONS)."""
    for marker, label in WAIT_REASONS:
        if marker in reason:
            return label
    return OTHER_REASON


def unit_of(resource: str) -> str:
    return UNITS.get(resource, "integer")


@dataclass(frozen=True)
class _Sample:
    labels: tuple[str, ...]
    value: float


@dataclass(frozen=True)
class _Family:
    name: str
    documentation: str
    label_names: tuple[str, ...]
    samples: tuple[_Sample, ...]

    def metric(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.label_names)
        for sample in self.samples:
            family.add_metric(list(sample.labels), sample.value)
        return family


class _CycleState(Collector):
    """Gauges whose label sets change from cycle to cycle: rebuilt whole each cycle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: tuple[_Family, ...] = ()

    def replace(self, families: Iterable[_Family]) -> None:
        with self._lock:
            self._families = tuple(families)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = self._families
        for family in families:
            yield family.metric()

    def describe(self) -> Iterator[Metric]:
        # Names only, so that the registry refuses a second collector of the same names.
        for name, (documentation, labels) in STATE_GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=labels)


class _RayAvailable(Collector):
    """`ray_backend_available`: no series until Ray is first tried (a scheduler whose
    placement is local by configuration has nothing to say), then 1 or 0."""

    NAME = f"{PREFIX}_ray_backend_available"
    HELP = "1 while the Ray placement backend answers, 0 while placement fell back to local."

    def __init__(self) -> None:
        self.value: float | None = None

    def collect(self) -> Iterator[Metric]:
        value = self.value
        if value is not None:
            yield GaugeMetricFamily(self.NAME, self.HELP, value=value)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP)


QUEUE_LABELS = ("queue", "resource", "unit")
#: The gauges rebuilt each cycle: name (after the prefix) -> (help, labels).
STATE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "queue_info": ("Every queue the scheduler knows, with its parent.", ("queue", "parent")),
    "queue_fair_share": ("The queue's fair share this cycle.", QUEUE_LABELS),
    "queue_quota": ("The queue's guaranteed quota (0 when unset).", QUEUE_LABELS),
    "queue_limit": ("The queue's limit; no series when it has none.", QUEUE_LABELS),
    "queue_allocated": ("What the queue's pods hold, this cycle's binds included.", QUEUE_LABELS),
    "queue_requested": ("What the queue's live pods ask for, bound or pending.", QUEUE_LABELS),
    "pods_pending": ("This scheduler's pods not bound after the cycle, by queue.", ("queue",)),
    "gangs_waiting": ("Gangs short of their minimum, by queue and reason.", ("queue", "reason")),
    "invalid_objects": ("Objects the snapshot left out as invalid, by kind.", ("kind",)),
}  # fmt: skip


class SchedulerMetrics:
    """Every metric of the scheduler on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = REGISTRY if registry is None else registry
        self.registry = registry
        self.cycle_seconds = Histogram(
            f"{PREFIX}_cycle_duration_seconds",
            "Time one scheduling cycle took: snapshot, decisions, binds, statuses.",
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )
        self.action_seconds = Histogram(
            f"{PREFIX}_action_duration_seconds",
            "Time one action of the cycle took.",
            ["action"],
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )
        self.step_seconds = Histogram(
            f"{PREFIX}_cycle_step_duration_seconds",
            "Time one step of the operator's cycle took: podgroups, snapshot, decide, "
            "bind, status.",
            ["step"],
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )
        self.cycles = Counter(f"{PREFIX}_cycles", "Scheduling cycles run.", registry=registry)
        self.last_cycle = Gauge(
            f"{PREFIX}_last_cycle_timestamp_seconds",
            "When the last cycle ended (Unix time).",
            registry=registry,
        )
        self.binds = Counter(f"{PREFIX}_binds", "Pods bound to a node.", registry=registry)
        self.bind_failures = Counter(
            f"{PREFIX}_bind_failures",
            "Binds planned but not made, by whether the next cycle may retry them.",
            ["outcome"],
            registry=registry,
        )
        self.evictions = Counter(
            f"{PREFIX}_evictions", "Pods evicted, by reason.", ["reason"], registry=registry
        )
        self.eviction_failures = Counter(
            f"{PREFIX}_eviction_failures",
            "Evictions planned but not made, by reason.",
            ["reason"],
            registry=registry,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader", "1 while this replica holds the leader Lease.", registry=registry
        )
        self.state = _CycleState()
        registry.register(self.state)
        self.ray_available = _RayAvailable()
        registry.register(self.ray_available)
        self.ray_fallbacks = Counter(
            f"{PREFIX}_ray_backend_fallbacks",
            "Times placement fell back from the Ray backend to the local one (Ray lost).",
            registry=registry,
        )
        self._fallbacks_counted = 0

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def set_ray_backend(self, status: RayStatus) -> None:
        """The Ray backend's availability, and the fallbacks since it was last told."""
        if not status.tried:
            return
        self.ray_available.value = 1.0 if status.available else 0.0
        if status.fallbacks > self._fallbacks_counted:
            self.ray_fallbacks.inc(status.fallbacks - self._fallbacks_counted)
            self._fallbacks_counted = status.fallbacks

    def record_cycle(
        self,
        snapshot: Snapshot,
        result: CycleResult,
        report: ApplyReport,
        seconds: float,
        leading: bool,
        *,
        now: float | None = None,
        action_seconds: Mapping[str, float] | None = None,
        step_seconds: Sequence[tuple[str, float]] = (),
    ) -> None:
        """Everything one cycle changed. `now` (Unix time) stamps the last cycle;
        `action_seconds` (per action name) when the cycle measured its actions;
        `step_seconds` (step, seconds) the operator's steps."""
        self.cycles.inc()
        self.cycle_seconds.observe(seconds)
        for action, spent in (action_seconds or {}).items():
            self.action_seconds.labels(action).observe(spent)
        for step, spent in step_seconds:
            self.step_seconds.labels(step).observe(spent)
        if now is None:
            self.last_cycle.set_to_current_time()
        else:
            self.last_cycle.set(now)
        self.set_leader(leading)
        self._count_writes(report)
        self.state.replace(cycle_families(snapshot, result, report))

    def count_bind(self, result: WriteResult) -> None:
        """One bind's outcome, whenever it is known (in the cycle or the back)."""
        if result.ok:
            self.binds.inc()
        else:
            self.bind_failures.labels(result.outcome.value).inc()

    def _count_writes(self, report: ApplyReport) -> None:
        """The cycle's evictions (binds are counted by `count_bind` as they end)."""
        for evict in report.evicted:
            self.evictions.labels(evict.reason).inc()
        for evict, _ in report.failed_evictions:
            self.eviction_failures.labels(evict.reason).inc()


@functools.cache
def process_metrics() -> SchedulerMetrics:
    """The operator's metrics, on the default registry (made once per process)."""
    return SchedulerMetrics()


# ------------------------------------------------------------ per-cycle gauges


def cycle_families(snapshot: Snapshot, result: CycleResult, report: ApplyReport) -> list[_Family]:
    """The gauges rebuilt each cycle, from what the cycle saw, decided and did."""
    tree = snapshot.queues
    demand = result.leaf_requests
    requested = _rolled_up(tree, leaf_requests(snapshot) if demand is None else demand)
    allocated = result.usage.allocated
    shares = result.fair_shares
    return [
        _family("queue_info", [_Sample((q, n.parent or ""), 1.0) for q, n in tree.nodes.items()]),
        _family("queue_fair_share", _per_resource(tree, lambda q, r: shares.get(q, _NONE)[r])),
        _family("queue_quota", _per_resource(tree, lambda q, r: quota_of(tree, q, r))),
        _family("queue_limit", _limits(tree)),
        _family("queue_allocated", _per_resource(tree, lambda q, r: allocated.get(q, _NONE)[r])),
        _family("queue_requested", _per_resource(tree, lambda q, r: requested.get(q, _NONE)[r])),
        _family("pods_pending", _tallied(_pending_by_queue(snapshot, report))),
        _family("gangs_waiting", _tallied(_waiting_gangs(snapshot, result.plan.statuses))),
        _family("invalid_objects", _tallied(Tally((p.obj.kind,) for p in snapshot.problems))),
    ]


_NONE = Resources()
#: A queue's amount of one resource.
_Value = Callable[[str, str], float]


def _family(name: str, samples: Iterable[_Sample]) -> _Family:
    documentation, labels = STATE_GAUGES[name]
    return _Family(f"{PREFIX}_{name}", documentation, labels, tuple(samples))


def _resources_of(tree: QueueTree, queue: str) -> list[str]:
    """The core resources, and any other the queue names (per-GPU-type keys included)."""
    named = [canonical_name(key) for key in tree[queue].spec.resources]
    return [CPU, MEMORY, GPU, *sorted(set(named) - {CPU, MEMORY, GPU})]


def _per_resource(tree: QueueTree, value: _Value) -> list[_Sample]:
    return [
        _Sample((queue, resource, unit_of(resource)), float(value(queue, resource)))
        for queue in tree.nodes
        for resource in _resources_of(tree, queue)
    ]


def _limits(tree: QueueTree) -> list[_Sample]:
    samples = _per_resource(tree, lambda q, r: limit_of(tree, q, r))
    return [sample for sample in samples if sample.value != float("inf")]


def _rolled_up(tree: QueueTree, per_leaf: Mapping[str, Resources]) -> dict[str, Resources]:
    totals: dict[str, Resources] = {}
    for leaf, amount in per_leaf.items():
        if leaf not in tree:
            continue
        for name in (leaf, *tree.ancestors(leaf)):
            totals[name] = totals.get(name, _NONE) + amount
    return totals


def _pending_by_queue(snapshot: Snapshot, report: ApplyReport) -> Tally[tuple[str, ...]]:
    bound = {bind.pod for bind in (*report.bound, *report.deferred)}
    tally: Tally[tuple[str, ...]] = Tally()
    for pod in snapshot.pending_pods:
        if pod.key not in bound:
            tally[(_queue_of(snapshot, pod.pod_group, pod.namespace),)] += 1
    return tally


def _queue_of(snapshot: Snapshot, group: str | None, namespace: str) -> str:
    state = snapshot.pod_groups.get(f"{namespace}/{group}") if group else None
    return state.queue if state is not None else ""


def _waiting_gangs(snapshot: Snapshot, statuses: Iterable[GroupStatus]) -> Tally[tuple[str, ...]]:
    """Gangs still short of their minimum, by queue and reason class. The last
    status of a group is the one its PodGroup shows."""
    last = {status.group: status for status in statuses}
    tally: Tally[tuple[str, ...]] = Tally()
    for key, group in snapshot.pod_groups.items():
        status = last.get(key)
        if not group.missing or (status is not None and status.admitted):
            continue
        reason = NOT_TRIED if status is None else wait_reason(status.reason)
        tally[(group.queue, reason)] += 1
    return tally


def _tallied(tally: Mapping[tuple[str, ...], int]) -> list[_Sample]:
    return [_Sample(labels, float(count)) for labels, count in sorted(tally.items())]
