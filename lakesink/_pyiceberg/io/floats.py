"""Float and double values in manifests: two pyiceberg 0.12.0 bugs, corrected where they are (RELIABILITY row 32).

Both are applied when this module is imported (:mod:`lakesink._pyiceberg.io` imports it: every process that writes
or commits imports it), and only while the installed pyiceberg has the bug; tests/seam/test_contract.py checks each.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.reader import DoubleReader
from pyiceberg.manifest import PartitionFieldStats
from pyiceberg.types import DoubleType


def _read_double_exactly(self: DoubleReader, decoder: Any) -> float:
    return float(_DOUBLE.unpack(decoder.read(8))[0])


def fast_avro_reads_doubles_as_float32() -> bool:
    """pyiceberg 0.12.0's Cython Avro decoder returns a C ``float``: every Avro double it reads, i.e. every
    identity partition value of a double column in a manifest, is rounded to float32 (0.1 becomes
    0.10000000149011612, 1e308 becomes inf). Every manifest pyiceberg rewrites (merge-append, an overwrite's
    manifests that keep entries, lakesink's manifest rewrite) then records those rounded values: engines prune
    the files by wrong partition values, two partitions can become one, and a compaction or upsert that removes
    such a file fails ("Missing required files to delete"). Fixed upstream by apache/iceberg-python#3808."""
    return bool(new_decoder(_DOUBLE.pack(0.1)).read_double() != 0.1)


def partition_summaries_merge_signed_zeros() -> bool:
    """pyiceberg 0.12.0's partition field summaries (a manifest list's lower/upper bound of each partition field)
    take Python's ``min``/``max``, for which -0.0 equals 0.0: a manifest holding partitions -0.0 and 0.0 can get
    the bounds [-0.0, -0.0] or [0.0, 0.0]. Iceberg orders -0.0 below 0.0 (the spec's sort order, Java's
    ``Double.compare``): an engine that prunes by those bounds skips the manifest for the other zero."""
    stats = PartitionFieldStats(DoubleType())
    stats.update(-0.0)
    stats.update(0.0)
    assert stats._max is not None
    return bool(math.copysign(1.0, stats._max) < 0)


def _iceberg_order(value: Any) -> Any:
    """Iceberg's order of a non-NaN partition value: -0.0 below 0.0 for floats, Python's order otherwise."""
    return (value, math.copysign(1.0, value)) if isinstance(value, float) else value


def _update_in_iceberg_order(self: PartitionFieldStats, value: Any) -> None:
    """``PartitionFieldStats.update``, comparing floats in Iceberg's order."""
    if value is None:
        self._contains_null = True
    elif isinstance(value, float) and math.isnan(value):
        self._contains_nan = True
    elif self._min is None:
        self._min = self._max = value
    else:
        if _iceberg_order(value) > _iceberg_order(self._max):
            self._max = value
        if _iceberg_order(value) < _iceberg_order(self._min):
            self._min = value


_DOUBLE = struct.Struct("<d")


if fast_avro_reads_doubles_as_float32():
    DoubleReader.read = _read_double_exactly  # type: ignore[method-assign]


if partition_summaries_merge_signed_zeros():
    PartitionFieldStats.update = _update_in_iceberg_order  # type: ignore[method-assign]
