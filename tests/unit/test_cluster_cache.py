"""The cluster cache: events in, snapshots out; assumed binds; the live room check."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.plan import Bind, Evict, GroupStatus, Plan
from kai_ray.effects.binder import DONE, Binder, Outcome, WriteResult
from kai_ray.state.cache import POD, ClusterCache
from kai_ray.state.snapshot import build_snapshot
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import ObjectRef
from kai_ray.values.names import ADMISSION_GATE, GPU_DEVICES_ANNOTATION


def node(name: str, gpus: int = 8, cpu: str = "64") -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str,
    gpus: int = 1,
    node_name: str | None = None,
    scheduler: str = "kai-ray",
    gates: tuple[str, ...] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if node_name:
        spec["nodeName"] = node_name
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_snapshot_of_the_cache_is_the_snapshot_of_its_objects() -> None:
    cache = ClusterCache()
    for obj in (node("n1"), node("n2"), pod("a", 2, "n1"), pod("b", 1)):
        cache.upsert(obj)
    cache.upsert(pod("a", 3, "n1"))  # an update replaces, in place
    built = build_snapshot(cache.objects())
    snapshot = cache.snapshot()
    assert snapshot.node_names == built.node_names == ("n1", "n2")
    assert snapshot.used.tolist() == built.used.tolist()
    assert list(snapshot.pods) == list(built.pods) == ["ns/a", "ns/b"]
    assert snapshot.free[0, snapshot.column("gpu")] == 5


def test_a_deleted_pod_frees_its_node_and_a_deleted_node_leaves_the_snapshot() -> None:
    cache = ClusterCache()
    for obj in (node("n1"), node("n2"), pod("a", 8, "n1")):
        cache.upsert(obj)
    assert cache.snapshot().free[0, 2] == 0
    cache.delete(POD, "ns/a")
    cache.delete("Node", "n2")
    snapshot = cache.snapshot()
    assert snapshot.node_names == ("n1",)
    assert snapshot.free[0, 2] == 8


def test_replace_all_drops_what_a_relist_no_longer_has() -> None:
    cache = ClusterCache()
    for obj in (pod("a"), pod("b"), pod("c")):
        cache.upsert(obj)
    cache.replace_all(POD, [pod("b"), pod("d")])
    assert [key for key, _ in cache.items(POD)] == ["ns/b", "ns/d"]


def test_an_assumed_bind_holds_the_node_until_the_watch_shows_it_or_it_expires() -> None:
    clock = Clock()
    cache = ClusterCache(clock=clock, assume_ttl_s=30)
    cache.upsert(node("n1"))
    cache.upsert(pod("a", 6))
    cache.assume("ns/a", "n1", "0,1,2,3,4,5")
    snapshot = cache.snapshot()
    assert snapshot.pods["ns/a"].node == "n1"
    assert snapshot.free[0, 2] == 2
    assert cache.pod("ns/a")["metadata"]["annotations"][GPU_DEVICES_ANNOTATION] == "0,1,2,3,4,5"
    clock.now = 31  # the watch never showed the bind: the pod is pending again
    assert cache.snapshot().pods["ns/a"].node is None
    cache.assume("ns/a", "n1")
    cache.upsert(pod("a", 6, "n1"))  # the watch caught up: nothing assumed is left
    clock.now = 100
    assert cache.snapshot().pods["ns/a"].node == "n1"


def test_the_room_check_counts_other_schedulers_and_assumed_binds() -> None:
    cache = ClusterCache()
    cache.upsert(node("n1", gpus=8))
    cache.upsert(pod("theirs", 4, "n1", scheduler="default-scheduler"))
    cache.upsert(pod("a", 3))
    cache.upsert(pod("b", 2))
    assert cache.room_problem("ns/a", "n1") is None
    cache.assume("ns/a", "n1")
    assert cache.room_problem("ns/b", "n1") == "node n1 has 1 nvidia.com/gpu free"
    assert cache.room_problem("ns/b", "gone") == "node gone is gone"


def share(
    name: str, fraction: str, node_name: str | None = None, device: str = ""
) -> dict[str, Any]:
    obj = pod(name, 0, node_name)
    obj["spec"]["containers"][0]["resources"] = {}
    obj["metadata"]["annotations"] = {"kai-ray.io/gpu-fraction": fraction}
    if device:
        obj["metadata"]["annotations"][GPU_DEVICES_ANNOTATION] = device
    return obj


def test_the_room_check_counts_the_shares_on_each_gpu_device() -> None:
    """A share asks no nvidia.com/gpu: the node's resources alone let a share onto a
    device that a share being deleted still holds (the soak saw 2 of one GPU held)."""
    cache = ClusterCache()
    cache.upsert(node("n1", gpus=2))
    going = share("going", "0.5", "n1", device="1")
    going["metadata"]["deletionTimestamp"] = "2026-12-04T20:36:03Z"  # holds it until gone
    cache.upsert(going)
    cache.upsert(share("new", "0.75"))
    assert cache.room_problem("ns/new", "n1", (1,), 0.75) == "GPU device 1 of node n1 has 0.5 free"
    assert cache.room_problem("ns/new", "n1", (0,), 0.75) is None
    cache.assume("ns/new", "n1", "0")
    cache.upsert(pod("whole", 1))  # device 0 and device 1 each hold a share: none is free
    assert cache.room_problem("ns/whole", "n1") == "node n1 has 0 untouched GPU devices"
    cache.delete("Pod", "ns/going")
    assert cache.room_problem("ns/whole", "n1") is None


# ---------------------------------------------------------------------- the binder


class MemoryWriter:
    """A writer that records calls and fails the pods it is told to."""

    def __init__(self, failing: Mapping[str, WriteResult] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.failing = dict(failing or {})
        self.events: list[tuple[str, str]] = []

    def evict(self, evict: Evict, message: str) -> WriteResult:
        self.calls.append(("evict", evict.pod))
        return DONE

    def lift_gate(self, pod: str, gate: str) -> WriteResult:
        self.calls.append(("lift", pod))
        return DONE

    def bind(self, bind: Bind, annotations: Mapping[str, str]) -> WriteResult:
        self.calls.append(("bind", f"{bind.pod}@{bind.node}:{annotations}"))
        return self.failing.get(bind.pod, DONE)

    def write_group_status(self, status: GroupStatus, now: float) -> WriteResult:
        self.calls.append(("status", status.group))
        return DONE

    def resume_workload(self, kind: str, key: str, nodes: Sequence[str]) -> WriteResult:
        self.calls.append(("resume", f"{kind} {key} on {','.join(nodes)}"))
        return DONE

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        self.events.append((ref.name, reason))


def test_the_binder_evicts_first_lifts_gates_then_binds_with_devices() -> None:
    cache = ClusterCache()
    for obj in (node("n1"), pod("v", 8, "n1"), pod("g", 0, gates=(ADMISSION_GATE,)), pod("w", 2)):
        cache.upsert(obj)
    plan = Plan(cycle=1)
    plan.evictions.append(Evict("ns/v", "ns/vg", "reclaim"))
    plan.binds.append(Bind("ns/g", "ns/pg", "n1", (0,), gpu_fraction=0.5))
    plan.binds.append(Bind("ns/w", "ns/pg", "n1", (1, 2)))
    writer = MemoryWriter()
    report = Binder(writer).apply(plan, cache.snapshot(), 0.0)
    assert writer.calls == [
        ("evict", "ns/v"),
        ("lift", "ns/g"),
        ("bind", "ns/g@n1:{'kai-ray.io/gpu-devices': '0'}"),  # a share: its device recorded
        ("bind", "ns/w@n1:{}"),  # whole GPUs: the device plugin's to choose
    ]
    assert [b.pod for b in report.bound] == ["ns/g", "ns/w"]
    assert ("v", "Evicted") in writer.events and ("g", "Scheduled") in writer.events


class SlowEvictions(MemoryWriter):
    """Each eviction waits until `together` of them are under way (or 5 s pass)."""

    def __init__(self, together: int, failing: Mapping[str, WriteResult]) -> None:
        super().__init__(failing)
        self.barrier = threading.Barrier(together, timeout=5)

    def evict(self, evict: Evict, message: str) -> WriteResult:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return WriteResult(Outcome.RETRY, "evicted one at a time")
        super().evict(evict, message)
        return self.failing.get(evict.pod, DONE)


def test_a_plans_evictions_go_out_together_and_before_its_binds() -> None:
    cache = ClusterCache()
    victims = [pod(f"v{i}", 2, "n1") for i in range(4)]
    for obj in (node("n1"), *victims, pod("w", 2)):
        cache.upsert(obj)
    plan = Plan(cycle=1)
    plan.evictions.extend(Evict(f"ns/v{i}", f"ns/vg{i}", "consolidation") for i in range(4))
    plan.binds.append(Bind("ns/w", "ns/pg", "n1", ()))
    gone = WriteResult(Outcome.PERMANENT, "not found")
    writer = SlowEvictions(4, {"ns/v3": gone})
    report = Binder(writer, parallelism=4).apply(plan, cache.snapshot(), 0.0)
    assert [e.pod for e in report.evicted] == ["ns/v0", "ns/v1", "ns/v2"]  # plan order
    assert [(e.pod, r) for e, r in report.failed_evictions] == [("ns/v3", gone)]
    assert writer.calls[-1] == ("bind", "ns/w@n1:{}")  # after every eviction
    assert sorted(c for c in writer.calls[:-1]) == [("evict", f"ns/v{i}") for i in range(4)]
    assert sorted(name for name, reason in writer.events if reason == "Evicted") == [
        "v0",
        "v1",
        "v2",
    ]


@pytest.mark.parametrize(
    "outcome", [Outcome.RETRY, Outcome.PERMANENT], ids=["a conflict", "the pod is gone"]
)
def test_a_failed_bind_is_reported_and_not_assumed(outcome: Outcome) -> None:
    cache = ClusterCache()
    for obj in (node("n1"), pod("a"), pod("b")):
        cache.upsert(obj)
    plan = Plan(cycle=1)
    plan.binds += [Bind("ns/a", "ns/pg", "n1"), Bind("ns/b", "ns/pg", "n1")]
    writer = MemoryWriter({"ns/a": WriteResult(outcome, "409: already bound")})
    binder = Binder(
        writer,
        room=lambda b: cache.room_problem(b.pod, b.node, b.gpu_devices, b.gpu_fraction),
        on_bound=lambda b: cache.assume(b.pod, b.node),
    )
    report = binder.apply(plan, cache.snapshot(), 0.0)
    assert [(b.pod, r.outcome) for b, r in report.failed] == [("ns/a", outcome)]
    assert [b.pod for b in report.bound] == ["ns/b"]
    assert cache.snapshot().pods["ns/a"].node is None
    assert cache.snapshot().pods["ns/b"].node == "n1"
    assert ("a", "FailedBinding") in writer.events


def test_a_bind_that_would_overcommit_the_live_node_is_skipped() -> None:
    cache = ClusterCache()
    for obj in (node("n1"), pod("a", 6)):
        cache.upsert(obj)
    snapshot = cache.snapshot()  # the cycle saw 8 free GPUs
    cache.upsert(pod("theirs", 4, "n1", scheduler="default-scheduler"))
    plan = Plan(cycle=1)
    plan.binds.append(Bind("ns/a", "ns/pg", "n1"))
    writer = MemoryWriter()
    report = Binder(
        writer, room=lambda b: cache.room_problem(b.pod, b.node, b.gpu_devices, b.gpu_fraction)
    ).apply(plan, snapshot, 0.0)
    assert not report.bound and not [c for c in writer.calls if c[0] == "bind"]
    assert report.failed[0][1].message == "bind to n1 skipped: node n1 has 4 nvidia.com/gpu free"


def test_a_pod_deleted_unbound_is_not_scheduled_and_a_bound_one_holds_its_node() -> None:
    cache = ClusterCache()
    cache.upsert(node("n1"))
    for obj in (pod("gone"), pod("going", 8, "n1"), pod("waits")):
        if obj["metadata"]["name"] != "waits":
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
        cache.upsert(obj)
    snapshot = cache.snapshot()
    assert sorted(snapshot.pods) == ["ns/going", "ns/waits"]
    assert [p.key for p in snapshot.pending_pods] == ["ns/waits"]
    assert snapshot.free[0, snapshot.column("gpu")] == 0  # until the bound one is gone
    assert sorted(build_snapshot(cache.objects()).pods) == sorted(snapshot.pods)
    cache.delete(POD, "ns/going")
    assert cache.snapshot().free[0, snapshot.column("gpu")] == 8


def _plan_moving_v_out_for_a() -> Plan:
    plan = Plan(cycle=1)
    plan.evictions.append(Evict("ns/v", "ns/vg", "reclaim"))
    plan.binds += [Bind("ns/a", "ns/pg", "n1"), Bind("ns/b", "ns/pg", "n2")]
    return plan


def _cache_with_v_on_n1() -> ClusterCache:
    """Two 8-GPU nodes, `v` running on n1, `a` and `b` waiting (for the plan above)."""
    cache = ClusterCache()
    for obj in (node("n1"), node("n2"), pod("v", 8, "n1"), pod("a", 8), pod("b", 8)):
        cache.upsert(obj)
    return cache


def _reserving_binder(cache: ClusterCache, writer: MemoryWriter, wait_s: float) -> Binder:
    return Binder(
        writer,
        room=lambda b: cache.room_problem(b.pod, b.node, b.gpu_devices, b.gpu_fraction),
        on_bound=lambda b: cache.assume(b.pod, b.node),
        eviction_wait_s=wait_s,
        reserve=lambda b: cache.assume(b.pod, b.node),
        unreserve=lambda b: cache.forget_assumed(b.pod),
    )


def test_a_bind_waiting_for_evicted_pods_holds_its_room_but_not_the_cycle() -> None:
    """The bind onto the node the plan evicts from waits in the background, its
    room reserved (read as bound there); the other node's bind is made at once."""
    cache = _cache_with_v_on_n1()
    writer = MemoryWriter()
    binder = _reserving_binder(cache, writer, wait_s=30.0)
    report = binder.apply(_plan_moving_v_out_for_a(), cache.snapshot(), 0.0)
    assert [b.pod for b in report.bound] == ["ns/b"]
    assert [b.pod for b in report.deferred] == ["ns/a"]
    assert cache.snapshot().pods["ns/a"].node == "n1"  # reserved: no other cycle takes it
    assert ("bind", "ns/a@n1:{}") not in writer.calls
    cache.delete(POD, "ns/v")  # the evicted pod has gone
    binder.wait_deferred(timeout=10)
    assert ("bind", "ns/a@n1:{}") in writer.calls
    assert cache.snapshot().pods["ns/a"].node == "n1"
    binder.close()


