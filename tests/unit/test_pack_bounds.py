"""`consolidate.sizes_could_fit` and `gangs_could_share`: the counts that rule out
a move before it is tried must never rule out a packing that exists (checked against
exhaustive searches on small random cases), and each catches what the counts before
it miss. `first_counts_fail`, the first count for every number of gangs moved at
once, gives the answers of that count made move by move."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_ray.decisions import consolidate
from kai_ray.decisions.consolidate import first_counts_fail, gangs_could_share, sizes_could_fit
from kai_ray.values.arrays import add_rows


def packs(items: list[float], rooms: list[float]) -> bool:
    """Whether the items fit the rooms, by trying every node for every item (largest
    first; nodes of equal room left tried once)."""
    order = sorted(items, reverse=True)

    def place(i: int, left: list[float]) -> bool:
        if i == len(order):
            return True
        tried: set[float] = set()
        for n, room in enumerate(left):
            if room + 1e-9 >= order[i] and room not in tried:
                tried.add(room)
                left[n] -= order[i]
                if place(i + 1, left):
                    return True
                left[n] += order[i]
        return False

    return place(0, list(rooms))


SIZES = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])


@settings(max_examples=600, deadline=None)
@example(items=[4.0, 5.0], rooms=[5.0, 4.0])  # a larger item filling its node exactly
@example(items=[0.5, 0.5, 1.0], rooms=[1.0, 1.0])
@given(st.lists(SIZES, min_size=1, max_size=7), st.lists(SIZES, min_size=1, max_size=4))
def test_no_packing_that_exists_is_ruled_out(items: list[float], rooms: list[float]) -> None:
    asked = [size for size in items if size > 0]
    if packs(asked, rooms):
        assert sizes_could_fit(np.array(items), np.array(rooms))


def test_two_items_of_more_than_half_a_node_do_not_share_it() -> None:
    """6, 5, 5 and 4 GPUs on three nodes with 8 free each: every count of items of a
    size or more passes (3 of 5 or more, 3 slots; 4 of 4 or more, 6 slots), but each
    node holds one of the first three and then has 3 or less left."""
    rooms = np.array([8.0, 8.0, 8.0, 1.0, 2.0])
    assert not packs([6, 5, 5, 4], list(rooms))
    assert not sizes_could_fit(np.array([6.0, 5.0, 5.0, 4.0]), rooms)
    assert sizes_could_fit(np.array([6.0, 5.0, 4.0, 4.0]), np.array([8.0, 8.0, 8.0]))
    assert sizes_could_fit(np.array([4.0, 4.0, 4.0, 4.0]), np.array([8.0, 8.0]))


def test_memory_sized_rooms_are_bounded_without_counting_every_item() -> None:
    """Rooms of a billion units and items a million each: the larger end of the
    relaxation stands in for the exact count (no million-step loop), still a bound."""
    rooms = np.array([1e9, 1e9])
    assert sizes_could_fit(np.array([1e6] * 50 + [2e6] * 50), rooms)
    assert not sizes_could_fit(np.array([6e8, 6e8, 6e8]), rooms)


def shares(items: list[list[list[float]]], domains: list[int], rooms: list[list[float]]) -> bool:
    """Whether every item (a gang: pods, each a row of sizes) can be placed inside one
    domain, each pod on a node of it with room, by trying every domain and node."""
    pods = [(gang, pod) for gang, item in enumerate(items) for pod in item]
    chosen: dict[int, int] = {}

    def place(i: int, left: list[list[float]]) -> bool:
        if i == len(pods):
            return True
        gang, pod = pods[i]
        for node, room in enumerate(left):
            domain = domains[node]
            if domain < 0 or chosen.get(gang, domain) != domain:
                continue
            if all(r + 1e-9 >= p for r, p in zip(room, pod, strict=True)):
                fresh = gang not in chosen
                chosen[gang] = domain
                left[node] = [r - p for r, p in zip(room, pod, strict=True)]
                if place(i + 1, left):
                    return True
                left[node] = room
                if fresh:
                    del chosen[gang]
        return False

    return place(0, [list(room) for room in rooms])


POD = st.lists(SIZES, min_size=2, max_size=2)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.lists(POD, min_size=1, max_size=3), min_size=1, max_size=3),
    st.lists(st.tuples(st.integers(-1, 2), POD), min_size=1, max_size=5),
)
def test_no_sharing_of_domains_that_exists_is_ruled_out(
    items: list[list[list[float]]], nodes: list[tuple[int, list[float]]]
) -> None:
    """`gangs_could_share` against an exhaustive search: two resources, nodes in up
    to three domains (or none), up to three gangs of up to three pods."""
    domains = [domain for domain, _ in nodes]
    rooms = [room for _, room in nodes]
    if shares(items, domains, rooms):
        matrices = [np.array(item) for item in items]
        assert gangs_could_share(matrices, np.array(domains), np.array(rooms))


def test_gangs_held_to_racks_do_not_share_one_rack_of_room() -> None:
    """Two gangs of two whole-node pods, racks with three and one free nodes: four
    pods on four free nodes pass every count cluster-wide, but after one gang takes
    two nodes of the first rack no rack has two left for the other."""
    rooms = np.array([[8.0], [8.0], [8.0], [8.0]])
    domains = np.array([0, 0, 0, 1])
    gangs = [np.array([[8.0], [8.0]]), np.array([[8.0], [8.0]])]
    assert not shares([[[8.0], [8.0]]] * 2, [0, 0, 0, 1], [[8.0]] * 4)
    assert sizes_could_fit(np.array([8.0] * 4), rooms[:, 0])
    assert not gangs_could_share(gangs, domains, rooms)
    assert gangs_could_share(gangs, np.array([0, 0, 1, 1]), rooms)
    assert gangs_could_share(gangs[:1], domains, rooms)


def test_the_search_rules_out_what_both_counts_let_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pods of 6, 2 and 1 GPUs and one node with 8 free: every count of either kind
    passes, but together they ask 9. The search finds no packing; when the rooms
    take more distinct values than it searches, it answers that they could fit."""
    items, rooms = np.array([6.0, 2.0, 1.0]), np.array([8.0])
    assert not packs(list(items), list(rooms))
    assert not sizes_could_fit(items, rooms)
    assert sizes_could_fit(items[:2], rooms)
    monkeypatch.setattr(consolidate, "_DISTINCT_ROOMS", 0)
    assert sizes_could_fit(items, rooms)


