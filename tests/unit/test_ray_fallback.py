"""When Ray goes away, placement goes on with the local backend and comes back to Ray.

No Ray here: `FlakyRay` stands in for the Ray backend (it answers as the local
backend does, until it is told Ray is gone), so the fallback's bookkeeping, the
plans, and the operator's loop losing its Ray cluster mid-run are tested in
milliseconds. tests/unit/test_placement_ray.py does the same against a real
local Ray (actors killed, Ray shut down mid-transaction).
"""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from prometheus_client import CollectorRegistry

from kai_ray.decisions.placement import place_extras, place_gang, ray_backend, ray_link
from kai_ray.decisions.placement.backend import Counts, LocalBackend, RoomQuery
from kai_ray.decisions.placement.backend_choice import backend_for
from kai_ray.decisions.placement.ray_link import RayLink, RayStatus, RayUnavailable
from kai_ray.decisions.transaction import Transaction
from kai_ray.effects.health import serve_health
from kai_ray.effects.metrics import SchedulerMetrics
from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.state.snapshot import Snapshot
from kai_ray.values.clock import VirtualClock
from kai_ray.values.config import RayBackend, SchedulerConfig, SchedulerConfigSpec
from kai_ray.values.names import QUEUE_LABEL
from tests.builders import make_node, make_pod, make_pod_group, make_queue, make_topology
from tests.unit.placement_setup import cluster

RETRY_S = 30.0
ALWAYS = SchedulerConfigSpec(rayBackend=RayBackend(mode="always", retryAfter="30s"))
NEVER = SchedulerConfigSpec(rayBackend=RayBackend(mode="never"))


class FlakyRay:
    """The Ray backend's stand-in: the local backend's answers while the "cluster" is
    up; `RayUnavailable` from every query (or from being made) while it is down."""

    name = "ray"
    up = True
    made = 0
    queries = 0
    fail_after: ClassVar[int | None] = None

    def __init__(self, tx: Transaction, address: str | None, timeout_s: float) -> None:
        if not FlakyRay.up:
            raise RayUnavailable(f"cannot reach Ray at {address}: connection refused")
        FlakyRay.made += 1

    def domain_room(self, tx: Transaction, query: RoomQuery) -> list[Counts]:
        if FlakyRay.fail_after is not None and FlakyRay.queries >= FlakyRay.fail_after:
            FlakyRay.up = False
        if not FlakyRay.up:
            raise RayUnavailable("a room query: ActorDiedError: the actor died unexpectedly")
        FlakyRay.queries += 1
        return LocalBackend().domain_room(tx, query)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """A fresh link on a virtual clock, and `FlakyRay` in place of the Ray backend."""
    virtual = VirtualClock(1_000_000.0)
    monkeypatch.setattr(ray_link, "RAY_LINK", RayLink(virtual))
    monkeypatch.setattr(ray_backend, "RayPlacementBackend", FlakyRay)
    monkeypatch.setattr(FlakyRay, "up", True)
    monkeypatch.setattr(FlakyRay, "made", 0)
    monkeypatch.setattr(FlakyRay, "queries", 0)
    monkeypatch.setattr(FlakyRay, "fail_after", None)
    yield virtual


# ------------------------------------------------------------------ the link


def test_a_link_counts_a_fallback_per_loss_not_per_failed_retry() -> None:
    clock = VirtualClock(100.0)
    link = RayLink(clock)
    assert link.may_try() and link.status() == RayStatus()
    link.connected()
    assert link.status() == RayStatus(tried=True, available=True, since=100.0)
    clock.advance_to(150.0)
    link.lost("a room query: timed out", RETRY_S)
    lost = RayStatus(True, False, 150.0, "a room query: timed out", 1, 180.0)
    assert link.status() == lost and not link.may_try()
    clock.advance_to(180.0)
    assert link.may_try()
    link.lost("cannot reach Ray", RETRY_S)  # the retry failed: still lost since 150
    assert link.status() == RayStatus(True, False, 150.0, "cannot reach Ray", 1, 210.0)
    clock.advance_to(210.0)
    link.connected()
    assert link.status() == RayStatus(True, True, 210.0, "", 1, None)


