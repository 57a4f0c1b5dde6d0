"""Upserts through ``format("lakesink")``: one task's rows resolved to one row per key (executor side).

A Python data source's writers each see one partition of a batch, never the whole batch, so the
resolution of :mod:`lakesink.sink.upsert_batch` (in Spark, over the batch) is done per task here: a null key
is an error naming the column; several rows of one key keep the one with the greatest ``order-by``
value, ordered as Spark orders it (:func:`lakesink.table.floats.spark_order`: a float's NaN is greatest; without
``order-by``: an error naming the key); ``delete-when`` is evaluated on the task's
rows as an Iceberg row filter expression (``op = 'd'``, ``op in ('d', 'x')``, ``deleted is true``;
parsed by pyiceberg, since no Spark SQL engine runs in a Python worker). The task writes the rows
that stay and returns the keys it changed in its TaskResult (Arrow IPC bytes). On the driver,
:func:`merge` joins the tasks' keys; a key changed by two tasks of one batch is an error telling the
user to repartition the stream by the key (then every row of a key is in one task).

No catalog, no Spark session: plain Arrow, as the rest of the executor side.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from lakesink._pyiceberg import io as seam
from lakesink.cdc import unavailable
from lakesink.errors import PROGRAMMING_ERRORS, InvalidOptionError, UpsertKeyError
from lakesink.table import floats
from lakesink.table.keys import DELETED, HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM, UNDONE_COLUMN
from lakesink.table.keys import ORDER_COLUMN as ORDER
from lakesink.table.keys import ROW_COLUMN as _ROW
from lakesink.table.keys import TOP_COLUMN as _TOP
from lakesink.table.keys import UNAVAILABLE_COLUMN as UNAVAILABLE
from lakesink.table.numbering import row_numbers

_NOT_KEYS = (DELETED, ORDER, UNAVAILABLE)
"""The columns of a batch's keys that are not key columns."""


@dataclass(frozen=True)
class UpsertSpec:
    """The upsert options an executor needs (``format("lakesink")`` only; foreach_batch resolves in Spark)."""

    key: tuple[str, ...]
    delete_when: str | None = None
    order_by: str | None = None
    copies_are_one: bool = False
    """Option cdc-format: rows of one key equal in every column, order included, are one change delivered twice (a
    Kafka Connect restart re-sends what it had not committed): one of them is kept instead of failing the batch."""
    not_written: tuple[str, ...] = ()
    """Columns the resolution reads but the table does not get (option payload: an order-by column of the stream)."""
    unavailable: unavailable.Placeholder | None = None
    """Option cdc-format: Debezium's unavailable-value placeholder (option cdc-unavailable-value), whose columns keep the
    key's earlier value (lakesink.cdc.unavailable)."""
    history_time: str | None = None
    """Option history (option history-time's column): the task also returns every change it received, for the table's
    history table (:func:`history_rows`)."""

    def check(self) -> None:
        """Parse ``delete-when`` on the driver, so that a bad expression fails at the start of the query."""
        if self.delete_when is not None:
            try:
                seam.parse_row_filter(self.delete_when)
            except PROGRAMMING_ERRORS:
                raise
            except Exception as e:
                raise InvalidOptionError(
                    f"option 'delete-when' {self.delete_when!r} is not an expression format('lakesink') can evaluate: "
                    f"its writers run without Spark SQL and take an Iceberg row filter expression (e.g. \"op = 'd'\", "
                    f"\"op in ('d', 'x')\", \"deleted = true\"); foreach_batch takes any Spark SQL expression ({e})"
                ) from None


