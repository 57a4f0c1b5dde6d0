"""Merge-on-read: a task's position deletes written as position delete files, for any number of tables. Executors.

Input: rows to delete, as ``(data file path, row position)`` -- Spark finds them (a candidate file's key column read
with its ``_metadata.row_index``, joined with a batch's keys) and hands each task its share. Output: Iceberg v2
position delete files (:mod:`lakesink._pyiceberg.io.deletes`: Parquet, Iceberg's field ids, sorted by path then
position, Java's statistics) and, per table, a :class:`DeleteTaskResult` for the driver, which commits them with the
batch's rows as one row delta (lakesink.driver.actions.row_delta).

**One file per partition per table per task, and no writer per table.** A delete file applies to the data files of
its own partition (spec and values: the spec's scope rules), so a task writes one delete file per (table, partition
spec, partition) it holds deletes for, named like the task's data files (lakesink.table.names: the orphan clean-up
tells whose it is), under the table's data path in the partition's folder -- never one per data file. The positions
are buffered as Arrow arrays (16 bytes a row) and written when the task finishes (:meth:`PositionDeleteWriter.finish`):
a table with no delete in the task costs nothing, one with a few costs one small Parquet write per partition, and a
task of many tables holds one :class:`PositionDeleteWriter` (issue 52 item 4: 100 tables with few changes each must not
cost 100 writers per task). Iceberg Java's counterparts: ``SortingPositionOnlyDeleteWriter`` (buffer, sort, write on
close) with ``DeleteGranularity.PARTITION`` inside a ``FanoutPositionOnlyDeleteWriter`` (any order of input).

Every position is checked against the plan before anything is written: a data file the plan does not name (the
lookup read another snapshot) or a position at or past the file's row count (a lookup gone wrong) is a loud
:class:`~lakesink.errors.LakesinkError` naming the table and the file -- a position delete that points nowhere would
delete nothing, or the wrong row, silently.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import FileIO
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage

from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink._pyiceberg.io import keep_written_positions, new_data_location
from lakesink.errors import LakesinkError, TableLocationError
from lakesink.executor.messages import TaskIds
from lakesink.faults import EXECUTOR_AFTER_FILE, fault_point
from lakesink.table import floats, names, storage
from lakesink.table.keys import LOOKUP_PATH, LOOKUP_POS, LOOKUP_SPARK_PATH, LOOKUP_STALE


@dataclass(frozen=True)
class TargetFile:
    """A data file a task may delete rows of: what its delete file must say (the driver reads it from the manifests)."""

    spec_id: int
    partition: tuple[Any, ...]
    """Its partition values (Iceberg's internal representation), which its delete file takes."""
    partition_path: str | None
    """The folder of its partition (``id_bucket=3``), None when unpartitioned: its delete file goes there."""
    record_count: int
    """Its rows: a position at or past it is an error."""


@dataclass(frozen=True)
class DeleteTarget:
    """Everything a task needs to write one table's position delete files: no catalog, no rows."""

    table: str
    location: str
    data_prefix: str
    """Every delete file is created under this prefix (lakesink.table.locations checked it on the driver)."""
    properties: Mapping[str, str]
    """The table's properties (``write.parquet.*``, ``write.data.path``, the object-store layout)."""
    io: FileIO = field(repr=False)
    files: Mapping[str, TargetFile] = field(repr=False, default_factory=dict)
    """The data files whose rows the batch may delete, by path (the lookup's candidates, from the snapshot it read)."""
    base_snapshot_id: int | None = None
    """The snapshot the files above (and the lookup) were read from: the commit validates from it on."""


@dataclass(frozen=True)
class WrittenDeleteFile:
    """One position delete file a task wrote (pre-commit: not in the table yet)."""

    path: str
    size_in_bytes: int
    record_count: int
    statistics: Mapping[str, Any] = field(repr=False)
    spec_id: int
    partition: tuple[Any, ...]
    referenced_data_files: tuple[str, ...]


@dataclass(frozen=True)
class DeleteTaskResult(WriterCommitMessage):
    """A task's position delete files for one table."""

    table: str
    files: tuple[WrittenDeleteFile, ...]
    base_snapshot_id: int | None
    """The snapshot the target's data files were read from (:attr:`DeleteTarget.base_snapshot_id`)."""
    written_since_ms: int | None = None
    """When the task began writing its delete files (ms since the epoch, the executor's clock)."""

    @property
    def referenced_data_files(self) -> frozenset[str]:
        return frozenset(p for f in self.files for p in f.referenced_data_files)

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def size_in_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.files)


