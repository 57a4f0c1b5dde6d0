"""Driver side, option ``order-by`` across batches: a change never overwrites a newer one, deletes included.

Within a batch the tasks (or Spark) keep each key's change with the greatest order value (lakesink.executor.upsert_task,
lakesink.sink.upsert_batch) and send it with the key (:data:`ORDER`). Here, on every commit attempt and against the table
that attempt read, each of those changes is compared with the order value the table already holds for its key:

- a **live row**'s order value is the table's own ``order-by`` column (the row is the change that wrote it), read from
  the files the copy-on-write reads anyway (:func:`lakesink.driver.upsert.rewrite` calls :meth:`OrderCheck.winners`);
- a **deleted key**'s order value (a tombstone) is kept in the table's **order file**: a Parquet file of (key columns,
  order value, deleted) next to the table's metadata files, named by the table property
  :data:`~lakesink.table.keys.PROPERTY_UPSERT_ORDER_FILE` (``.<branch>`` appended off main). A batch that changes it
  writes a new one (named after its commit attempt) and sets the property in its own commit, so the tombstones move
  atomically with the rows (and with the other tables of a routed unit); a replayed batch is skipped before anything is
  compared, so a replay gives the identical table;
- a table **without** the ``order-by`` column (option payload does not write it) keeps every key's order value in the
  order file, live keys too;
- a **truncate** (option cdc-format) at source position P leaves P in the order file as its **floor**
  (:data:`~lakesink.table.keys.ORDER_FILE_FLOOR`, :func:`truncated`): every later change below P is older than the
  truncate and stale, for any key, in every later batch;
- after a **rollback** of the table (or branch) the property may name an order file of snapshots no longer in the
  head's history: the order file is the one the head's lineage recorded (:func:`order_file`).

A change wins when its order value is greater than or equal to the held one (a tie goes to the later batch, as Hudi's
ordering field and Paimon's sequence field do); a change that loses is not applied: its key keeps the table's row (or
stays deleted), its row is dropped from the batch's files, and the snapshot counts it in ``lakesink.upsert.stale-changes``.
A winning delete leaves a tombstone, a winning upsert removes its key's tombstone. Order values compare as Spark SQL
orders them (floats by :func:`lakesink.table.floats.spark_order`); a null is below every value, and a change whose order
value is null for a key the table holds a non-null order value for is an UpsertKeyError naming the column (it cannot be
ordered, and dropping it would be silent). docs/upserts.md: the semantics and the order file's cost.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from lakesink._pyiceberg import io as seam
from lakesink.cdc import binlog
from lakesink.driver.actions import upsert
from lakesink.errors import InvalidOptionError, LakesinkError, UpsertKeyError
from lakesink.executor.messages import WritePlan
from lakesink.options.keys import CDC_ORDER_BY
from lakesink.table import floats, names, state_files
from lakesink.table.keys import (
    DELETED,
    HELD_COLUMN,
    MAIN_BRANCH,
    ORDER_FILE_FLOOR,
    ORDER_PRESENT_COLUMN,
    PROPERTY_UPSERT_ORDER_FILE,
    SUMMARY_UPSERT_ORDER_FILE,
)
from lakesink.table.keys import ORDER_COLUMN as ORDER
from lakesink.table.keys import ROW_COLUMN as _ROW
from lakesink.table.numbering import row_numbers

#: ``partition_id`` of the files that hold a batch's rows without its stale changes (in their names).
STALE_REWRITE_PARTITION_ID = 99997

_PRESENT = ORDER_PRESENT_COLUMN

log = logging.getLogger("lakesink")


def property_key(branch: str) -> str:
    """The table property naming the order file of ``branch``."""
    return PROPERTY_UPSERT_ORDER_FILE if branch == MAIN_BRANCH else f"{PROPERTY_UPSERT_ORDER_FILE}.{branch}"


def orderable(data_type: pa.DataType) -> bool:
    """Types whose values order across batches: integers, decimals, floats, dates, timestamps, strings."""
    t = pa.types
    return bool(
        t.is_integer(data_type)
        or t.is_decimal(data_type)
        or t.is_floating(data_type)
        or t.is_date(data_type)
        or t.is_timestamp(data_type)
        or t.is_string(data_type)
        or t.is_large_string(data_type)
    )


@dataclass
class OrderCheck:
    """One commit attempt's comparison of a batch's changes with the order values its table holds."""

    table_name: str
    column: str
    """The option order-by, as given."""
    batch_id: int
    key_names: list[str]
    table_column: str | None
    """The table's order-by column (None: the table has none, the order file keeps every key's order value)."""
    held: pa.Table | None
    """The order file's rows (key columns, :data:`HELD_COLUMN`, :data:`DELETED`), None when the table has none."""
    held_path: str | None
    floor: str | None = None
    """The order file's floor (the source position of the table's last truncate, as text), None without one."""
    stale: list[pa.Table] = field(default_factory=list)
    """The changes that lost (key columns, :data:`DELETED`)."""
    stale_in_files: int = 0
    """Of them, upserts that lost to a live row (the copy-on-write counted them as inserted)."""
    binlog_epoch: binlog.Epoch | None = None
    """Option cdc-format: the table's binlog epoch; a stale change further back than a redelivery fails the batch."""
    warn: bool = True
    """Log binlog changes taken for redeliveries (:func:`_warn`); False for a second look at the same changes (option
    history's versions, lakesink.driver.actions.history), which the batch's own check logs."""

    def winners(self, hit: pa.Table, rows: pa.Table) -> pa.Table:
        """The batch's keys a file holds (``hit``) whose change is not older than the file's row of the key."""
        if self.table_column is None or self.table_column not in rows.column_names:
            return hit  # no order column (or one this very commit adds, by merge-schema): the file's rows have none
        live = rows.select([*self.key_names, self.table_column]).rename_columns([*self.key_names, HELD_COLUMN])
        live = upsert._cast_like(live, hit.select(self.key_names).schema)
        stale = _stale(hit, live, self)
        if not pc.any(stale).as_py():
            return hit
        lost = hit.filter(stale)
        self.stale.append(lost.select([*self.key_names, DELETED]))
        self.stale_in_files += int(pc.sum(pc.invert(lost.column(DELETED))).as_py() or 0)
        return hit.filter(pc.invert(stale))


