"""Array helpers the layers share. Pure: no I/O."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: Below this many rows one 2-D call costs less than a call per column.
FEW_ROWS = 128


def add_rows(
    target: npt.NDArray[np.float64], rows: npt.NDArray[np.intp], values: npt.NDArray[np.float64]
) -> None:
    """`np.add.at(target, rows, values)` for a 2-D `target` (`values` one row per
    index of `rows`): each row of `values` added to the target's row it names, in
    order and unbuffered, so that a row named twice gets both. Done column by
    column, where numpy takes its fast path for one dimension (several times
    faster than the 2-D call): each element gets the very same additions in the
    same order, so the sums are the same to the bit. Few rows are added in one call
    (each call costs more than the rows then)."""
    if len(rows) < FEW_ROWS:
        np.add.at(target, rows, values)
        return
    for column in range(target.shape[1]):
        np.add.at(target[:, column], rows, values[:, column])
