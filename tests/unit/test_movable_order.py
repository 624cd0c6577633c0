"""`consolidate.first_movable`: the first movable gangs, worked out from the two
keys in arrays and the tied ones sorted, are exactly the first of every gang
sorted by the whole order (`movable_order`), ties of every key included."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.decisions.consolidate import first_movable, movable_order
from kai_ray.decisions.kept import PER_GROUP, KeptPerGroup
from kai_ray.decisions.transaction import CycleMemo
from kai_ray.values.resources import GPU, Resources

NODES = 6


def _ctx(free_gpus: list[float], kept: KeptPerGroup | None = None) -> Any:
    names = tuple(f"n{i}" for i in range(NODES))
    snapshot = SimpleNamespace(
        node_names=names,
        node_index={name: i for i, name in enumerate(names)},
        column=lambda resource: 1 if resource == GPU else 0,
    )
    free = np.array([[0.0, gpus] for gpus in free_gpus])
    memo = CycleMemo()
    if kept is not None:
        memo.keep(PER_GROUP, None, kept)
    transaction = SimpleNamespace(free=free, memo=memo, snapshot=snapshot)
    return SimpleNamespace(snapshot=snapshot, transaction=transaction)


def _gang(i: int, nodes: list[int], gpus: float, created: int) -> Any:
    pods = [SimpleNamespace(node=f"n{n}") for n in nodes]
    return SimpleNamespace(
        key=f"default/g{i}",
        bound=pods,
        bound_requests=Resources({GPU: gpus}),
        creation_timestamp=f"2026-12-06T00:00:0{created}Z",
    )


GANG = st.tuples(
    st.lists(st.integers(0, NODES - 1), min_size=1, max_size=3),
    st.sampled_from([1.0, 2.0, 8.0]),
    st.integers(0, 2),
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 4.0]), min_size=NODES, max_size=NODES),
    st.lists(GANG, max_size=12),
    st.integers(1, 6),
)
def test_the_first_gangs_are_those_of_the_whole_sort(
    free_gpus: list[float], shapes: list[tuple[list[int], float, int]], count: int
) -> None:
    ctx = _ctx(free_gpus)
    gangs = [_gang(i, *shape) for i, shape in enumerate(shapes)]

    def whole(gang: Any) -> tuple[object, ...]:
        emptiest = max(free_gpus[int(pod.node[1:])] for pod in gang.bound)
        return movable_order(gang, emptiest)

    expected = sorted(gangs, key=whole)[:count]
    assert [g.key for g in first_movable(ctx, gangs, count)] == [g.key for g in expected]


def test_ties_beyond_the_count_are_sorted_by_the_whole_key() -> None:
    # Four gangs tie on both array keys; the newest two come first (by name among them).
    ctx = _ctx([4.0] * NODES)
    gangs = [_gang(i, [i], 8.0, created) for i, created in enumerate([0, 2, 1, 2])]
    first = first_movable(ctx, gangs, 2)
    assert [g.key for g in first] == ["default/g1", "default/g3"]


def test_seats_kept_from_cycle_to_cycle_follow_the_gangs_state() -> None:
    """A gang's seats are kept with the very state they were read from: the next
    cycle's new state of the gang (moved to the emptier node) is read again."""
    kept = KeptPerGroup()
    free = [0.0, 0.0, 0.0, 0.0, 0.0, 4.0]
    old = [_gang(0, [0], 1.0, 0), _gang(1, [1], 1.0, 0)]
    assert [g.key for g in first_movable(_ctx(free, kept), old, 1)] == ["default/g0"]
    new = [_gang(0, [0], 1.0, 0), _gang(1, [5], 1.0, 0)]
    assert [g.key for g in first_movable(_ctx(free, kept), new, 1)] == ["default/g1"]
    again = [old[0], new[1]]
    assert [g.key for g in first_movable(_ctx(free, kept), again, 1)] == ["default/g1"]