def test_a_deferred_bind_that_never_gets_its_room_gives_the_reservation_back() -> None:
    cache = _cache_with_v_on_n1()
    writer = MemoryWriter()
    binder = _reserving_binder(cache, writer, wait_s=0.3)
    binder.apply(_plan_moving_v_out_for_a(), cache.snapshot(), 0.0)
    binder.wait_deferred(timeout=10)
    assert ("bind", "ns/a@n1:{}") not in writer.calls
    assert cache.snapshot().pods["ns/a"].node is None  # pending again, for the next cycle
    assert ("a", "FailedBinding") in writer.events
    binder.close()


def test_a_deferred_bind_of_a_replica_that_stopped_leading_is_dropped() -> None:
    """A bind waiting in the back for an evicted pod to go is not made once the
    replica no longer leads, even when the room comes: the new leader plans that
    room from its own view (a bind made anyway overcommits what it gave away)."""
    cache = _cache_with_v_on_n1()
    writer = MemoryWriter()
    leading = [True]
    binder = _reserving_binder(cache, writer, wait_s=30.0)
    binder.may_write = lambda: leading[0]
    report = binder.apply(_plan_moving_v_out_for_a(), cache.snapshot(), 0.0)
    assert [b.pod for b in report.bound] == ["ns/b"]  # made while leading
    leading[0] = False  # the Lease is lost while the evicted pod is going
    cache.delete(POD, "ns/v")
    binder.wait_deferred(timeout=10)
    assert ("bind", "ns/a@n1:{}") not in writer.calls
    assert cache.snapshot().pods["ns/a"].node is None  # its reservation given back
    binder.close()


