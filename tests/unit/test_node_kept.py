"""What a cycle keeps from the cycles before it plans what a cycle without it plans.

Hypothesis draws sequences of the events a cache is fed (pods placed and
pending, with and without a rack selector or inter-pod terms; PodGroups; nodes relabelled,
resized, cordoned, made unready and deleted; queues; a Topology), and after
every event one cycle runs on the cache's kept snapshot with the values kept
by the cycles before it (`run_cycle`'s `GroupTotals`: the per-node values and
the nodes' static facts of `node_kept.KeptAcrossCycles`, the count of pods with
inter-pod terms, the sums and values kept per group) and one on a fresh build
of the same objects with nothing kept. Their plans must be equal.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.cycle import run_cycle
from kai_ray.decisions.placement import filters
from kai_ray.decisions.placement.node_kept import ACROSS_CYCLES, KeptAcrossCycles
from kai_ray.decisions.plan import Plan
from kai_ray.decisions.totals import GroupTotals
from kai_ray.decisions.transaction import Transaction
from kai_ray.state.cache import NODE, POD, POD_GROUP, QUEUE, TOPOLOGY, ClusterCache
from kai_ray.state.snapshot import build_snapshot
from kai_ray.values.config import SchedulerConfig
from tests.builders import make_node, make_pod, make_pod_group, make_queue, make_topology

SCHEDULER = "kai-ray"
PODS, GROUPS, NODES = 10, 4, 5
NOW = 1_800_000_000.0

pod_events = st.tuples(
    st.just("pod"),
    st.integers(0, PODS - 1),
    st.fixed_dictionaries(
        {
            "gpus": st.sampled_from([1, 2, 4, 8]),
            "cpu": st.sampled_from([1, 8, 30]),
            "node": st.sampled_from([None, None, None, "n0", "n1", "n2", "n3", "n4"]),
            "group": st.integers(0, GROUPS - 1),
            "rack": st.sampled_from([None, None, "r0", "r1"]),
            "spread": st.sampled_from([False, False, False, True]),
        }
    ),
)
node_events = st.tuples(
    st.just("node"),
    st.integers(0, NODES - 1),
    st.fixed_dictionaries(
        {
            "gpus": st.sampled_from([4, 8]),
            "cpu": st.sampled_from([32, 64]),
            "ready": st.sampled_from([True, True, False]),
            "cordoned": st.sampled_from([False, False, True]),
            "rack": st.sampled_from(["r0", "r1"]),
        }
    ),
)
events = st.one_of(
    pod_events,
    pod_events,
    pod_events,
    node_events,
    node_events,
    st.tuples(st.just("group"), st.integers(0, GROUPS - 1), st.integers(1, 3)),
    st.tuples(st.just("delete pod"), st.integers(0, PODS - 1)),
    st.tuples(st.just("delete node"), st.integers(0, NODES - 1)),
    st.tuples(st.just("topology"), st.booleans()),
    st.tuples(st.just("nothing")),
)


def node(index: int, shape: dict[str, Any]) -> dict[str, Any]:
    builder = make_node(f"n{index}").gpus(shape["gpus"]).cpu(shape["cpu"]).memory("512Gi")
    builder = builder.in_domains(rack=shape["rack"]).label("kubernetes.io/hostname", f"n{index}")
    if not shape["ready"]:
        builder = builder.unready()
    if shape["cordoned"]:
        builder = builder.cordoned()
    return builder.build()


def pod(index: int, shape: dict[str, Any]) -> dict[str, Any]:
    builder = make_pod(f"p{index}", "ns").scheduler(SCHEDULER).created(index)
    app = f"g{shape['group']}"
    builder = builder.gpus(shape["gpus"]).cpu(shape["cpu"]).group(app).label("app", app)
    if shape["rack"] is not None:
        builder = builder.set("spec.nodeSelector", {"rack": shape["rack"]})
    if shape["spread"]:  # one per node among the pods of its group
        term = {
            "labelSelector": {"matchLabels": {"app": app}},
            "topologyKey": "kubernetes.io/hostname",
        }
        anti = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        builder = builder.set("spec.affinity", {"podAntiAffinity": anti})
    if shape["node"] is not None:
        builder = builder.on(shape["node"]).phase("Running")
    return builder.build()


def apply(cache: ClusterCache, event: tuple[Any, ...]) -> None:
    kind, *args = event
    if kind == "pod":
        cache.upsert(pod(args[0], args[1]), POD)
    elif kind == "node":
        cache.upsert(node(args[0], args[1]), NODE)
    elif kind == "group":
        group = make_pod_group(f"g{args[0]}", "ns").queue("team").min_member(args[1])
        cache.upsert(group.build(), POD_GROUP)
    elif kind == "delete pod":
        cache.delete(POD, f"ns/p{args[0]}")
    elif kind == "delete node":
        cache.delete(NODE, f"n{args[0]}")
    elif kind == "topology":
        if args[0]:
            cache.upsert(make_topology("dc", "rack", "kubernetes.io/hostname").build(), TOPOLOGY)
        else:
            cache.delete(TOPOLOGY, "dc")


def started() -> ClusterCache:
    cache = ClusterCache(SCHEDULER)
    cache.upsert(make_queue("root").build(), QUEUE)
    cache.upsert(make_queue("team").parent("root").build(), QUEUE)
    for index in range(NODES):
        shape = {"gpus": 8, "cpu": 64, "ready": True, "cordoned": False, "rack": f"r{index % 2}"}
        cache.upsert(node(index, shape), NODE)
    for index in range(GROUPS):
        group = make_pod_group(f"g{index}", "ns").queue("team").min_member(1 + index % 2)
        cache.upsert(group.build(), POD_GROUP)
    return cache


def fields(plan: Plan) -> tuple[object, ...]:
    return (plan.binds, plan.evictions, plan.nominations, list(plan.statuses), plan.wake_at)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(events, min_size=1, max_size=25))
def test_cycles_with_what_they_kept_plan_what_fresh_cycles_plan(
    steps: list[tuple[Any, ...]],
) -> None:
    cache, totals, config = started(), GroupTotals(), SchedulerConfig()
    for cycle, step in enumerate(steps, start=1):
        apply(cache, step)
        snapshot = cache.snapshot()
        kept = run_cycle(snapshot, config, cycle, NOW, totals=totals).plan
        fresh = build_snapshot(cache.objects(), scheduler_name=SCHEDULER)
        assert fields(kept) == fields(run_cycle(fresh, config, cycle, NOW).plan)
        with_terms = {k for k, p in snapshot.pods.items() if p.pod_affinity}
        assert totals.with_terms.follow(snapshot.pods, None).count == len(with_terms)


def test_the_nodes_static_facts_are_read_again_once_a_node_is_relabelled() -> None:
    """A selector's nodes kept from one snapshot are not those of the next once a
    node moved racks."""
    cache, across = started(), KeptAcrossCycles()
    selecting = make_pod("p", "ns").gpus(1).set("spec.nodeSelector", {"rack": "r0"}).build()
    cache.upsert(selecting, POD)
    racks = []
    for rack in ("r0", "r1"):
        shape = {"gpus": 8, "cpu": 64, "ready": True, "cordoned": False, "rack": rack}
        cache.upsert(node(1, shape), NODE)
        tx = Transaction(cache.snapshot())
        tx.memo.keep(ACROSS_CYCLES, None, across)
        racks.append(filters.static_nodes(tx, tx.snapshot.pods["ns/p"]).tolist())
    assert racks == [[0, 1, 2, 4], [0, 2, 4]]
