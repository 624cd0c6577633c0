"""`eviction.nodes_could_be_freed`: the bound that rules out a victim search for a
gang held to one domain must never rule out a victim set within the caps that lets
the gang's members fit (checked against every set of units on small random cases),
and it catches what the counts before it miss (units spanning two racks)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.decisions import eviction
from kai_ray.decisions.eviction import FreedUnit, UnitPods, nodes_could_be_freed
from kai_ray.decisions.victims import pods_fitting

QUEUES = ("q0", "q1")


@dataclass(frozen=True)
class Unit:
    """A victim unit of a case: its queue, its cost, and each pod's node and holding."""

    queue: str
    cost: tuple[float, ...]
    pods: tuple[tuple[int, np.ndarray], ...]


def could_be_freed(case: tuple[Any, ...]) -> bool:
    """`nodes_could_be_freed` on a case (`cases`), its units' pods laid out as the
    search lays them out."""
    free, least, count, domains, allowed, units, caps = case
    found = [(n, node, held) for n, unit in enumerate(units) for node, held in unit.pods]
    pods = UnitPods(
        np.array([n for n, _, _ in found], dtype=np.int64),
        np.array([node for _, node, _ in found], dtype=np.int64),
        np.array([held for _, _, held in found]).reshape(len(found), free.shape[1]),
    )
    freed = [FreedUnit(unit.queue, unit.cost) for unit in units]
    return nodes_could_be_freed(free, least, count, domains, allowed, freed, pods, caps)


def some_set_fits(
    free: np.ndarray,
    least: np.ndarray,
    count: int,
    domains: np.ndarray,
    allowed: np.ndarray,
    units: list[Unit],
    caps: dict[str, tuple[float, ...]],
) -> bool:
    """Whether some set of units within every cap, gone, leaves one domain whose
    nodes could take `count` items asking `least`, counted node by node."""
    for size in range(len(units) + 1):
        for chosen in itertools.combinations(units, size):
            spent: dict[str, np.ndarray] = {}
            for unit in chosen:
                spent[unit.queue] = spent.get(unit.queue, 0.0) + np.array(unit.cost)
            if any(np.any(amounts > np.array(caps[q])) for q, amounts in spent.items()):
                continue
            room = free.copy()
            for unit in chosen:
                for node, held in unit.pods:
                    room[node] += held
            fits = np.where(allowed & (domains >= 0), pods_fitting(room, least), 0)
            for domain in set(domains.tolist()) - {-1}:
                if fits[domains == domain].sum() >= count:
                    return True
    return False


NODES = 5


@st.composite
def cases(draw: st.DrawFn) -> tuple[object, ...]:
    free = np.array([[draw(st.sampled_from([0.0, 2.0, 4.0, 8.0])), 1.0] for _ in range(NODES)])
    capacity = 8.0
    domains = np.array([draw(st.sampled_from([-1, 0, 0, 1, 1])) for _ in range(NODES)])
    allowed = np.array([draw(st.booleans()) for _ in range(NODES)])
    units = []
    for _ in range(draw(st.integers(0, 5))):
        queue = draw(st.sampled_from(QUEUES))
        nodes = draw(st.lists(st.integers(0, NODES - 1), min_size=1, max_size=3))
        pods = []
        for node in nodes:
            gpus = draw(st.sampled_from([1.0, 2.0, 4.0, 8.0]))
            pods.append((node, np.array([min(gpus, capacity), 0.0])))
        cost = (sum(float(held[0]) for _, held in pods),)
        units.append(Unit(queue, cost, tuple(pods)))
    caps = {q: (draw(st.sampled_from([0.0, 4.0, 8.0, 16.0, 100.0])) + 1e-9,) for q in QUEUES}
    least = np.array([draw(st.sampled_from([2.0, 4.0, 8.0])), 0.0])
    count = draw(st.integers(1, 3))
    return free, least, count, domains, allowed, units, caps


@settings(max_examples=400, deadline=None)
@given(cases())
def test_no_set_that_fits_is_ruled_out(case: tuple[object, ...]) -> None:
    free, least, count, domains, allowed, units, caps = case
    if some_set_fits(free, least, count, domains, allowed, units, caps):  # type: ignore[arg-type]
        assert could_be_freed(case)


def _rack_case() -> tuple[object, ...]:
    # Racks A (nodes 0, 1) and B (node 2), full. Unit u1 of q0 holds node 0 and node 2
    # (16 GPUs), u2 of q0 holds node 1 (8). q0 may give 16: rack A's two nodes need
    # u1 and u2 (24); rack B has one node. The counts pass: rack A frees 16 of q0.
    free = np.zeros((3, 1))
    u1 = Unit("q0", (16.0,), ((0, np.array([8.0])), (2, np.array([8.0]))))
    u2 = Unit("q0", (8.0,), ((1, np.array([8.0])),))
    domains = np.array([0, 0, 1])
    allowed = np.ones(3, dtype=bool)
    return free, np.array([8.0]), 2, domains, allowed, [u1, u2], {"q0": (16.0 + 1e-9,)}


def test_units_spanning_racks_beyond_the_cap_are_ruled_out() -> None:
    case = _rack_case()
    assert not some_set_fits(*case)  # type: ignore[arg-type]
    assert not could_be_freed(case)
    free, least, count, domains, allowed, units, _ = case
    more = {"q0": (24.0 + 1e-9,)}
    assert could_be_freed((free, least, count, domains, allowed, units, more))


def test_past_the_search_bound_the_sets_could_be_freed(monkeypatch: object) -> None:
    monkeypatch.setattr(eviction, "_UNIT_SETS", 0)  # type: ignore[attr-defined]
    assert could_be_freed(_rack_case())
