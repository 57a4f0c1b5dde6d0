"""Float and double values as Iceberg tells them apart and as Spark orders them (executor and driver side).

Two different notions, and Python's own ``==`` is neither:

- **Identity** (partition values): Iceberg and its engines compare float partition values as Java's
  ``Double.compare`` does: ``-0.0`` is not ``0.0``, and every NaN is the same value. Python's ``==`` (and so
  dict keys, sets and tuples) merges ``-0.0`` with ``0.0`` and tells every NaN object from every other one:
  one file would hold rows of two partitions under one partition value, or one partition would be split
  into a file per row. :func:`partition_key` is the key to group partition values by.
- **Order** (an upsert's ``order-by``): Spark SQL's ``max``/``=`` on doubles rank NaN above +inf and equal to
  NaN, and ``-0.0`` equal to ``0.0``; Arrow's ``max`` skips NaN and Arrow's ``=`` never matches NaN.
  :func:`spark_order` turns a float column into an int64 column that Arrow orders and compares as Spark does,
  so that ``format("lakesink")`` (Arrow, per task) and ``foreach_batch`` (Spark) pick the same row.

No catalog, no Spark: plain Arrow and Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_NON_SIGN_BITS = 0x7FFF_FFFF_FFFF_FFFF


def value_key(value: Any) -> Any:
    """``value`` as a dict key that tells values apart as Iceberg does: floats by bit pattern (``-0.0`` apart
    from ``0.0``; every NaN one value, as Java's ``doubleToLongBits`` makes them), anything else unchanged."""
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else value.hex())
    return value


def partition_key(values: Iterable[Any]) -> tuple[Any, ...]:
    """A partition's values (a tuple or a pyiceberg Record) as a key to group files or rows by."""
    return tuple(value_key(v) for v in values)


def spark_order(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A float or double column as int64 keys that order and compare as Spark SQL orders the values: ``-inf`` <
    ... < ``-0.0`` = ``0.0`` < ... < ``+inf`` < ``NaN`` = ``NaN``; nulls stay null. Other types: unchanged."""
    if not pa.types.is_floating(values.type):
        return values
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    doubles = values.cast(pa.float64())  # exact for float and half float
    # one NaN (Spark's NaN = NaN) and one zero (Spark's -0.0 = 0.0); null stays null
    doubles = pc.if_else(pc.is_nan(doubles), pa.scalar(math.nan, pa.float64()), doubles)
    doubles = pc.if_else(pc.equal(doubles, 0.0), pa.scalar(0.0, pa.float64()), doubles)
    bits = doubles.view(pa.int64())
    # IEEE 754 bits as a signed integer order positive values; flipping the non-sign bits of negative ones
    # orders those too (-inf lowest), and the positive quiet NaN sorts above +inf
    flipped = pc.bit_wise_xor(bits, pa.scalar(_NON_SIGN_BITS, pa.int64()))
    return pc.if_else(pc.less(bits, 0), flipped, bits)