def test_the_first_try_failing_is_a_fallback() -> None:
    link = RayLink(VirtualClock(5.0))
    link.lost("cannot reach Ray at head:6379", RETRY_S)
    assert link.status().fallbacks == 1 and link.status().since == 5.0


# ---------------------------------------------------------- one transaction


def gangs() -> Snapshot:
    """Eight racks of two 8-GPU nodes; six gangs of two 8-GPU pods, each in one rack."""
    nodes = [
        make_node(f"n{i}").gpus(8).in_domains(block=f"b{i // 4}", rack=f"r{i // 2}").build()
        for i in range(16)
    ]
    pods, groups = [], []
    for g in range(6):
        pods += [make_pod(f"g{g}-{i}").gpus(8).group(f"g{g}").created(g).build() for i in range(2)]
        group = make_pod_group(f"g{g}").queue("q").min_member(2).created(g)
        groups.append(group.topology("dc", "rack").build())
    topology = make_topology("dc").level("block").level("rack").hostname().build()
    return cluster(nodes, pods, groups, [topology])


def plan(snapshot: Snapshot, config: SchedulerConfigSpec) -> tuple[Any, list[str], str]:
    tx = Transaction(snapshot)
    ordered = sorted(snapshot.pod_groups.values(), key=lambda g: g.creation_timestamp)
    reasons = [place_gang(tx, group, config).reason for group in ordered]
    for group in ordered:
        place_extras(tx, group, config)
    tx.commit()
    return tx.binds(), reasons, backend_for(tx, config).name


def test_ray_lost_mid_transaction_gives_the_local_plan_and_ray_comes_back(
    clock: VirtualClock,
) -> None:
    snapshot = gangs()
    local_binds, local_reasons, _ = plan(snapshot, NEVER)
    FlakyRay.fail_after = 3  # three gangs' queries answered by "Ray", then it is gone
    binds, reasons, name = plan(snapshot, ALWAYS)
    assert (binds, reasons, name) == (local_binds, local_reasons, "local")
    assert FlakyRay.queries == 3
    status = ray_link.RAY_LINK.status()
    assert (status.available, status.fallbacks, status.retry_at) == (False, 1, clock.now() + 30)
    assert "ActorDiedError" in status.reason
    FlakyRay.up, FlakyRay.fail_after = True, None  # the cluster is back...
    clock.advance_to(clock.now() + RETRY_S - 1)
    assert plan(snapshot, ALWAYS)[2] == "local", "...but the backoff is not over"
    assert FlakyRay.made == 1
    clock.advance_to(clock.now() + 1)
    binds, reasons, name = plan(snapshot, ALWAYS)
    assert (binds, reasons, name) == (local_binds, local_reasons, "ray")
    assert ray_link.RAY_LINK.status() == RayStatus(True, True, clock.now(), "", 1, None)


def test_an_unreachable_ray_at_the_start_means_local_until_the_retry(
    clock: VirtualClock,
) -> None:
    FlakyRay.up = False
    snapshot = gangs()
    assert plan(snapshot, ALWAYS) == plan(snapshot, NEVER)
    status = ray_link.RAY_LINK.status()
    assert (status.tried, status.available, status.fallbacks) == (True, False, 1)
    assert "cannot reach Ray" in status.reason
    clock.advance_to(clock.now() + RETRY_S)
    assert plan(snapshot, ALWAYS)[2] == "local"  # the retry fails: not one more fallback
    assert ray_link.RAY_LINK.status().fallbacks == 1


# ------------------------------------------------- the operator's loop, whole