def resolve_task(
    batches: Iterable[pa.RecordBatch], spec: UpsertSpec, *, batch_id: int, partition_id: int
) -> tuple[list[pa.RecordBatch], pa.Table]:
    """(the task's rows to write, the keys it changes with :data:`DELETED` and, with ``order-by``, the winning row's
    order value as :data:`ORDER`), one row per key. Option cdc-format, rows marking Debezium's unavailable-value
    placeholders (:data:`UNAVAILABLE`, lakesink.cdc.unavailable): a marked column takes the value of its key's earlier
    change in the task; the keys carry the columns left to keep from the table's row (the commit fills them)."""
    received = [b for b in batches if b.num_rows]
    if not received:
        return [], pa.table({})
    table = pa.Table.from_batches(received)
    keys = [_column(table, k, "upsert-key") for k in spec.key]
    for k in keys:
        if table.column(k).null_count:
            raise UpsertKeyError(
                f"batch {batch_id} has a row whose key column {k!r} is null (task {partition_id}); option 'upsert-key' "
                f"({', '.join(keys)}) needs a value in every key column. Nothing was committed; filter or fill the null "
                "keys before the sink"
            )
    if DELETED in table.column_names:  # foreach_batch with route-by: Spark evaluated delete-when into the column
        deleted = pc.fill_null(table.column(DELETED), False)
        table = table.drop_columns([DELETED])
    else:
        deleted = deleted_flags(table, spec.delete_when)
    table = table.append_column(DELETED, deleted)
    table = table.append_column(_ROW, row_numbers(table.num_rows))
    order_column: str | None = None
    if spec.order_by is not None and UNAVAILABLE in table.column_names:  # before the key's earlier changes are dropped
        order = _column(table, spec.order_by, "order-by")
        table = unavailable.fill_from_earlier(table, keys, order, DELETED, row_column=_ROW)
    if spec.order_by is not None:
        # the rows with the greatest order value of their key (joined on the narrow columns only: Arrow's hash
        # join carries no nested payload columns)
        order = order_column = _column(table, spec.order_by, "order-by")
        # compared as Spark compares (foreach_batch resolves in Spark): a float's NaN greatest and equal to NaN,
        # -0.0 equal to 0.0 (Arrow's max skips NaN and its = never matches one: such a key lost its row)
        narrow = table.select([*keys, _ROW]).append_column(order, floats.spark_order(table.column(order)))
        top = narrow.group_by(keys, use_threads=False).aggregate([(order, "max")]).rename_columns([*keys, _TOP])
        joined = narrow.join(top, keys, join_type="inner", use_threads=False)
        same = pc.fill_null(pc.equal(joined.column(order), joined.column(_TOP)), False)
        both_null = pc.and_(joined.column(order).is_null(), joined.column(_TOP).is_null())
        winners = joined.filter(pc.or_(same, both_null)).column(_ROW)
        table = table.take(pc.take(winners, pc.sort_indices(winners)))
    counts = table.group_by(keys, use_threads=False).aggregate([(_ROW, "count")])
    several = counts.filter(pc.greater(counts.column(f"{_ROW}_count"), 1))
    if several.num_rows and order_column is not None and spec.copies_are_one:
        table = _one_of_each_copy(table, keys, several.select(keys))
        counts = table.group_by(keys, use_threads=False).aggregate([(_ROW, "count")])
        several = counts.filter(pc.greater(counts.column(f"{_ROW}_count"), 1))
    if several.num_rows:
        row = several.slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        how = (
            f"with the same greatest 'order-by' value ({spec.order_by})"
            if spec.order_by
            else "and no option 'order-by' (a column whose greatest value wins)"
        )
        raise UpsertKeyError(
            f"batch {batch_id} has {row[f'{_ROW}_count']} rows for key ({key}) {how} (task {partition_id}). Nothing was committed"
        )
    changes = table.select([*keys, DELETED])
    if order_column is not None:  # the commit compares it with the order value the table holds for the key
        changes = changes.append_column(ORDER, table.column(order_column))
    if UNAVAILABLE in table.column_names:  # the columns the commit keeps from the table's row of the key
        changes = changes.append_column(UNAVAILABLE, table.column(UNAVAILABLE))
    gone = [c for c in (*spec.not_written, UNAVAILABLE) if c in table.column_names]
    rows = table.filter(pc.invert(table.column(DELETED))).drop_columns([DELETED, _ROW, *gone])
    return rows.to_batches(), changes