def test_a_replica_that_no_longer_leads_neither_evicts_nor_binds() -> None:
    cache = _cache_with_v_on_n1()
    writer = MemoryWriter()
    binder = _reserving_binder(cache, writer, wait_s=0.0)
    binder.may_write = lambda: False
    report = binder.apply(_plan_moving_v_out_for_a(), cache.snapshot(), 0.0)
    assert writer.calls == []
    assert (report.evicted, report.bound) == ([], [])
    assert [r.message for _, r in report.failed_evictions] == [
        "not written: this replica no longer leads"
    ]


def test_binds_handed_to_the_writers_are_reserved_until_each_ends() -> None:
    """With `submit`, `apply` reserves every bind and returns before any is made;
    a reservation does not expire while its bind waits its turn; a bind made is
    assumed (its TTL counted from then), a failed one is given back."""
    clock = Clock()
    cache = ClusterCache(clock=clock, assume_ttl_s=30)
    for obj in (node("n1"), pod("a", 2), pod("b", 2)):
        cache.upsert(obj)
    queued: list[Callable[[], None]] = []
    ended: list[tuple[str, bool]] = []
    writer = MemoryWriter(failing={"ns/b": WriteResult(Outcome.RETRY, "409")})
    binder = Binder(
        writer,
        room=lambda b: cache.room_problem(b.pod, b.node, b.gpu_devices, b.gpu_fraction),
        on_bound=lambda b: (cache.assume(b.pod, b.node), ended.append((b.pod, True))),
        on_failed=lambda b, _: ended.append((b.pod, False)),
        reserve=lambda b: cache.reserve(b.pod, b.node),
        unreserve=lambda b: cache.forget_assumed(b.pod),
        submit=queued.append,
    )
    binds = [Bind("ns/a", "ns/a", "n1"), Bind("ns/b", "ns/b", "n1")]
    report = binder.apply(Plan(cycle=1, binds=binds), cache.snapshot(), 0.0)
    assert (report.bound, [b.pod for b in report.deferred]) == ([], ["ns/a", "ns/b"])
    assert writer.calls == [] and len(queued) == 2  # a bind a writer, in plan order
    clock.now = 100  # long past the TTL: still reserved, nothing else may take the room
    assert cache.snapshot().free[0, 2] == 4
    for write in queued:
        write()
    assert ended == [("ns/a", True), ("ns/b", False)]
    assert ("b", "FailedBinding") in writer.events
    snapshot = cache.snapshot()
    assert (snapshot.pods["ns/a"].node, snapshot.pods["ns/b"].node) == ("n1", None)
    clock.now = 131  # the made bind's assumption runs from when it was made
    assert cache.snapshot().pods["ns/a"].node is None