class PositionDeleteWriter:
    """One task's position deletes for any number of tables (``targets``, by table name), buffered by :meth:`add`
    and written by :meth:`finish` (one file per table and partition); :meth:`abort` deletes what was written."""

    def __init__(self, ids: TaskIds, targets: Mapping[str, DeleteTarget], *, keep: bool = False):
        """``keep``: each file's positions are kept in this process as the next lookup reads them
        (lakesink._pyiceberg.io.reads.keep_written_positions) -- a writer in the process that looks the keys up."""
        self._ids = ids
        self._targets = targets
        self._keep = keep
        self._token = names.new_token()
        self._counter = 0
        self._paths: dict[str, list[pa.Array]] = {}
        self._positions: dict[str, list[pa.Array]] = {}
        self._written: list[tuple[FileIO, str]] = []
        self._since_ms: int | None = None

    def add(self, table: str, file_paths: pa.Array | pa.ChunkedArray | Iterable[str], positions: Any) -> None:
        """Buffer the deletes of rows ``positions`` of data files ``file_paths`` (equal lengths) of ``table``."""
        if table not in self._targets:
            raise LakesinkError(f"position deletes for table {table}, which this task has no delete target for")
        paths = file_paths if isinstance(file_paths, (pa.Array, pa.ChunkedArray)) else pa.array(list(file_paths), pa.string())
        pos = positions if isinstance(positions, (pa.Array, pa.ChunkedArray)) else pa.array(list(positions), pa.int64())
        if len(paths) != len(pos):
            raise ValueError(f"table {table}: {len(paths)} data file paths for {len(pos)} positions")
        if len(paths):
            self._paths.setdefault(table, []).append(pc.cast(paths, pa.string()))
            self._positions.setdefault(table, []).append(pc.cast(pos, pa.int64()))

    def add_batch(
        self, table: str, batch: pa.RecordBatch | pa.Table, *, path_column: str = "file_path", pos_column: str = "pos"
    ) -> None:
        """:meth:`add` of a batch's ``path_column`` and ``pos_column``."""
        self.add(table, batch.column(path_column), batch.column(pos_column))

    def finish(self) -> list[DeleteTaskResult]:
        """Write every table's buffered deletes (one file per partition; none for a table without deletes) and return
        one result per table that has deletes. On any error the files written so far are deleted."""
        results = []
        try:
            for table in sorted(self._paths):
                target = self._targets[table]
                rows = seam_deletes.sorted_positions(
                    pa.chunked_array(_chunks(self._paths.pop(table)), pa.string()),
                    pa.chunked_array(_chunks(self._positions.pop(table)), pa.int64()),
                )
                files = self._write_table(target, rows)
                results.append(
                    DeleteTaskResult(
                        table=table, files=tuple(files), base_snapshot_id=target.base_snapshot_id, written_since_ms=self._since_ms
                    )
                )
        except BaseException:
            self.abort()
            raise
        return results

    def _write_table(self, target: DeleteTarget, rows: pa.Table) -> list[WrittenDeleteFile]:
        by_file = seam_deletes.positions_by_file(rows)
        # every position checked before anything of the table is written
        groups: dict[tuple[int, tuple[Any, ...]], list[str]] = {}
        slots: dict[tuple[int, tuple[Any, ...]], TargetFile] = {}
        for path, positions in by_file.items():
            known = target.files.get(path)
            if known is None:
                raise LakesinkError(
                    f"table {target.table}: position deletes for data file {path}, which is not among the "
                    f"{len(target.files)} data file(s) of snapshot {target.base_snapshot_id} the deletes were planned on "
                    "(the lookup read another snapshot, or another table's file); nothing was written"
                )
            highest = positions[-1].as_py()
            if highest >= known.record_count:
                raise LakesinkError(
                    f"table {target.table}: a position delete for row {highest} of data file {path}, which has "
                    f"{known.record_count} row(s); nothing was written"
                )
            key = (known.spec_id, _partition_key(known.partition))
            groups.setdefault(key, []).append(path)
            slots[key] = known
        out = []
        paths_column = rows.column("file_path")
        for key in sorted(groups, key=repr):
            wanted = pa.array(groups[key], pa.string())
            part = rows.filter(pc.is_in(paths_column, value_set=wanted)) if len(groups) > 1 else rows
            out.append(self._write_file(target, slots[key], part))
        return out

    def _write_file(self, target: DeleteTarget, slot: TargetFile, rows: pa.Table) -> WrittenDeleteFile:
        name = self._ids.data_file_name(token=self._token, counter=self._counter)
        self._counter += 1
        location = new_data_location(target.location, target.properties, name, slot.partition_path)
        if not location.startswith(target.data_prefix.rstrip("/") + "/"):
            raise TableLocationError(
                f"lakesink refuses to write {location!r}: outside the data path {target.data_prefix!r} of table {target.table}"
            )
        if self._since_ms is None:
            self._since_ms = names.now_ms()
        self._written.append((target.io, location))
        written = seam_deletes.write_position_deletes(target.io, location, rows, target.properties)
        if self._keep:
            keep_written_positions(written.path, written.size_in_bytes, rows)
        fault_point(EXECUTOR_AFTER_FILE)
        return WrittenDeleteFile(
            path=written.path,
            size_in_bytes=written.size_in_bytes,
            record_count=written.record_count,
            statistics=written.statistics,
            spec_id=slot.spec_id,
            partition=slot.partition,
            referenced_data_files=written.referenced_data_files,
        )

    def abort(self) -> None:
        """Delete the files this writer wrote (the task failed) and drop what it buffered."""
        self._paths, self._positions = {}, {}
        written, self._written = self._written, []
        by_io: dict[int, tuple[FileIO, list[str]]] = {}
        for io, path in written:
            by_io.setdefault(id(io), (io, []))[1].append(path)
        for io, paths in by_io.values():
            storage.delete_failed_task_files(io, paths)