def start(
    table: Table, schema: Schema, keys: upsert.BatchKeys, *, order_by: str, branch: str, batch_id: int
) -> tuple[upsert.BatchKeys, OrderCheck]:
    """The batch's keys without the changes older than the order file's (a deleted key's tombstone, or any key's
    when the table has no order column), and the check the copy-on-write asks about live rows."""
    keys, check, stale = older_than_held(table, schema, keys, order_by=order_by, branch=branch, batch_id=batch_id)
    if not pc.any(stale).as_py():
        return keys, check
    check.stale.append(keys.table.filter(stale).select([*check.key_names, DELETED]))
    return upsert.BatchKeys(keys.table_name, schema, keys.table.filter(pc.invert(stale))), check


def older_than_held(
    table: Table,
    schema: Schema,
    keys: upsert.BatchKeys,
    *,
    order_by: str,
    branch: str,
    batch_id: int,
    warn: bool = True,
) -> tuple[upsert.BatchKeys, OrderCheck, pa.Array]:
    """:func:`start`'s comparison: the batch's keys (their order values shifted by the table's binlog epoch), the check,
    and per change whether it is older than the order file's value for its key (or its truncate floor); ``warn``:
    :attr:`OrderCheck.warn`."""
    if ORDER not in keys.table.column_names:
        raise AssertionError("option order-by, but the batch's keys carry no order value")
    changes = keys.table
    order_type = changes.column(ORDER).type
    if not orderable(order_type) and not pa.types.is_null(order_type):
        raise InvalidOptionError(
            f"option 'order-by': column {order_by!r} has type {order_type}, whose values lakesink does not order across "
            f"batches (table {keys.table_name}). Order by an integer, decimal, float, date, timestamp or string column "
            "(a sequence number or the source's log position)"
        )
    try:
        table_column: str | None = schema.find_field(order_by, case_sensitive=False).name
    except ValueError:
        table_column = None
    path = order_file(table, branch)
    key_names = [f.name for f in keys.fields]
    held = _read(table, path, keys.table_name, key_names) if path else None
    epoch = binlog.Epoch.of(table.properties, keys.table_name) if order_by == CDC_ORDER_BY else None
    shifted = epoch.shift(changes.column(ORDER).to_pylist()) if epoch is not None and epoch.epoch else None
    if shifted is not None:  # table property lakesink.cdc.binlog-epoch: coordinates above every lower epoch's
        at = changes.column_names.index(ORDER)
        changes = changes.set_column(at, changes.field(at), pa.array(shifted, changes.field(at).type))
        keys = upsert.BatchKeys(keys.table_name, schema, changes)
    check = OrderCheck(
        keys.table_name,
        order_by,
        batch_id,
        key_names,
        table_column,
        held,
        path,
        floor=_floor(held),
        binlog_epoch=epoch,
        warn=warn,
    )
    stale = _below_floor(changes, check)
    if held is not None and held.num_rows:
        held_keys = upsert._cast_like(held.select([*key_names, HELD_COLUMN]), changes.select(key_names).schema)
        stale = pc.or_(stale, _stale(changes, held_keys, check))
    return keys, check, stale


