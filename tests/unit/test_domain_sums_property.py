"""A domain's free resources, as a transaction follows them through placements,
evictions and rollbacks, stay what summing its nodes as they are counts: nothing of a
node no pod may be placed on (cordoned, unready), nothing below zero of an
overcommitted one (random clusters and random steps)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.decisions.plan import Bind
from kai_ray.decisions.transaction import Placement, Transaction
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from tests.builders import make_node, make_pod, make_topology

RACK = "example.com/rack"

#: Per node: GPUs, state, rack, and the GPUs of each pod bound to it (more than the
#: node has makes it overcommitted).
nodes_strategy = st.lists(
    st.tuples(
        st.integers(1, 8),
        st.sampled_from(["ready", "cordoned", "unready"]),
        st.sampled_from(["r1", "r2"]),
        st.lists(st.integers(1, 4), max_size=4),
    ),
    min_size=1,
    max_size=6,
)
#: Steps: ("evict", i) the i-th bound pod still there, ("place", i) one GPU on the
#: i-th node where it fits, ("rollback", i) to the i-th mark taken so far.
steps_strategy = st.lists(
    st.tuples(st.sampled_from(["evict", "place", "rollback"]), st.integers(0, 30)),
    max_size=12,
)


def expected(tx: Transaction) -> np.ndarray:
    """Free GPUs per rack, summed afresh from the transaction's nodes as they are."""
    snapshot = tx.snapshot
    level = snapshot.topologies["t"].levels[0]
    gpu = snapshot.column("gpu")
    sums = np.zeros(len(level.domains))
    for node in range(len(snapshot.node_names)):
        if snapshot.schedulable[node] and level.node_domain[node] >= 0:
            sums[level.node_domain[node]] += max(tx.free[node, gpu], 0.0)
    return sums


@settings(max_examples=150, deadline=None)
@given(nodes=nodes_strategy, steps=steps_strategy)
def test_followed_domain_sums_are_the_fresh_ones(
    nodes: list[tuple[int, str, str, list[int]]], steps: list[tuple[str, int]]
) -> None:
    built, pods = [], []
    for index, (gpus, state, rack, held) in enumerate(nodes):
        node = make_node(f"n{index}").gpus(gpus).label(RACK, rack)
        node = node.cordoned() if state == "cordoned" else node
        node = node.unready() if state == "unready" else node
        built.append(node.build())
        pods += [
            make_pod(f"p{index}-{i}").gpus(g).on(f"n{index}").build() for i, g in enumerate(held)
        ]
    snapshot = build_snapshot(
        ClusterObjects(nodes=built, pods=pods, topologies=[make_topology("t", RACK).build()])
    )
    tx = Transaction(snapshot)
    gpu = snapshot.column("gpu")
    followed = lambda: tx.domain_free("t", 0)[:, gpu]  # noqa: E731
    assert np.allclose(followed(), expected(tx))
    marks: list[int] = []
    for number, (kind, pick) in enumerate(steps):
        if kind == "evict":
            bound = [pod for pod in snapshot.pods.values() if pod.key not in tx.removed]
            if not bound:
                continue
            marks.append(tx.checkpoint())
            tx.evict(bound[pick % len(bound)], "g")
        elif kind == "place":
            node = pick % len(snapshot.node_names)
            if not snapshot.schedulable[node] or tx.free[node, gpu] < 1:
                continue
            marks.append(tx.checkpoint())
            taken = np.zeros(tx.free.shape[1])
            taken[gpu] = 1.0
            bind = Bind(f"default/new-{number}", "g", snapshot.node_names[node])
            tx.place(Placement(bind, node, taken))
        elif marks:
            mark = marks[pick % len(marks)]
            tx.rollback(mark)
            marks = [m for m in marks if m < mark]
        assert np.allclose(followed(), expected(tx)), (kind, pick)
