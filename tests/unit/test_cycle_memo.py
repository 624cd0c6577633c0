"""`CycleMemo.of_object`: values per very object, built once per cycle."""

from __future__ import annotations

import gc

from kai_ray.decisions.transaction import CycleMemo, MemoKey

SUM = MemoKey[int]("sum of a list")


def test_a_value_per_very_object_is_built_once_and_never_given_to_another() -> None:
    memo, built = CycleMemo(), []

    def total(items: list[int]) -> int:
        def build() -> int:
            built.append(list(items))
            return sum(items)

        return memo.of_object(SUM, items, None, build)

    first = [1, 2]
    assert total(first) == 3
    assert total(first) == 3
    assert built == [[1, 2]], "built once for the same object"
    assert total([1, 2]) == 3 and len(built) == 2, "an equal list is another object"
    # Lists made and dropped one after another often take a dropped one's id: the
    # memo keeps each owner, so a new list never meets an old list's value.
    for n in range(50):
        assert total([n]) == n
        gc.collect()
    assert len(built) == 52
    assert memo.of_object(SUM, first, "another argument", lambda: -1) == -1