@dataclass(frozen=True)
class Finished:
    """What the order check adds to a batch's commit attempt."""

    data_files: list[DataFile]
    """The batch's files, those that held a stale change replaced by copies without it."""
    written: tuple[str, ...]
    """Files this attempt wrote (the copies, the new order file): deleted when the attempt does not land."""
    replaced: tuple[str, ...]
    """The batch's files this attempt replaced by copies (they held a stale change): unreferenced once it lands, but
    kept until then -- a retry (or a replay of a commit that failed) reads them again (lakesink.driver.actions.batch:
    UpsertBatch.replaced, deleted by the committer after the landing)."""
    properties: dict[str, str]
    summary: dict[str, str]
    rewrite: upsert.Rewrite


def finish(
    check: OrderCheck,
    table: Table,
    schema: Schema,
    *,
    keys: upsert.BatchKeys,
    rewrite: upsert.Rewrite,
    data_files: Sequence[DataFile],
    plan: WritePlan,
    branch: str,
    commit: names.CommitName,
    attempt: int,
    written_without_stale: bool = False,
) -> Finished:
    """After the copy-on-write: the batch's stale rows dropped from its files, the order file brought up to date.
    ``written_without_stale``: the batch's files hold none of its stale changes already (merge-on-read's lookup ran
    before the rows were written, lakesink.sink.merge_on_read): no file is read or replaced."""
    stale = pa.concat_tables(check.stale) if check.stale else None
    files, written = list(data_files), list[str]()
    if stale is not None and not written_without_stale:
        lost_rows = stale.filter(pc.invert(stale.column(DELETED))).select(check.key_names)
        if lost_rows.num_rows:
            files, written = _without(table, schema, files, lost_rows, plan=plan, batch_id=check.batch_id, attempt=attempt)
    winners = keys.table.select([*check.key_names, DELETED, ORDER])
    if stale is not None and check.stale_in_files:
        winners = winners.join(stale.select(check.key_names), check.key_names, join_type="left anti")
    # the order file: tombstones of the winning deletes (every winner's order when the table has no order column),
    # without the keys a winning upsert brought back
    kept = winners if check.table_column is None else winners.filter(winners.column(DELETED))
    new_held = kept.rename_columns([*check.key_names, DELETED, HELD_COLUMN]).select([*check.key_names, HELD_COLUMN, DELETED])
    path = check.held_path
    properties: dict[str, str] = {}
    held = check.held
    rest = None
    if held is not None and held.num_rows and winners.num_rows:
        held = upsert._cast_like(held, winners.select(check.key_names).schema)
        rest = held.join(winners.select(check.key_names), check.key_names, join_type="left anti")
    if new_held.num_rows or (rest is not None and held is not None and rest.num_rows != held.num_rows):
        base = rest if rest is not None else held
        parts = [t for t in (base, new_held) if t is not None and t.num_rows]
        merged = pa.concat_tables(parts, promote_options="permissive") if parts else new_held
        path = posixpath.join(posixpath.dirname(table.metadata_location), names.order_file_name(commit))
        _write(table, path, merged.combine_chunks(), check.floor)
        written.append(path)
    if path is not None and table.properties.get(property_key(branch)) != path:
        properties[property_key(branch)] = path  # a new file, or the lineage's after a rollback (order_file)
    remaining = {f.file_path for f in files}
    return Finished(
        data_files=files,
        written=tuple(written),
        replaced=tuple(f.file_path for f in data_files if f.file_path not in remaining),
        properties=properties,
        summary={SUMMARY_UPSERT_ORDER_FILE: path} if path else {},
        rewrite=replace(
            rewrite,
            inserted=rewrite.inserted - check.stale_in_files,
            stale=stale.num_rows if stale is not None else 0,
        ),
    )