def first_count_fails(items: np.ndarray, room: np.ndarray) -> bool:
    """`sizes_could_fit`'s first count, made on its own: some size asked is asked (or
    more) by more items than the nodes could hold of it, node by node."""
    asked = items[items > 1e-9]
    return any(
        np.count_nonzero(asked >= size - 1e-9) > np.floor(room / size + 1e-9).sum()
        for size in np.unique(asked)
    )


GANG = st.lists(st.tuples(st.integers(0, 4), SIZES), min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(SIZES, min_size=5, max_size=5),
    st.lists(SIZES, min_size=0, max_size=3),
    st.lists(GANG, min_size=1, max_size=4),
)
def test_the_first_count_for_every_move_at_once_is_the_count_made_move_by_move(
    free: list[float], least: list[float], gangs: list[list[tuple[int, float]]]
) -> None:
    """Five nodes, the target's least asks, and up to four gangs of up to three pods:
    for each k, the answer for the first k gangs moved is the first count made on
    the target's and those gangs' items, in the room with what they hold added back
    (`add_rows`, as `could_pack` adds it); when it fails, `sizes_could_fit` fails."""
    room = np.array(free)
    nodes = [np.array([node for node, _ in gang], dtype=np.intp) for gang in gangs]
    sizes = [np.array([size for _, size in gang]) for gang in gangs]
    answers = first_counts_fail(room, np.array(least), nodes, sizes)
    assert len(answers) == len(gangs)
    for k in range(1, len(gangs) + 1):
        after = room[:, None].copy()
        for on, held in zip(nodes[:k], sizes[:k], strict=True):
            add_rows(after, on, held[:, None])
        items = np.concatenate([np.array(least), *sizes[:k]])
        assert answers[k - 1] == first_count_fails(items, after[:, 0])
        if answers[k - 1]:
            assert not sizes_could_fit(items, after[:, 0])


def test_a_move_whose_pods_take_back_the_room_they_free_is_counted_out() -> None:
    """Nodes with 4, 4 and 0 GPUs free, a waiting pod of 8: moving the 8-GPU pod off
    the full node frees a node of 8 but asks for one again (two items of 8, one
    slot); moving also a 4-GPU pod held beside 4 free makes a second slot of 8."""
    room = np.array([4.0, 4.0, 0.0])
    nodes = [np.array([2]), np.array([0])]
    sizes = [np.array([8.0]), np.array([4.0])]
    assert first_counts_fail(room, np.array([8.0]), nodes, sizes).tolist() == [True, False]
