"""Strings that are not UTF-8: an Iceberg string column holds UTF-8 text (the spec), and pyiceberg reads a Parquet
file's string bounds as text, so a task writing bytes that are not UTF-8 into one failed with a bare
UnicodeDecodeError (only when such a value was a file's smallest or largest; else the file was written as it was).

Spark's strings are bytes (a Kafka value or a binary column cast to string keeps bytes that are not UTF-8): the
rows are checked before they are written -- a dead letter ``not-utf8`` with option dead-letter-table, else a
SchemaMismatchError naming the table, the column and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa


def _holds_strings(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return True
    if pa.types.is_dictionary(t):
        return _holds_strings(t.value_type)
    return any(_holds_strings(t.field(i).type) for i in range(t.num_fields))


def not_utf8(batch: pa.RecordBatch) -> Iterator[tuple[str, np.ndarray]]:
    """Each column of ``batch`` holding a string that is not UTF-8 (at any depth), with the mask of its rows that do.
    Arrow's full validation checks the whole column at once (a few ms per million strings); rows are told apart only
    in a column that failed it."""
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if not _holds_strings(column.type):
            continue
        try:
            column.validate(full=True)
            continue
        except pa.ArrowInvalid:
            pass
        yield name, np.array([not _valid(column.slice(i, 1)) for i in range(len(column))], dtype=bool)


def _valid(value: pa.Array) -> bool:
    try:
        value.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True
