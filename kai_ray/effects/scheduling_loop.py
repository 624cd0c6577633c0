"""The operator's scheduling loop: watches feed the cache; cycles run; the binder applies.

    informers (one thread per kind) --events--> ClusterCache (under a lock)
    loop thread, every cycle period while leading:
      1. PodGroups for new workloads (derived, owned by the workload; an
         existing PodGroup is never overwritten);
      2. the snapshot, then `run_cycle`: the same cycle the simulator runs;
      3. the binder applies the plan (evictions, gate lifts, binds in
         parallel with a live room check, statuses); binds are assumed in the
         cache until the watch shows them;
      4. PodGroup and Queue statuses written where they changed, with Events;
         the Ray placement backend's state told when it changed (`ray_report`).

The loop knows no kopf: the controller starts and stops it. A cycle runs when
something changed (not our own PodGroup and Queue statuses coming back through
the watch: they are kept, and the next cycle reads them), when the plan asked
to wake, or at least every `idle_cycle_s` (usage keeps decaying). Nothing here
raises out of a cycle: a broken cycle is logged and the next one tries again.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.placement import ray_link
from kai_ray.decisions.plan import Bind, GroupStatus, Plan
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.usage import UsageState
from kai_ray.effects.binder import DONE, ApplyReport, Binder, Outcome, WriteResult
from kai_ray.effects.kube import (
    WATCHED,
    Informer,
    KubeWriter,
    LeaseElector,
    Rest,
    Urgency,
    WriteBacklog,
)
from kai_ray.effects.metrics import process_metrics
from kai_ray.effects.ray_report import RayReport
from kai_ray.effects.reporting import merge_condition, problems_condition
from kai_ray.effects.status import pod_group_status, queue_statuses, waits_for_its_pods
from kai_ray.state.cache import POD, POD_GROUP, QUEUE, ClusterCache, object_key
from kai_ray.state.groups import PodGroupState
from kai_ray.state.heap import long_lived_heap, settle
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.api import Phase
from kai_ray.values.clock import Clock, WallClock, rfc3339
from kai_ray.values.config import SchedulerConfig, duration_seconds
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import POD_GROUP_ANNOTATION
from kai_ray.workloads.grouping import derive_groups
from kai_ray.workloads.membership import (
    RAY_CLUSTER_LABEL,
    as_written,
    needs_derived_group,
    owner_of_kind,
    with_membership,
    with_owner_queue,
)

LOG = logging.getLogger("kai_ray.loop")
LEASE = "Lease"
WORKLOAD_KINDS = ("Job", "RayCluster", "RayJob", "Pod", "PodGang")


@dataclass
class LoopOptions:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    leader_elect: bool = True
    lease_namespace: str = "kube-system"
    lease_name: str = "kai-ray"
    identity: str = "kai-ray"
    #: Bind writer threads: 32 bound a burst of 4,000 pods in 0.72 of the time 16
    #: took (docs/benchmarks.md); binds wait on the API server, not the interpreter.
    bind_parallelism: int = 32
    #: Threads for PodGroup creations, statuses and Events (`WriteBacklog`).
    bookkeeping_parallelism: int = 4
    eviction_wait_s: float = 20.0
    idle_cycle_s: float = 10.0
    assume_ttl_s: float = 30.0
    #: How long a cycle goes on placing once it has placed `HAND_OVER_AT` pods, before
    #: it hands its binds over and starts the next (`run_cycle`'s `time_up`): in a
    #: burst of thousands of new pods the writers start binding after this, not
    #: after the whole burst is decided.
    placement_budget_s: float = 3.0
    #: ...and sooner, once it has placed that long, while the bind writers have
    #: fewer than `bind_parallelism` binds to make: the writers never wait for a
    #: cycle that has binds for them (a burst's first binds go out in about a
    #: second, not after its first cycle's whole budget).
    idle_writers_budget_s: float = 0.25
    #: A PodGroup's status is written once it has settled this long (`WriteBacklog`):
    #: a gang of a burst goes Admitted, bound and Running within about a second, and
    #: `kubectl get podgroups` a second late is as good.
    status_settle_s: float = 1.0


class SchedulingLoop:
    def __init__(self, rest: Rest, options: LoopOptions, clock: Clock | None = None) -> None:
        self.rest, self.options = rest, options
        self.clock = clock or WallClock()
        self.config = options.config
        self.scheduler = self.config.spec.schedulerName
        self.period = duration_seconds(self.config.spec.cyclePeriod)
        self.lock = threading.RLock()
        self.cache = ClusterCache(
            self.scheduler, self.clock.now, options.assume_ttl_s, dra=self.config.spec.dra
        )
        self.stop_event = threading.Event()
        self.changed = threading.Event()
        #: A new pod of ours waits to be placed (`_pause`): set by the informers.
        self.arrived = threading.Event()
        #: The last cycle left no gang waiting: an arrival need not wait for the period.
        self._idle = False
        self.backlog = WriteBacklog(
            options.bind_parallelism,
            self.stop_event,
            options.bookkeeping_parallelism,
            status_settle_s=options.status_settle_s,
        )
        self.writer = KubeWriter(rest, self._current, self.backlog)
        self.binder = Binder(
            self.writer,
            room=self._room,
            on_bound=self._bound,
            parallelism=options.bind_parallelism,
            eviction_wait_s=options.eviction_wait_s,
            placeholder_owner=self._placeholder_owner,
            on_resumed=self._assume_resumed,
            reserve=self._reserve,
            unreserve=self._forget,
            submit=functools.partial(self.backlog.later, urgency=Urgency.BIND),
            on_failed=self._bind_failed,
            may_write=self.leading,
        )
        self.informers = [
            Informer(rest, kind, self._on_list, self._on_event, self.stop_event) for kind in WATCHED
        ]
        self.elector: LeaseElector | None = None
        if options.leader_elect:
            self.elector = LeaseElector(
                rest, options.lease_namespace, options.lease_name, options.identity, self.stop_event
            )
        self.cycles = 0
        self.usage: UsageState | None = None
        #: The cycle's sums over every group, following the cache's snapshots.
        self.totals = GroupTotals()
        self.last_result: CycleResult | None = None
        self.last_cycle_s = 0.0
        self._wake_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="scheduling-loop", daemon=True)
        #: Status bodies last written, by (kind, key): a write only when they change.
        self._written: dict[tuple[str, str], Mapping[str, Any]] = {}
        #: Status bodies queued for the writers and not tried yet, by (kind, key).
        self._queued: dict[tuple[str, str], Mapping[str, Any]] = {}
        #: The PodGroup status bodies last made, with what they were made of: a
        #: group whose inputs are the same objects is not worked out again.
        self._group_bodies: dict[str, _StatusBody] = {}
        self._created_groups: set[str] = set()
        #: Workloads (kind, key) written since their PodGroups were last derived.
        self._to_derive: set[tuple[str, str]] = set()
        #: The problems last reported on each object, by (kind, key).
        self._problems: dict[tuple[str, str], str] = {}
        self.metrics = process_metrics()
        #: The Ray placement backend's state, told on the leader Lease (when there is one).
        self.ray_report = RayReport(self.metrics, self._post_lease_event)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        if self.elector is not None:
            self.elector.start()
        self._thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.changed.set()
        self.arrived.set()
        self._thread.join(timeout=10)
        self.binder.close()
        if self.elector is not None:
            self.elector.release()

    def synced(self) -> bool:
        return all(informer.synced.is_set() for informer in self.informers)

    def leading(self) -> bool:
        return self.elector is None or self.elector.holds()

    def alive(self) -> bool:
        return self._thread.is_alive() and all(i.is_alive() for i in self.informers)

    # ------------------------------------------------------------- feeding

    def _on_list(self, kind: str, objects: list[dict[str, Any]]) -> None:
        with self.lock:
            if kind == POD:
                objects = [dict(self._member(pod)) for pod in objects]
            self.cache.replace_all(kind, objects)
            if kind in WORKLOAD_KINDS:
                self._to_derive |= {(kind, object_key(obj, kind)) for obj in objects}
            if kind == "RayCluster":
                self._refresh_ray_pods()
        self.changed.set()

    def _on_event(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        with self.lock:
            # Our own status writes coming back: kept, but they wake no cycle (as in
            # the simulator, where a cycle that only wrote statuses schedules none).
            echo = kind in STATUS_KINDS and _status_only(
                self.cache.get(kind, object_key(obj, kind)), obj
            )
            if event == "DELETED":
                self.cache.delete(kind, object_key(obj, kind))
            else:
                self.cache.upsert(self._member(obj) if kind == POD else obj, kind)
                if kind in WORKLOAD_KINDS:
                    self._to_derive.add((kind, object_key(obj, kind)))
                if kind == "RayCluster":
                    self._refresh_ray_pods()
        if kind == POD and event == "ADDED" and self._ours_to_place(obj):
            self.arrived.set()
        if not echo or event == "DELETED":
            self.changed.set()

    def _ours_to_place(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return spec.get("schedulerName") == self.scheduler and not spec.get("nodeName")

    def _member(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        """Our pods as the webhook would have annotated them (their gang named)."""
        if (pod.get("spec") or {}).get("schedulerName") != self.scheduler:
            return pod
        return with_membership(pod, self.rayjob_of)

    def rayjob_of(self, namespace: str, cluster: str) -> str | None:
        """The RayJob owning a RayCluster, if one does (for naming its pods' gang)."""
        obj = self.cache.get("RayCluster", f"{namespace}/{cluster}")
        return owner_of_kind(obj, ("RayJob",)) if obj is not None else None

    def _refresh_ray_pods(self) -> None:
        """A RayJob's cluster arrived after its pods: they join the RayJob's gang."""
        for _, pod in list(self.cache.items(POD)):
            meta = pod.get("metadata") or {}
            cluster = (meta.get("labels") or {}).get(RAY_CLUSTER_LABEL)
            annotations = meta.get("annotations") or {}
            if not cluster or annotations.get(POD_GROUP_ANNOTATION) != f"raycluster-{cluster}":
                continue
            owner = self.rayjob_of(str(meta.get("namespace") or "default"), str(cluster))
            if owner is not None:
                renamed = {**annotations, POD_GROUP_ANNOTATION: f"rayjob-{owner}"}
                self.cache.upsert({**pod, "metadata": {**meta, "annotations": renamed}}, POD)

    def queue_objects(self) -> dict[str, Mapping[str, Any]]:
        """Every Queue object the cache holds, by name."""
        with self.lock:
            return dict(self.cache.items(QUEUE))

    def pod_group_objects(self) -> list[Mapping[str, Any]]:
        """Every PodGroup object the cache holds."""
        with self.lock:
            return [obj for _, obj in self.cache.items(POD_GROUP)]

    def _current(self, kind: str, key: str) -> Mapping[str, Any] | None:
        if kind == LEASE:
            return self._lease()
        with self.lock:
            return self.cache.get(kind, key)

    def _lease(self) -> Mapping[str, Any] | None:
        """The leader Lease as its Events need it (the cache does not hold Leases)."""
        if self.elector is None:
            return None
        meta = {"uid": self.elector.uid} if self.elector.uid else {}
        return {"apiVersion": "coordination.k8s.io/v1", "metadata": meta}

    def _post_lease_event(self, warning: bool, reason: str, message: str) -> None:
        """An Event on the leader Lease: the operator's own object (none without one)."""
        if self.elector is not None:
            ref = ObjectRef(LEASE, self.options.lease_name, self.options.lease_namespace)
            self.writer.record_event(ref, warning, reason, message)

    def _room(self, bind: Bind) -> str | None:
        with self.lock:
            return self.cache.room_problem(bind.pod, bind.node, bind.gpu_devices, bind.gpu_fraction)

    def _placeholder_owner(self, pod: str) -> tuple[str, str] | None:
        with self.lock:
            return self.cache.placeholder_owner(pod)

    def _assume_resumed(self, kind: str, key: str, placed: dict[str, str]) -> None:
        with self.lock:
            self.cache.assume_resumed(kind, key, placed)

    def _reserve(self, bind: Bind) -> None:
        with self.lock:
            self.cache.reserve(bind.pod, bind.node, _devices(bind))
            if bind.claims:
                self.cache.assume_claims(bind.pod, bind.claims)

    def _bound(self, bind: Bind) -> None:
        with self.lock:
            self.cache.assume(bind.pod, bind.node, _devices(bind))
        self.metrics.count_bind(DONE)

    def _bind_failed(self, bind: Bind, result: WriteResult) -> None:
        self.metrics.count_bind(result)

    def _forget(self, bind: Bind) -> None:
        with self.lock:
            self.cache.forget_assumed(bind.pod)
        self.changed.set()

    # ---------------------------------------------------------------- loop

    def _run(self) -> None:
        # The cache holds the cluster for as long as the operator runs: the cycle
        # collector is tuned for that, as in the simulator (`state/heap.py`).
        with long_lived_heap():
            self._cycles()

    def _cycles(self) -> None:
        last = 0.0
        settled = False
        while not self.stop_event.is_set():
            self.changed.wait(timeout=self.period)
            if self.stop_event.is_set():
                return
            now = self.clock.now()
            due = self._wake_at is not None and now >= self._wake_at
            idle = now - last >= self.options.idle_cycle_s
            if not (self.changed.is_set() or due or idle) or not self.synced():
                continue
            if not self.leading():
                self.metrics.set_leader(False)
                self.changed.clear()
                continue
            self.changed.clear()
            if not settled:
                settle()  # the cluster as first listed: kept, out of the collector's sight
                settled = True
            self.arrived.clear()  # arrivals from here on are the next cycle's
            try:
                if self.run_once().cut_short:
                    self.changed.set()  # the rest of the burst: at once, no pause
                    continue
            except Exception:
                LOG.exception("cycle %d failed; the next one tries again", self.cycles)
                self._idle = False
            last = self.clock.now()
            self._pause()

    def _pause(self) -> None:
        """Until the next period's start; sooner when the last cycle left nothing
        waiting and a new pod of ours comes (it is placed at once, as a scheduler
        that places pod by pod would, instead of up to a period later). A cluster
        with gangs waiting keeps the period: each cycle there judges the backlog."""
        pause = self.period - (time.monotonic() % self.period if self.period else 0)
        pause = min(pause, self.period)
        if self._idle:
            self.arrived.wait(pause)
        else:
            self.stop_event.wait(pause)

    def run_once(self) -> CycleResult:
        """One cycle, steps 1 to 4 of the module docstring."""
        steps = _Stopwatch()
        self._derive_pod_groups()
        steps.lap("podgroups")
        with self.lock:
            # Those written while the first pass worked: no pod of the snapshot
            # is without the PodGroup it was given (nor reported for it).
            self._derive_pod_groups()
            snapshot = self.cache.snapshot()
        steps.lap("snapshot")
        self.cycles += 1
        now = self.clock.now()
        result = run_cycle(
            snapshot,
            self.config,
            self.cycles,
            now,
            self.usage,
            totals=self.totals,
            time_up=_Budget(
                self.options.placement_budget_s,
                self.options.idle_writers_budget_s,
                lambda: self.backlog.binding < self.options.bind_parallelism,
            ),
        )
        self.usage = result.usage
        with self.lock:
            self.cache.set_usage(result.usage.queues)
        steps.lap("decide")
        report = self.binder.apply(result.plan, snapshot, now)
        steps.lap("bind")
        self._wake_at = result.plan.wake_at
        self._idle = not result.cut_short and _none_left_waiting(snapshot, result.plan)
        self._write_statuses(snapshot, result, report, now)
        steps.lap("status")
        self.last_result = result
        self.last_cycle_s = steps.total()
        self.metrics.record_cycle(
            snapshot, result, report, self.last_cycle_s, True, now=now, step_seconds=steps.laps
        )
        self.ray_report.cycle_ended(ray_link.RAY_LINK.status(), self.cycles)
        if result.plan.binds or result.plan.evictions or self.last_cycle_s > 1.0:
            LOG.info(
                "[cycle %d] %d bound, %d binding in the back, %d evicted, %d admitted, "
                "%d failed in %.3fs (%s)",
                self.cycles,
                len(report.bound),
                len(report.deferred),
                len(report.evicted),
                len(report.resumed),
                len(report.failed),
                self.last_cycle_s,
                steps,
            )
        return result

    # ----------------------------------------------------------- PodGroups

    def _derive_pod_groups(self) -> None:
        """PodGroups for the workloads written since the last pass that have none
        yet, created in the back."""
        with self.lock:
            written, self._to_derive = self._to_derive, set()
            # A submitter Job with no queue of its own reads its RayJob's.
            workloads = [
                (kind, obj, with_owner_queue(as_written(obj), self.cache.get))
                for kind, key in written
                if (obj := self.cache.get(kind, key)) is not None
                and not self._has_group(derived_group_key(kind, key))
            ]
        bodies: dict[str, dict[str, Any]] = {}
        workload_of: dict[str, tuple[str, str]] = {}
        for kind, obj, read in workloads:
            if not needs_derived_group(obj, self.scheduler):
                continue
            try:
                groups = derive_groups(read)
            except InvalidObjectError as err:
                self._report_bad_workload(kind, obj, err)
                continue
            for derived in groups:
                body = pod_group_body(derived.pod_group.model_dump(mode="json"), obj)
                bodies.setdefault(object_key(body, POD_GROUP), body)
                workload_of.setdefault(object_key(body, POD_GROUP), (kind, object_key(obj, kind)))
        # The cycle uses them at once; the API gets them in the back.
        with self.lock:
            stamp = rfc3339(self.clock.now())
            for key, body in bodies.items():
                meta = {**body["metadata"], "creationTimestamp": stamp}
                self.cache.upsert({**body, "kind": POD_GROUP, "metadata": meta}, POD_GROUP)
                self._created_groups.add(key)
        for key, body in bodies.items():
            create = functools.partial(self._create_pod_group, key, body, workload_of[key])
            self.backlog.later(create, Urgency.CREATE)

    def _has_group(self, key: str) -> bool:
        return key in self._created_groups or self.cache.get(POD_GROUP, key) is not None

    def _create_pod_group(self, key: str, body: dict[str, Any], workload: tuple[str, str]) -> None:
        result = self.writer.create_pod_group(body)
        if result.ok:
            # Its status may have been tried before it existed (another writer took
            # it meanwhile): the next cycle writes it, without waiting for an event.
            self.changed.set()
        elif result.outcome is Outcome.PERMANENT:
            LOG.warning("PodGroup %s not created: %s", key, result.message)
            with self.lock:
                self.cache.delete(POD_GROUP, key)
        else:
            with self.lock:
                self._created_groups.discard(key)  # derived again next cycle
                self._to_derive.add(workload)

    def _report_bad_workload(self, kind: str, obj: Mapping[str, Any], err: Exception) -> None:
        meta = obj.get("metadata") or {}
        ref = ObjectRef(kind, str(meta.get("name")), meta.get("namespace"))
        message = str(err)
        if self._written.get((kind, object_key(obj, kind))) != {"problem": message}:
            self._written[(kind, object_key(obj, kind))] = {"problem": message}
            self.writer.record_event(ref, True, "InvalidWorkload", message)

    # ------------------------------------------------------------ statuses

    def _write_statuses(
        self, snapshot: Snapshot, result: CycleResult, report: ApplyReport, now: float
    ) -> None:
        """PodGroup and Queue statuses where they changed; problems on their objects."""
        stamp = rfc3339(now)
        evicted: dict[str, tuple[str, int]] = {}
        for evict in report.evicted:
            reason, count = evicted.get(evict.group, (evict.reason, 0))
            evicted[evict.group] = (reason, count + 1)
        planned = _statuses_by_group(result.plan)
        phases: dict[str, str] = {}
        changes: list[tuple[str, str, Mapping[str, Any], ObjectRef]] = []
        if len(self._group_bodies) > len(snapshot.pod_groups):
            for gone in self._group_bodies.keys() - snapshot.pod_groups.keys():
                del self._group_bodies[gone]
        for key, group in snapshot.pod_groups.items():
            why, count = evicted.get(key, ("", 0))
            inputs = _StatusInputs(group, planned.get(key), why, count)
            kept = self._group_bodies.get(key)
            if result.cut_short and key not in planned and not count:
                # Not tried by a cycle cut short by its budget: what it was last
                # told stands until a cycle tries it (the next, at once).
                phases[key] = kept.phase if kept is not None else _untold_phase(group)
                continue
            if (
                kept is not None
                and kept.inputs.same_as(inputs)
                and self._told((POD_GROUP, key), kept.body)
            ):
                # The same group state (the cache keeps it while nothing of it
                # changed), told the same: the body written (or on its way, as
                # while binds go first in a burst) is still right.
                phases[key] = kept.phase
                continue
            partly = count if count < len(group.bound) else None
            body = pod_group_status(group, inputs.planned, why or None, stamp, evicted_pods=partly)
            phases[key] = str(body["phase"])
            # Groups in the snapshot are valid (the others are reported as problems).
            body["conditions"] = merge_condition(body["conditions"], problems_condition([], stamp))
            self._group_bodies[key] = _StatusBody(inputs, body, phases[key])
            changes.append((POD_GROUP, key, body, group.ref()))
        with self.lock:
            previous = {
                name: dict(obj.get("status") or {}) for name, obj in self.cache.items(QUEUE)
            }
        bodies = queue_statuses(snapshot, result, phases, previous, names=list(previous))
        changes += [(QUEUE, name, body, ObjectRef("Queue", name)) for name, body in bodies.items()]
        self._patch_all(changes)
        self._report_problems(snapshot, stamp)

    def _report_problems(self, snapshot: Snapshot, stamp: str) -> None:
        """Objects the snapshot left out or could not fully read: an Event on each
        once per change, and a `Valid=False` condition on PodGroups and Topologies,
        written (in the back) until it is there."""
        by_object: dict[ObjectRef, list[Problem]] = {}
        for problem in snapshot.problems:
            ref = ObjectRef(problem.obj.kind, problem.obj.name, problem.obj.namespace)
            by_object.setdefault(ref, []).append(problem)
        changes: list[tuple[str, str, Mapping[str, Any], ObjectRef]] = []
        for ref, problems in by_object.items():
            message = "; ".join(f"{p.field}: {p.message}" for p in problems)
            key = ref.name if ref.namespace is None else f"{ref.namespace}/{ref.name}"
            if self._problems.get((ref.kind, key)) != message:
                self._problems[(ref.kind, key)] = message
                self.writer.record_event(ref, True, "InvalidSpec", message)
            if ref.kind in (POD_GROUP, "Topology"):
                with self.lock:
                    obj = self.cache.get(ref.kind, key) or {}
                old = (obj.get("status") or {}).get("conditions")
                conditions = merge_condition(old, problems_condition(problems, stamp))
                changes.append((ref.kind, key, {"conditions": conditions}, ref))
        self._patch_all(changes)

    def _patch_all(self, changes: list[tuple[str, str, Mapping[str, Any], ObjectRef]]) -> None:
        """Queue the statuses that changed since they were last written (in the
        back, latest wins); a PodGroup whose waiting reason changed gets an
        Unschedulable Event, and so do its waiting pods."""
        for kind, key, body, ref in changes:
            if self._written.get((kind, key)) != body:
                self._queued[(kind, key)] = body
                write = functools.partial(self._write_status, kind, key, body, ref)
                # A Queue's status says what it holds now (one write per cycle at
                # most, whatever the burst): only PodGroups' settle.
                self.backlog.status(kind, key, write, settle=kind == POD_GROUP)

    def _told(self, target: tuple[str, str], body: Mapping[str, Any]) -> bool:
        """Whether `body` is the status last written, or the one waiting to be."""
        return self._queued.get(target) is body or self._written.get(target) == body

    def _write_status(self, kind: str, key: str, body: Mapping[str, Any], ref: ObjectRef) -> None:
        before = self._written.get((kind, key)) or {}
        if self._queued.get((kind, key)) is body:
            del self._queued[(kind, key)]
        if before == body or not self.writer.patch_status(kind, key, body).ok:
            return  # a PodGroup not created yet is written again next cycle
        self._written[(kind, key)] = body
        reason = str(body.get("reason") or "")
        if kind == POD_GROUP and reason and reason != before.get("reason"):
            if waits_for_its_pods(reason):
                # Released and waiting for its controller: normal, not a warning.
                self.writer.record_event(ref, False, "WaitingForPods", reason)
                return
            self.writer.record_event(ref, True, "Unschedulable", reason)
            # Its waiting pods are told too: `kubectl describe pod` is where a
            # person looks first, and a gated pod's own condition only says
            # that it is gated.
            kept = self._group_bodies.get(key)
            for pod in kept.inputs.group.pending if kept is not None else ():
                self.writer.record_event(
                    pod.ref(), True, "Unschedulable", f"PodGroup {ref.name}: {reason}"
                )


#: Kinds whose status only kai-ray writes (`_on_event`).
STATUS_KINDS = (POD_GROUP, QUEUE)
#: Metadata a status write changes by itself.
_WRITE_STAMPS = ("resourceVersion", "managedFields")


def _status_only(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> bool:
    """`after` differs from `before` in its status alone (and the stamps any write
    leaves): a status written back, which no cycle need look at before its next."""
    if before is None:
        return False
    outside = ("status", "metadata")
    if any(before.get(k) != after.get(k) for k in before.keys() | after.keys() if k not in outside):
        return False
    meta_a, meta_b = before.get("metadata") or {}, after.get("metadata") or {}
    return all(
        meta_a.get(k) == meta_b.get(k)
        for k in meta_a.keys() | meta_b.keys()
        if k not in _WRITE_STAMPS
    )


def _devices(bind: Bind) -> str:
    return ",".join(str(d) for d in sorted(bind.gpu_devices))


@dataclass(frozen=True)
class _StatusInputs:
    """What a PodGroup's status body is made of, besides the time."""

    group: PodGroupState
    planned: GroupStatus | None
    evicted_reason: str
    evicted_pods: int

    def same_as(self, other: _StatusInputs) -> bool:
        return (
            self.group is other.group
            and self.planned == other.planned
            and (self.evicted_reason, self.evicted_pods)
            == (other.evicted_reason, other.evicted_pods)
        )


@dataclass(frozen=True)
class _StatusBody:
    inputs: _StatusInputs
    body: Mapping[str, Any]
    phase: str


class _Stopwatch:
    """Seconds spent in each step of a cycle, for its log line."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.laps: list[tuple[str, float]] = []

    def lap(self, step: str) -> None:
        now = time.monotonic()
        self.laps.append((step, now - self.last))
        self.last = now

    def total(self) -> float:
        return self.last - self.start

    def __str__(self) -> str:
        return ", ".join(f"{step} {seconds:.3f}s" for step, seconds in self.laps)


def derived_group_key(kind: str, key: str) -> str:
    """The key of the PodGroup kai-ray derives for a workload (see `derive_groups`)."""
    namespace, _, name = key.partition("/")
    return f"{namespace}/{kind.lower()}-{name}"


class _Budget:
    """A cycle's placement budget (`run_cycle`'s `time_up`): its clock starts at the
    first question, which the cycle asks once it has placed `HAND_OVER_AT` pods, so
    what the cycle spends before placing (fair shares, ordering thousands of new
    gangs) does not eat it. It is spent after `seconds`, or after `idle_seconds`
    when the writers are running out of binds (`writers_idle`)."""

    def __init__(
        self,
        seconds: float,
        idle_seconds: float | None = None,
        writers_idle: Callable[[], bool] | None = None,
    ) -> None:
        self.seconds = seconds
        self.idle_seconds = seconds if idle_seconds is None else idle_seconds
        self.writers_idle = writers_idle
        self.start: float | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.start is None:
            self.start = now
        spent = now - self.start
        if spent > self.seconds:
            return True
        return spent > self.idle_seconds and self.writers_idle is not None and self.writers_idle()


def _untold_phase(group: PodGroupState) -> str:
    """The phase a group's PodGroup says it is in (Pending when it says nothing)."""
    status = group.status
    return (status.phase if status is not None and status.phase else Phase.PENDING).value


def _none_left_waiting(snapshot: Snapshot, plan: Plan) -> bool:
    """Every gang the snapshot had waiting was admitted by the plan."""
    for group in snapshot.waiting_groups:
        status = plan.status_of(group.key)
        if status is None or not status.admitted:
            return False
    return True


def _statuses_by_group(plan: Plan) -> dict[str, Any]:
    statuses = plan.statuses
    values = statuses.values() if isinstance(statuses, Mapping) else statuses
    return {status.group: status for status in values}


def pod_group_body(pod_group: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner.get("metadata") or {}
    body = {k: v for k, v in pod_group.items() if k != "status" and v is not None}
    body["metadata"] = {
        k: v for k, v in (body.get("metadata") or {}).items() if v not in (None, {}, [])
    }
    body["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner.get("apiVersion"),
            "kind": owner.get("kind"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    return body
