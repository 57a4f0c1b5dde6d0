"""Driver side, upserts: the copy-on-write of the table's files that can hold a batch's keys.

A batch of an upsert sink (option ``upsert-key``) arrives resolved to one row per key
(:mod:`lakesink.sink.upsert_batch`): its rows are written as new data files like any batch's, and its keys
(with a flag for the deleted ones) come to the commit. For every commit attempt, against the table
that attempt read, :func:`rewrite` finds the live data files whose partition and key statistics can
hold any of those keys, reads them, and writes their rows *without* those keys into new files. The
batch's snapshot then removes the files that held a key and adds the rewritten files and the batch's
rows (:func:`lakesink._pyiceberg.producers.prepare_snapshot`), so every reader sees the new state without
reading a delete file.

Why copy-on-write and not delete files: docs/upserts.md (what every reader here reads, measured).
Reading and writing rows on the driver is the one exception to "the driver never touches rows":
only the files that can hold the batch's keys are read, and they are written by the executor's own
:class:`~lakesink.executor.task_writer.TaskWriter` (same Parquet settings, statistics, partitioning and names).
"""

from __future__ import annotations

import bisect
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, IcebergType, TimestampType, TimestamptzType

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import producers
from lakesink.cdc import unavailable
from lakesink.errors import LakesinkError
from lakesink.executor.messages import TaskIds, WritePlan, WrittenFile
from lakesink.executor.task_writer import TaskWriter, utc_schema
from lakesink.table import floats, settings
from lakesink.table.keys import COPY_ON_WRITE, DELETED
from lakesink.table.keys import ORDER_COLUMN as ORDER
from lakesink.table.keys import ROW_COLUMN as _ROW
from lakesink.table.keys import SUMMARY_UPSERT_BYTES_READ as SUMMARY_BYTES_READ
from lakesink.table.keys import SUMMARY_UPSERT_DELETED as SUMMARY_DELETED
from lakesink.table.keys import SUMMARY_UPSERT_FILES_READ as SUMMARY_FILES_READ
from lakesink.table.keys import SUMMARY_UPSERT_INSERTED as SUMMARY_INSERTED
from lakesink.table.keys import SUMMARY_UPSERT_MODE as SUMMARY_MODE
from lakesink.table.keys import SUMMARY_UPSERT_STALE as SUMMARY_STALE
from lakesink.table.keys import SUMMARY_UPSERT_UPDATED as SUMMARY_UPDATED
from lakesink.table.keys import UNAVAILABLE_COLUMN as UNAVAILABLE
from lakesink.table.numbering import row_numbers

log = logging.getLogger("lakesink")

#: ``partition_id`` of the files a rewrite writes (in their names), telling them from a task's files.
REWRITE_PARTITION_ID = 99999
#: ``partition_id`` of the copies of a batch's files whose unavailable values were filled (:func:`fill_unavailable`).
FILLED_PARTITION_ID = 99996


@dataclass(frozen=True)
class Rewrite:
    """What one commit attempt changes in the table's existing files."""

    removed: tuple[DataFile, ...] = ()
    """Live files that held a key of the batch (removed by the snapshot)."""
    written: tuple[WrittenFile, ...] = ()
    """Their rows without the batch's keys (added by the snapshot)."""
    spec_id: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    bytes_read: int = 0
    files_considered: int = 0
    """Files whose partition and key bounds could hold a key (read; only those holding one are removed)."""
    stale: int | None = None
    """With option order-by: the batch's changes older than the table's (lakesink.driver.actions.upsert_order), not applied."""
    unavailable: dict[tuple[Any, ...], list[str]] = field(default_factory=dict)
    """Option cdc-format: the keys whose change keeps columns of the row this attempt replaces (Debezium's
    unavailable-value placeholder, lakesink.cdc.unavailable), and those columns; changes that lost to a newer row are
    not among them."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    """The replaced rows of those keys (their values fill the batch's rows: :func:`fill_unavailable`)."""

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.written]