class Api:
    """Every write answers at once; a bind comes back as the pod's watch event; Events
    are recorded."""

    def __init__(self) -> None:
        self.loop: SchedulingLoop | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.bound: set[str] = set()
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, path: str, query: Any = None, body: Any = None, **_: Any) -> Any:
        parts = path.strip("/").split("/")
        if method == "POST" and parts[-1] == "binding" and self.loop is not None:
            key = f"{parts[-4]}/{parts[-2]}"
            pod = self.pods[key]
            self.bound.add(key)
            bound = {**pod, "spec": {**pod["spec"], "nodeName": body["target"]["name"]}}
            self.loop._on_event("Pod", "MODIFIED", bound)
        if method == "POST" and parts[-1] == "events":
            self.events.append(body)
        return body if method == "POST" and parts[-1] == "podgroups" else {}

    def submit_gang(self, name: str) -> list[str]:
        """A gang of two 8-GPU pods that must share a rack; the keys of its pods."""
        assert self.loop is not None
        group = make_pod_group(name).queue("team").min_member(2).topology("dc", "rack").build()
        self.loop._on_event("PodGroup", "ADDED", group)
        keys = []
        for i in range(2):
            pod = make_pod(f"{name}-{i}").label(QUEUE_LABEL, "team").gpus(8).group(name)
            body = pod.scheduler("kai-ray").build()
            body["metadata"].update(uid=f"uid-{name}-{i}", resourceVersion="1")
            body.setdefault("status", {"phase": "Pending"})
            keys.append(f"default/{name}-{i}")
            self.pods[keys[-1]] = body
            self.loop._on_event("Pod", "ADDED", body)
        return keys


@pytest.fixture
def operator(clock: VirtualClock) -> Iterator[tuple[SchedulingLoop, Api]]:
    """The operator's loop on a fake API server (no thread: each test runs its cycles),
    leading through a Lease it never renews in this test's few seconds."""
    api = Api()
    config = SchedulerConfig.model_validate(
        {"spec": {"rayBackend": {"mode": "always", "retryAfter": "30s"}}}
    )
    loop = SchedulingLoop(api, LoopOptions(config=config, lease_namespace="ops"))  # type: ignore[arg-type]
    loop.metrics = SchedulerMetrics(CollectorRegistry())
    loop.ray_report.metrics = loop.metrics
    assert loop.elector is not None
    loop.elector.leading.set()
    loop.elector.renewed_at = loop.elector.monotonic()
    loop.elector.uid = "lease-uid"
    api.loop = loop
    nodes = [make_node(f"n{i}").gpus(8).in_domains(rack=f"r{i // 2}").build() for i in range(8)]
    loop._on_list("Node", nodes)
    loop._on_list("Queue", [make_queue("team").build()])
    loop._on_list("Topology", [make_topology("dc").level("rack").hostname().build()])
    for kind in ("PodGroup", "Pod"):
        loop._on_list(kind, [])
    yield loop, api
    loop.stop_event.set()  # the writers' threads end (the loop's own never started)
    loop.binder.close()


def cycle_binds(loop: SchedulingLoop, api: Api, keys: list[str]) -> None:
    """One cycle, then its binds (made by the writers in the back) waited for."""
    loop.run_once()
    deadline = time.monotonic() + 5
    while not set(keys) <= api.bound and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(keys) <= api.bound, f"not bound: {sorted(set(keys) - api.bound)}"


def events(api: Api, count: int) -> list[tuple[str, str, str]]:
    """The Events posted so far, once there are `count` (they are posted in the back)."""
    deadline = time.monotonic() + 5
    while len(_on_lease(api)) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return [(e["type"], e["reason"], e["involvedObject"]["kind"]) for e in _on_lease(api)]


def _on_lease(api: Api) -> list[dict[str, Any]]:
    return [e for e in api.events if e["involvedObject"]["kind"] == "Lease"]


def sample(loop: SchedulingLoop, name: str) -> float | None:
    return loop.metrics.registry.get_sample_value(name)


