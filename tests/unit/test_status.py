"""What the operator writes in PodGroup and Queue status, as named scenarios.

Every body is held to the CRD schema and the model (`status_checks`): a field the
API server would prune, or a value the next snapshot could not read, fails here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kai_ray.decisions.cycle import CycleResult, run_cycle
from kai_ray.decisions.plan import GroupStatus, Staleness
from kai_ray.effects.reporting import queue_validity_condition
from kai_ray.effects.status import (
    NOMINATED_NODES,
    pending_workloads,
    pod_group_status,
    quantity,
    queue_status,
    queue_statuses,
    usage_amounts,
    waits_for_its_pods,
)
from kai_ray.state.groups import PodGroupState
from kai_ray.state.queues import build_queue_tree
from kai_ray.state.snapshot import ClusterObjects, Snapshot, build_snapshot
from kai_ray.values.api import PodGroupStatus
from kai_ray.values.clock import rfc3339
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue
from tests.unit.status_checks import assert_kept_by_the_api_server, merge_patch

NOW = "2026-12-02T10:00:00.000000Z"
EARLIER = "2026-12-02T09:00:00.000000Z"
VALID = {
    "type": "Valid",
    "status": "True",
    "reason": "SpecValid",
    "message": "",
    "lastTransitionTime": EARLIER,
}


# ------------------------------------------------------------------------ PodGroup


@dataclass(frozen=True)
class Member:
    node: str | None = None
    phase: str = "Pending"


def pending(count: int) -> list[Member]:
    return [Member() for _ in range(count)]


def running(count: int) -> list[Member]:
    return [Member("n0", "Running") for _ in range(count)]


def bound(count: int) -> list[Member]:
    return [Member("n0", "Pending") for _ in range(count)]


def finished(phase: str, count: int) -> list[Member]:
    return [Member("n0", phase) for _ in range(count)]


@dataclass(frozen=True)
class GroupCase:
    members: Sequence[Member]
    min_member: int = 4
    status: dict[str, Any] | None = None
    planned: GroupStatus | None = None
    evicted_reason: str | None = None
    evicted_pods: int | None = None
    #: Expected
    phase: str = "Pending"
    reason: str = ""
    scheduled: tuple[str, str] | None = None  # (status, reason) of `Scheduled`
    counts: tuple[int, int, int] | None = None  # pending, bound, running


def group_state(case: GroupCase) -> PodGroupState:
    group = make_pod_group("g", "ml").queue("team").min_member(case.min_member).build()
    if case.status is not None:
        group["status"] = case.status
    pods = []
    for i, member in enumerate(case.members):
        pod = make_pod(f"p{i}", "ml").group("g").gpus(1).phase(member.phase)
        pods.append((pod.on(member.node) if member.node else pod).build())
    nodes = [make_node("n0").gpus(8).build()]
    objects = ClusterObjects(nodes, pods, [group], [make_queue("team").build()])
    return build_snapshot(objects).pod_groups["ml/g"]


def status_of(case: GroupCase) -> dict[str, Any]:
    group = group_state(case)
    return pod_group_status(
        group, case.planned, case.evicted_reason, NOW, evicted_pods=case.evicted_pods
    )


def admitted(reason: str = "") -> GroupStatus:
    return GroupStatus("ml/g", True, reason)


def refused(reason: str) -> GroupStatus:
    return GroupStatus("ml/g", False, reason)


NO_ROOM = "gang of 4 does not fit: needs 4 pods with 8 GPUs each; best rack has 6"
GROUP_CASES = [
    pytest.param(
        GroupCase(
            pending(4),
            planned=refused(NO_ROOM),
            reason=NO_ROOM,
            scheduled=("False", "Unschedulable"),
            counts=(4, 0, 0),
        ),
        id="gang of 4 waits: Pending, the plan's reason, Scheduled=False Unschedulable",
    ),
    pytest.param(
        GroupCase(
            pending(4),
            planned=admitted(),
            phase="Admitted",
            scheduled=("True", "Admitted"),
            counts=(4, 0, 0),
        ),
        id="gang admitted this cycle: Admitted, no reason, Scheduled=True",
    ),
    pytest.param(
        GroupCase(
            running(4),
            status={"phase": "Admitted"},
            phase="Running",
            scheduled=("True", "Admitted"),
            counts=(0, 4, 4),
        ),
        id="admitted gang whose four pods run: Running",
    ),
    pytest.param(
        GroupCase(
            [*running(2), *bound(2)],
            status={"phase": "Admitted"},
            phase="Admitted",
            counts=(0, 4, 2),
        ),
        id="bound pods not running yet are bound, not running: still Admitted",
    ),
    pytest.param(
        GroupCase(
            running(4),
            status={"phase": "Running"},
            evicted_reason="reclaim",
            phase="Evicted",
            reason="evicted: reclaim",
            scheduled=("False", "Evicted"),
        ),
        id="running gang reclaimed: Evicted, the eviction's reason",
    ),
    pytest.param(
        GroupCase(
            running(4),
            status={"phase": "Evicted", "reason": "evicted: reclaim"},
            phase="Evicted",
            reason="evicted: reclaim",
        ),
        id="evicted gang whose pods still terminate keeps its reason",
    ),
    pytest.param(
        GroupCase(
            running(6),
            status={"phase": "Running"},
            evicted_reason="reclaim",
            evicted_pods=2,
            phase="Running",
        ),
        id="evicting two elastic extras of six leaves the gang of 4 Running",
    ),
    pytest.param(
        GroupCase(
            finished("Succeeded", 4),
            status={"phase": "Running", "conditions": [VALID]},
            phase="Succeeded",
            counts=(0, 0, 0),
        ),
        id="every pod succeeded: Succeeded, nothing pending",
    ),
    pytest.param(
        GroupCase([], reason="waiting for its pods to be created"),
        id="a group whose pods are not made yet says so",
    ),
    pytest.param(
        GroupCase(
            pending(4),
            status={"phase": "Pending", "reason": NO_ROOM},
            reason=NO_ROOM,
        ),
        id="a waiting group the plan says nothing of keeps its reason",
    ),
]


@pytest.mark.parametrize("case", GROUP_CASES)
def test_pod_group_status(case: GroupCase) -> None:
    status = status_of(case)
    assert (status["phase"], status["reason"]) == (case.phase, case.reason)
    if case.counts is not None:
        assert (status["pending"], status["bound"], status["running"]) == case.counts
    scheduled = [c for c in status["conditions"] if c["type"] == "Scheduled"]
    if case.scheduled is not None:
        assert (scheduled[0]["status"], scheduled[0]["reason"]) == case.scheduled
        assert scheduled[0]["message"] == (case.reason if case.scheduled[0] == "False" else "")
    assert_kept_by_the_api_server("PodGroup", merge_patch(case.status or {}, status))


def test_only_a_refusal_is_told_as_a_warning() -> None:
    """A released group whose pods are not made yet waits normally (a Normal Event);
    a gang that does not fit is refused (a Warning)."""
    made_yet = status_of(GroupCase([], reason="waiting for its pods to be created"))
    assert waits_for_its_pods(made_yet["reason"])
    assert not waits_for_its_pods(NO_ROOM)
    assert not waits_for_its_pods("queue team-a is at its limit of nvidia.com/gpu 64")


def test_the_valid_condition_is_kept_untouched() -> None:
    case = GroupCase(pending(4), status={"conditions": [VALID]}, planned=refused(NO_ROOM))
    conditions = status_of(case)["conditions"]
    assert conditions[0] == VALID
    assert [c["type"] for c in conditions] == ["Valid", "Scheduled"]


def test_an_unchanged_condition_keeps_its_transition_time() -> None:
    scheduled = {"type": "Scheduled", "status": "False", "reason": "Unschedulable"}
    before = {"phase": "Pending", "conditions": [{**scheduled, "lastTransitionTime": EARLIER}]}
    case = GroupCase(pending(4), status=before, planned=refused(NO_ROOM))
    (condition,) = status_of(case)["conditions"]
    assert condition["lastTransitionTime"] == EARLIER
    assert condition["message"] == NO_ROOM


def test_the_stale_condition_comes_from_the_plan() -> None:
    since = 1_780_000_000.0
    planned = GroupStatus("ml/g", True, staleness=Staleness(since))
    case = GroupCase(running(3), status={"phase": "Running"}, planned=planned)
    status = status_of(case)
    (stale,) = [c for c in status["conditions"] if c["type"] == "Stale"]
    assert (stale["status"], stale["lastTransitionTime"]) == ("True", rfc3339(since))
    assert status["phase"] == "Admitted"  # below its minimum, re-admitted during the grace


def test_stale_gang_eviction_says_why() -> None:
    reason = "stale gang: 3 pods held for longer than the grace period while 4 are needed"
    planned = GroupStatus("ml/g", False, reason, Staleness(None))
    case = GroupCase(running(3), status={"phase": "Running"}, planned=planned)
    status = pod_group_status(group_state(case), planned, "stale-gang", NOW)
    assert (status["phase"], status["reason"]) == ("Evicted", reason)
    stale = next(c for c in status["conditions"] if c["type"] == "Stale")
    assert stale["status"] == "False"


def test_no_nominated_nodes_are_written_until_the_model_has_the_field() -> None:
    status = status_of(GroupCase(pending(4), planned=admitted()))
    if NOMINATED_NODES not in PodGroupStatus.model_fields:
        assert NOMINATED_NODES not in status


def test_a_gang_refused_by_the_cycle_carries_the_cycle_reason() -> None:
    """Through the whole cycle: 4 pods of 8 GPUs, one node of 8 free."""
    group = make_pod_group("g", "ml").queue("team").min_member(4).build()
    pods = [make_pod(f"p{i}", "ml").group("g").gpus(8).build() for i in range(4)]
    objects = ClusterObjects(
        [make_node("n0").gpus(8).build()], pods, [group], [make_queue("team").build()]
    )
    snapshot = build_snapshot(objects)
    result = run_cycle(snapshot, SchedulerConfig(), 1, 1000.0)
    planned = result.plan.status_of("ml/g")
    status = pod_group_status(snapshot.pod_groups["ml/g"], planned, None, NOW)
    assert planned is not None and planned.reason
    assert (status["phase"], status["reason"]) == ("Pending", planned.reason)


# --------------------------------------------------------------------------- Queue


@dataclass
class Cluster:
    """A department with two teams on two nodes of 8 GPUs; team-a runs a gang of two
    3-GPU pods, team-b waits with a gang of four 4-GPU pods."""

    queues: list[dict[str, Any]] = field(
        default_factory=lambda: [
            make_queue("dept").gpu(16).build(),
            make_queue("team-a").parent("dept").gpu(8).build(),
            make_queue("team-b").parent("dept").gpu(8).resource("example.com/nic", 2).build(),
        ]
    )

    def snapshot(self) -> Snapshot:
        nodes = [make_node(f"n{i}").gpus(8).cpu(64).memory("512Gi").build() for i in range(2)]
        groups = [
            make_pod_group("a", "ml").queue("team-a").min_member(2).build(),
            make_pod_group("b", "ml").queue("team-b").min_member(4).build(),
        ]
        pods = [
            make_pod(f"a{i}", "ml").group("a").gpus(3).cpu("500m").memory("4Gi").on("n0")
            for i in range(2)
        ]
        pods += [make_pod(f"b{i}", "ml").group("b").gpus(4).cpu(1) for i in range(4)]
        running = [pod.phase("Running").build() for pod in pods[:2]]
        objects = ClusterObjects(nodes, running + [p.build() for p in pods[2:]], groups)
        return build_snapshot(ClusterObjects(**{**vars(objects), "queues": self.queues}))


def cycle(snapshot: Snapshot, now: float = 1000.0) -> CycleResult:
    return run_cycle(snapshot, SchedulerConfig(), 1, now)


PHASES = {"ml/a": "Running", "ml/b": "Pending"}


def test_a_pending_group_without_pods_is_not_a_pending_workload() -> None:
    """A PodGroup whose pods are all gone (a failed RayJob's cluster torn down) or not
    made yet waits for its controller, not for its queue: not counted."""
    snapshot = Cluster().snapshot()
    empty = dataclasses.replace(snapshot.pod_groups["ml/b"], pods=())
    groups = {**snapshot.pod_groups, "ml/b": empty}
    counts = pending_workloads(snapshot.queues, groups, PHASES)
    assert counts.get("team-b", 0) == 0 and counts.get("dept", 0) == 0
    admitted = pending_workloads(snapshot.queues, groups, {**PHASES, "ml/b": "Admitted"})
    assert admitted["team-b"] == 1  # released, its pods about to be made: it waits


def test_queue_status_of_a_department_and_its_teams() -> None:
    snapshot = Cluster().snapshot()
    statuses = queue_statuses(snapshot, cycle(snapshot), PHASES)
    dept, team_a, team_b = statuses["dept"], statuses["team-a"], statuses["team-b"]
    assert team_a["allocated"] == {"cpu": 1, "memory": "8Gi", "gpu": 6}
    assert dept["allocated"]["gpu"] == 6
    assert (team_b["requested"]["gpu"], dept["requested"]["gpu"]) == (16, 22)
    assert dept["fairShare"]["gpu"] == 16 and team_a["fairShare"]["gpu"] == 6
    assert dept["childQueues"] == ["team-a", "team-b"] and team_a["childQueues"] == []
    assert (dept["pendingWorkloads"], team_a["pendingWorkloads"]) == (1, 0)
    assert team_b["pendingWorkloads"] == 1
    for status in statuses.values():
        assert_kept_by_the_api_server("Queue", status)


def test_a_resource_the_spec_names_is_reported_at_zero() -> None:
    snapshot = Cluster().snapshot()
    status = queue_statuses(snapshot, cycle(snapshot), PHASES)["team-b"]
    assert status["allocated"]["example.com/nic"] == 0
    assert set(status["fairShare"]) >= {"cpu", "memory", "gpu"}


def test_a_resource_no_longer_held_is_removed_by_the_merge_patch() -> None:
    snapshot = Cluster().snapshot()
    before = {
        "allocated": {"gpu": 2, "example.com/fpga": 1},
        "usage": {"example.com/fpga": "0.5"},
        "conditions": [VALID],
    }
    status = queue_status("team-a", snapshot, cycle(snapshot), 0, previous=before)
    assert status["allocated"]["example.com/fpga"] is None
    assert status["usage"]["example.com/fpga"] is None
    merged = merge_patch(before, status)
    assert "example.com/fpga" not in merged["allocated"]
    assert merged["conditions"] == [VALID]  # unchanged: its time kept
    assert_kept_by_the_api_server("Queue", merged)


def test_usage_is_persisted_in_the_shape_the_queue_tree_reads_back() -> None:
    snapshot = Cluster().snapshot()
    config = SchedulerConfig.model_validate({"spec": {"timeBasedFairness": {"k": 1}}})
    first = run_cycle(snapshot, config, 1, 1000.0)
    later = run_cycle(snapshot, config, 2, 4600.0, first.usage)
    status = queue_status("team-a", snapshot, later, 0)
    assert float(status["usage"]["gpu"]) > 0
    queue = make_queue("team-a").gpu(8).build()
    queue["status"] = status
    tree, problems = build_queue_tree([queue], {})
    assert problems == []
    for resource, fraction in later.usage.queues["team-a"].items():
        assert tree["team-a"].usage[resource] == pytest.approx(fraction, abs=1e-9)
    # the history, in whole minutes that are over (the first one in part held)
    kept = tree["team-a"].usage_history
    assert (kept[0].start_s, kept[-1].end_s) == (960.0, 4560.0)


def test_a_queue_left_out_of_the_tree_gets_valid_false_and_nothing_else() -> None:
    cluster = Cluster()
    cluster.queues.append(make_queue("orphan").parent("gone").build())
    snapshot = cluster.snapshot()
    status = queue_statuses(snapshot, cycle(snapshot), PHASES, names=["orphan"])["orphan"]
    assert list(status) == ["conditions"]
    (valid,) = status["conditions"]
    assert (valid["type"], valid["status"], valid["reason"]) == (
        "Valid",
        "False",
        "InvalidParentQueue",
    )
    assert valid["message"].startswith("spec.parentQueue: parent queue 'gone' does not exist")
    assert_kept_by_the_api_server("Queue", status)
    # The same condition the operator writes when the Queue is created or changed.
    by_name = {q["metadata"]["name"]: q for q in cluster.queues}
    at_creation = queue_validity_condition(by_name["orphan"], by_name, rfc3339(1000.0))
    assert valid == at_creation


def test_a_queue_back_in_the_tree_is_valid_again() -> None:
    snapshot = Cluster().snapshot()
    invalid = {**VALID, "status": "False", "reason": "InvalidParentQueue", "message": "gone"}
    status = queue_status(
        "team-a", snapshot, cycle(snapshot), 0, previous={"conditions": [invalid]}
    )
    (valid,) = status["conditions"]
    assert (valid["status"], valid["message"]) == ("True", "")
    assert valid["lastTransitionTime"] == rfc3339(1000.0)


@pytest.mark.parametrize(
    ("resource", "amount", "written"),
    [
        pytest.param("nvidia.com/gpu", 6.0, 6, id="whole GPUs as an integer"),
        pytest.param("nvidia.com/gpu", 2.5, "2.5", id="half a GPU as a decimal string"),
        pytest.param("nvidia.com/gpu", 16 / 3, "5.333", id="a fair share of 16/3 to 3 places"),
        pytest.param("nvidia.com/gpu", 5.9999999, 6, id="float noise rounds to a whole GPU"),
        pytest.param("cpu", 0.5, "500m", id="half a core in millicores"),
        pytest.param("cpu", 12.0, 12, id="whole cores as an integer"),
        pytest.param("memory", 64 * 2**30, "64Gi", id="memory in binary units when exact"),
        pytest.param("memory", 1_000_000_000.4, 1_000_000_000, id="other memory in bytes"),
        pytest.param("example.com/nic", 0.0, 0, id="zero as an integer"),
    ],
)
def test_quantity(resource: str, amount: float, written: int | str) -> None:
    assert quantity(resource, amount) == written


def test_usage_fractions_are_fixed_point_never_exponents() -> None:
    usage = usage_amounts({"nvidia.com/gpu": 1.23e-7, "cpu": 0.25})
    assert usage == {"cpu": "0.25", "gpu": "0.000000123"}
    assert_kept_by_the_api_server("Queue", {"usage": usage})