class BatchKeys:
    """The keys a batch changes, as the table's key columns, with lookups for pruning files."""

    def __init__(self, table_name: str, schema: Schema, keys: pa.Table):
        self.names = [n for n in keys.column_names if n not in (DELETED, ORDER, UNAVAILABLE)]
        self.fields = []
        for name in self.names:
            found = schema.find_field(name, case_sensitive=False)
            self.fields.append(found)
        target = utc_schema(seam.arrow_schema(schema))
        # a key the table's type cannot hold (a long beyond an int key's range, deleted by a batch that wrote no
        # rows, so that merge-schema did not widen the key) is in no file: it is left out, never cast
        keys = keys.filter(
            _fits(keys, [(name, target.field(f.name).type) for name, f in zip(self.names, self.fields, strict=True)])
        )
        columns = []
        for name, f in zip(self.names, self.fields, strict=True):
            t = target.field(f.name).type
            columns.append(keys.column(name).cast(t))
        # the key columns under the table's names (the batch may spell them in another case)
        # with option order-by, each key's order value last; with cdc-format, the columns its change keeps
        ordered = [c for c in (ORDER, UNAVAILABLE) if c in keys.column_names]
        self.table = pa.table(
            [*columns, keys.column(DELETED), *(keys.column(c) for c in ordered)],
            names=[*(f.name for f in self.fields), DELETED, *ordered],
        )
        self.upserts = self.table.num_rows - (pc.sum(self.table.column(DELETED)).as_py() or 0)
        self._sorted = [_sorted_internal(self.table.column(f.name), f.field_type) for f in self.fields]
        self._partition_values: dict[int, list[set[Any] | None]] = {}
        self.table_name = table_name

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def may_hold(self, data_file: DataFile, specs: dict[int, PartitionSpec], schema: Schema) -> bool:
        """False when the file's partition or key-column bounds show it holds none of the keys."""
        spec = specs.get(data_file.spec_id)
        if spec is not None and spec.fields:
            allowed = self._partition_sets(spec, schema)
            for i, values in enumerate(allowed):
                if values is not None and _normalized(data_file.partition[i]) not in values:
                    return False
        for f, ordered in zip(self.fields, self._sorted, strict=True):
            bounds = seam.column_bounds(data_file, f.field_id, f.field_type)
            if bounds is None:
                continue
            lower, upper = bounds
            at = bisect.bisect_left(ordered, lower)
            if at == len(ordered) or ordered[at] > upper:
                return False
        return True

    def _partition_sets(self, spec: PartitionSpec, schema: Schema) -> list[set[Any] | None]:
        """Per partition field of ``spec``: the values the batch's keys have (None: not a key column's transform)."""
        if spec.spec_id not in self._partition_values:
            by_id = {f.field_id: f for f in self.fields}
            out: list[set[Any] | None] = []
            for pf in spec.fields:
                source = by_id.get(pf.source_id)
                if source is None:
                    out.append(None)
                    continue
                array = self.table.column(source.name).combine_chunks()
                if isinstance(pf.transform, IdentityTransform):
                    values = {_normalized(seam.identity_partition_value(source.field_type, v)) for v in array.to_pylist()}
                else:
                    values = {_normalized(v) for v in seam.partition_values(_one(pf, spec), schema, [array])[0].to_pylist()}
                out.append(values)
            self._partition_values[spec.spec_id] = out
        return self._partition_values[spec.spec_id]


