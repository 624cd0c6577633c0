"""The binder: applies a cycle's plan to a cluster through a small writer protocol.

The cycle decides; the binder makes it so, in the order a cluster needs:

1. evictions (each through the writer: the Eviction API in the operator, the
   workload controller's restart in the simulator), so that room is freed; on
   up to `parallelism` threads at once (a consolidation of 29 pods took the
   operator's cycle 3 s one by one);
2. admissions: a suspended RayCluster or RayJob appears in the snapshot as the
   pods it would make (placeholders, see `kai_ray.state.cache`); a plan that
   places them admits the workload, which the binder releases (`suspend:
   false`) instead of binding pods that do not exist; its controller then
   creates the real pods, which the next cycles place;
3. binds, gang by gang: the pod's `kai-ray.io/admission` gate lifted first (a
   gated pod cannot be bound), then its GPU devices recorded, then the bind.
   Just before a bind the optional `room` check asks whether the node still has
   room by the latest events (pods of other schedulers, evictions not finished):
   a bind that would overcommit waits for evicted pods to go, up to a deadline,
   and is otherwise skipped and left to the next cycle. Binds run in parallel
   across nodes (`parallelism`), one node's binds in order. With a `reserve`
   callback, the binds onto nodes this plan evicts from do their waiting in the
   background instead (`ApplyReport.deferred`): each is reserved first (the
   operator reads the pod as bound there, so no later cycle places anything on
   that room, nor evicts for it again), the cycle goes on, and a bind that does
   not happen in the end gives its reservation back (`unreserve`). One slow
   eviction thus holds up neither the cycle nor any other gang's binds. With
   `submit` as well (the operator), every bind is made that way: reserved in
   plan order, then handed to the operator's writers one bind at a time (a gang
   packed onto a few nodes is bound by many writers at once), which make them
   ahead of any status, Event or PodGroup creation. The next cycle
   starts while they go out, and reads them as bound; `on_bound` and
   `on_failed` hear how each ended;
4. group statuses the plan states (staleness, nominations), persisted on the
   PodGroup so that the next cycle (or the next operator) reads them back.

Applying the same plan twice is harmless: the writers treat "already bound to
this node" and "already gone" as done. Write errors are values (`WriteResult`)
that say whether trying again can help; the binder never raises for them.
No Kubernetes client here: the writer holds it.
"""

from __future__ import annotations

import enum
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kai_ray.decisions.plan import Bind, Evict, GroupStatus, Plan
from kai_ray.state.dra_allocate import ClaimAllocation
from kai_ray.state.dra_status import Consumer
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.errors import ObjectRef
from kai_ray.values.names import ADMISSION_GATE, GPU_DEVICES_ANNOTATION
from kai_ray.workloads.pod_fields import format_device_list

LOG = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class Outcome(enum.Enum):
    DONE = "done"
    #: Worth trying again (a conflict, a timeout, the API server busy).
    RETRY = "retry"
    #: Trying again cannot help (the pod or node is gone, the request is refused).
    PERMANENT = "permanent"


@dataclass(frozen=True)
class WriteResult:
    outcome: Outcome
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.DONE


DONE = WriteResult(Outcome.DONE)
#: A write of a replica that no longer leads: not made (the leader plans it anew).
NOT_LEADING = WriteResult(Outcome.RETRY, "not written: this replica no longer leads")


class ClusterWriter(Protocol):
    """What the binder needs from a cluster; each call is idempotent."""

    def evict(self, evict: Evict, message: str) -> WriteResult: ...

    def lift_gate(self, pod: str, gate: str) -> WriteResult: ...

    def bind(self, bind: Bind, annotations: Mapping[str, str]) -> WriteResult: ...

    def write_group_status(self, status: GroupStatus, now: float) -> WriteResult: ...

    def resume_workload(self, kind: str, key: str, nodes: Sequence[str]) -> WriteResult: ...

    def write_claim(
        self, namespace: str, name: str, allocation: ClaimAllocation, consumer: Consumer
    ) -> WriteResult:
        """Allocate the claim (unless it is already) and reserve it for `consumer`."""
        ...

    def release_claim(self, namespace: str, name: str, pod_uid: str) -> WriteResult:
        """The pod no longer uses the claim: deallocated when nobody does."""
        ...

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None: ...


