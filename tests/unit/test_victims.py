"""Victim selection as pure functions: units, their order, and the greedy per-node choice."""

from __future__ import annotations

import numpy as np
import pytest

from kai_ray.decisions.victims import (
    Budget,
    Need,
    VictimUnit,
    select_victims,
    unit_order,
    victim_units,
)
from kai_ray.state.groups import PodGroupState
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from tests.builders import make_node, make_pod, make_pod_group, make_queue

GPU_COLUMN = 2


def groups(*specs: tuple[str, int, int, list[str], int]) -> dict[str, PodGroupState]:
    """(name, minMember, GPUs per pod, nodes of its pods, created) per group; 4 nodes x 8 GPUs."""
    pods, pgs = [], []
    for name, minimum, gpus, nodes, created in specs:
        pgs.append(make_pod_group(name).queue("q").min_member(minimum).created(created).build())
        for i, node in enumerate(nodes):
            pod = make_pod(f"{name}-{i}").group(name).gpus(gpus).on(node).created(created + i)
            pods.append(pod.phase("Running").build())
    objects = ClusterObjects(
        nodes=[make_node(f"n{i}").gpus(8).build() for i in range(4)],
        queues=[make_queue("q").build()],
        pod_groups=pgs,
        pods=pods,
    )
    snapshot = build_snapshot(objects)
    return {g.name: g for g in snapshot.pod_groups.values()}


def units_of(found: dict[str, PodGroupState], priority: int = 50) -> list[VictimUnit]:
    return [u for g in found.values() for u in victim_units(g, priority, g.creation_timestamp)]


def test_elastic_members_above_the_minimum_are_units_of_their_own_newest_first() -> None:
    found = groups(("e", 2, 1, ["n0", "n0", "n1", "n1"], 0))
    units = victim_units(found["e"], 50, "")
    assert [[p.name for p in u.pods] for u in units] == [["e-3"], ["e-2"], ["e-0", "e-1"]]
    assert [u.extra for u in units] == [True, True, False]


@pytest.mark.parametrize(
    ("a", "b", "first"),
    [
        pytest.param((1.0, 50, 2), (2.0, 50, 9), 0, id="fewer GPUs first"),
        pytest.param((2.0, 10, 1), (2.0, 50, 9), 0, id="then lower priority"),
        pytest.param((2.0, 50, 1), (2.0, 50, 9), 1, id="then the newer by creation time"),
        pytest.param((2.0, 50, 5), (2.0, 50, 5), 0, id="then the name"),
    ],
)
def test_unit_order(a: tuple[float, int, int], b: tuple[float, int, int], first: int) -> None:
    found = groups(("x", 1, int(a[0]), ["n0"], a[2]), ("y", 1, int(b[0]), ["n1"], b[2]))
    # The start times say the opposite of the creation times: creation decides.
    ux = VictimUnit(found["x"], found["x"].pods, a[1], str(10 - a[2]), False)
    uy = VictimUnit(found["y"], found["y"].pods, b[1], str(10 - b[2]), False)
    ranked = sorted([ux, uy], key=unit_order)
    assert ranked[0] is (ux, uy)[first]


def _need(count: int, gpus: float = 8.0) -> Need:
    return Need(np.array([0.0, 0.0, gpus, 0.0]), count, np.ones(4, dtype=bool), GPU_COLUMN)


def _select(
    found: dict[str, PodGroupState], need: Need, budget: Budget | None = None
) -> list[str] | None:
    used = np.zeros((4, 4))
    index = {f"n{i}": i for i in range(4)}
    for group in found.values():
        for pod in group.pods:
            used[index[pod.node or ""], GPU_COLUMN] += pod.requests["nvidia.com/gpu"]
    free = np.zeros((4, 4))
    free[:, GPU_COLUMN] = 8.0
    free -= used
    vector = lambda pod: np.array([0.0, 0.0, pod.requests["nvidia.com/gpu"], 0.0])  # noqa: E731
    chosen = select_victims(
        free, need, units_of(found), vector, lambda p: index[p.node or ""], budget or Budget()
    )
    return None if chosen is None else sorted(u.label() for u in chosen)


def test_the_node_needing_the_fewest_gpus_back_is_freed_and_nothing_more() -> None:
    # n3 is free; n2 needs other's 4 GPUs back, n0 big's 8, n1 small's and other's.
    found = groups(
        ("big", 2, 4, ["n0", "n0"], 0), ("small", 1, 4, ["n1"], 1), ("other", 2, 4, ["n1", "n2"], 2)
    )
    assert _select(found, _need(2)) == ["gang default/other"]


def test_nothing_is_chosen_when_the_job_fits_already() -> None:
    found = groups(("big", 2, 8, ["n0", "n1"], 0))
    assert _select(found, _need(2)) == []


def test_none_when_every_victim_together_is_not_enough() -> None:
    found = groups(("a", 1, 8, ["n0"], 0))
    assert _select(found, _need(5)) is None


class _Refuse(Budget):
    def take(self, units: object) -> bool:
        return False


def test_a_budget_that_refuses_leaves_the_job_waiting() -> None:
    found = groups(
        ("a", 1, 8, ["n0"], 0),
        ("b", 1, 8, ["n1"], 0),
        ("c", 1, 8, ["n2"], 0),
        ("d", 1, 8, ["n3"], 0),
    )
    assert _select(found, _need(1), _Refuse()) is None


def _on_n0(gpus: float) -> Need:
    allowed = np.array([True, False, False, False])
    return Need(np.array([0.0, 0.0, gpus, 0.0]), 1, allowed, GPU_COLUMN)


@pytest.mark.parametrize(
    ("specs", "gpus", "chosen"),
    [
        pytest.param(
            [("big", 1, 4, ["n0"], 0), ("s1", 1, 2, ["n0"], 1), ("s2", 1, 2, ["n0"], 2)],
            4.0,
            ["gang default/big"],
            id="one gang rather than two smaller ones",
        ),
        pytest.param(
            [("a", 1, 4, ["n0"], 0), ("b", 1, 2, ["n0"], 1), ("c", 1, 2, ["n0"], 2)],
            2.0,
            ["gang default/c"],
            id="then the fewest GPUs, then the newest",
        ),
        pytest.param(
            [("e", 1, 2, ["n0", "n0", "n0"], 0), ("g", 1, 2, ["n0"], 1)],
            4.0,
            ["extra pod default/e-1 of default/e", "extra pod default/e-2 of default/e"],
            id="two elastic extras before any whole gang",
        ),
    ],
)
def test_the_least_disruptive_set_on_a_node(
    specs: list[tuple[str, int, int, list[str], int]], gpus: float, chosen: list[str]
) -> None:
    assert _select(groups(*specs), _on_n0(gpus)) == chosen