def order_file(table: Table, branch: str) -> str | None:
    """The order file of ``branch``: the one its table property names -- unless the table was rolled back (pyiceberg's
    ``manage_snapshots().rollback_to_snapshot``, Spark's ``CALL ... rollback_to_snapshot``): the property is the table's,
    not the snapshot's, so after a rollback it may name a file that only snapshots no longer in the head's history
    recorded (their summary's :data:`SUMMARY_UPSERT_ORDER_FILE`), whose tombstones belong to deletes the rollback
    undid. Then the order file is the one the head's lineage recorded last (None: no snapshot of it had one). A removed
    property stays removed (the documented way to forget the tombstones)."""
    path = table.properties.get(property_key(branch))
    if path is None:
        return None
    md = table.metadata
    head = md.snapshot_by_name(branch)
    lineage: str | None = None
    ancestry: set[int] = set()
    for snapshot in ancestors_of(head, md) if head is not None else ():
        ancestry.add(snapshot.snapshot_id)
        recorded = snapshot.summary.get(SUMMARY_UPSERT_ORDER_FILE) if snapshot.summary is not None else None
        if recorded is not None and lineage is None:
            if recorded == path:
                return path  # the usual case: the head (or its nearest ancestor with order-by) recorded it
            lineage = recorded
    setters = {s.snapshot_id for s in md.snapshots if s.summary is not None and s.summary.get(SUMMARY_UPSERT_ORDER_FILE) == path}
    if setters and not setters & ancestry:
        return lineage  # rolled back past every snapshot that went with the property's file
    return path