#: Why a bind of pod (key) to node (name) would overcommit the node now; None if it fits.
RoomCheck = Callable[[Bind], str | None]
#: The suspended workload (kind, key) a placeholder pod stands for; None for real pods.
PlaceholderOwner = Callable[[str], tuple[str, str] | None]


@dataclass
class ApplyReport:
    """What came of one plan: per intent, done or why not."""

    bound: list[Bind] = field(default_factory=list)
    #: Suspended workloads released (kind, key).
    resumed: list[tuple[str, str]] = field(default_factory=list)
    evicted: list[Evict] = field(default_factory=list)
    #: Binds not made, with the reason (a skipped coexistence check or a write error).
    failed: list[tuple[Bind, WriteResult]] = field(default_factory=list)
    #: Binds reserved and made in the background (those waiting for evicted pods
    #: to go; every bind when the binder has `submit`).
    deferred: list[Bind] = field(default_factory=list)
    failed_evictions: list[tuple[Evict, WriteResult]] = field(default_factory=list)


@dataclass
class Binder:
    writer: ClusterWriter
    #: Checks the live node before each bind (the operator); None trusts the plan.
    room: RoomCheck | None = None
    #: Called after each successful bind (the operator assumes it in its cache).
    on_bound: Callable[[Bind], None] | None = None
    #: Tells placeholder pods from real ones (the operator); None: all pods are real.
    placeholder_owner: PlaceholderOwner | None = None
    #: Called after a suspended workload is released, with where its placeholders
    #: went (pod -> node): the operator assumes it and holds that room.
    on_resumed: Callable[[str, str, dict[str, str]], None] | None = None
    parallelism: int = 1
    #: How long a bind onto a node with evictions in the same plan waits for room.
    eviction_wait_s: float = 0.0
    sleep: Callable[[float], None] = time.sleep
    #: Holds a bind's room while it waits in the background (the operator assumes
    #: it in its cache); None: such binds wait in `apply`, holding the cycle.
    reserve: Callable[[Bind], None] | None = None
    #: Gives back a reservation whose bind did not happen.
    unreserve: Callable[[Bind], None] | None = None
    #: Hands one bind to the writers (the operator's, binds first); with
    #: `reserve`, `apply` then returns as soon as every bind is reserved.
    submit: Callable[[Callable[[], None]], None] | None = None
    #: Called after each bind that failed or was skipped, with why.
    on_failed: Callable[[Bind, WriteResult], None] | None = None
    #: Whether this replica may still write (the operator: it holds the Lease). A
    #: bind or an eviction planned while leading is dropped once it no longer does:
    #: the new leader plans from its own view, and a bind waiting in the back for an
    #: evicted pod to go would otherwise land on room the new leader gave away.
    may_write: Callable[[], bool] | None = None
    _background: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _waiting: list[Future[None]] = field(default_factory=list, init=False, repr=False)

    def apply(self, plan: Plan, snapshot: Snapshot, now: float) -> ApplyReport:
        report = ApplyReport()
        # 1. Evictions first, all at once (each waits on the API server, not on
        # the others): they make the room some binds need.
        for evict, result in zip(
            plan.evictions, self._map(self._evict, plan.evictions), strict=True
        ):
            if result.ok:
                report.evicted.append(evict)
            else:
                report.failed_evictions.append((evict, result))
        # 2. Admissions: placed placeholders release their workload.
        planned = self._admit(plan.binds, report)
        # 3. Binds, in parallel across nodes, in plan order on each node.
        freed = {snapshot.pods[e.pod].node for e in report.evicted if e.pod in snapshot.pods}
        by_node: dict[str, list[Bind]] = {}
        for bind in planned:
            by_node.setdefault(bind.node, []).append(bind)
        batches = [(binds, node in freed) for node, binds in by_node.items()]
        if self.reserve is not None and self.eviction_wait_s > 0:
            for binds, _ in (batch for batch in batches if batch[1]):
                self._defer(binds, snapshot, report)
            batches = [batch for batch in batches if not batch[1]]
        if self.reserve is not None and self.submit is not None:
            not_deferred = {binds[0].node for binds, _ in batches}
            self._hand_over([b for b in planned if b.node in not_deferred], snapshot, report)
            batches = []
        for done in self._map(lambda b: self._bind_all(b[0], b[1], snapshot), batches):
            for bind, result in done:
                if result.ok:
                    report.bound.append(bind)
                else:
                    report.failed.append((bind, result))
        # 4. What the plan says of each group, kept on its PodGroup.
        for status in plan.statuses:
            if status.staleness is not None or status.nominated is not None:
                self.writer.write_group_status(status, now)
        return report

    def _defer(self, binds: list[Bind], snapshot: Snapshot, report: ApplyReport) -> None:
        """One node's binds reserved now and made once the evicted pods have gone."""
        assert self.reserve is not None
        for bind in binds:
            self.reserve(bind)
        report.deferred.extend(binds)
        if self._background is None:
            self._background = ThreadPoolExecutor(
                max_workers=max(self.parallelism, 1), thread_name_prefix="bind-after-evictions"
            )
        self._waiting = [f for f in self._waiting if not f.done()]
        self._waiting.append(self._background.submit(self._finish, binds, snapshot))

    def _hand_over(self, binds: list[Bind], snapshot: Snapshot, report: ApplyReport) -> None:
        """Every bind reserved now, then made by the writers one by one in plan
        order: gang after gang, each gang's pods on as many writers as are free.
        (Handing a node's binds to one writer made a gang packed onto a few nodes
        wait for those nodes' binds one after another.)"""
        assert self.reserve is not None and self.submit is not None
        for bind in binds:
            self.reserve(bind)
        report.deferred.extend(binds)
        for bind in binds:
            self.submit(functools.partial(self._finish, [bind], snapshot, False))

    def _finish(self, binds: list[Bind], snapshot: Snapshot, wait: bool = True) -> None:
        made: set[str] = set()
        try:
            for bind in binds:
                if self._bind(bind, wait, snapshot).ok:
                    made.add(bind.pod)
        except Exception:
            LOG.exception("binds onto %s failed", binds[0].node)
            raise
        finally:
            for bind in binds:
                if bind.pod not in made and self.unreserve is not None:
                    self.unreserve(bind)

    def wait_deferred(self, timeout: float | None = None) -> None:
        """Until every deferred bind is made or given up (tests, shutdown); raises
        what a deferred batch raised."""
        futures.wait(list(self._waiting), timeout=timeout)
        for future in self._waiting:
            if future.done():
                future.result()

    def close(self) -> None:
        if self._background is not None:
            self._background.shutdown(wait=False, cancel_futures=True)

    def _admit(self, binds: list[Bind], report: ApplyReport) -> list[Bind]:
        """The real binds; the workloads whose placeholders were placed are released."""
        if self.placeholder_owner is None:
            return binds
        real: list[Bind] = []
        owners: dict[tuple[str, str], dict[str, str]] = {}
        for bind in binds:
            owner = self.placeholder_owner(bind.pod)
            if owner is None:
                real.append(bind)
            else:
                owners.setdefault(owner, {})[bind.pod] = bind.node
        for (kind, key), placed in owners.items():
            result = self.writer.resume_workload(kind, key, [placed[p] for p in sorted(placed)])
            namespace, _, name = key.partition("/")
            if result.ok:
                report.resumed.append((kind, key))
                if self.on_resumed is not None:
                    self.on_resumed(kind, key, placed)
                message = f"{kind} {key} admitted: its whole gang fits; released from suspend"
                self.writer.record_event(
                    ObjectRef(kind, name, namespace), False, "Admitted", message
                )
        return real

    def _map(self, work: Callable[[T], R], items: list[T]) -> list[R]:
        """`work` on each item, on up to `parallelism` threads; results in order."""
        if self.parallelism <= 1 or len(items) <= 1:
            return [work(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(items))) as pool:
            return list(pool.map(work, items))

    def _evict(self, evict: Evict) -> WriteResult:
        if not self._may_write():
            return NOT_LEADING
        message = f"evicted by kai-ray ({evict.reason}) with its gang {evict.group}"
        if evict.for_queue is not None:
            message += f", for queue {evict.for_queue}"
        if evict.standing:
            message += f": {evict.standing}"
        result = self.writer.evict(evict, message)
        if result.ok:
            self.writer.record_event(_pod_ref(evict.pod), False, "Evicted", message)
        return result

    def _bind_all(
        self, binds: list[Bind], wait: bool, snapshot: Snapshot
    ) -> list[tuple[Bind, WriteResult]]:
        return [(bind, self._bind(bind, wait, snapshot)) for bind in binds]

    def _bind(self, bind: Bind, wait: bool, snapshot: Snapshot) -> WriteResult:
        problem = self._room_problem(bind, wait)
        if problem is not None:
            result = WriteResult(Outcome.RETRY, f"bind to {bind.node} skipped: {problem}")
            self._failed(bind, result)
            return result
        if not self._may_write():
            self._failed(bind, NOT_LEADING)
            return NOT_LEADING
        pod = snapshot.pods.get(bind.pod)
        if pod is not None and ADMISSION_GATE in pod.scheduling_gates:
            lifted = self.writer.lift_gate(bind.pod, ADMISSION_GATE)
            if not lifted.ok:
                if self.on_failed is not None:
                    self.on_failed(bind, lifted)
                return lifted
        claimed = self._write_claims(bind, pod.uid if pod is not None else "")
        if not claimed.ok:
            self._failed(bind, claimed)
            return claimed
        result = self.writer.bind(bind, _bind_annotations(bind))
        if not result.ok and bind.claims:
            self._release_claims(bind, bind.claims, pod.uid if pod is not None else "")
        if result.ok:
            if self.on_bound is not None:
                self.on_bound(bind)
            message = f"Successfully assigned {bind.pod} to {bind.node}"
            self.writer.record_event(_pod_ref(bind.pod), False, "Scheduled", message)
        else:
            self._failed(bind, result)
        return result

    def _write_claims(self, bind: Bind, uid: str) -> WriteResult:
        """The pod's DRA claims allocated and reserved for it, before its bind; on a
        failure the ones written are released again (the bind is then not made)."""
        name = bind.pod.partition("/")[2]
        for done, claim in enumerate(bind.claims):
            result = self.writer.write_claim(
                claim.namespace, claim.name, claim, Consumer(name, uid)
            )
            if not result.ok:
                self._release_claims(bind, bind.claims[:done], uid)
                return result
        return WriteResult(Outcome.DONE)

    def _release_claims(self, bind: Bind, claims: Iterable[ClaimAllocation], uid: str) -> None:
        for claim in claims:
            released = self.writer.release_claim(claim.namespace, claim.name, uid)
            if not released.ok:
                LOG.warning(
                    "bind of %s failed and its ResourceClaim %s/%s was not released: %s",
                    bind.pod,
                    claim.namespace,
                    claim.name,
                    released.message,
                )

    def _failed(self, bind: Bind, result: WriteResult) -> None:
        if self.on_failed is not None:
            self.on_failed(bind, result)
        self.writer.record_event(_pod_ref(bind.pod), True, "FailedBinding", result.message)

    def _may_write(self) -> bool:
        return self.may_write is None or self.may_write()

    def _room_problem(self, bind: Bind, wait: bool) -> str | None:
        if self.room is None:
            return None
        problem = self.room(bind)
        deadline = time.monotonic() + (self.eviction_wait_s if wait else 0.0)
        while problem is not None and time.monotonic() < deadline and self._may_write():
            self.sleep(0.2)
            problem = self.room(bind)
        return problem


def _bind_annotations(bind: Bind) -> dict[str, str]:
    """The devices a GPU-sharing pod was given (whole GPUs are the device plugin's
    to choose; the snapshot accounts for them without a record)."""
    if not bind.gpu_devices or bind.gpu_fraction <= 0:
        return {}
    return {GPU_DEVICES_ANNOTATION: format_device_list(bind.gpu_devices)}


def _pod_ref(key: str) -> ObjectRef:
    namespace, _, name = key.partition("/")
    return ObjectRef("Pod", name, namespace)
