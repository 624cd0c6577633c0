"""The simulation loop: the unchanged scheduling cycle on an in-memory cluster.

Time is virtual and event-driven. Events are submissions, completions, cluster
events (`kai_ray.sim.events`) and cycles; a cycle runs on the grid of the cycle
period at or after each event, and again one period later while it keeps
changing something (or at the time its plan asks to wake). The engine plays the
parts a cluster would: the workload controllers create pods (through
`kai_ray.workloads.expected_pods`) and create them again, pending, when they are evicted
or fail; binds take effect at once (pods run as kwok makes them run); a job runs
`duration` from the moment its whole gang is bound, and starts over when it loses
its gang; finished workloads release their pods. It plays the resource claim
controller too (`kai_ray.sim.claims`): claims from templates when pods are made,
released and deleted when they go. After each cycle that changed something,
`BindingLedger` checks the invariants. Nothing in the cycle knows it is
simulated. Same input, same output. No I/O.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.fairness import OverCommitment
from kai_ray.decisions.plan import Bind, Evict, Plan
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.usage import UsageState
from kai_ray.effects.binder import Binder
from kai_ray.effects.reporting import merge_condition
from kai_ray.sim.accounting import Amounts, QueueAccounting, add_into
from kai_ray.sim.claims import ClaimController, device_names
from kai_ray.sim.events import ClusterEvent
from kai_ray.sim.invariants import BindingLedger, Holding, InvariantViolation
from kai_ray.sim.loader import SimInput, explicit_ref, termination_grace
from kai_ray.sim.records import BindingRecord, JobRecord, QueueSample
from kai_ray.sim.writer import SimWriter
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, TOPOLOGY, ClusterCache
from kai_ray.state.dra_status import Consumer
from kai_ray.state.heap import long_lived_heap
from kai_ray.state.memo import json_copy
from kai_ray.state.snapshot import ClusterObjects, Snapshot
from kai_ray.values.api import Queue
from kai_ray.values.clock import SIM_EPOCH_S, VirtualClock, rfc3339
from kai_ray.values.config import SchedulerConfig, duration_seconds
from kai_ray.values.names import GPU_DEVICES_ANNOTATION, POD_GROUP_ANNOTATION
from kai_ray.values.resources import GPU
from kai_ray.workloads.pod_fields import gpu_share, pod_key, pod_node, pod_requests

# Same-time order: arrivals, departures, evicted pods gone, cluster events, then a cycle.
SUBMIT, COMPLETE, GONE, CLUSTER, CYCLE = 0, 1, 2, 3, 4

CycleFunction = Callable[[Snapshot, SchedulerConfig, int, float, UsageState | None], CycleResult]
Progress = Callable[[float], None]


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
    #: The pods as the input gives them (shared with it); copied into `pods` at
    #: submission, so a week of jobs is not held twice before it is submitted.
    templates: Sequence[Mapping[str, Any]]
    duration: float | None
    #: How long an evicted pod of the job holds its node before it is gone.
    grace: float = 0.0
    #: Bumped each time the job loses its gang, so that an old completion is ignored.
    epoch: int = 0
    running: bool = False
    pods: list[dict[str, Any]] = field(default_factory=list)


class Simulation:
    """One run. `run()` advances virtual time until nothing is left to happen."""

    def __init__(
        self, sim: SimInput, until: float | None = None, cycle: CycleFunction | None = None
    ) -> None:
        self.sim = sim
        self.config = sim.config
        self.period = duration_seconds(sim.config.spec.cyclePeriod)
        self.until = until
        # The cycle's sums over every group follow the cache's snapshots from cycle to cycle.
        self.cycle_fn = cycle or functools.partial(run_cycle, totals=GroupTotals())
        self.clock = VirtualClock()
        self.nodes = list(sim.nodes)
        self.queues: dict[str, Queue] = {q.metadata.name: q for q in sim.queues}
        self.pods: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, _Job] = {}
        self.bindings: dict[str, BindingRecord] = {}
        self.released: list[BindingRecord] = []
        self.accounting = QueueAccounting({n: q.spec.parentQueue for n, q in self.queues.items()})
        self.ledger = BindingLedger(self.nodes, sim.topologies)
        #: The one cluster state the operator also keeps, fed with every change.
        self.cache = ClusterCache(sim.config.spec.schedulerName, dra=sim.config.spec.dra)
        self.binder = Binder(SimWriter(self))
        self.cycles = 0
        #: The ResourceClaims, kept as the API server and the resource claim controller would.
        self.claims = ClaimController(
            sim.dra, self.cache, sim.config.spec.dra, cycle=lambda: self.cycles
        )
        #: How many times each pod key was created: a pod made again is a new pod (new uid).
        self._incarnations: dict[str, int] = {}
        self._node_index = {str(n["metadata"]["name"]): i for i, n in enumerate(self.nodes)}
        #: Decayed queue usage, carried from cycle to cycle as the operator persists it.
        self.usage: UsageState | None = None
        #: Quotas over-committed (the Queue's QuotaOverCommitted warning), each with
        #: the virtual time it was first seen.
        self.over_committed: dict[OverCommitment, float] = {}
        #: Evicted pods within their grace period (still on their node), with the
        #: eviction's reason; and, per group, the binds of the last plan waiting for
        #: the room those pods release (pipelined), applied when it is free.
        self.going: dict[str, str] = {}
        self.pipelined: dict[str, list[Bind]] = {}
        self._live: dict[str, _Job] = {}
        self._holdings: dict[str, Holding] = {}
        self._feed_cluster()
        dra = self.cache.dra_view()
        self.ledger.add_node_facts(dra.node_resources, dra.node_labels)
        self._events: list[_Event] = []
        self._seq = 0
        self._cycle_at: float | None = None
        self._schedule_submissions()
        for event in sim.events:
            self._push(event.at_s, CLUSTER, event)

    @property
    def samples(self) -> dict[str, list[QueueSample]]:
        return self.accounting.samples

    def horizon(self) -> float:
        """Where the progress bar ends: `until`, else the last scheduled event."""
        last = max((e.time for e in self._events), default=0.0)
        return self.until if self.until is not None else max(last, self.clock.now())

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
                pg = group.pod_group.model_dump(mode="json", exclude_none=True)
                kind = workload.ref.kind
                job = _new_job(pg, group_pods, kind, workload.submit_at, workload.duration)
                job.grace = termination_grace(workload.raw, workload.ref)
                self._push(workload.submit_at, SUBMIT, job)
        members = _members_by_group(d.raw for d in self.sim.member_pods)
        for explicit, submit_at, duration in self.sim.pod_groups:
            pg = explicit.model_dump(mode="json", exclude_none=True)
            named = (explicit.metadata.namespace or "default", explicit.metadata.name)
            pods = members.get(named, [])
            job = _new_job(pg, pods, "PodGroup", submit_at, duration)
            job.grace = termination_grace(pg, explicit_ref(explicit))
            self._push(submit_at, SUBMIT, job)

    def run(self, progress: Progress | None = None) -> None:
        with long_lived_heap():
            self._run(progress)

    def _run(self, progress: Progress | None) -> None:
        while self._events:
            event = heapq.heappop(self._events)
            if self.until is not None and event.time > self.until:
                break
            self.clock.advance_to(event.time)
            if event.order == SUBMIT:
                self._submit(event.payload)
            elif event.order == COMPLETE:
                self._complete(*event.payload)
            elif event.order == GONE:
                self._gone(*event.payload)
            elif event.order == CLUSTER:
                self._apply_cluster_event(event.payload)
            elif event.time == self._cycle_at:
                self._cycle_at = None
                self._run_cycle()
                if progress is not None:
                    progress(event.time)

    def end_time(self) -> float:
        return self.clock.now()

    # ------------------------------------------------------------- handlers

    def _submit(self, job: _Job) -> None:
        now = self.clock.now()
        stamp = _timestamp(now)
        job.group["metadata"]["creationTimestamp"] = stamp
        job.pods = [json_copy(pod) for pod in job.templates]
        for pod in job.pods:
            pod.setdefault("metadata", {})["creationTimestamp"] = stamp
            self._created(pod)
            self.pods[pod_key(pod)] = pod
            self.cache.upsert(pod, POD)
            if pod_node(pod) is not None:  # bound by another scheduler already
                self._hold(pod_key(pod), Holding(str(pod_node(pod)), pod_requests(pod)))
        self.jobs[job.group_key] = self._live[job.group_key] = job
        self.cache.upsert(job.group, POD_GROUP)
        self._account(job)
        self._schedule_cycle(now)

    def _complete(self, group_key: str, epoch: int) -> None:
        job = self.jobs[group_key]
        if epoch != job.epoch or job.record.finished_s is not None:
            return
        now = self.clock.now()
        job.record.finished_s = now
        job.record.reason = None
        for pod in job.pods:
            self._release(pod_key(pod), now, "completed")
            self.claims.pod_gone(pod)
            self._forget_pod(pod_key(pod))
            pod.setdefault("status", {})["phase"] = "Succeeded"
        # The report reads a finished job's record alone: its pods go (a week of
        # finished jobs would otherwise hold every pod it ever made).
        job.pods, job.templates = [], ()
        del self._live[group_key]
        self.cache.delete(POD_GROUP, group_key)
        self.accounting.remove_job(group_key)
        self._schedule_cycle(now)

    def _release(self, key: str, now: float, reason: str) -> None:
        record = self.bindings.pop(key, None)
        if record is not None:
            record.released_s = now
            record.release_reason = reason
            self.released.append(record)
        holding = self._holdings.pop(key, None)
        if holding is not None:
            self.ledger.release(holding)

    def _forget_pod(self, key: str) -> None:
        self.pods.pop(key, None)
        self.cache.delete(POD, key)

    def _recreate(self, key: str, now: float, reason: str) -> None:
        """The pod is gone (evicted, failed); its controller creates it again, pending."""
        pod = self.pods.get(key)
        self.going.pop(key, None)
        if pod is not None:
            pod["metadata"].pop("deletionTimestamp", None)
        self._release(key, now, reason)
        if pod is not None:
            self.claims.pod_gone(pod)
        if pod is None or pod["spec"].get("schedulerName") not in (None, self._scheduler):
            return
        pod["spec"].pop("nodeName", None)
        pod["metadata"].get("annotations", {}).pop(GPU_DEVICES_ANNOTATION, None)
        pod["metadata"]["creationTimestamp"] = _timestamp(now)
        pod.setdefault("status", {})["phase"] = "Pending"
        self._created(pod)
        self.cache.upsert(pod, POD)

    def _created(self, pod: dict[str, Any]) -> None:
        """A pod is made (or made again): a uid of its own, and the claims of its templates."""
        self._give_uid(pod)
        self.claims.pod_created(pod)

    def _give_uid(self, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        count = self._incarnations[key] = self._incarnations.get(key, 0) + 1
        meta = pod.setdefault("metadata", {})
        if count > 1 or not meta.get("uid"):
            meta["uid"] = str(uuid.uuid5(_UID_NAMESPACE, f"{key}#{count}"))

    @property
    def _scheduler(self) -> str:
        return self.config.spec.schedulerName

    # --------------------------------------------------------------- cycles

    def objects(self) -> ClusterObjects:
        return self.cache.objects()

    def _run_cycle(self) -> None:
        now = self.clock.now()
        self.cycles += 1
        snapshot = self.cache.snapshot()
        # The cycle sees Unix time, as in a cluster; objects' timestamps count from the same epoch.
        result = self.cycle_fn(snapshot, self.config, self.cycles, SIM_EPOCH_S + now, self.usage)
        self.usage = result.usage
        self.cache.set_usage(result.usage.queues)
        # The binder applies the plan as in a cluster: evictions, binds, statuses; binds
        # onto room that evicted pods still hold wait for it (pipelined).
        plan = self._pipeline(result.plan)
        self.binder.apply(plan, snapshot, SIM_EPOCH_S + now)
        touched = self._touched_jobs(plan.binds, plan.evictions)
        self._update_jobs(touched, result, now)
        changed = bool(plan.binds or plan.evictions)
        if changed:
            self._check_invariants(touched)
            self._schedule_cycle(now + self.period)
        if result.plan.wake_at is not None:
            self._schedule_cycle(max(result.plan.wake_at - SIM_EPOCH_S, now + self.period))
        self.accounting.sample(now, result.fair_shares)
        for found in result.over_committed:
            self.over_committed.setdefault(found, now)

    def _bind(self, bind: Bind, now: float) -> None:
        pod = self.pods[bind.pod]
        claims = self.claims.pod_claim_keys(pod)
        self._check_claims_reach(bind, claims)
        pod.setdefault("spec", {})["nodeName"] = bind.node
        if bind.gpu_devices:
            devices = ",".join(str(d) for d in bind.gpu_devices)
            pod["metadata"].setdefault("annotations", {})[GPU_DEVICES_ANNOTATION] = devices
        pod.setdefault("status", {}).update(phase="Running", startTime=_timestamp(now))
        self.cache.upsert(pod, POD)
        # A claim's devices count with the pod whose bind allocated it (a shared claim once).
        claimed = self.claims.allocation_resources(bind.claims)
        asked = pod_requests(pod)
        requests = asked + {GPU: bind.gpu_fraction} + claimed
        self.bindings[bind.pod] = BindingRecord(
            name=pod["metadata"]["name"],
            namespace=pod["metadata"].get("namespace") or "default",
            job=bind.group,
            node=bind.node,
            requests=requests,
            gpu_devices=list(bind.gpu_devices),
            bound_s=now,
            claims=[
                {"name": key, "devices": device_names(self.claims.claims[key])} for key in claims
            ],
        )
        holding = Holding(bind.node, asked + claimed, bind.gpu_devices, bind.gpu_fraction)
        self._hold(bind.pod, holding)

    def _check_claims_reach(self, bind: Bind, claims: Sequence[str]) -> None:
        """Invariant: every claim of a pod bound to a node is allocated, to devices the
        node can use."""
        if not claims:
            return
        node = self.nodes[self._node_index[bind.node]] if bind.node in self._node_index else {}
        labels = dict(node.get("metadata", {}).get("labels") or {})
        for key in claims:
            raw = self.claims.claims[key]
            if not (raw.get("status") or {}).get("allocation"):
                rule = f"bound to {bind.node} with ResourceClaim {key} not allocated"
                raise InvariantViolation(self.cycles, f"Pod {bind.pod}", rule)
            selector = self.claims.node_selector(key)
            if selector is not None and not selector.matches(bind.node, labels):
                rule = f"bound to {bind.node}, which cannot use the devices of ResourceClaim {key}"
                raise InvariantViolation(self.cycles, f"Pod {bind.pod}", rule)

    def _write_claims(self, bind: Bind) -> None:
        """The claim writes the binder makes before a bind, for a bind applied later."""
        pod = self.pods[bind.pod]
        consumer = Consumer(pod["metadata"]["name"], str(pod["metadata"].get("uid") or ""))
        for claim in bind.claims:
            self.claims.write(claim.namespace, claim.name, claim, consumer)

    def _hold(self, key: str, holding: Holding) -> None:
        self._holdings[key] = holding
        self.ledger.hold(holding)

    def _touched_jobs(self, binds: Iterable[Bind], evictions: Iterable[Evict]) -> list[_Job]:
        keys = dict.fromkeys([b.group for b in binds] + [e.group for e in evictions])
        return [self.jobs[key] for key in keys if key in self.jobs]

    def _update_jobs(self, touched: list[_Job], result: CycleResult, now: float) -> None:
        for job in touched:
            self._follow_gang(job, now)
        for status in result.plan.statuses:
            waiting = self._live.get(status.group)
            if waiting is not None and not waiting.running:
                waiting.record.reason = status.reason

    def _follow_gang(self, job: _Job, now: float) -> None:
        """Start the job's clock when its gang is whole; stop it when the gang breaks."""
        record = job.record
        whole = self._bound_count(job) >= max(record.min_member, 1)
        if whole and not job.running:
            job.running = True
            record.admitted_s = record.admitted_s if record.admitted_s is not None else now
            record.started_s = record.started_s if record.started_s is not None else now
            record.reason = None
            if job.duration is not None:
                self._push(now + job.duration, COMPLETE, (job.group_key, job.epoch))
        elif not whole and job.running:
            job.running = False
            job.epoch += 1
        self._account(job)

    def _bound_count(self, job: _Job) -> int:
        return sum(1 for p in job.pods if pod_key(p) in self.bindings)

    def _check_invariants(self, touched: list[_Job]) -> None:
        self.ledger.check_nodes(self.cycles)
        for job in touched:
            # Every member holding a node counts, those bound before the run began too
            # (a snapshot of a live cluster): growing a whole gang is not breaking it.
            # A pod within its grace is leaving: the eviction has broken the gang already.
            held = [pod_key(p) for p in job.pods if pod_key(p) not in self.going]
            nodes = [h.node for key in held if (h := self._holdings.get(key))]
            min_member = job.record.min_member
            self.ledger.check_gang(self.cycles, job.group_key, min_member, nodes, job.group)

    def _account(self, job: _Job) -> None:
        allocated: Amounts = {}
        requested: Amounts = {}
        counted: set[str] = set()  # a claim the pods share counts once
        for pod in job.pods:
            binding = self.bindings.get(pod_key(pod))
            claims = [k for k in self.claims.pod_claim_keys(pod) if k not in counted]
            counted.update(claims)
            if binding is not None:
                add_into(requested, binding.requests)
                add_into(allocated, binding.requests)
                continue
            pending = [k for k in claims if not self.claims.is_allocated(k)]
            add_into(requested, _pending_requests(pod))
            add_into(requested, dict(self.claims.resources(pending).items()))
        self.accounting.set_job(job.group_key, job.record.queue, allocated, requested)

    # ------------------------------------------------------- cluster events

    def _apply_cluster_event(self, event: ClusterEvent) -> None:
        from kai_ray.sim.cluster_events import apply_cluster_event

        apply_cluster_event(self, event, self.clock.now())
        self._schedule_cycle(self.clock.now())

    def _feed_cluster(self) -> None:
        """The cluster as the operator's watches would first list it."""
        for node in self.nodes:
            self.cache.upsert(node, NODE)
        for queue in self.queues.values():
            self.cache.upsert(queue.model_dump(mode="json", exclude_none=True), QUEUE)
        for topology in self.sim.topologies:
            self.cache.upsert(topology.model_dump(mode="json", exclude_none=True), TOPOLOGY)
        for pod in self.sim.held_pods:
            self._give_uid(pod)  # its claims are read as given: it is bound already
            self.cache.upsert(pod, POD)
            self._hold(pod_key(pod), Holding(str(pod_node(pod)), pod_requests(pod)))

    def set_queue(self, queue: Queue) -> None:
        self.queues[queue.metadata.name] = queue
        self.accounting.parents[queue.metadata.name] = queue.spec.parentQueue
        self.cache.upsert(queue.model_dump(mode="json", exclude_none=True), QUEUE)

    def set_node(self, index: int, node: dict[str, Any]) -> None:
        self.nodes[index] = node
        self.cache.upsert(node, NODE)

    def persist_group_status(self, group: str, condition: dict[str, str]) -> None:
        """Keep a condition the plan states on the PodGroup, as the operator's binder
        does, so that the next cycle's snapshot reads it back."""
        job = self._live.get(group)
        if job is None:
            return
        status = job.group.setdefault("status", {})
        status["conditions"] = merge_condition(status.get("conditions"), condition)
        self.cache.upsert(job.group, POD_GROUP)

    def persist_nominations(self, group: str, nodes: tuple[str, ...]) -> None:
        """Keep where the group's recreated pods should go on the PodGroup (cleared
        when empty), as the operator's binder does."""
        job = self._live.get(group)
        if job is None:
            return
        status = job.group.setdefault("status", {})
        if nodes:
            status["nominatedNodes"] = list(nodes)
        else:
            status.pop("nominatedNodes", None)
        self.cache.upsert(job.group, POD_GROUP)

    def evict(self, evict: Evict) -> None:
        """Evicted: a pod whose job has a termination grace keeps its node for that
        long, marked as being deleted (the cycle pipelines onto its room); then it
        is gone and its controller creates it again."""
        now, job = self.clock.now(), self.jobs.get(evict.group)
        if evict.pod in self.going:
            return  # already going: evicting it again changes nothing
        pod = self.pods.get(evict.pod)
        if job is None or job.grace <= 0 or pod is None or evict.pod not in self.bindings:
            self._recreate(evict.pod, now, evict.reason)
            return
        pod["metadata"]["deletionTimestamp"] = _timestamp(now)
        self.cache.upsert(pod, POD)
        self.going[evict.pod] = evict.reason
        self._push(now + job.grace, GONE, (evict.pod, evict.group))

    def _gone(self, key: str, group: str) -> None:
        """An evicted pod's grace is over: it releases its node, and the binds that
        waited for the room are applied."""
        reason, now = self.going.get(key), self.clock.now()
        if reason is None:
            return  # gone already (its job finished, its node went down)
        self._recreate(key, now, reason)
        # A job that finished within the pod's grace is not followed again: it would
        # be counted as asking for its pods once more.
        touched = [self._live[group]] if group in self._live else []
        touched += self._bind_pipelined(now)
        for job in touched:
            self._follow_gang(job, now)
        self._check_invariants(touched)
        self._schedule_cycle(now)

    def _pipeline(self, plan: Plan) -> Plan:
        """The plan with the binds it can apply now; a group's binds that need room
        evicted pods still hold wait, whole, in `pipelined` (the last plan's only)."""
        self.pipelined.clear()
        freed = [self._holdings[e.pod] for e in plan.evictions if self._freed_at_once(e)]
        going = {self._holdings[k].node for k in self.going if k in self._holdings}
        going |= {self._holdings[e.pod].node for e in plan.evictions if e.pod in self._holdings}
        taken: list[Holding] = []
        by_group: dict[str, list[Bind]] = {}
        for bind in plan.binds:
            by_group.setdefault(bind.group, []).append(bind)
        now: list[Bind] = []
        claimed = self._devices_of_going(plan.evictions)
        for group, binds in by_group.items():
            adding = [*taken, *map(self._holding_of, binds)]
            devices_free = not claimed & _new_devices(binds)
            if devices_free and (
                self.ledger.fits(adding, freed) or not going & {b.node for b in binds}
            ):
                now.extend(binds)
                taken = adding
            else:
                self.pipelined[group] = binds
        return dataclasses.replace(plan, binds=now)

    def _devices_of_going(self, evictions: Iterable[Evict]) -> set[Any]:
        """Devices still held by claims of pods that are going (within their grace, or
        evicted now with a grace): they are free only once those pods are gone."""
        keys = set(self.going) | {e.pod for e in evictions if not self._freed_at_once(e)}
        uids = {str(self.pods[k]["metadata"].get("uid")) for k in keys if k in self.pods}
        return self.claims.devices_reserved_by(uids) if uids else set()

    def _freed_at_once(self, evict: Evict) -> bool:
        job = self.jobs.get(evict.group)
        gone_now = job is None or job.grace <= 0
        return gone_now and evict.pod in self._holdings and evict.pod not in self.going

    def _holding_of(self, bind: Bind) -> Holding:
        requests = pod_requests(self.pods[bind.pod]) + self.claims.allocation_resources(bind.claims)
        return Holding(bind.node, requests, bind.gpu_devices, bind.gpu_fraction)

    def _bind_pipelined(self, now: float) -> list[_Job]:
        """The pipelined groups whose room is free now, bound (in plan order)."""
        bound = []
        for group, binds in list(self.pipelined.items()):
            live = [b for b in binds if b.pod in self.pods and b.pod not in self.bindings]
            if len(live) < len(binds) or not self.ledger.fits([self._holding_of(b) for b in live]):
                continue
            if self._devices_of_going(()) & _new_devices(live):
                continue
            del self.pipelined[group]
            for bind in live:
                self._write_claims(bind)
                self._bind(bind, now)
            if group in self.jobs:
                bound.append(self.jobs[group])
        return bound

    def bind(self, bind: Bind) -> None:
        self._bind(bind, self.clock.now())

    def fail_pod(self, key: str, reason: str) -> None:
        """A bound pod fails: released with `reason`, created again pending; its job follows."""
        record = self.bindings.get(key)
        if record is None:
            return
        self._recreate(key, self.clock.now(), reason)
        job = self.jobs.get(record.job)
        if job is not None:
            self._follow_gang(job, self.clock.now())