def truncated(
    table: Table,
    schema: Schema,
    changes: pa.Table | None,
    *,
    at: Decimal,
    order_by: str,
    branch: str,
    commit: names.CommitName,
    table_name: str,
) -> tuple[str, dict[str, str]]:
    """Option cdc-format, a truncate at source position ``at`` whose commit replaces everything live: the order file that
    goes with it (written; its path and the table property naming it). Its floor is ``at``; it holds only the batch's
    changes after the truncate (``changes``: key columns, DELETED, ORDER; the batch already kept each key's newest):
    their tombstones, or every one's order value when the table has no ``order_by`` column. Of the order file it
    replaces, the entries below ``at`` are dropped (the floor stands for them); those at or above it (changes after the
    truncate's position that earlier batches delivered) are kept, unless the batch changes their key."""
    entries: pa.Table
    if changes is not None and changes.num_rows:
        key_names = [c for c in changes.column_names if c not in (ORDER, DELETED)]
        entries = changes.select([*key_names, ORDER, DELETED]).rename_columns([*key_names, HELD_COLUMN, DELETED])
        try:
            schema.find_field(order_by, case_sensitive=False)
            entries = entries.filter(entries.column(DELETED))  # a live row's order value is its own order-by column
        except ValueError:
            pass  # no order-by column: every key's order value is in the order file
    else:
        key_names = [schema.find_field(i).name for i in schema.identifier_field_ids]
        arrow = seam.arrow_schema(schema)
        entries = pa.table(
            {k: pa.array([], arrow.field(k).type) for k in key_names}
            | {HELD_COLUMN: pa.array([], pa.decimal128(38, 0)), DELETED: pa.array([], pa.bool_())}
        )
    old_path = order_file(table, branch)
    old = _read(table, old_path, table_name, key_names) if old_path else None
    if old is not None and old.num_rows and not pa.types.is_null(old.column(HELD_COLUMN).type):
        held = old.column(HELD_COLUMN)
        try:
            floor = pa.array([str(at)]).cast(held.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise LakesinkError(
                f"table {table_name}: the order values its order file holds ({held.type}) cannot be compared with the "
                f"truncate's source position {at}: {e}. Order a cdc-format stream by its source position"
            ) from None
        newer = old.filter(pc.fill_null(pc.greater_equal(floats.spark_order(held), floats.spark_order(floor)[0]), False))
        if newer.num_rows:
            newer = newer.select([*key_names, HELD_COLUMN, DELETED])
            if entries.num_rows:
                newer = upsert._cast_like(newer, entries.select([*key_names, HELD_COLUMN]).schema)
                newer = newer.join(entries.select(key_names), key_names, join_type="left anti")
                entries = pa.concat_tables([newer, entries], promote_options="permissive")
            else:
                entries = newer
    path = posixpath.join(posixpath.dirname(table.metadata_location), names.order_file_name(commit))
    _write(table, path, entries.combine_chunks(), str(at))
    return path, {property_key(branch): path}


def _floor(held: pa.Table | None) -> str | None:
    meta = held.schema.metadata if held is not None else None
    value = (meta or {}).get(ORDER_FILE_FLOOR.encode())
    return value.decode() if value is not None else None


def truncate_floor(table: Table, branch: str, table_name: str) -> Decimal | None:
    """The source position of the last truncate the branch's order file holds as its floor (None: none)."""
    path = order_file(table, branch)
    if path is None:
        return None
    try:
        floor = _floor(state_files.read_parquet(table.io, [table], path))
    except FileNotFoundError:
        raise _missing(path, table_name) from None
    return Decimal(floor) if floor is not None else None


def _below_floor(changes: pa.Table, check: OrderCheck) -> pa.Array:
    """Per change: true when its order value is below the order file's floor (older than the table's last truncate). A
    null order value cannot be ordered after the truncate: an UpsertKeyError, as against a held value."""
    if check.floor is None:
        return pa.array([False] * changes.num_rows)
    order = changes.column(ORDER)
    if order.null_count:
        row = changes.filter(order.is_null()).slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in check.key_names)
        raise UpsertKeyError(
            f"batch {check.batch_id}: option 'order-by' column {check.column!r} is null for key ({key}) of table "
            f"{check.table_name}, truncated at source position {check.floor}: a change without an order value cannot be "
            "ordered after the truncate. Nothing was committed; give every change an order value"
        )
    floor = _as_order_type(
        pa.array([check.floor]),
        order.type,
        check,
        what=f"its last truncate's source position {check.floor}",
        fix="Order a cdc-format stream by its source position",
    )
    below = pc.less(floats.spark_order(order), floats.spark_order(floor)[0])
    below = below.combine_chunks() if isinstance(below, pa.ChunkedArray) else below
    if check.binlog_epoch is not None and pc.any(below).as_py():
        lost = changes.filter(below).select([*check.key_names, ORDER])
        lost = lost.append_column(HELD_COLUMN, pa.array([floor[0].as_py()] * lost.num_rows, floor.type))
        what = "the position of the table's last truncate"
        rows = lost.to_pylist()
        redelivered = check.binlog_epoch.check(
            rows, order=ORDER, held=HELD_COLUMN, keys=check.key_names, batch_id=check.batch_id, what=what
        )
        _warn(check, redelivered, what=what)
    return below


ArrayT = TypeVar("ArrayT", pa.Array, pa.ChunkedArray)