def rewrite(
    table: Table,
    *,
    branch: str,
    keys: BatchKeys,
    plan: WritePlan,
    batch_id: int,
    attempt: int,
    winners: Callable[[pa.Table, pa.Table], pa.Table] | None = None,
) -> Rewrite:
    """Rewrite the branch's live files that hold a key of the batch (see the module's description).

    ``winners`` (option order-by, lakesink.driver.actions.upsert_order): given the batch's keys a file holds and the file's
    rows, the keys whose change is not older than the file's row; the others keep their row."""
    has_deletes, live = seam.branch_data_files(table, branch)  # one read of the branch's manifest list
    merge_on_read = settings.merge_on_read(keys.table_name, table.properties)
    if merge_on_read:
        log.warning(
            "lakesink: table=%s says merge-on-read, but this batch is upserted copy-on-write (its files rewritten, its "
            "position deletes applied): this path applies merge-on-read tables copy-on-write (docs/upserts.md, 'Which paths "
            "are merge-on-read')",
            keys.table_name,
        )
    deleted_positions: dict[str, set[int]] = {}
    if has_deletes:
        if not merge_on_read:
            raise LakesinkError(
                f"table {keys.table_name} (branch {branch}) has delete files, written by a merge-on-read update or delete "
                "(another engine's, or lakesink's own before the table's write.merge.mode was set back to "
                "copy-on-write); lakesink's copy-on-write upserts of a copy-on-write table would bring deleted rows "
                "back. Compact the table so that no delete files remain (lakesink compact, Spark's rewrite_data_files "
                "with delete-file-threshold=1, or rewrite_position_delete_files) and restart the query, or set "
                "write.merge.mode=merge-on-read"
            )
        # a merge-on-read table upserted by a path that rewrites files (docs/upserts.md): its position deletes applied
        deleted_positions = _deleted_positions(table, branch, keys.table_name)
    specs = table.specs()
    schema = table.schema()
    candidates = [f for f in live if keys.may_hold(f, specs, schema)]
    key_names = [f.name for f in keys.fields]
    wanted = unavailable.wanted(keys.table, key_names)  # option cdc-format: the changes keeping the row's values
    if not candidates or not len(keys):
        unavailable.check_held(wanted, {}, key_names, table=keys.table_name)
        return Rewrite(inserted=keys.upserts, spec_id=plan.spec_id)
    writer = rewrite_writer(plan, batch_id=batch_id, partition_id=REWRITE_PARTITION_ID, attempt=attempt)
    removed: list[DataFile] = []
    kept: list[pa.RecordBatch] = []
    matched: list[pa.Table] = []
    bytes_read = 0
    seen: set[tuple[Any, ...]] = set()
    kept_values: dict[tuple[Any, ...], dict[str, Any]] = {}
    for data_file in candidates:
        # one Arrow type per column whichever engine wrote a file: pyiceberg reads a string column back as the type
        # the file's footer records (string from lakesink's files, large_string from a file written from large_string
        # data, as a pyiceberg append of rows in the table's own Arrow schema is), and the rows of several files go
        # into one file below (a mix failed with ArrowInvalid)
        rows = seam.with_small_types(seam.read_data_file(table, data_file))
        if data_file.file_path in deleted_positions:  # rows a position delete file deletes are not the table's
            gone = pa.array(sorted(deleted_positions[data_file.file_path]), pa.int64())
            rows = rows.filter(pc.invert(pc.is_in(row_numbers(rows.num_rows), value_set=gone)))
        bytes_read += data_file.file_size_in_bytes
        # the file's keys in the keys' types: the table's, or wider when this commit widens a key (merge-schema)
        file_keys = _cast_like(rows.select(key_names), keys.table.select(key_names).schema)
        hit = keys.table.join(file_keys, key_names, join_type="left semi")
        if wanted and hit.num_rows:
            seen.update(zip(*(hit.column(k).to_pylist() for k in key_names), strict=True))
        if winners is not None and hit.num_rows:
            hit = winners(hit, rows)
        if not hit.num_rows:
            continue  # its bounds could hold a key, but it holds none (or only rows newer than the batch's changes)
        if wanted:
            kept_values.update(_rows_of(rows, file_keys, hit, key_names, wanted))
        matched.append(hit)
        removed.append(data_file)
        # joined on the key columns and a row number only (Arrow's hash join carries no nested payload columns)
        numbered = file_keys.append_column(_ROW, row_numbers(rows.num_rows))
        rest = numbered.join(hit.select(key_names), key_names, join_type="left anti")
        order = rest.column(_ROW)
        kept.extend(rows.take(order.take(pc.sort_indices(order))).to_batches())
    # a change that lost to a newer row (order-by) is not applied: nothing of its to keep
    wanted = {k: v for k, v in wanted.items() if k in kept_values or k not in seen}
    unavailable.check_held(wanted, kept_values, key_names, table=keys.table_name)
    written = writer.write(iter(kept)) if kept else None
    found = pa.concat_tables(matched).group_by([*key_names, DELETED]).aggregate([]) if matched else None
    deleted = int(pc.sum(found.column(DELETED)).as_py() or 0) if found is not None else 0
    updated = (found.num_rows - deleted) if found is not None else 0
    return Rewrite(
        removed=tuple(removed),
        written=written.files if written is not None else (),
        spec_id=plan.spec_id,
        inserted=keys.upserts - updated,
        updated=updated,
        deleted=deleted,
        bytes_read=bytes_read,
        files_considered=len(candidates),
        unavailable=wanted,
        kept=kept_values,
    )


