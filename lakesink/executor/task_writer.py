"""Executor side: Arrow record batches in, immutable Parquet data files out (the pre-commit).

Runs inside Spark's Python workers. It never opens a catalog and never commits: it writes files
under the table's data location with names unique per query, batch, task attempt and writer, and
returns their metadata in a :class:`~lakesink.executor.messages.TaskResult` (names: :mod:`lakesink.table.names`).
If the task fails, the files it wrote are deleted before the error propagates (a SIGKILLed worker leaves them
unreferenced; they are never committed and an orphan-file clean-up collects them).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyspark import TaskContext

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError, SchemaMismatchError, TableLocationError
from lakesink.executor import text, upsert_task
from lakesink.executor.dead_letters import RowSorter
from lakesink.executor.messages import TaskIds, TaskResult, WritePlan, WrittenFile
from lakesink.faults import EXECUTOR_AFTER_FILE, EXECUTOR_BEFORE_RETURN, EXECUTOR_BEFORE_WRITE, fault_point
from lakesink.table import floats, names, required, settings, storage
from lakesink.table.keys import DELETED, DICT_SIZE_DEFAULT, UNAVAILABLE_COLUMN
from lakesink.table.numbering import row_numbers
from lakesink.table.parquet_layout import dictionary_columns

log = logging.getLogger(__name__)


def utc_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every zoned timestamp (at any depth) in UTC: the same instants, only the label changes."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz="UTC") if t.tz is not None and t.tz != "UTC" else t
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(utc_type(f.type)) for f in t])
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(utc_type(t.value_type)))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(utc_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(t.key_field.with_type(utc_type(t.key_type)), t.item_field.with_type(utc_type(t.item_type)))
    return t


def utc_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_type(utc_type(f.type)) for f in schema], metadata=schema.metadata)


class _OpenFile:
    """One data file being written (one partition's), with the row group it is collecting."""

    def __init__(self, partition: tuple[Any, ...], path_segment: str | None):
        self.partition = partition
        self.path_segment = path_segment
        self.path: str | None = None
        self.stream: Any = None
        self.writer: pq.ParquetWriter | None = None
        self.rows_in_file = 0
        self.buffer: list[pa.RecordBatch] = []
        self.buffer_rows = 0
        self.buffer_bytes = 0
        self.kept: list[pa.Table] = []
        """The key (and order-by) columns of the row groups written, in order (TaskWriter's ``keep``)."""


class TaskWriter:
    """Writes one task's rows into Parquet data files of the table, rolling at the target file size.

    Partitioned tables: each row goes to the open file of its partition (a "fanout" writer, so unsorted
    input does not produce a file per change of partition). A task keeps at most
    ``write.lakesink.max-open-files`` files open; when a new partition needs a file beyond that, the
    least recently written one is closed (a later row of that partition starts a new file). Rows wait
    in per-partition row groups whose total size is bounded by ``write.parquet.row-group-size-bytes``:
    beyond it the largest is written out.

    ``keep``: a writer in the process that looks a merge-on-read table's keys up (the driver's write of a small batch,
    lakesink.sink.driver_write): these columns of each file (:func:`lookup_columns`) are kept in this process as the
    next lookup reads them (lakesink._pyiceberg.io.reads.keep_written_columns), not read back from the file.
    """

    def __init__(self, plan: WritePlan, ids: TaskIds, *, keep: Schema | None = None):
        self._plan = plan
        self._ids = ids
        self._token = names.new_token()
        self._since_ms = names.now_ms()  # before any file: every file of the task is at least this recent
        self._file_schema: Schema = seam.file_schema(plan.schema)
        settings = plan.settings
        self._target_file_size = settings.target_file_size
        self._row_group_rows = settings.row_group_rows
        self._row_group_bytes = settings.row_group_bytes
        self._max_open = settings.max_open_files
        self._dict_size = settings.dict_size or DICT_SIZE_DEFAULT
        self._writer_options = seam.parquet_writer_options(plan.properties)
        self._table_arrow = seam.arrow_schema(self._file_schema)
        self._has_required = required.has_required(self._table_arrow)
        self._partitioned = not plan.spec.is_unpartitioned()
        self._kept = keep
        self._files: list[WrittenFile] = []
        self._changes: bytes | None = None
        self._history: bytes | None = None
        self._pending: list[pa.RecordBatch] = []
        """A routed task with WritePlan.upsert: the table's rows, resolved to one row per key by :meth:`finish`."""
        self._sorter: RowSorter | None = None
        self._last_projected: tuple[pa.RecordBatch, pa.RecordBatch] | None = None
        if plan.row_checks is not None:  # option dead-letter-table: rows that do not fit become dead letters
            self._sorter = RowSorter(
                plan.row_checks,
                table=plan.table,
                query_id=ids.query_id,
                batch_id=ids.batch_id,
                project=self._project,
                table_schema=self._table_arrow,
            )
        self._dead_letters: TaskResult | None = None
        self._counter = 0
        # open files by partition (the unpartitioned table has one, keyed by ()), least recently written first;
        # keyed by floats.partition_key: Python's == would merge -0.0 with 0.0 and split NaN from NaN
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._buffered_bytes = 0
        # how incoming batches map onto the table (computed from the first batch)
        self._incoming: pa.Schema | None = None
        self._utc: pa.Schema | None = None
        self._relaxed: pa.Schema | None = None
        self._source: Schema | None = None

    @property
    def plan(self) -> WritePlan:
        return self._plan

    def write(self, batches: Iterable[pa.RecordBatch]) -> TaskResult:
        """Write every batch; on any failure delete this task's files and re-raise."""
        try:
            fault_point(EXECUTOR_BEFORE_WRITE)
            for batch in batches:  # format("lakesink") with upsert-key: put keeps them, finish resolves one row per key
                self.put(self.sort(batch))
            self.finish()
            fault_point(EXECUTOR_BEFORE_RETURN)
        except BaseException:
            self.abort()
            raise
        return self._result(replay_skipped=False)

    # --- one batch at a time (the routed writer feeds one TaskWriter per table: lakesink.executor.routed_writer) ---

    def add(self, batch: pa.RecordBatch) -> None:
        """Conform ``batch`` to the table and add its rows to the open files (the caller aborts on failure)."""
        if batch.num_rows:
            if self._sorter is None:  # (with row checks, such rows are dead letters already: RowSorter.sort)
                self._refuse_not_utf8(batch)
            conformed = self._conform(batch)
            if self._partitioned:
                for key, part in self._split(conformed):
                    self._add(self._slot(key), part)
            else:
                self._add(self._slot(()), conformed)

    def sort(self, batch: pa.RecordBatch, extra: dict[str, object] | None = None) -> pa.RecordBatch:
        """The good rows of ``batch`` (option dead-letter-table; the rest kept as dead letters, with ``extra`` put back
        in their JSON: a routed task's routing value), or ``batch`` itself without row checks. With upserts, before the
        resolution: the deleted flag computed first, so that a delete is checked by its key only."""
        if self._sorter is None:
            return batch
        if self._plan.upsert is not None:
            batch = upsert_task.with_deleted(batch, self._plan.upsert)
        return self._sorter.sort(batch, extra)

    def put(self, batch: pa.RecordBatch) -> None:
        """Rows of this table (:meth:`write`'s, or a routed task's): added; with ``WritePlan.upsert`` kept until
        :meth:`finish` resolves the task's rows of the table to one row per key."""
        if self._plan.upsert is None:
            self.add(batch)
        elif batch.num_rows:
            self._pending.append(batch)

    def finish(self) -> None:
        """After the task's rows were put: every file closed and the dead letters written."""
        if self._plan.upsert is not None:
            pending, self._pending = self._pending, []
            # option history: every change, before the resolution -- but the dead letters :meth:`sort` took out
            if self._plan.upsert.history_time is not None:
                self._history = upsert_task.to_ipc(
                    upsert_task.history_rows(pending, self._plan.upsert, batch_id=self._ids.batch_id)
                )
                pending = upsert_task.without_undone(pending)  # a change a later truncate undoes: history only
            rows, changes = upsert_task.resolve_task(
                pending,
                self._plan.upsert,
                batch_id=self._ids.batch_id,
                partition_id=self._ids.partition_id,
            )
            self._changes = upsert_task.to_ipc(changes)
            for batch in rows:
                self.add(batch)
        self.close_files()
        self._write_dead_letters()

    def _write_dead_letters(self) -> None:
        """Option dead-letter-table: the task's dead letters, written as files of the dead-letter table."""
        if self._sorter is not None and self._plan.row_checks is not None:
            self._dead_letters = TaskWriter(
                self._plan.row_checks.dead_letters,
                TaskIds(
                    query_id=self._ids.query_id,
                    batch_id=self._ids.batch_id,
                    partition_id=self._ids.partition_id,
                    task_attempt_id=self._ids.task_attempt_id,
                    run_id=self._ids.run_id,
                ),
            ).write(self._sorter.letters)

    def close_files(self) -> None:
        """Write out every row group and close every file."""
        for slot in list(self._open.values()):
            self._flush_row_group(slot)
            self._close_file(slot)

    def result(self) -> TaskResult:
        """The task's result, once :meth:`close_files` closed its files."""
        return self._result(replay_skipped=False)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of rows collected for row groups not written yet."""
        return self._buffered_bytes

    def flush_largest(self) -> None:
        """Write out the largest row group being collected (a routed task bounds its memory across tables)."""
        if self._open:
            self._flush_row_group(max(self._open.values(), key=lambda s: s.buffer_bytes))

    def skip_replay(self, batches: Iterator[pa.RecordBatch]) -> TaskResult:
        """The batch is already in the table: consume the input, write nothing."""
        for _ in batches:
            pass
        log.info(
            "lakesink: batch %s of query %s is already committed; task writes nothing", self._ids.batch_id, self._ids.query_id
        )
        return self._result(replay_skipped=True)

    def _result(self, *, replay_skipped: bool) -> TaskResult:
        return TaskResult.of_task(
            self._ids,
            schema_id=self._plan.schema_id,
            spec_id=self._plan.spec_id,
            files=tuple(self._files),
            replay_skipped=replay_skipped,
            table_uuid=self._plan.table_uuid,
            written_schema=self._plan.schema_digest,
            schema_changes=self._plan.schema_changes,
            changes=self._changes,
            history=self._history,
            written_since_ms=self._since_ms if self._files else None,
            dead_letters=self._dead_letters,
            rows_in=self._sorter.rows_in if self._sorter else 0,
            rejected=self._sorter.rejected if self._sorter else 0,
            reasons=tuple(self._sorter.reasons) if self._sorter else (),
        )

    # --- conforming rows to the table -----------------------------------------------------------

    def _project(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, Schema]:
        """The batch as the table's files hold it (UTC, cast, projected), and the stream schema with the table's ids.
        The last batch's projection is kept: the row sorter projects a batch, and when it keeps all its rows the
        writer projects the very same batch next (measured: 40% more CPU per row without it)."""
        last = self._last_projected
        if last is not None and last[0] is batch and self._source is not None:
            return last[1], self._source
        original = batch
        upsert = self._plan.upsert
        if upsert is not None:  # a routed upsert's rows carry columns its resolution reads, which are not written
            unwritten = [n for n in batch.schema.names if n in (DELETED, UNAVAILABLE_COLUMN) or n in upsert.not_written]
            batch = batch.drop_columns(unwritten) if unwritten else batch
        if self._incoming is None or not batch.schema.equals(self._incoming):
            self._incoming = batch.schema
            self._utc = utc_schema(batch.schema)
            self._relaxed = required.relaxed_schema(self._utc)
            self._source = seam.stream_schema(self._utc, self._plan.schema)
        assert self._utc is not None and self._source is not None
        if not self._utc.equals(batch.schema):
            # relaxed: Spark declares a NOT NULL field non-nullable, and pyarrow's cast refuses its nulls under a
            # null parent (lakesink.table.required)
            batch = batch.cast(self._relaxed)
        projected = seam.project_batch(batch, target=self._file_schema, source=self._source)
        self._last_projected = (original, projected) if self._sorter is not None else None
        return projected, self._source

    def _refuse_not_utf8(self, batch: pa.RecordBatch) -> None:
        """A string that is not UTF-8 is never written into an Iceberg string column (lakesink.executor.text)."""
        for name, mask in text.not_utf8(batch):
            raise SchemaMismatchError(
                f"column {name!r} of table {self._plan.table} is a string (UTF-8 text in Iceberg), but batch "
                f"{self._ids.batch_id} has {int(mask.sum())} row(s) whose value in it holds bytes that are not UTF-8 "
                f"(partition {self._ids.partition_id}; e.g. a binary or Kafka column cast to string); nothing was committed. "
                "Keep such a column binary (an Iceberg binary column), repair the text before the sink (replace or "
                "drop the bytes that are not UTF-8), or set option dead-letter-table "
                "(such rows become dead letters of error 'not-utf8')"
            )

    def _conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch projected onto the table, NOT NULL checked, with the table's nullability (Parquet's form)."""
        projected, _ = self._project(batch)
        if not self._has_required:
            return projected
        for nulls in required.violations(projected, self._table_arrow):
            raise SchemaMismatchError(
                f"column {nulls.path!r} is required (NOT NULL) in table {self._plan.table}, but batch "
                f"{self._ids.batch_id} has {nulls.count} null value(s) in it (partition {self._ids.partition_id})"
            )
        return required.as_written(projected, self._table_arrow)

    def _split(self, batch: pa.RecordBatch) -> Iterator[tuple[tuple[Any, ...], pa.RecordBatch]]:
        """The batch's rows grouped by partition (one pass: hash grouping, then one take per partition)."""
        spec, schema = self._plan.spec, self._plan.schema
        values = seam.partition_values(spec, schema, seam.partition_source_arrays(spec, batch))
        names = [f"p{i}" for i in range(len(values))]
        if all(v.null_count == 0 and len(pc.unique(v)) == 1 for v in values):  # the common case: one partition
            key = seam.partition_record_values(spec, schema, [v[0].as_py() for v in values])
            yield key, batch
            return
        keyed = pa.table([*values, row_numbers(batch.num_rows)], names=[*names, "__row"])
        groups = keyed.group_by(names, use_threads=False).aggregate([("__row", "list")])
        rows = groups.column("__row_list")
        for i in range(groups.num_rows):
            key = seam.partition_record_values(spec, schema, [groups.column(n)[i].as_py() for n in names])
            yield key, batch.take(rows[i].values)

    # --- row groups and files -------------------------------------------------------------------

    def _slot(self, partition: tuple[Any, ...]) -> _OpenFile:
        key = floats.partition_key(partition)
        slot = self._open.pop(key, None)
        if slot is None:
            if len(self._open) >= self._max_open:
                oldest = next(iter(self._open))
                self._flush_row_group(self._open[oldest])
                self._close_file(self._open.pop(oldest))
            segment = seam.partition_path(self._plan.spec, self._plan.schema, partition) if self._partitioned else None
            slot = _OpenFile(partition, segment)
        self._open[key] = slot  # most recently written last
        return slot

    def _add(self, slot: _OpenFile, batch: pa.RecordBatch) -> None:
        # write.parquet.row-group-limit is a cap (batches are split at it);
        # write.parquet.row-group-size-bytes is a threshold on the in-memory size of the collected rows,
        # of one partition and of all partitions together
        while batch.num_rows:
            take = min(batch.num_rows, self._row_group_rows - slot.buffer_rows)
            part = batch if take == batch.num_rows else batch.slice(0, take)
            batch = batch.slice(take)
            slot.buffer.append(part)
            slot.buffer_rows += part.num_rows
            slot.buffer_bytes += part.nbytes
            self._buffered_bytes += part.nbytes
            if slot.buffer_rows >= self._row_group_rows or slot.buffer_bytes >= self._row_group_bytes:
                self._flush_row_group(slot)
            elif self._buffered_bytes >= self._row_group_bytes:
                self._flush_row_group(max(self._open.values(), key=lambda s: s.buffer_bytes))

    def _flush_row_group(self, slot: _OpenFile) -> None:
        if not slot.buffer:
            return
        table = pa.Table.from_batches(slot.buffer)
        self._buffered_bytes -= slot.buffer_bytes
        slot.buffer, slot.buffer_rows, slot.buffer_bytes = [], 0, 0
        if slot.writer is None:
            self._open_file(slot, table)
        assert slot.writer is not None
        slot.writer.write_table(table, row_group_size=table.num_rows)
        if self._kept is not None:
            kept = [f.name for f in self._kept.fields]
            if all(n in table.column_names for n in kept):
                slot.kept.append(table.select(kept))
            else:  # (a file holds every column of the table: never) nothing kept, the lookups read the files
                self._kept = None
        slot.rows_in_file += table.num_rows
        if slot.stream.tell() >= self._target_file_size:
            self._close_file(slot)

    def _open_file(self, slot: _OpenFile, first_row_group: pa.Table) -> None:
        name = self._ids.data_file_name(token=self._token, counter=self._counter)
        self._counter += 1
        path = seam.new_data_location(self._plan.location, self._plan.properties, name, slot.path_segment)
        if not path.startswith(self._plan.data_prefix.rstrip("/") + "/"):
            raise TableLocationError(
                f"lakesink refuses to write {path!r}: outside the data path {self._plan.data_prefix!r} "
                f"of table {self._plan.table}"
            )
        # overwrite=False: a name collision fails loudly instead of replacing a committed file
        stream = self._plan.io.new_output(path).create(overwrite=False)
        slot.path = path
        try:
            options = {**self._writer_options, "use_dictionary": dictionary_columns(first_row_group, self._dict_size)}
            slot.writer = pq.ParquetWriter(stream, schema=first_row_group.schema, **options)
        except BaseException:
            stream.close()
            raise
        slot.stream = stream
        slot.rows_in_file = 0

    def _close_file(self, slot: _OpenFile) -> None:
        if slot.writer is None:
            return
        writer, stream, path = slot.writer, slot.stream, slot.path
        slot.writer = None
        writer.close()
        size = stream.tell()
        stream.close()
        assert path is not None
        stats = seam.file_statistics(writer.writer.metadata, self._file_schema, self._plan.properties)
        if self._kept is not None and slot.kept:
            seam.keep_written_columns(path, size, self._kept, pa.concat_tables(slot.kept))
        slot.kept = []
        self._files.append(
            WrittenFile(path=path, size_in_bytes=size, record_count=slot.rows_in_file, statistics=stats, partition=slot.partition)
        )
        slot.path = None
        fault_point(EXECUTOR_AFTER_FILE)

    def abort(self) -> None:
        """Delete the files this task wrote (its failure, or a routed task's failure in another table)."""
        paths = [f.path for f in self._files]
        for slot in self._open.values():
            if slot.writer is not None:
                try:
                    slot.writer.close()
                    slot.stream.close()
                except Exception:
                    pass
                slot.writer = None
            if slot.path is not None:
                paths.append(slot.path)
        self._open = {}
        storage.delete_failed_task_files(self._plan.io, paths)
        self._files = []
        if self._dead_letters is not None and self._plan.row_checks is not None:
            storage.delete_failed_task_files(self._plan.row_checks.dead_letters.io, (f.path for f in self._dead_letters.files))
            self._dead_letters = None


def lookup_columns(plan: WritePlan, key: Sequence[str], order_by: str | None) -> Schema | None:
    """The columns a merge-on-read lookup reads of the files written by ``plan`` (lakesink.sink.merge_on_read: the key
    and, when the table has it, the order-by column, in the table's order), or None: the table is not merge-on-read
    (its properties), there is no key, or a key column is not in the plan's schema."""
    try:
        if not key or not settings.merge_on_read(plan.table, plan.properties):
            return None
    except LakesinkError:
        return None  # a bad write mode: the driver's checks name it
    names: list[str] = []
    for name in (*key, *([order_by] if order_by is not None else [])):
        try:
            names.append(plan.schema.find_field(name, case_sensitive=False).name)
        except ValueError:
            if name in key:
                return None
    return plan.schema.select(*names)


TASK_RESULT_SCHEMA = "task_result binary"
"""The schema of what :class:`PartitionWriter` yields: one row per task, its pickled TaskResult."""


@dataclass(frozen=True)
class PartitionWriter:
    """The ``mapInArrow`` function of foreachBatch's Arrow path: writes one partition, yields its pickled TaskResult.

    A module-level class (pickled by reference, with the plan and batch id as its state) rather than a
    closure in :mod:`lakesink.sink.foreach`, so that the Python workers that run it import this executor
    module only, never the driver side.
    """

    plan: WritePlan
    batch_id: int
    run_id: str | None = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield task_result_batch(TaskWriter, "PartitionWriter", self.plan, self.batch_id, self.run_id, batches)


def task_result_batch(
    make: Callable[..., Any], what: str, plan: Any, batch_id: int, run_id: str | None, batches: Iterator[pa.RecordBatch]
) -> pa.RecordBatch:
    """One ``mapInArrow`` task: a writer ``make(plan, ids)`` for this Spark task writes ``batches``; its pickled result
    as the task's one output row (``what`` names the mapInArrow function in the error outside a task)."""
    ctx = TaskContext.get()
    if ctx is None:
        raise LakesinkError(f"{what} must run inside a Spark task (df.mapInArrow)")
    writer = make(plan, TaskIds(plan.query_id or "", batch_id, ctx.partitionId(), ctx.taskAttemptId(), run_id))
    result = writer.write(batches)
    return pa.record_batch([pa.array([pickle.dumps(result)], pa.binary())], names=["task_result"])