def test_the_operator_keeps_scheduling_when_its_ray_cluster_goes_away(
    operator: tuple[SchedulingLoop, Api], clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    loop, api = operator
    caplog.set_level(logging.INFO, logger="kai_ray.loop")
    cycle_binds(loop, api, api.submit_gang("before"))
    assert FlakyRay.queries > 0 and sample(loop, "kai_ray_ray_backend_available") == 1
    assert loop.ray_report.health_line().startswith("ray backend: connected since")

    FlakyRay.up = False  # the Ray cluster goes away mid-run
    cycle_binds(loop, api, api.submit_gang("lost"))
    cycle_binds(loop, api, api.submit_gang("still-lost"))
    assert sample(loop, "kai_ray_ray_backend_available") == 0
    assert sample(loop, "kai_ray_ray_backend_fallbacks_total") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Ray backend lost" in warnings[0], warnings
    assert "placing with the local backend" in loop.ray_report.health_line()
    assert events(api, 1) == [("Warning", "RayBackendLost", "Lease")]
    lost = _on_lease(api)[0]
    assert lost["involvedObject"]["uid"] == "lease-uid"
    assert lost["involvedObject"]["apiVersion"] == "coordination.k8s.io/v1"
    assert lost["metadata"]["namespace"] == "ops"

    FlakyRay.up = True  # it comes back; the next cycle after the backoff uses it
    clock.advance_to(clock.now() + RETRY_S)
    made = FlakyRay.made
    cycle_binds(loop, api, api.submit_gang("back"))
    assert FlakyRay.made == made + 1
    assert sample(loop, "kai_ray_ray_backend_available") == 1
    assert sample(loop, "kai_ray_ray_backend_fallbacks_total") == 1
    infos = [r.getMessage() for r in caplog.records if "connected again" in r.getMessage()]
    assert len(infos) == 1 and "again after 30 s" in infos[0]
    assert events(api, 2)[1] == ("Normal", "RayBackendRestored", "Lease")


def test_a_scheduler_that_never_used_ray_says_nothing_of_it(
    operator: tuple[SchedulingLoop, Api],
) -> None:
    loop, api = operator
    loop.config = SchedulerConfig.model_validate({"spec": {"rayBackend": {"mode": "never"}}})
    cycle_binds(loop, api, api.submit_gang("g"))
    assert FlakyRay.made == 0
    assert sample(loop, "kai_ray_ray_backend_available") is None
    assert loop.ray_report.health_line() == ""


# ------------------------------------------------- reaching Ray, and timeouts


@pytest.mark.parametrize(
    ("address", "target"),
    [
        pytest.param("ray://head.ray:10001", ("head.ray", 10001), id="a Ray client address"),
        pytest.param("10.0.0.7:6379", ("10.0.0.7", 6379), id="a GCS address"),
        pytest.param("[::1]:6379", ("::1", 6379), id="an IPv6 address"),
        pytest.param("auto", None, id="auto: nothing to try before ray.init"),
    ],
)
def test_where_an_address_is_tried(address: str, target: tuple[str, int] | None) -> None:
    assert ray_backend._host_port(address) == target


def test_an_address_nobody_listens_on_is_refused_at_once() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        started = time.monotonic()
        with pytest.raises(RayUnavailable, match=f"cannot reach Ray at 127.0.0.1:{port}"):
            ray_backend._probe(f"127.0.0.1:{port}", timeout_s=5.0)
    assert time.monotonic() - started < 1.0


def test_a_query_that_times_out_says_how_long_it_waited() -> None:
    expected = pytest.raises(RayUnavailable, match="a room query: no answer within 10 s")
    with expected, ray_backend._calling_ray("a room query", 10.0):
        raise TimeoutError("Get timed out: some object(s) not ready.")


def test_the_health_endpoints_tell_the_ray_backend_without_failing() -> None:
    line = "ray backend: lost since 2026-12-05T08:00:00.000000Z (a room query: ...)"
    server = serve_health("127.0.0.1", 0, lambda: True, lambda: False, lambda: line)
    port = server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200 and answer.read().decode() == f"ok\n{line}\n"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert refused.value.read().decode() == f"/readyz failed\n{line}\n"
    finally:
        server.shutdown()
