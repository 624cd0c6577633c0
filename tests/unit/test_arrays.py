"""`values.arrays.add_rows` adds what `np.add.at` adds, to the bit: the same additions
to each element, in the same order (floats whose sums depend on the order included)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.values.arrays import FEW_ROWS, add_rows

#: Amounts whose sums depend on the order they are added in.
AMOUNTS = st.sampled_from((0.1, 0.2, 0.3, 1e16, -1e16, 1.0, 2.5, -0.7, 1e-9))


@settings(max_examples=200, deadline=None)
@given(
    targets=st.integers(1, 6),
    columns=st.integers(1, 4),
    rows=st.integers(0, 3 * FEW_ROWS),
    data=st.data(),
)
def test_rows_are_added_as_add_at_adds_them(
    targets: int, columns: int, rows: int, data: st.DataObject
) -> None:
    start = np.array(
        data.draw(st.lists(AMOUNTS, min_size=targets * columns, max_size=targets * columns))
    ).reshape(targets, columns)
    index = np.array(
        data.draw(st.lists(st.integers(0, targets - 1), min_size=rows, max_size=rows)),
        dtype=np.int64,
    )
    values = np.array(
        data.draw(st.lists(AMOUNTS, min_size=rows * columns, max_size=rows * columns))
    ).reshape(rows, columns)
    expected, found = start.copy(), start.copy()
    np.add.at(expected, index, values)
    add_rows(found, index, values)
    assert found.tobytes() == expected.tobytes()


def test_many_rows_on_one_element_keep_their_order() -> None:
    """1e16 then 1.0 a thousand times then -1e16: each 1.0 is lost against 1e16 when
    added in order (a sum made in another order would keep them)."""
    values = np.array([[1e16], *([[1.0]] * 1000), [-1e16]])
    target = np.zeros((2, 1))
    add_rows(target, np.zeros(len(values), dtype=np.int64), values)
    assert target[0, 0] == 0.0