def test_a_pod_of_another_scheduler_naming_a_pod_group_is_not_ours_to_place() -> None:
    """Two schedulers reading the same group annotation would both bind the pod:
    another scheduler's pod counts on its node only, not as a member of the group,
    in the kept snapshot and in a full build alike."""
    group = {
        "apiVersion": "scheduling.kai-ray.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "gang", "namespace": "ns"},
        "spec": {"queue": "team", "minMember": 1},
    }
    queues = [
        {"apiVersion": "scheduling.kai-ray.io/v1alpha1", "kind": "Queue", "metadata": {"name": n}}
        for n in ("team",)
    ]
    theirs = pod("theirs", 1, scheduler="kai-ray-other")
    theirs["metadata"]["annotations"] = {"kai-ray.io/pod-group": "gang"}
    bound = pod("bound", 2, "n1", scheduler="kai-ray-other")
    bound["metadata"]["annotations"] = {"kai-ray.io/pod-group": "gang"}
    cache = ClusterCache()
    for obj in (node("n1"), *queues, group, theirs, bound):
        cache.upsert(obj)
    for snapshot in (cache.snapshot(), build_snapshot(cache.objects())):
        state = snapshot.pod_groups["ns/gang"]
        assert (state.bound, state.live) == ((), ())
        assert snapshot.problems == ()
        assert snapshot.free[0, snapshot.column("gpu")] == 6  # its bound pod still counts
        assert run_cycle(snapshot, SchedulerConfig(), 1, 1.0e9).plan.binds == []
