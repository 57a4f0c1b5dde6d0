"""lakesink.table.numbering.row_numbers: the positions of a file's rows (a merge-on-read lookup deletes the rows at
them) and the original order of rows; a wrong number deletes another row."""

from __future__ import annotations

import pyarrow as pa
import pytest

from lakesink.table.numbering import row_numbers


@pytest.mark.parametrize("n", [0, 1, 2, 1000, 1_000_003])
def test_row_numbers_are_zero_to_n_as_int64(n: int) -> None:
    numbers = row_numbers(n)
    assert numbers.type == pa.int64()
    assert numbers.null_count == 0
    assert numbers.equals(pa.array(range(n), pa.int64()))