def _as_order_type(values: ArrayT, order_type: pa.DataType, check: OrderCheck, *, what: str, fix: str) -> ArrayT:
    """``values`` (a value the table holds: its truncate's position, its rows' order values) cast to the type of the
    batch's option ``order-by`` column, or a LakesinkError saying which (``what``) cannot be compared, and ``fix``."""
    try:
        return values.cast(order_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise LakesinkError(
            f"table {check.table_name}: {what} cannot be compared with the batch's option 'order-by' column "
            f"{check.column!r} ({order_type}): {e}. {fix}"
        ) from None


def _stale(changes: pa.Table, held: pa.Table, check: OrderCheck) -> pa.Array:
    """Per row of ``changes`` (key columns and :data:`ORDER`): true when ``held`` (key columns and
    :data:`HELD_COLUMN`) holds a greater order value for its key. A null change against a non-null held value raises."""
    keys = check.key_names
    numbered = changes.select([*keys, ORDER]).append_column(_ROW, row_numbers(changes.num_rows))
    held = held.append_column(_PRESENT, pa.array([True] * held.num_rows))
    joined = numbered.join(held, keys, join_type="left outer", use_threads=False)
    joined = joined.take(pc.sort_indices(joined.column(_ROW)))
    change, older = joined.column(ORDER), joined.column(HELD_COLUMN)
    if older.type != change.type and not pa.types.is_null(change.type) and not pa.types.is_null(older.type):
        older = _as_order_type(
            older,
            change.type,
            check,
            what=f"the order values it holds ({older.type})",
            fix="Keep the order-by column's type (or widen it: int to long, a decimal's precision)",
        )
    present = pc.fill_null(joined.column(_PRESENT), False)
    null_change = pc.and_(pc.and_(present, older.is_valid()), change.is_null())
    if pc.any(null_change).as_py():
        row = joined.filter(null_change).slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in keys)
        raise UpsertKeyError(
            f"batch {check.batch_id}: option 'order-by' column {check.column!r} is null for key ({key}) of table "
            f"{check.table_name}, which holds order value {row[HELD_COLUMN]!r} for it: a change without an order value "
            "cannot be ordered after it. Nothing was committed; give every change an order value"
        )
    if pa.types.is_null(change.type) or pa.types.is_null(older.type):
        return pa.array([False] * changes.num_rows)
    greater = pc.greater(floats.spark_order(older), floats.spark_order(change))
    stale = pc.fill_null(greater, False)
    stale = stale.combine_chunks() if isinstance(stale, pa.ChunkedArray) else stale
    if check.binlog_epoch is not None and pc.any(stale).as_py():  # option cdc-format: a redelivery, or binlog gone back
        lost = joined.select(keys).append_column(ORDER, change).append_column(HELD_COLUMN, older).filter(stale)
        redelivered = check.binlog_epoch.check(
            lost.to_pylist(), order=ORDER, held=HELD_COLUMN, keys=keys, batch_id=check.batch_id
        )
        _warn(check, redelivered, what="the binlog coordinates the table holds for their keys")
    return stale


def _warn(check: OrderCheck, redelivered: list[Mapping[str, Any]], *, what: str) -> None:
    """Option cdc-format: binlog changes dropped as redeliveries are logged (a break of the source's binlog within the
    redelivery reach looks the same: docs/cdc.md, 'MySQL without GTIDs, MariaDB: coordinates that go back')."""
    if redelivered and check.binlog_epoch is not None and check.warn:
        log.warning(
            "%s",
            check.binlog_epoch.redeliveries_warning(
                redelivered, order=ORDER, held=HELD_COLUMN, keys=check.key_names, batch_id=check.batch_id, what=what
            ),
        )


def _without(
    table: Table, schema: Schema, files: list[DataFile], lost: pa.Table, *, plan: WritePlan, batch_id: int, attempt: int
) -> tuple[list[DataFile], list[str]]:
    """The batch's files, each that holds a key of ``lost`` replaced by a copy of its other rows."""
    writer = upsert.rewrite_writer(plan, batch_id=batch_id, partition_id=STALE_REWRITE_PARTITION_ID, attempt=attempt)
    names_ = list(lost.column_names)
    out: list[DataFile] = []
    kept: list[pa.RecordBatch] = []
    for data_file in files:
        rows = seam.with_small_types(seam.read_data_file(table, data_file, schema))
        file_keys = upsert._cast_like(rows.select(names_), lost.schema)
        numbered = file_keys.append_column(_ROW, row_numbers(rows.num_rows))
        rest = numbered.join(lost, names_, join_type="left anti").column(_ROW)
        if len(rest) == rows.num_rows:
            out.append(data_file)
            continue
        kept.extend(rows.take(rest.take(pc.sort_indices(rest))).to_batches())
    new = upsert.written_copies(writer, kept, plan)
    out.extend(new)
    return out, [f.file_path for f in new]


