"""`Transaction.placed_pending` against looking the group's pending pods up in `placed`.

The transaction counts, per group, its pending pods placed, through placements,
evictions, re-placements of bound pods (consolidation's moves) and rollbacks;
the answer must be what walking the group's pending pods gives at every step."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from kai_ray.decisions.consolidate import replace_gang
from kai_ray.decisions.placement import place_extras, place_gang
from kai_ray.decisions.transaction import Transaction
from kai_ray.values.config import SchedulerConfigSpec
from tests.builders import make_node, make_pod, make_pod_group
from tests.unit.placement_setup import cluster, gang_pods

CONFIG = SchedulerConfigSpec()
GANGS = ("a", "b", "c")


def _snapshot():  # type: ignore[no-untyped-def]
    nodes = [make_node(f"n{i}").gpus(8).build() for i in range(3)]
    pods, groups = [], []
    for name, size in zip(GANGS, (2, 3, 1), strict=True):
        pods += [p.build() for p in gang_pods(name, size + 1, gpus=2)]
        groups.append(make_pod_group(name).queue("q").min_member(size).build())
    # a running gang: its bound pods may be evicted and placed again
    pods += [make_pod(f"run-{i}").gpus(2).group("run").on("n0").build() for i in range(2)]
    groups.append(make_pod_group("run").queue("q").min_member(2).build())
    return cluster(nodes, pods, groups)


def _agrees(tx: Transaction) -> None:
    for key, group in tx.snapshot.pod_groups.items():
        walked = any(pod.key in tx.placed for pod in group.pending)
        assert tx.placed_pending(key) == walked, key


STEPS = st.lists(
    st.tuples(st.sampled_from(("gang", "extras", "move")), st.sampled_from(GANGS), st.booleans()),
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(steps=STEPS)
def test_placed_pending_is_what_walking_the_pending_pods_gives(
    steps: list[tuple[str, str, bool]],
) -> None:
    snapshot = _snapshot()
    tx = Transaction(snapshot)
    running = snapshot.pod_groups["default/run"]
    for kind, name, keep in steps:
        group = snapshot.pod_groups[f"default/{name}"]
        mark = tx.checkpoint()
        if kind == "gang":
            place_gang(tx, group, CONFIG)
        elif kind == "extras":
            place_extras(tx, group, CONFIG, limit=1)
        else:  # the running gang moved: its bound pods evicted and placed again
            for pod in running.bound:
                tx.evict(pod, running.key)
            replace_gang(tx, running, CONFIG)
        _agrees(tx)
        if keep:
            tx.commit()
        else:
            tx.rollback(mark)
        _agrees(tx)
