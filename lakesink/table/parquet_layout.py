"""How lakesink's pyarrow writers lay out a Parquet file: row groups and dictionary encoding.

Used by the executor's :class:`~lakesink.executor.task_writer.TaskWriter` and by compaction (through the seam's
``write_parquet``), so that every file lakesink writes with pyarrow is laid out by the same rules. Executor-safe:
pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.table.keys import DICT_SIZE_DEFAULT

#: rows of a file's first row group that decide which of its columns are dictionary-encoded: Iceberg's default
#: page row limit, i.e. the first page, on which parquet-mr (Iceberg's Java writer, Spark's writer) decides
DICTIONARY_SAMPLE_ROWS = 20_000


def dictionary_columns(table: pa.Table, dictionary_page_limit: int = DICT_SIZE_DEFAULT) -> list[str]:
    """Parquet column paths worth dictionary encoding in a file whose first row group is ``table``.

    pyarrow dictionary-encodes every column until its dictionary outgrows the page limit; parquet-mr keeps a
    column's dictionary only when, on the first page, the dictionary plus the encoded indices are smaller than
    the plain values (``DictionaryValuesWriter.isCompressionSatisfying``) and falls back to plain otherwise. The
    same rule here, on the first :data:`DICTIONARY_SAMPLE_ROWS` rows: an id, a timestamp, a measurement (nearly
    every value distinct) is written plain, a category or a repeated string keeps its dictionary. Measured on
    1.5M of the throughput benchmark's rows: pyarrow's encoding 0.31 -> 0.18 s of CPU, ``TaskWriter.write``
    0.34 -> 0.25 s, the file 11.6 -> 8.4 MB (plain values compress better under zstd than the dictionary
    indices of high-cardinality columns; docs/performance.md). Leaves of lists and maps keep the
    dictionary (pyarrow's default). Only the encoding changes: every reader reads both.
    """
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    chosen: list[str] = []

    def visit(path: str, t: pa.DataType, array: pa.ChunkedArray | None) -> None:
        if pa.types.is_struct(t):
            for i, child in enumerate(t):
                inner = None if array is None else pa.chunked_array([c.field(i) for c in array.chunks], child.type)
                visit(f"{path}.{child.name}", child.type, inner)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            visit(f"{path}.list.element", t.value_type, None)
        elif pa.types.is_map(t):
            visit(f"{path}.key_value.key", t.key_type, None)
            visit(f"{path}.key_value.value", t.item_type, None)
        elif array is None:
            chosen.append(path)  # inside a list or map: pyarrow's default
        elif not pa.types.is_boolean(t) and _dictionary_pays(array, dictionary_page_limit):
            chosen.append(path)

    for field, column in zip(table.schema, sample.columns, strict=True):
        visit(field.name, field.type, column)
    return chosen


def _dictionary_pays(array: pa.ChunkedArray, page_limit: int) -> bool:
    values = len(array) - array.null_count
    if values == 0:
        return True
    try:
        distinct = pc.count_distinct(array).as_py()
        t = array.type
        if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
            width = 4 + (pc.sum(pc.binary_length(array)).as_py() or 0) / values  # PLAIN: length prefix + bytes
        else:
            width = max(1, t.bit_width) / 8  # fixed width: numbers, dates, times, timestamps, decimals, fixed
    except (pa.ArrowNotImplementedError, ValueError, TypeError):
        return True  # a type this estimate does not know: pyarrow's default
    dictionary = distinct * width
    indices = values * max(1, (distinct - 1).bit_length()) / 8
    return bool(dictionary + indices < values * width and dictionary <= page_limit)


def row_groups(batches: Iterable[pa.RecordBatch], *, schema: pa.Schema, max_rows: int, max_bytes: int) -> Iterator[pa.Table]:
    """``batches``, each cast to ``schema`` (files written by different writers come back as ``string`` or
    ``large_string``, ...), regrouped into row groups of at most ``max_rows`` rows
    (``write.parquet.row-group-limit``), closed once they hold ``max_bytes`` in memory
    (``write.parquet.row-group-size-bytes``), as the executor's writer groups a task's rows."""
    buffer: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if not batch.schema.equals(schema):
            batch = pa.RecordBatch.from_arrays(batch.cast(schema.remove_metadata()).columns, schema=schema)
        while batch.num_rows:
            take = min(batch.num_rows, max_rows - rows)
            part = batch if take == batch.num_rows else batch.slice(0, take)
            batch = batch.slice(take)
            buffer.append(part)
            rows += part.num_rows
            size += part.nbytes
            if rows >= max_rows or size >= max_bytes:
                yield pa.Table.from_batches(buffer)
                buffer, rows, size = [], 0, 0
    if buffer:
        yield pa.Table.from_batches(buffer)
