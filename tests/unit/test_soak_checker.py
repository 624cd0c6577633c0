"""The soak's checker finds what it is there to find (tests/e2e/soak_oracle.py,
soak_checker.py): a zero count from it means nothing was wrong, not that it looked
away. Plain objects as the API returns them; no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e import soak_checker as checker
from tests.e2e import soak_oracle as oracle
from tests.e2e.soak_faults import Fault
from tests.e2e.soak_observer import Episode, EvictionSeen

RACK = "kai-ray.io/rack"


def node(name: str, gpus: int = 8, rack: str = "r0", cordoned: bool = False) -> dict[str, Any]:
    room = {"nvidia.com/gpu": str(gpus), "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {RACK: rack}},
        "spec": {"unschedulable": cordoned},
        "status": {"allocatable": room, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(
    name: str,
    gpus: int = 0,
    on: str | None = None,
    group: str | None = None,
    fraction: str | None = None,
    devices: str | None = None,
    phase: str | None = None,
) -> dict[str, Any]:
    annotations = {}
    if group:
        annotations["kai-ray.io/pod-group"] = group
    if fraction:
        annotations["kai-ray.io/gpu-fraction"] = fraction
    if devices:
        annotations["kai-ray.io/gpu-devices"] = devices
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": phase or ("Running" if on else "Pending")},
    }


def gang(name: str, min_member: int, level: str | None = None) -> oracle.GangView:
    return oracle.GangView(f"ns/{name}", "team", min_member, RACK if level else None)


QUEUES = {
    "dept": oracle.QueueView("dept", None, 16, None),
    "team": oracle.QueueView("team", "dept", 8, 12),
}


def judge(pods: list[dict[str, Any]], nodes: list[dict[str, Any]], groups: list[oracle.GangView]):
    views = [oracle.read_pod(p, {}) for p in pods]
    node_views = {n.name: n for n in map(oracle.read_node, nodes)}
    usage = oracle.node_usage(node_views.values(), views)
    gangs = oracle.by_gang(views)
    by_key = {g.key: g for g in groups}
    allocated = oracle.queue_allocations(views, {g.key: g.queue for g in groups}, QUEUES)
    fits = oracle.fit_pending(gangs, by_key, node_views, usage, QUEUES, allocated)
    partial = oracle.partial_gangs(gangs, by_key, node_views)
    return fits, partial, oracle.overcommitted(node_views.values(), usage)


FIT_CASES = [
    pytest.param(
        [pod("a-0", 4, group="a"), pod("a-1", 4, group="a")],
        [node("n0"), node("n1", rack="r1")],
        [gang("a", 2)],
        ["ns/a"],
        id="a gang of two 4-GPU pods pending on an empty 8-GPU node fits",
    ),
    pytest.param(
        [pod("a-0", 6, group="a"), pod("a-1", 6, group="a")],
        [node("n0"), node("n1", rack="r1")],
        [gang("a", 2, "rack")],
        [],
        id="the same gang held to one rack does not fit in two racks of one node",
    ),
    pytest.param(
        [pod("a-0", 4, group="a"), pod("a-1", 4, group="a"), pod("x", 6, on="n0", group="x")],
        [node("n0"), node("n1", rack="r1")],
        [gang("a", 2), gang("x", 1)],
        [],
        id="a gang that needs more than the free room does not fit",
    ),
    pytest.param(
        [pod("a-0", 4, group="a"), pod("x", 9, on="n0", group="x")],
        [node("n0", gpus=16), node("n1")],
        [gang("a", 1), gang("x", 1)],
        [],
        id="a queue at its limit has no room although nodes do",
    ),
    pytest.param(
        [pod("a-0", 1, group="a")],
        [node("n0", cordoned=True)],
        [gang("a", 1)],
        [],
        id="a cordoned node takes nothing",
    ),
    pytest.param(
        [pod("s", fraction="0.5", group="s"), pod("w", 7, on="n0", group="w")],
        [node("n0")],
        [gang("s", 1), gang("w", 1)],
        ["ns/s"],
        id="a half GPU fits on the one untouched device left",
    ),
    pytest.param(
        [
            pod("s", fraction="0.5", group="s"),
            pod("w", 7, on="n0", group="w"),
            pod("t", on="n0", fraction="0.75", devices="7", group="t"),
        ],
        [node("n0")],
        [gang("s", 1), gang("w", 1), gang("t", 1)],
        [],
        id="a half GPU does not fit a device three quarters used",
    ),
]


#: A gang of two 4-GPU pods, one bound on n0 (rack r0, 2 GPUs left after another
#: pod), the other pending; n1 (rack r1) is empty.
PARTLY_BOUND = (
    [pod("a-0", 4, on="n0", group="a"), pod("x", 2, on="n0", group="x"), pod("a-1", 4, group="a")],
    [node("n0"), node("n1", rack="r1")],
)

FIT_CASES += [
    pytest.param(
        [pod("a-0", 1, on="gone", group="a")] * 3 + [pod("a-3", 1, group="a")],
        [node("n0")],
        [gang("a", 4)],
        [],
        id="a gang whose other members sit on a deleted node cannot reach its minimum",
    ),
    pytest.param(
        [pod("j-0", 1, on="n0", group="j", phase="Succeeded"), pod("j-1", 1, group="j")],
        [node("n0")],
        [gang("j", 2)],
        ["ns/j"],
        id="a member that finished counts towards the minimum: the other one fits",
    ),
    pytest.param(
        *PARTLY_BOUND,
        [gang("a", 2, "rack"), gang("x", 1)],
        [],
        id="the rest of a partly bound gang held to a rack must join its bound member's rack",
    ),
    pytest.param(
        *PARTLY_BOUND,
        [gang("a", 2), gang("x", 1)],
        ["ns/a"],
        id="without a required rack the rest of a partly bound gang may go anywhere",
    ),
]


@pytest.mark.parametrize(("pods", "nodes", "groups", "expected"), FIT_CASES)
def test_fit_pending(
    pods: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    groups: list[oracle.GangView],
    expected: list[str],
) -> None:
    fits, _, _ = judge(pods, nodes, groups)
    assert sorted(fits) == expected


def test_an_extra_beyond_its_queues_quota_waits_while_another_queue_waits() -> None:
    queues = {
        **QUEUES,
        "team": oracle.QueueView("team", "dept", 2, None),
        "other": oracle.QueueView("other", "dept", 8, None),
    }
    groups = [gang("a", 2), oracle.GangView("ns/o", "other", 1, None)]
    at_minimum = [pod("a-0", 1, on="n0", group="a"), pod("a-1", 1, on="n0", group="a")]
    extra = pod("a-2", 1, group="a")
    views = [oracle.read_pod(p, {}) for p in [*at_minimum, extra, pod("o-0", 16, group="o")]]

    def fits(views: list[oracle.PodView]) -> list[str]:
        nodes = {n.name: n for n in map(oracle.read_node, [node("n0")])}
        usage = oracle.node_usage(nodes.values(), views)
        allocated = oracle.queue_allocations(views, {g.key: g.queue for g in groups}, queues)
        by_key = {g.key: g for g in groups}
        return sorted(
            oracle.fit_pending(oracle.by_gang(views), by_key, nodes, usage, queues, allocated)
        )

    assert fits(views) == []  # team holds its quota of 2; other waits (for 16 GPUs)
    assert fits(views[:3]) == ["ns/a"]  # nobody else waits: the extra fits and should go


def test_room_held_for_an_admitted_workload_until_its_pods_exist_is_not_a_fit() -> None:
    """kai-ray released RayCluster `r` (2 pods) onto n1, whose room it holds until
    KubeRay makes the pods; n0 is full, so gang `a` fits only on held room."""
    cluster = {
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "annotations": {"kai-ray.io/admitted-nodes": "n1,n1"},
        },
        "spec": {"suspend": False},
    }
    nodes = {n.name: n for n in map(oracle.read_node, [node("n0"), node("n1")])}
    views = [
        oracle.read_pod(p, {}) for p in [pod("x", 8, on="n0", group="x"), pod("a-0", 4, group="a")]
    ]
    gangs = oracle.by_gang(views)
    gang_key = oracle.workload_gang(cluster, "RayCluster")
    assert gang_key == "ns/raycluster-r"
    admitted = {gang_key: (100.0, oracle.admitted_nodes(cluster))}
    groups = {g.key: g for g in [gang("a", 1), gang("x", 1)]}
    usage = oracle.node_usage(nodes.values(), views)
    allocated = oracle.queue_allocations(views, {k: "team" for k in groups}, QUEUES)

    def fits(now: float, pods_made: int = 0) -> list[str]:
        made = {**gangs, gang_key: [oracle.read_pod(pod(f"r-{i}"), {}) for i in range(pods_made)]}
        held = oracle.admitted_room(admitted, made, now)
        return sorted(oracle.fit_pending(gangs, groups, nodes, usage, QUEUES, allocated, held))

    assert fits(now=110.0) == []  # n1 is held for r's pods
    holders: dict[str, str] = {}
    assert oracle.admitted_room(admitted, gangs, 110.0, None, holders) == {"n1"}
    assert holders == {"n1": "ns/raycluster-r (0 of 2 pods, 10s)"}
    assert fits(now=110.0, pods_made=2) == ["ns/a"]  # its pods exist: they hold their own room
    assert fits(now=100.0 + oracle.ADMITTED_HOLD_S) == ["ns/a"]  # the operator lets go in time
    # once all its pods existed, the hold is over for good, as the operator's is
    ended: set[tuple[str, float]] = set()
    made = {**gangs, gang_key: [oracle.read_pod(pod(f"r-{i}"), {}) for i in range(2)]}
    assert oracle.admitted_room(admitted, made, 110.0, ended) == set()
    made[gang_key] = made[gang_key][:1]  # one of its pods deleted
    assert oracle.admitted_room(admitted, made, 111.0, ended) == set()
    assert oracle.admitted_room(admitted, made, 111.0) == {"n1"}
    assert oracle.admitted_nodes({**cluster, "spec": {"suspend": True}}) == ()


def test_a_gang_with_too_few_live_members_bound_is_partial_unless_one_finished() -> None:
    pods = [pod("a-0", 1, on="n0", group="a"), pod("a-1", 1, group="a")]
    pods += [pod("b-0", 1, on="n0", group="b", phase="Succeeded"), pod("b-1", 1, group="b")]
    pods += [pod("c-0", 1, on="ghost", group="c"), pod("c-1", 1, on="n0", group="c")]
    _, partial, _ = judge(pods, [node("n0")], [gang("a", 2), gang("b", 2), gang("c", 2)])
    assert sorted(partial) == ["ns/a", "ns/c"]


def test_overcommitted_nodes_and_devices_are_named() -> None:
    pods = [pod("a", 6, on="n0", group="a"), pod("b", 4, on="n0", group="b")]
    pods += [
        pod("c", on="n1", fraction="0.75", devices="0", group="c"),
        pod("d", on="n1", fraction="0.5", devices="0", group="d"),
        pod("e", on="n1", fraction="0.5", devices="9", group="e"),
    ]
    _, _, over = judge(pods, [node("n0"), node("n1")], [])
    assert over == [
        "node n0: 10 GPUs held of 8",
        "node n1 device 0: 1.25 of one GPU held",
        "node n1: device 9 does not exist",
    ]


def test_double_binds_and_binds_onto_cordoned_or_deleted_nodes_come_from_the_audit() -> None:
    entries = [
        checker.AuditEntry("binding", "ns/a", 100.0, 201, "n0"),
        checker.AuditEntry("binding", "ns/a", 101.0, 409, "n1"),
        checker.AuditEntry("binding", "ns/b", 102.0, 201, "n1"),
        checker.AuditEntry("binding", "ns/b", 103.0, 201, "n1"),
        checker.AuditEntry("binding", "ns/c", 110.0, 201, "n2"),
        checker.AuditEntry("binding", "ns/d", 120.0, 201, "n3"),
    ]
    assert checker.double_binds(entries) == ["ns/b bound 2 times"]
    cordon = Fault("cordon-node", 0, 105.0, node="n2", until_wall=130.0)
    deleted = Fault("delete-node-mid-bind", 0, 100.0, node="n3")
    on_cordoned, on_deleted = checker.binds_onto(entries, [cordon, deleted], patience_s=2.0)
    assert on_cordoned == ["ns/c bound to cordoned n2 5.0s after the cordon"]
    assert on_deleted == ["ns/d bound to n3 20.0s after it was deleted"]


def test_evictions_that_break_the_rules() -> None:
    def seen(reason: str, held: float, gpus: float = 4, released: float = 0, owned: bool = True):
        return EvictionSeen("ns/p", "team", reason, 100.0, gpus, owned, held, released)

    partial = {"ns/g": [Episode("ns/g", "partial", 30.0, 99.0)]}
    found = checker.bad_evictions(
        [
            seen("Reclaim", held=12),  # 8 left, the quota: fine
            seen("Reclaim", held=10),  # 6 left: below the quota
            seen("Reclaim", held=10, released=2),  # the cycle could not see 2 GPUs go
            seen("Preempt", held=12),
            seen("Consolidation", held=12, owned=False),
            seen("StaleGang", held=12),
        ],
        QUEUES,
        partial,
        {"ns/p": "ns/g"},
        grace_s=60,
        slack_s=2,
    )
    assert [line.split(" ")[0] for line in found] == ["reclaim", "preemption", "consolidation"]
    too_soon = checker.bad_evictions(
        [seen("StaleGang", 12)], QUEUES, partial, {"ns/p": "ns/g"}, grace_s=90, slack_s=2
    )
    assert len(too_soon) == 1 and "grace" in too_soon[0]


def test_a_reclaim_is_judged_with_the_binds_the_cycle_had_made_and_on_its_own_count() -> None:
    """Allocate may give the victim's queue a pod in the same cycle that reclaims
    from it: the cycle counts it at once, the API server has it only after the
    evictions. Such a bind, close to the eviction, counts as held; one long after,
    or one the observer had counted already, does not. kai-ray's own count (the
    condition's message) is judged as it stands."""

    def seen(held: float, kept: float | None = None) -> EvictionSeen:
        return EvictionSeen(
            "ns/p", "team", "Reclaim", 100.0, 4, True, held, 0.0,
            wall=1000.0, counted=frozenset({"ns/old"}), cycle_kept=kept,
        )  # fmt: skip

    gpus = {"ns/new": 4.0, "ns/old": 4.0, "ns/late": 4.0}
    binds = [
        checker.AuditEntry("binding", "ns/new", 1000.4, 201, "n1"),
        checker.AuditEntry("binding", "ns/old", 999.0, 201, "n1"),  # counted already
        checker.AuditEntry("binding", "ns/late", 1030.0, 201, "n2"),  # a later cycle's
        checker.AuditEntry("binding", "other/x", 1000.2, 201, "n2"),  # another queue's
    ]

    def judge(*evictions: EvictionSeen) -> list[str]:
        return checker.bad_evictions(evictions, QUEUES, {}, {}, 60, 2, binds, gpus)

    assert judge(seen(held=8, kept=8)) == []  # 8 - 4 + 4 in flight: the quota
    (found,) = judge(seen(held=6))  # 6 - 4 + 4 = 6: below
    assert "4 of them bound close to the eviction" in found
    (own,) = judge(seen(held=12, kept=7))  # the cycle said it kept 7 of quota 8
    assert "kai-ray said 7" in own
    assert checker.bad_evictions([seen(held=8)], QUEUES, {}, {}, 60, 2) != []