def history_rows(batches: Iterable[pa.RecordBatch], spec: UpsertSpec, *, batch_id: int) -> pa.Table:
    """Option history: every change the task received (not one per key; with option dead-letter-table, every one that
    fits: the task sorts its rows first, and a dead letter is never a version), for the history table
    (lakesink.driver.actions.history): the table's columns, :data:`DELETED`, :data:`HISTORY_CHANGE_ORDER` (option
    order-by's value, else the batch id) and :data:`HISTORY_VALID_FROM` (option history-time's value); the stream
    columns outside the table (``spec.not_written``: a change stream's order and time) left out. Option cdc-format: a
    column holding Debezium's unavailable-value placeholder takes the value of its key's earlier change in the task
    (lakesink.cdc.unavailable.fill_from_earlier, as the table's upsert does); one still marked (:data:`UNAVAILABLE`)
    takes its key's previous version in the history (lakesink.driver.actions.history)."""
    assert spec.history_time is not None
    received = [b for b in batches if b.num_rows]
    if not received:
        return pa.table({})
    table = pa.Table.from_batches(received)
    if DELETED not in table.column_names:
        table = table.append_column(DELETED, deleted_flags(table, spec.delete_when))
    else:
        table = table.set_column(table.schema.get_field_index(DELETED), DELETED, pc.fill_null(table.column(DELETED), False))
    if spec.order_by is not None:
        order_name = _column(table, spec.order_by, "order-by")
        if UNAVAILABLE in table.column_names:
            keys = [_column(table, k, "upsert-key") for k in spec.key]
            table = table.append_column(_ROW, row_numbers(table.num_rows))
            table = unavailable.fill_from_earlier(table, keys, order_name, DELETED, row_column=_ROW).drop_columns([_ROW])
        order = table.column(order_name)
    else:
        order = pa.array([batch_id] * table.num_rows, pa.int64())
    time = table.column(_column(table, spec.history_time, "history-time"))
    outside = [c for c in (*spec.not_written, UNDONE_COLUMN) if c in table.column_names]
    table = table.drop_columns(outside)
    return table.append_column(HISTORY_CHANGE_ORDER, order).append_column(HISTORY_VALID_FROM, time)