def _deleted_positions(table: Table, branch: str, table_name: str) -> dict[str, set[int]]:
    """The positions the branch's live position delete files delete, by data file path (the spec's scope rules:
    same spec and partition, a data sequence number not above the delete file's). Equality deletes: a loud error."""
    entries = seam.live_entries(table, branch)
    equality = [e.data_file.file_path for e in entries if e.data_file.content == DataFileContent.EQUALITY_DELETES]
    if equality:
        raise LakesinkError(
            f"table {table_name} (branch {branch}) has {len(equality)} equality delete file(s) (e.g. {equality[0]}), "
            "written by another engine; lakesink neither reads nor applies equality deletes, and an upsert would bring "
            "the rows they delete back. Compact the table with an engine that applies them (Spark's rewrite_data_files "
            "with delete-file-threshold=1) and restart the query"
        )
    data = {e.data_file.file_path: e for e in entries if e.data_file.content == DataFileContent.DATA}
    out: dict[str, set[int]] = {}
    for entry in entries:
        delete = entry.data_file
        if delete.content != DataFileContent.POSITION_DELETES:
            continue
        for path, positions in seam.deleted_positions(table.io, delete).items():
            found = data.get(path)
            if found is None or found.data_file.spec_id != delete.spec_id:
                continue
            if floats.partition_key(seam.partition_of(found.data_file)) != floats.partition_key(seam.partition_of(delete)):
                continue
            if found.sequence_number is not None and entry.sequence_number is not None:
                if found.sequence_number > entry.sequence_number:
                    continue
            out.setdefault(path, set()).update(positions.to_pylist())
    return out


