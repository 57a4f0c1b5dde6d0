"""Position delete files (Iceberg format v2), written and read: executor-safe (Arrow in, Parquet out).

A position delete file lists rows of data files by ``(file_path, pos)`` -- the data file's full location as its
manifest entry names it, and the row's ordinal position in it, from 0 -- with Iceberg's reserved field ids
(``file_path`` 2147483546, ``pos`` 2147483545), sorted by ``file_path`` then ``pos`` (the spec's "Position Delete
Files"). No ``row`` column is written (the deleted rows' values: optional, and Java's merge-on-read writers omit it).

Statistics as Iceberg Java's ``PositionDeleteWriter`` records them (``MetricsConfig.forPositionDelete``: full bounds,
never truncated): the bounds of ``file_path`` and ``pos`` when the file holds one data file's deletes -- a reader then
knows the one data file it applies to (``lower == upper``: Java's ``ContentFileUtil.referencedDataFile``, pyiceberg's
``DeleteFileIndex``) --, no ``pos`` bounds when it holds several (they would say nothing), and no value or null counts
of either column (Java drops them). ``file_path`` bounds are kept for a file of several data files too: untruncated,
they let every reader skip the delete file for data files outside its range (Java 1.9 drops them to save manifest
space; the spec allows both). The manifest field ``referenced_data_file`` (143) is not written: pyiceberg 0.12's
model of a v2 manifest entry has no such field (its v3 one has), and the equal bounds say the same to every reader.

Deletion vectors (format v3, a Puffin blob per data file) are the same information: one data file, a set of
positions. :func:`positions_by_file` is the grouping a DV writer needs; switching is a writer change (docs/upserts.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.io import FileIO
from pyiceberg.types import LongType, StringType

from lakesink._pyiceberg.io.parquet import parquet_writer_options

#: Iceberg's reserved field ids of a position delete file's columns (the spec's "Reserved Field IDs")
FILE_PATH_ID = 2147483546
POS_ID = 2147483545

#: The Arrow schema of a position delete file, with Iceberg's field ids (both columns required)
POSITION_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
        pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
    ]
)


@dataclass(frozen=True)
class WrittenDeletes:
    """One position delete file as written: what its manifest entry needs (plain, picklable values)."""

    path: str
    size_in_bytes: int
    record_count: int
    statistics: Mapping[str, Any]
    """Keyword arguments of pyiceberg's ``DataFile.from_args``: column sizes, bounds, split offsets."""
    referenced_data_files: tuple[str, ...]
    """The data files it deletes rows of, sorted."""

    @property
    def referenced_data_file(self) -> str | None:
        """The one data file it deletes rows of (a file-scoped delete file), or None when several."""
        return self.referenced_data_files[0] if len(self.referenced_data_files) == 1 else None


