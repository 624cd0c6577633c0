"""The simulation loop: the unchanged scheduling cycle on an in-memory cluster.

Time is virtual and event-driven. Events are submissions, completions and
cycles; a cycle runs on the grid of the cycle period at or after each event,
and again one period later while it keeps changing something. The engine
plays the parts a cluster would: the workload controllers create pods (through
`kai_ray.sim.controllers`), binds take effect at once (pods run as kwok makes
them run), and finished workloads release their pods. Nothing in the cycle
knows it is simulated. Same input, same output. No I/O.
"""

from __future__ import annotations

import copy
import datetime as dt
import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.plan import Bind, Evict
from kai_ray.decisions.usage import UsageState
from kai_ray.sim.invariants import check_invariants
from kai_ray.sim.loader import SimInput
from kai_ray.sim.records import BindingRecord, JobRecord, QueueSample
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.api import PodGroup
from kai_ray.values.clock import VirtualClock
from kai_ray.values.config import SchedulerConfig, duration_seconds
from kai_ray.values.names import GPU_DEVICES_ANNOTATION, POD_GROUP_ANNOTATION
from kai_ray.values.resources import GPU, Resources
from kai_ray.workloads.pods import gpu_share, pod_key, pod_requests

SUBMIT, COMPLETE, CYCLE = 0, 1, 2  # same-time order: arrivals, then departures, then a cycle

CycleFunction = Callable[[Snapshot, SchedulerConfig, int, float, UsageState | None], CycleResult]


@dataclass(order=True)
class _Event:
    time: float
    order: int
    seq: int
    payload: Any = field(compare=False)


@dataclass
class _Job:
    record: JobRecord
    group_key: str
    group: dict[str, Any]
    pods: list[dict[str, Any]]
    duration: float | None