def _rows_of(
    rows: pa.Table, file_keys: pa.Table, hit: pa.Table, key_names: list[str], wanted: dict[tuple[Any, ...], list[str]]
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The rows of a file (``rows``, its keys ``file_keys`` in the batch's key types) whose key the batch changes
    (``hit``) keeping some of their columns (``wanted``), by key: those columns' values."""
    asked = hit.filter(pc.invert(hit.column(DELETED))).select(key_names)
    numbered = file_keys.append_column(_ROW, row_numbers(rows.num_rows))
    at = numbered.join(asked, key_names, join_type="left semi").column(_ROW)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    if not len(at):
        return out
    taken_keys = file_keys.take(at).to_pylist()
    taken = rows.take(at).to_pylist()
    for k, row in zip(taken_keys, taken, strict=True):
        key = tuple(k[n] for n in key_names)
        if key in wanted:
            out[key] = {n: row.get(n) for n in wanted[key]}
    return out


def fill_unavailable(
    table: Table,
    schema: Schema,
    files: list[DataFile],
    result: Rewrite,
    *,
    keys: BatchKeys,
    plan: WritePlan,
    batch_id: int,
    attempt: int,
) -> tuple[list[DataFile], list[str], list[str]]:
    """Option cdc-format: the batch's files (``files``), each holding a row whose change keeps columns of the row this
    attempt replaces (``result.unavailable``) replaced by a copy with those values (``result.kept``;
    lakesink.cdc.unavailable.fill); only the files whose key bounds can hold such a key are read. Returns (the batch's
    files, the copies written, the files they replace)."""
    if not result.unavailable:
        return files, [], []
    key_names = [f.name for f in keys.fields]
    marked = keys.table.filter(pc.is_valid(keys.table.column(UNAVAILABLE)))
    asking = BatchKeys(keys.table_name, schema, marked.select([*key_names, DELETED]))
    specs = table.specs()
    writer = rewrite_writer(plan, batch_id=batch_id, partition_id=FILLED_PARTITION_ID, attempt=attempt)
    asked = [dict(zip(key_names, key, strict=True)) for key in result.unavailable]
    out: list[DataFile] = []
    filled: list[pa.RecordBatch] = []
    replaced: list[str] = []
    for data_file in files:
        if not asking.may_hold(data_file, specs, schema):
            out.append(data_file)
            continue
        rows = seam.with_small_types(seam.read_data_file(table, data_file, schema))
        file_keys = rows.select(key_names)
        if not file_keys.join(pa.Table.from_pylist(asked, schema=file_keys.schema), key_names, join_type="left semi").num_rows:
            out.append(data_file)
            continue
        replaced.append(data_file.file_path)
        filled.extend(unavailable.fill(rows, result.unavailable, result.kept, key_names).to_batches())
    new = written_copies(writer, filled, plan)
    out.extend(new)
    return out, [f.file_path for f in new], replaced


def written_copies(writer: TaskWriter, rows: list[pa.RecordBatch], plan: WritePlan) -> list[DataFile]:
    """``rows`` written by ``writer`` (a rewrite's copies of a batch's files), as the DataFiles the commit adds."""
    written = writer.write(iter(rows)) if rows else None
    new: tuple[WrittenFile, ...] = written.files if written is not None else ()
    return [
        producers.data_file(
            path=f.path, size_in_bytes=f.size_in_bytes, statistics=f.statistics, spec_id=plan.spec_id, partition=f.partition
        )
        for f in new
    ]


def rewrite_writer(plan: WritePlan, *, batch_id: int, partition_id: int, attempt: int) -> TaskWriter:
    """The writer of the files a rewrite on the driver writes (the kept rows of the files it replaces), under a
    partition id of its own (``partition_id``) so that its file names differ from the tasks'."""
    return TaskWriter(
        plan, TaskIds(query_id=plan.query_id or "rewrite", batch_id=batch_id, partition_id=partition_id, task_attempt_id=attempt)
    )


def summary(result: Rewrite, *, mode: str = COPY_ON_WRITE) -> dict[str, str]:
    """The batch's counts, for the snapshot summary (the audit commands read them), and how it applied them (``mode``:
    copy-on-write, or merge-on-read: no file rewritten)."""
    return {
        SUMMARY_MODE: mode,
        SUMMARY_INSERTED: str(result.inserted),
        SUMMARY_UPDATED: str(result.updated),
        SUMMARY_DELETED: str(result.deleted),
        SUMMARY_FILES_READ: str(len(result.removed)),
        SUMMARY_BYTES_READ: str(result.bytes_read),
        **({SUMMARY_STALE: str(result.stale)} if result.stale is not None else {}),
    }


def _cast_like(keys: pa.Table, schema: pa.Schema) -> pa.Table:
    """``keys``' columns named in ``schema`` cast to its types (the other columns as they are)."""
    columns = [
        keys.column(name).cast(schema.field(name).type) if name in schema.names else keys.column(name)
        for name in keys.column_names
    ]
    return pa.table(columns, names=keys.column_names)


def _fits(keys: pa.Table, targets: list[tuple[str, pa.DataType]]) -> pa.Array:
    """Per key: true when every key column's value fits the target integer type (other types: always)."""
    fits = pa.array([True] * keys.num_rows, pa.bool_())
    for name, t in targets:
        column = keys.column(name)
        if pa.types.is_integer(t) and pa.types.is_integer(column.type) and column.type.bit_width > t.bit_width:
            low, high = -(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1
            inside = pc.and_(pc.greater_equal(column, low), pc.less_equal(column, high))
            fits = pc.and_(fits, pc.fill_null(inside, True))
    return fits


def _one(pf: Any, spec: PartitionSpec) -> PartitionSpec:
    return PartitionSpec(pf, spec_id=spec.spec_id)


def _sorted_internal(column: pa.ChunkedArray, field_type: IcebergType) -> list[Any]:
    """The distinct values of a key column as Iceberg's bounds decode (dates as days, timestamps as micros)."""
    array = pc.unique(column.combine_chunks())
    if isinstance(field_type, DateType):
        array = array.cast(pa.int32())
    elif isinstance(field_type, (TimestampType, TimestamptzType)):
        array = array.cast(pa.int64())
    return sorted(v for v in array.to_pylist() if v is not None)


_EPOCH_DATE = datetime.date(1970, 1, 1)
_EPOCH = datetime.datetime(1970, 1, 1)


def _normalized(value: Any) -> Any:
    """A partition value in one representation (days, micros; floats by bit pattern) whichever side computed it."""
    if isinstance(value, float):
        return floats.value_key(value)  # -0.0 apart from 0.0, NaN equal to NaN (a set of floats does neither)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return (value - _EPOCH) // datetime.timedelta(microseconds=1)
    if isinstance(value, datetime.date):
        return (value - _EPOCH_DATE).days
    return value