def sorted_positions(file_paths: pa.Array | pa.ChunkedArray, positions: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``(file_path, pos)`` rows, duplicates removed, sorted by ``file_path`` (its UTF-8 bytes, as Iceberg compares
    strings) then ``pos``: the rows of a position delete file. Raises ValueError for a null or a negative position,
    or a null path."""
    rows = pa.table({"file_path": pc.cast(file_paths, pa.string()), "pos": pc.cast(positions, pa.int64())})
    if rows.num_rows == 0:
        return pa.Table.from_batches([], schema=POSITION_DELETE_SCHEMA)
    if rows.column("file_path").null_count or rows.column("pos").null_count:
        raise ValueError("a position delete has a null data file path or a null position")
    lowest = pc.min(rows.column("pos")).as_py()
    if lowest < 0:
        raise ValueError(f"a position delete has the negative position {lowest}")
    # Arrow's string sort is by bytes (UTF-8), as Iceberg's comparator of strings in bounds
    rows = rows.group_by(["file_path", "pos"]).aggregate([]).sort_by([("file_path", "ascending"), ("pos", "ascending")])
    return pa.Table.from_arrays([rows.column("file_path"), rows.column("pos")], schema=POSITION_DELETE_SCHEMA)


def positions_by_file(rows: pa.Table) -> dict[str, pa.Array]:
    """The sorted rows of :func:`sorted_positions` as each data file's positions (a deletion vector's content)."""
    out: dict[str, pa.Array] = {}
    paths = rows.column("file_path").combine_chunks()
    positions = rows.column("pos").combine_chunks()
    if not len(paths):
        return out
    ends = pc.indices_nonzero(pc.not_equal(paths[1:], paths[:-1])).to_pylist()
    start = 0
    for end in [*(e + 1 for e in ends), len(paths)]:
        out[paths[start].as_py()] = positions.slice(start, end - start)
        start = end
    return out


def write_position_deletes(io: FileIO, location: str, rows: pa.Table, table_properties: Mapping[str, str]) -> WrittenDeletes:
    """Write ``rows`` (from :func:`sorted_positions`: sorted, no duplicates) as one position delete file at
    ``location`` with the table's Parquet settings (``write.parquet.*``: codec, level, page sizes), never overwriting
    a file; its statistics as Iceberg Java records them (the module's docstring)."""
    if rows.num_rows == 0:
        raise ValueError("a position delete file needs at least one position")
    rows = pa.Table.from_arrays(rows.columns, schema=POSITION_DELETE_SCHEMA)
    paths = rows.column("file_path")
    first, last = paths[0].as_py(), paths[-1].as_py()
    referenced = tuple(sorted(pc.unique(paths).to_pylist()))
    options = parquet_writer_options(table_properties)
    with io.new_output(location).create(overwrite=False) as stream:
        with pq.ParquetWriter(stream, schema=POSITION_DELETE_SCHEMA, **options, use_dictionary=["file_path"]) as writer:
            writer.write_table(rows)
        metadata = writer.writer.metadata
    size = len(io.new_input(location))
    lower: dict[int, bytes] = {FILE_PATH_ID: to_bytes(StringType(), first)}
    upper: dict[int, bytes] = {FILE_PATH_ID: to_bytes(StringType(), last)}
    if len(referenced) == 1:
        pos = rows.column("pos")
        lower[POS_ID] = to_bytes(LongType(), pos[0].as_py())
        upper[POS_ID] = to_bytes(LongType(), pos[-1].as_py())
    return WrittenDeletes(
        path=location,
        size_in_bytes=size,
        record_count=rows.num_rows,
        statistics={
            "record_count": rows.num_rows,
            "column_sizes": _column_sizes(metadata),
            "lower_bounds": lower,
            "upper_bounds": upper,
            "split_offsets": _split_offsets(metadata),
        },
        referenced_data_files=referenced,
    )


def read_position_deletes(io: FileIO, location: str) -> pa.Table:
    """A position delete file's ``(file_path, pos)`` rows (by field id, whatever the column names; a ``row``
    column, when present, is not read)."""
    with io.new_input(location).open() as stream:
        table = pq.read_table(stream)
    by_id = {}
    for i, f in enumerate(table.schema):
        field_id = (f.metadata or {}).get(b"PARQUET:field_id")
        if field_id is not None:
            by_id[int(field_id)] = table.column(i)
    if FILE_PATH_ID not in by_id or POS_ID not in by_id:
        raise ValueError(f"{location} is not a position delete file (no columns with field ids {FILE_PATH_ID} and {POS_ID})")
    return pa.Table.from_arrays(
        [pc.cast(by_id[FILE_PATH_ID], pa.string()), pc.cast(by_id[POS_ID], pa.int64())], schema=POSITION_DELETE_SCHEMA
    )


def _column_sizes(metadata: pq.FileMetaData) -> dict[int, int]:
    sizes = {FILE_PATH_ID: 0, POS_ID: 0}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            sizes[FILE_PATH_ID if column.path_in_schema == "file_path" else POS_ID] += column.total_compressed_size
    return sizes


def _split_offsets(metadata: pq.FileMetaData) -> list[int]:
    offsets = []
    for g in range(metadata.num_row_groups):
        column = metadata.row_group(g).column(0)
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        offsets.append(start)
    return sorted(offsets)
