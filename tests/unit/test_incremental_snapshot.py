"""The cache's kept snapshot equals a fresh build after any sequence of events.

`ClusterCache.snapshot()` patches the last snapshot with what changed
(`state/incremental.py`). Hypothesis draws sequences of the events the cache is
fed (pods, PodGroups, nodes, Queues and a Topology upserted and deleted, binds
assumed, forgotten and expired, usage set, suspended Jobs standing as their
placeholder pods, nothing at all) and after every
step the kept snapshot must equal `build_snapshot(cache.objects())` in every
field, orders included; the snapshot handed out before must not have changed;
and a step that changed nothing must hand out the same snapshot object.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, TOPOLOGY, ClusterCache
from kai_ray.state.snapshot import Snapshot, build_snapshot
from tests.builders import (
    make_job,
    make_node,
    make_pod,
    make_pod_group,
    make_queue,
    make_topology,
)
from tests.unit.snapshot_checks import assert_same_snapshot

SCHEDULER = "kai-ray"
PODS, GROUPS, NODES = 8, 4, 4


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


pod_events = st.tuples(
    st.just("pod"),
    st.integers(0, PODS - 1),
    st.fixed_dictionaries(
        {
            "gpus": st.sampled_from(["0", "1", "2", "8", "0.5"]),
            "node": st.sampled_from([None, None, "n0", "n1", "n2", "n3", "gone"]),
            "phase": st.sampled_from(["Running", "Running", "Succeeded", "Failed"]),
            "group": st.sampled_from([None, "g0", "g1", "g2", "g3", "nowhere"]),
            "scheduler": st.sampled_from([SCHEDULER, SCHEDULER, "default-scheduler"]),
            "created": st.integers(0, 3),
            "extra": st.sampled_from([None, None, None, "bad-cpu", "example.com/foo"]),
            "gate": st.booleans(),
            "devices": st.sampled_from([None, None, "0", "1", "9"]),
            "leaving": st.integers(0, 9),
        }
    ),
)
group_events = st.tuples(
    st.just("group"),
    st.integers(0, GROUPS - 1),
    st.fixed_dictionaries(
        {
            "queue": st.sampled_from(["team-a", "team-a", "team-b", "missing", "root"]),
            "min_member": st.integers(0, 3),
        }
    ),
)
node_events = st.tuples(
    st.just("node"),
    st.integers(0, NODES - 1),
    st.fixed_dictionaries(
        {
            "gpus": st.sampled_from([0, 2, 8]),
            "ready": st.booleans(),
            "cordoned": st.booleans(),
            "rack": st.sampled_from(["r0", "r1"]),
            "heartbeat": st.integers(0, 3),
        }
    ),
)
events = st.one_of(
    pod_events,
    pod_events,
    pod_events,
    group_events,
    node_events,
    st.tuples(st.just("delete pod"), st.integers(0, PODS - 1)),
    st.tuples(st.just("delete group"), st.integers(0, GROUPS - 1)),
    st.tuples(st.just("delete node"), st.integers(0, NODES - 1)),
    st.tuples(st.just("same pod"), st.integers(0, PODS - 1)),
    st.tuples(st.just("assume"), st.integers(0, PODS - 1), st.integers(0, NODES - 1)),
    st.tuples(st.just("forget"), st.integers(0, PODS - 1)),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 40.0])),
    st.tuples(st.just("team-b"), st.sampled_from(["root", "team-a", None])),
    st.tuples(st.just("usage"), st.sampled_from([0.0, 0.5])),
    st.tuples(st.just("topology"), st.booleans()),
    st.tuples(st.just("job"), st.integers(0, 1), st.booleans(), st.integers(1, 3)),
    st.tuples(st.just("delete job"), st.integers(0, 1)),
    st.tuples(st.just("nothing")),
)


def pod(index: int, shape: dict[str, Any]) -> dict[str, Any]:
    builder = make_pod(f"p{index}", "ns").scheduler(shape["scheduler"]).created(shape["created"])
    gpus = shape["gpus"]
    builder = builder.gpu_fraction(gpus) if gpus == "0.5" else builder.gpus(int(gpus))
    if shape["node"] is not None:
        builder = builder.on(shape["node"]).phase(shape["phase"])
    if shape["group"] is not None:
        builder = builder.group(shape["group"])
    if shape["gate"]:
        builder = builder.gate("other.io/hold")
    if shape["devices"] is not None:
        builder = builder.devices(shape["devices"])
    if shape["extra"] == "bad-cpu":
        builder = builder.cpu("lots")
    elif shape["extra"] is not None:
        builder = builder.request(shape["extra"], 1)
    obj = builder.build()
    if shape["leaving"] == 0:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:09Z"
    return obj


def node(index: int, shape: dict[str, Any]) -> dict[str, Any]:
    builder = make_node(f"n{index}").gpus(shape["gpus"]).in_domains(rack=shape["rack"])
    if not shape["ready"]:
        builder = builder.unready()
    if shape["cordoned"]:
        builder = builder.cordoned()
    obj = builder.build()
    obj["metadata"]["annotations"] = {"heartbeat": str(shape["heartbeat"])}
    return obj


def apply(cache: ClusterCache, clock: Clock, event: tuple[Any, ...]) -> None:
    kind, *args = event
    if kind == "pod":
        cache.upsert(pod(args[0], args[1]), POD)
    elif kind == "group":
        shape = args[1]
        group = make_pod_group(f"g{args[0]}", "ns").queue(shape["queue"])
        cache.upsert(group.min_member(shape["min_member"]).build(), POD_GROUP)
    elif kind == "node":
        cache.upsert(node(args[0], args[1]), NODE)
    elif kind == "job":  # a suspended Job of ours stands as its placeholder pods
        job = make_job(f"j{args[0]}", "ns").queue("team-a").gpus(1).scheduler(SCHEDULER)
        cache.upsert(job.parallelism(args[2]).set("spec.suspend", args[1]).build())
    elif kind == "delete job":
        cache.delete("Job", f"ns/j{args[0]}")
    elif kind.startswith("delete"):
        what = {"delete pod": (POD, "ns/p"), "delete group": (POD_GROUP, "ns/g")}
        cache_kind, prefix = what.get(kind, (NODE, "n"))
        cache.delete(cache_kind, f"{prefix}{args[0]}")
    elif kind == "same pod":
        same = cache.get(POD, f"ns/p{args[0]}")
        if same is not None:
            cache.upsert(copy.deepcopy(same), POD)
    elif kind == "assume":
        if cache.get(POD, f"ns/p{args[0]}") is not None:
            cache.assume(f"ns/p{args[0]}", f"n{args[1]}", "0")
    elif kind == "forget":
        cache.forget_assumed(f"ns/p{args[0]}")
    elif kind == "tick":
        clock.now += args[0]
    elif kind == "team-b":
        if args[0] is None:
            cache.delete(QUEUE, "team-b")
        else:
            cache.upsert(make_queue("team-b").parent(args[0]).build(), QUEUE)
    elif kind == "usage":
        cache.set_usage({"team-a": {"nvidia.com/gpu": args[0]}})
    elif kind == "topology":
        if args[0]:
            cache.upsert(make_topology("dc", "rack", "kubernetes.io/hostname").build(), TOPOLOGY)
        else:
            cache.delete(TOPOLOGY, "dc")


def fingerprint(snapshot: Snapshot) -> Any:
    """What a later patch could wrongly change in a snapshot handed out before."""
    return (
        list(snapshot.pods.items()),
        list(snapshot.pod_groups.items()),
        snapshot.pending_pods,
        snapshot.problems,
        snapshot.used.tolist(),
        snapshot.gpu_free.tolist(),
    )


def started() -> tuple[ClusterCache, Clock]:
    clock = Clock()
    cache = ClusterCache(SCHEDULER, clock=clock, assume_ttl_s=30.0)
    cache.upsert(make_queue("root").build(), QUEUE)
    cache.upsert(make_queue("team-a").parent("root").build(), QUEUE)
    for index in range(NODES - 1):
        shape = {"gpus": 8, "ready": True, "cordoned": False, "rack": "r0", "heartbeat": 0}
        cache.upsert(node(index, shape), NODE)
    return cache, clock


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(events, min_size=1, max_size=40))
def test_the_kept_snapshot_equals_a_fresh_build_after_every_event(
    steps: list[tuple[Any, ...]],
) -> None:
    cache, clock = started()
    before = cache.snapshot()
    for step in steps:
        kept = fingerprint(before)
        apply(cache, clock, step)
        snapshot = cache.snapshot()
        assert_same_snapshot(snapshot, build_snapshot(cache.objects(), scheduler_name=SCHEDULER))
        assert fingerprint(before) == kept, "a snapshot handed out before was changed"
        if step[0] == "nothing":
            assert snapshot is before
        before = snapshot


def test_a_quiet_cycle_gets_the_same_snapshot_and_a_heartbeat_changes_nothing() -> None:
    cache, _ = started()
    cache.upsert(make_pod_group("g0", "ns").queue("team-a").build(), POD_GROUP)
    shape = {"gpus": "1", "node": "n0", "phase": "Running", "group": "g0"}
    shape |= {"scheduler": SCHEDULER, "created": 0, "extra": None, "gate": False}
    cache.upsert(pod(0, shape | {"devices": None, "leaving": 1}), POD)
    first = cache.snapshot()
    assert cache.snapshot() is first
    beat = {"gpus": 8, "ready": True, "cordoned": False, "rack": "r0", "heartbeat": 7}
    cache.upsert(node(0, beat), NODE)  # only an annotation the snapshot does not read
    assert cache.snapshot() is first


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(("pod", 1), id="a pending pod added shares every other pod and group"),
        pytest.param(("delete pod", 0), id="a pod deleted shares every other group"),
    ],
)
def test_one_pod_changed_shares_what_it_did_not_touch(change: tuple[str, int]) -> None:
    cache, clock = started()
    base = {"gpus": "1", "phase": "Running", "scheduler": SCHEDULER, "created": 0}
    base |= {"extra": None, "gate": False, "leaving": 1}
    for index in range(4):
        cache.upsert(make_pod_group(f"g{index}", "ns").queue("team-a").build(), POD_GROUP)
        on_device = {"node": "n1", "group": f"g{index}", "devices": str(index)}
        cache.upsert(pod(index, base | on_device), POD)
    first = cache.snapshot()
    if change[0] == "pod":
        waiting = {"node": None, "group": "g3", "devices": None}
        apply(cache, clock, ("pod", 4, base | waiting))
    else:
        apply(cache, clock, change)
    second = cache.snapshot()
    assert second is not first
    assert_same_snapshot(second, build_snapshot(cache.objects(), scheduler_name=SCHEDULER))
    assert second.pod_groups["ns/g1"] is first.pod_groups["ns/g1"]
    assert second.pods["ns/p2"] is first.pods["ns/p2"]