def _chunks(arrays: list[pa.Array | pa.ChunkedArray]) -> list[pa.Array]:
    out: list[pa.Array] = []
    for a in arrays:
        out.extend(a.chunks if isinstance(a, pa.ChunkedArray) else [a])
    return out


def _partition_key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Partition values as a dict key that tells -0.0 from 0.0 and NaN equal to NaN (lakesink.table.floats)."""
    return floats.partition_key(values)


@dataclass(frozen=True)
class LookupTaskResult:
    """One lookup task's outcome: its position delete files, and the matched rows' other columns (the batch's keys,
    deleted flag, staleness: what the driver counts and the order file records), as Arrow IPC."""

    deletes: tuple[DeleteTaskResult, ...]
    matched: bytes


@dataclass(frozen=True)
class LookupWriter:
    """The ``mapInArrow`` function of a merge-on-read lookup (lakesink.sink.merge_on_read): a task's matched rows
    (:data:`LOOKUP_PATH`, :data:`LOOKUP_POS`, :data:`LOOKUP_STALE` and ``outcome`` columns) -- the rows of the non-stale
    ones deleted by position delete files (:class:`PositionDeleteWriter`, one file per partition), the ``outcome``
    columns of every one returned; yields the task's pickled :class:`LookupTaskResult` (one row, ``task_result binary``).
    A module-level class, pickled by reference: the Python workers import this executor module only."""

    target: DeleteTarget
    query_id: str
    batch_id: int
    outcome: tuple[str, ...]
    run_id: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        if ctx is None:
            raise LakesinkError("LookupWriter must run inside a Spark task (df.mapInArrow)")
        ids = TaskIds(self.query_id, self.batch_id, ctx.partitionId(), ctx.taskAttemptId(), self.run_id)
        result = lookup_result(self.target, ids, self.outcome, batches)
        yield pa.record_batch([pa.array([pickle.dumps(result)], pa.binary())], names=["task_result"])


def lookup_result(
    target: DeleteTarget, ids: TaskIds, outcome: Sequence[str], batches: Iterable[pa.RecordBatch]
) -> LookupTaskResult:
    """A lookup's matched rows (``batches``: :data:`LOOKUP_PATH`, :data:`LOOKUP_POS`, :data:`LOOKUP_STALE` and the
    ``outcome`` columns): the rows of the non-stale ones deleted by position delete files, the ``outcome`` columns of
    every one kept for the driver -- :class:`LookupWriter`'s work in a Spark task, or in the process that commits when
    no Spark session is at hand (format("lakesink"): lakesink.sink.merge_on_read.look_up_here)."""
    # this process looks the next batch's keys up too: the positions it writes are kept for that lookup
    writer = PositionDeleteWriter(ids, {target.table: target}, keep=True)
    matched: list[pa.RecordBatch] = []
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if batch.column(LOOKUP_PATH).null_count:
                unnamed = batch.filter(batch.column(LOOKUP_PATH).is_null()).column(LOOKUP_SPARK_PATH)[0].as_py()
                raise LakesinkError(
                    f"table {target.table}: Spark read a row of data file {unnamed}, which is none of the "
                    f"{len(target.files)} candidate file(s) by the name the table's manifests give it (a path "
                    "spelled another way); no position delete was committed"
                )
            live = batch.filter(pc.invert(pc.fill_null(batch.column(LOOKUP_STALE), False)))
            writer.add(target.table, live.column(LOOKUP_PATH), live.column(LOOKUP_POS))
            matched.append(batch.select([*outcome, LOOKUP_STALE]))
        results = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return LookupTaskResult(tuple(results), _ipc(matched))


def _ipc(batches: Sequence[pa.RecordBatch]) -> bytes:
    if not batches:
        return b""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as stream:
        for b in batches:
            stream.write_batch(b)
    return bytes(sink.getvalue())


def matched_rows(results: Iterable[LookupTaskResult]) -> pa.Table | None:
    """Every lookup task's matched rows as one table (None: no task matched a row)."""
    tables = [pa.ipc.open_stream(r.matched).read_all() for r in results if r.matched]
    return pa.concat_tables(tables) if tables else None