def without_undone(batches: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``batches`` without the changes a later truncate of their table undoes (:data:`UNDONE_COLUMN`, option history
    with cdc-format: versions of the history, never applied to the table), and without that column."""
    out = []
    for b in batches:
        if UNDONE_COLUMN in b.schema.names:
            index = b.schema.get_field_index(UNDONE_COLUMN)
            b = b.filter(pc.invert(pc.fill_null(b.column(index), False))).remove_column(index)
        if b.num_rows:
            out.append(b)
    return out


def _one_of_each_copy(table: pa.Table, keys: Sequence[str], tied: pa.Table) -> pa.Table:
    """``table`` without the copies among the rows of the ``tied`` keys (several rows with the key's greatest order): a
    row equal to an earlier one in every column but the row number is the same change delivered twice (a Kafka Connect
    restart re-sends what it had not committed, with the same source position): one of them stays. Rows of a tied key
    that differ stay, and fail the batch as before. Only the tied keys' rows are compared (in Python: they may hold
    nested values Arrow cannot group by)."""
    marked = table.select(list(keys)).append_column(_ROW, table.column(_ROW))
    rows = marked.join(tied, list(keys), join_type="inner", use_threads=False).column(_ROW).to_pylist()
    index = {n: i for i, n in enumerate(table.column(_ROW).to_pylist())}
    seen: set[str] = set()
    dropped: set[int] = set()
    others = table.drop_columns([_ROW])
    for number in sorted(rows):
        image = repr(others.slice(index[number], 1).to_pylist()[0])
        if image in seen:
            dropped.add(index[number])
        seen.add(image)
    if not dropped:
        return table
    return table.take(pa.array([i for i in range(table.num_rows) if i not in dropped], pa.int64()))


def to_ipc(changes: pa.Table) -> bytes | None:
    if not changes.num_columns:
        return None
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, changes.schema) as writer:
        writer.write_table(changes)
    return bytes(sink.getvalue().to_pybytes())


def merge(parts: Sequence[bytes], *, batch_id: int) -> pa.Table:
    """On the driver: the tasks' keys, joined; a key changed by two tasks is an UpsertKeyError."""
    tables = [pa.ipc.open_stream(p).read_all() for p in parts]
    changes = pa.concat_tables(tables, promote_options="permissive")
    keys = [n for n in changes.column_names if n not in _NOT_KEYS]
    counts = changes.group_by(keys, use_threads=False).aggregate([(DELETED, "count")])
    several = counts.filter(pc.greater(counts.column(f"{DELETED}_count"), 1))
    if several.num_rows:
        row = several.slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        raise UpsertKeyError(
            f"batch {batch_id} has rows for key ({key}) in {row[f'{DELETED}_count']} tasks: format('lakesink') resolves "
            "several rows of one key within one task only (its writers never see the whole batch). Nothing was "
            f"committed; repartition the stream by the key before the sink (df.repartition({', '.join(map(repr, keys))})), "
            "or use foreach_batch, which resolves over the whole batch"
        )
    return changes


def _column(table: pa.Table, name: str, option: str) -> str:
    for column in table.column_names:
        if column == name or column.lower() == name.lower():
            return str(column)
    raise InvalidOptionError(
        f"option '{option}' names column {name!r}, which the stream does not have (columns: {', '.join(table.column_names)})"
    )


def deleted_flags(table: pa.Table, expression: str | None) -> pa.Array:
    """Whether option delete-when (an Iceberg row filter) is true for each row (false for null)."""
    if expression is None:
        return pa.array([False] * table.num_rows)
    numbered = table.append_column(_ROW, row_numbers(table.num_rows))
    matched = seam.filter_rows(numbered, expression).column(_ROW)
    return pc.is_in(numbered.column(_ROW), value_set=matched.combine_chunks())


def with_deleted(rows: pa.RecordBatch, spec: UpsertSpec) -> pa.RecordBatch:
    """``rows`` with the deleted flag (:data:`DELETED`, option delete-when) before they are sorted into dead letters
    (option dead-letter-table), so that a delete is checked by its key only -- on a table of its own as on a routed
    table. foreach_batch's Spark computed the flag already; the resolution reads it (:func:`resolve_task`)."""
    if spec.delete_when is None or DELETED in rows.schema.names:
        return rows
    flags = deleted_flags(pa.Table.from_batches([rows]), spec.delete_when)
    if isinstance(flags, pa.ChunkedArray):
        flags = flags.combine_chunks()
    return rows.append_column(DELETED, flags)


def keys_of(rows: pa.RecordBatch, changes: bytes) -> set[tuple[object, ...]]:
    """The keys ``rows`` hold, as the key columns of ``changes`` (a task's keys, :func:`to_ipc`) name them."""
    names = [n for n in pa.ipc.open_stream(changes).schema.names if n not in _NOT_KEYS]
    by_name = {n.lower(): n for n in rows.schema.names}  # the table's spelling of the key (the task's: the stream's)
    columns = [rows.column(by_name.get(n.lower(), n)).to_pylist() for n in names]
    return set(zip(*columns, strict=True)) if rows.num_rows else set()


def without_keys(changes: bytes | None, dropped: set[tuple[object, ...]]) -> bytes | None:
    """A task's keys without ``dropped`` (keys whose resolved row became a dead letter after the task: the change is
    not applied, the table keeps the key's row)."""
    if changes is None or not dropped:
        return changes
    table = pa.ipc.open_stream(changes).read_all()
    names = [n for n in table.column_names if n not in _NOT_KEYS]
    keep = [k not in dropped for k in zip(*(table.column(n).to_pylist() for n in names), strict=True)]
    return to_ipc(table.filter(pa.array(keep, pa.bool_())))


def history_without_keys(history: bytes | None, changes: bytes, dropped: set[tuple[object, ...]]) -> bytes | None:
    """A task's changes for the history (:func:`history_rows`) without those of ``dropped`` (:func:`without_keys`: keys
    whose resolved row became a dead letter after the task, so the table applies none of their changes): the history
    records the changes the table applies, and its current version of such a key stays the one the table holds."""
    if history is None or not dropped:
        return history
    table = pa.ipc.open_stream(history).read_all()
    by_name = {n.lower(): n for n in table.column_names}  # the history's spelling of the key (the stream's)
    names = [by_name.get(n.lower(), n) for n in pa.ipc.open_stream(changes).schema.names if n not in _NOT_KEYS]
    keep = [k not in dropped for k in zip(*(table.column(n).to_pylist() for n in names), strict=True)]
    return to_ipc(table.filter(pa.array(keep, pa.bool_())))
