"""Rows numbered 0, 1, ..., n - 1: the positions of a file's rows (merge-on-read lookups, position deletes) and the
original order of rows sorted or joined.

NumPy's ``arange`` made into an Arrow array without a copy: ``pa.array(range(n))`` converts n Python integers (about
0.2 s for a million, each lookup of a million-row file paid it) and Arrow's ``cumulative_sum`` of ones is ten times
NumPy's. Runs anywhere (driver and Spark's Python workers).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def row_numbers(n: int) -> pa.Array:
    """0, 1, ..., ``n`` - 1 as an int64 array."""
    return pa.array(np.arange(n, dtype=np.int64))