def live_orders(table: Table, branch: str, table_name: str, key_names: Sequence[str]) -> pa.Table | None:
    """The order values the order file of ``branch`` holds for live keys (key columns, :data:`HELD_COLUMN`; its
    tombstones left out), None when the table has no order file. Under option cdc-format it holds every key's."""
    path = order_file(table, branch)
    if path is None:
        return None
    held = _read(table, path, table_name, key_names)
    return held.filter(pc.invert(held.column(DELETED))).select([*key_names, HELD_COLUMN])


def _read(table: Table, path: str, table_name: str, key_names: Sequence[str]) -> pa.Table:
    """The order file: the file, else its copy in a state file the table's metadata lists (lakesink.table.state_files:
    another engine's orphan removal deletes the file, never a statistics file). A file keyed by other columns than
    ``key_names`` (the table's key changed since it was written) is a loud error."""
    try:
        held = state_files.read_parquet(table.io, [table], path)
    except FileNotFoundError:
        raise _missing(path, table_name) from None
    missing = [k for k in key_names if k not in held.column_names]
    if missing:
        theirs = [n for n in held.column_names if n not in (HELD_COLUMN, DELETED)]
        raise LakesinkError(
            f"table {table_name}: its order file {path} (table property {PROPERTY_UPSERT_ORDER_FILE}, option order-by) "
            f"holds the order values of keys ({', '.join(theirs)}), but the batch upserts the table by "
            f"({', '.join(key_names)}): the table's key changed since, and the held order values cannot be compared "
            "with the new key's changes. Nothing was committed. Remove the table property (it forgets the order values "
            "held for the old key, deletes included: docs/upserts.md) and restart"
        )
    return held


def _missing(path: str, table_name: str) -> LakesinkError:
    return LakesinkError(
        f"table {table_name}: its order file {path} (table property {PROPERTY_UPSERT_ORDER_FILE}, the order values "
        "of its deleted keys and its last truncate's position, option order-by) is missing, and no state file of the "
        "table (a Puffin file its metadata lists, lakesink-*-99996.puffin) holds a copy of it: a change older than a "
        "delete or a truncate could bring the row back. Nothing was committed. Restore the file (from a backup of the "
        "table's metadata folder), or roll the table back to a snapshot whose state file holds it; removing the "
        "property forgets the deletes (docs/upserts.md)"
    )


def _write(table: Table, path: str, rows: pa.Table, floor: str | None) -> None:
    if floor is not None:
        rows = rows.replace_schema_metadata({**(rows.schema.metadata or {}), ORDER_FILE_FLOOR.encode(): floor.encode()})
    state_files.write_parquet(table.io, path, rows)


def rewrite(
    table: Table,
    schema: Schema,
    keys: upsert.BatchKeys,
    *,
    order_by: str | None,
    branch: str,
    plan: WritePlan,
    batch_id: int,
    attempt: int,
    data_files: Sequence[DataFile],
    commit: names.CommitName,
) -> Finished:
    """An upsert batch's copy-on-write (:func:`lakesink.driver.upsert.rewrite`) for one commit attempt; with option
    ``order-by``, without the changes older than what the table holds (the module's description)."""
    if order_by is None:
        done = upsert.rewrite(table, branch=branch, keys=keys, plan=plan, batch_id=batch_id, attempt=attempt)
        return Finished(data_files=list(data_files), written=(), replaced=(), properties={}, summary={}, rewrite=done)
    keys, check = start(table, schema, keys, order_by=order_by, branch=branch, batch_id=batch_id)
    done = upsert.rewrite(table, branch=branch, keys=keys, plan=plan, batch_id=batch_id, attempt=attempt, winners=check.winners)
    return finish(
        check,
        table,
        schema,
        keys=keys,
        rewrite=done,
        data_files=data_files,
        plan=plan,
        branch=branch,
        commit=commit,
        attempt=attempt,
    )