def test_episodes_are_judged_in_cycles_after_the_grace() -> None:
    def episode(seconds: float, cycles: float, state: str = "fit") -> Episode:
        return Episode("ns/g", state, 0.0, seconds, counted_s=seconds, cycles=cycles)

    assert checker.long_episodes([episode(2.5, 2.5)], "fit", 3) == []
    assert len(checker.long_episodes([episode(4, 4)], "fit", 3)) == 1
    assert len(checker.long_episodes([episode(20, 4)], "fit", 3)) == 1  # slow cycles count
    partial = [episode(62, 62, "partial"), episode(70, 70, "partial")]
    found = checker.long_episodes(partial, "partial", 3, grace_s=60)
    assert len(found) == 1 and "10.0 cycles past 60s" in found[0]


def test_a_workload_counts_as_deleted_by_the_soak_only_once_a_delete_was_answered() -> None:
    """The soak's `delete`: a delete that fails (the API server down) leaves the
    workload's gangs judged as before, so their episodes go on; an answered one
    (a 404 included) takes them out."""
    from types import SimpleNamespace

    from kubernetes.client.rest import ApiException

    from tests.e2e.soak import Soak
    from tests.e2e.soak_workloads import Team, Workload

    class Custom:
        def __init__(self) -> None:
            self.down = True

        def delete_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> None:
            if self.down:
                raise ConnectionRefusedError("the API server is down")
            raise ApiException(status=404)

    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"}}
    workload = Workload("raycluster", "rc", Team("q", "ns"), (cluster,), 30.0, 8.0)
    soak = Soak.__new__(Soak)
    soak.observer = SimpleNamespace(deleted=set())  # type: ignore[assignment]
    soak.custom = Custom()  # type: ignore[assignment]
    assert soak.delete(workload) is False
    assert soak.observer.deleted == set()
    soak.custom.down = False  # type: ignore[attr-defined]
    assert soak.delete(workload) is True
    assert soak.observer.deleted == {"ns/raycluster-rc"}


def test_the_observer_reads_what_kai_ray_said_a_reclaimed_queue_keeps() -> None:
    from kai_ray.decisions.plan import Evict, Plan
    from kai_ray.effects.binder import Binder
    from kai_ray.state.cache import ClusterCache
    from tests.e2e.soak_observer import _kept_gpus

    from .test_cluster_cache import node, pod
    from .test_eviction_for_queue import MessageWriter

    cache = ClusterCache()
    for obj in (node("n1"), pod("v", 8, "n1")):
        cache.upsert(obj)
    plan = Plan(cycle=1)
    kept = "team-a keeps nvidia.com/gpu 156.75 (quota 160, fair share 150)"
    plan.evictions.append(Evict("ns/v", "ns/vg", "reclaim", for_queue="team-b", standing=kept))
    writer = MessageWriter()
    Binder(writer).apply(plan, cache.snapshot(), 0.0)
    (message,) = writer.messages
    condition = {"type": "DisruptionTarget", "reason": "KaiRayReclaim", "message": message}
    assert _kept_gpus({"status": {"conditions": [condition]}}) == 156.75
    condition["message"] = "evicted by kai-ray (reclaim) with its gang ns/vg"
    assert _kept_gpus({"status": {"conditions": [condition]}}) is None