#: Pod uids are UUIDs derived from the pod's key and how many times it was made.
_UID_NAMESPACE = uuid.UUID("6b2e4f0a-3c1d-5e8f-9a7b-2c4d6e8f0a1b")


def _new_devices(binds: Iterable[Bind]) -> set[Any]:
    """The devices these binds' claims allocate that were free."""
    return {d.ref for b in binds for c in b.claims if c.new for d in c.devices}


def _pending_requests(pod: Mapping[str, Any]) -> Amounts:
    """A waiting pod's requests, its GPU share counted when it is a plain fraction."""
    share = gpu_share(pod)
    fraction = share.fraction if share is not None and share.fraction is not None else 0.0
    return dict(pod_requests(pod) + {GPU: fraction})


def _members_by_group(
    pods: Iterable[Mapping[str, Any]],
) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The member pods of explicit PodGroups by (namespace, group name), in input
    order: one pass, so a snapshot of thousands of PodGroups loads in linear time."""
    members: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        named = annotations.get(POD_GROUP_ANNOTATION, annotations.get("pod-group-name"))
        if named is not None:
            members.setdefault((meta.get("namespace") or "default", named), []).append(pod)
    return members


def _new_job(
    pg: dict[str, Any],
    pods: Sequence[Mapping[str, Any]],
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
    """An RFC 3339 time on the virtual clock (which starts at SIM_EPOCH_S)."""
    return rfc3339(SIM_EPOCH_S + seconds)
