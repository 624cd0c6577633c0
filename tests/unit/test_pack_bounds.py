"""`consolidate.sizes_could_fit`: the counts that rule out a move before it is tried
must never rule out a packing that exists (checked against an exhaustive search on
small random cases), and the second count catches what the first misses."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kai_ray.decisions.consolidate import sizes_could_fit


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