class Simulation:
    """One run. `run()` advances virtual time until nothing is left to happen."""

    def __init__(
        self, sim: SimInput, until: float | None = None, cycle: CycleFunction = run_cycle
    ) -> None:
        self.sim = sim
        self.config = sim.config
        self.period = duration_seconds(sim.config.spec.cyclePeriod)
        self.until = until
        self.cycle_fn = cycle
        self.clock = VirtualClock()
        self.pods: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, _Job] = {}
        self.bindings: dict[str, BindingRecord] = {}
        self.released: list[BindingRecord] = []
        self.samples: dict[str, list[QueueSample]] = {q.metadata.name: [] for q in sim.queues}
        self._parents = {q.metadata.name: q.spec.parentQueue for q in sim.queues}
        self.cycles = 0
        #: Decayed queue usage, carried from cycle to cycle as the operator persists it.
        self.usage: UsageState | None = None
        self._events: list[_Event] = []
        self._seq = 0
        self._cycle_at: float | None = None
        self._schedule_submissions()

    # ---------------------------------------------------------------- events

    def _push(self, time: float, order: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, _Event(time, order, self._seq, payload))

    def _schedule_cycle(self, after: float) -> None:
        at = math.ceil(after / self.period - 1e-9) * self.period
        if self._cycle_at is None or at < self._cycle_at:
            self._cycle_at = at
            self._push(at, CYCLE, at)

    def _schedule_submissions(self) -> None:
        for workload in self.sim.workloads:
            for group, group_pods in zip(workload.groups, workload.pods, strict=True):
                pods = [copy.deepcopy(pod) for pod in group_pods]
                pg = group.pod_group.model_dump(mode="json", exclude_none=True)
                job = _new_job(pg, pods, workload.ref.kind, workload.submit_at, workload.duration)
                self._push(workload.submit_at, SUBMIT, job)
        for explicit, submit_at, duration in self.sim.pod_groups:
            pg = explicit.model_dump(mode="json", exclude_none=True)
            pods = [
                copy.deepcopy(dict(d.raw))
                for d in self.sim.member_pods
                if _member_of(d.raw, explicit)
            ]
            self._push(submit_at, SUBMIT, _new_job(pg, pods, "PodGroup", submit_at, duration))

    def run(self) -> None:
        while self._events:
            event = heapq.heappop(self._events)
            if self.until is not None and event.time > self.until:
                break
            self.clock.advance_to(event.time)
            if event.order == SUBMIT:
                self._submit(event.payload)
            elif event.order == COMPLETE:
                self._complete(event.payload)
            elif event.time == self._cycle_at:
                self._cycle_at = None
                self._run_cycle()

    def end_time(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------- handlers

    def _submit(self, job: _Job) -> None:
        now = self.clock.now()
        stamp = _timestamp(now)
        job.group["metadata"]["creationTimestamp"] = stamp
        for pod in job.pods:
            pod.setdefault("metadata", {})["creationTimestamp"] = stamp
            self.pods[pod_key(pod)] = pod
        self.jobs[job.group_key] = job
        self._schedule_cycle(now)

    def _complete(self, group_key: str) -> None:
        job = self.jobs[group_key]
        now = self.clock.now()
        job.record.finished_s = now
        job.record.reason = None
        for pod in job.pods:
            self._release(pod_key(pod), now, "completed")
            pod.setdefault("status", {})["phase"] = "Succeeded"
        self._schedule_cycle(now)

    def _release(self, key: str, now: float, reason: str) -> None:
        record = self.bindings.pop(key, None)
        if record is not None:
            record.released_s = now
            record.release_reason = reason
            self.released.append(record)
        self.pods.pop(key, None)

    # --------------------------------------------------------------- cycles

    def objects(self) -> ClusterObjects:
        live_groups = [j.group for j in self.jobs.values() if j.record.finished_s is None]
        return ClusterObjects(
            nodes=self.sim.nodes,
            pods=list(self.pods.values()),
            pod_groups=live_groups,
            queues=[q.model_dump(mode="json", exclude_none=True) for q in self.sim.queues],
            topologies=[t.model_dump(mode="json", exclude_none=True) for t in self.sim.topologies],
            usage=self.usage.queues if self.usage is not None else {},
        )

    def _run_cycle(self) -> None:
        now = self.clock.now()
        self.cycles += 1
        snapshot = build_snapshot(self.objects())
        result = self.cycle_fn(snapshot, self.config, self.cycles, now, self.usage)
        self.usage = result.usage
        for evict in result.plan.evictions:
            self._evict(evict, now)
        for bind in result.plan.binds:
            self._bind(bind, now)
        self._update_jobs(result, now)
        changed = bool(result.plan.binds or result.plan.evictions)
        if changed:
            check_invariants(build_snapshot(self.objects()), self.cycles, self.jobs_by_group())
            self._schedule_cycle(now + self.period)
        if result.plan.wake_at is not None:
            self._schedule_cycle(max(result.plan.wake_at, now + self.period))
        self._sample_queues(result, now, changed)

    def _bind(self, bind: Bind, now: float) -> None:
        pod = self.pods[bind.pod]
        pod.setdefault("spec", {})["nodeName"] = bind.node
        if bind.gpu_devices:
            devices = ",".join(str(d) for d in bind.gpu_devices)
            pod["metadata"].setdefault("annotations", {})[GPU_DEVICES_ANNOTATION] = devices
        pod.setdefault("status", {})["phase"] = "Running"
        self.bindings[bind.pod] = BindingRecord(
            name=pod["metadata"]["name"],
            namespace=pod["metadata"].get("namespace") or "default",
            job=bind.group,
            node=bind.node,
            requests=pod_requests(pod) + {GPU: bind.gpu_fraction},
            gpu_devices=list(bind.gpu_devices),
            bound_s=now,
        )

    def _evict(self, evict: Evict, now: float) -> None:
        self._release(evict.pod, now, evict.reason)

    def _update_jobs(self, result: CycleResult, now: float) -> None:
        statuses = {status.group: status for status in result.plan.statuses}
        for key, job in self.jobs.items():
            record = job.record
            if record.finished_s is not None:
                continue
            running = sum(1 for p in job.pods if pod_key(p) in self.bindings)
            if record.started_s is None and running >= max(record.min_member, 1):
                record.admitted_s = record.admitted_s if record.admitted_s is not None else now
                record.started_s = now
                record.reason = None
                if job.duration is not None:
                    self._push(now + job.duration, COMPLETE, key)
            status = statuses.get(key)
            if record.started_s is None and status is not None:
                record.reason = status.reason

    def _queue_path(self, leaf: str) -> list[str]:
        return _queue_path_of(self._parents, leaf)

    def jobs_by_group(self) -> Mapping[str, JobRecord]:
        return {key: job.record for key, job in self.jobs.items()}

    def _sample_queues(self, result: CycleResult, now: float, changed: bool) -> None:
        allocated: dict[str, Resources] = {}
        requested: dict[str, Resources] = {}
        for job in self.jobs.values():
            if job.record.finished_s is not None:
                continue
            for pod in job.pods:
                binding = self.bindings.get(pod_key(pod))
                amount = binding.requests if binding else _pending_requests(pod)
                for queue in self._queue_path(job.record.queue):
                    requested[queue] = requested.get(queue, Resources()) + amount
                    if binding is not None:
                        allocated[queue] = allocated.get(queue, Resources()) + amount
        for name, series in self.samples.items():
            sample = QueueSample(
                t_s=now,
                allocated=allocated.get(name, Resources()),
                requested=requested.get(name, Resources()),
                fair_share=result.fair_shares.get(name, Resources()),
            )
            if not series or not series[-1].same_values(sample):
                series.append(sample)


def _queue_path_of(parents: Mapping[str, str | None], leaf: str) -> list[str]:
    """The leaf and its ancestors, leaf first."""
    path = [leaf]
    while (parent := parents.get(path[-1])) is not None and parent not in path:
        path.append(parent)
    return path


def _pending_requests(pod: Mapping[str, Any]) -> Resources:
    """A waiting pod's requests, its GPU share counted when it is a plain fraction."""
    share = gpu_share(pod)
    fraction = share.fraction if share is not None and share.fraction is not None else 0.0
    return pod_requests(pod) + {GPU: fraction}


def _member_of(pod: Mapping[str, Any], group: PodGroup) -> bool:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    named = annotations.get(POD_GROUP_ANNOTATION, annotations.get("pod-group-name"))
    same_ns = (meta.get("namespace") or "default") == (group.metadata.namespace or "default")
    return named == group.metadata.name and same_ns


def _new_job(
    pg: dict[str, Any],
    pods: list[dict[str, Any]],
    kind: str,
    submit_at: float,
    duration: float | None,
) -> _Job:
    meta = pg["metadata"]
    meta.setdefault("namespace", "default")
    key = f"{meta['namespace']}/{meta['name']}"
    record = JobRecord(
        name=meta["name"],
        namespace=meta["namespace"],
        kind=kind,
        queue=pg["spec"]["queue"],
        min_member=int(pg["spec"].get("minMember", 1)),
        submitted_s=submit_at,
    )
    return _Job(record, key, pg, pods, duration)


def _timestamp(seconds: float) -> str:
    """An RFC 3339 time on the virtual clock (origin 2026-01-01T00:00:00Z)."""
    origin = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    moment = origin + dt.timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"
