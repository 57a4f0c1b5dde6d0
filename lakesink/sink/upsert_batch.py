"""Upserts, first step: resolve one micro-batch of changes to one row per key (``foreach_batch`` only).

Runs on the driver with the batch's DataFrame: the work itself runs in Spark (a window over the batch, one job), and
only the batch's keys come back to the driver (an Arrow table), because the commit must know which keys the batch
replaces or deletes; a key twice or a null key is found in them. The rows that stay (one per
key, deletes removed) are written by the usual write paths; :mod:`lakesink.driver.actions.upsert` then
rewrites the table's files that hold any of the keys (copy-on-write) in the batch's own snapshot.

With option route-by on the Arrow path, and for one table with a dead-letter table, the batch is not resolved here:
:func:`for_routed_tasks` (:func:`for_tasks`) makes every task hold all the rows of its (table, key) pairs, and the tasks
sort them into dead letters first and resolve the rest as ``format("lakesink")``'s do (one resolution
for both entry points of a routed sink). With route-by and ``writer='spark'`` no row may pass through a Python worker:
:func:`resolve_routed` resolves each (table, key) here, in Spark, as :func:`resolve` resolves one table's keys, and the
keys each table's changes carry go to the routed commit, whose per-table action is the single table's upsert.

Why not in ``format("lakesink")``: its writers each see one partition of the batch, never the whole
batch, so several rows of one key in different partitions could not be resolved (and Spark rejects
``outputMode("update")`` for Python data sources).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink.driver.actions.history import HistoryChanges, checked_changes
from lakesink.errors import InvalidOptionError, LakesinkError, UpsertKeyError
from lakesink.executor import upsert_task
from lakesink.executor.messages import RowsDigest
from lakesink.executor.routed_writer import RoutedTaskResult
from lakesink.options import DELETE_WHEN, HISTORY_TIME, ORDER_BY, UPSERT_KEY, SinkOptions
from lakesink.sink import driver_write
from lakesink.sink.spark import routed as spark_routed
from lakesink.table.keys import DELETED, HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM, ROUTED_TABLE_COLUMN, WINS_COLUMN
from lakesink.table.keys import ORDER_COLUMN as ORDER
from lakesink.table.keys import TOP_COLUMN as _TOP

_KEY_TYPES = (
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.StringType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
    T.DecimalType,
    T.BinaryType,
)


@dataclass(frozen=True)
class ResolvedBatch:
    """A batch of changes resolved to one row per key."""

    rows: DataFrame
    """The rows to write: the last row of every key the batch does not delete (the batch's columns)."""
    keys: pa.Table
    """Every key the batch changes (key columns, then :data:`DELETED`, then with ``order-by`` its order value as
    :data:`lakesink.table.keys.ORDER_COLUMN`); each key once."""
    cached: DataFrame
    """Cached by :func:`resolve`; call :func:`release` when the batch is done."""
    history: HistoryChanges | None = None
    """Option history: every change of the batch, for the table's history table (lakesink.driver.actions.history)."""
    collected_rows: pa.Table | None = None
    """Option history: :attr:`rows` as Arrow, taken from the changes the resolution collected (every column is there):
    a batch written on the driver writes them instead of collecting :attr:`rows` in a second Spark job."""


def resolve(df: DataFrame, batch_id: int, options: SinkOptions) -> ResolvedBatch:
    """One row per key: the row with the greatest ``order-by`` value, or the only row (else UpsertKeyError).

    Raises UpsertKeyError naming the batch for a null key (naming the column) or for several rows of one key
    (naming the key), before anything is written; InvalidOptionError for a key or ``order-by`` column the batch
    lacks, or a ``delete-when`` expression Spark cannot evaluate over the batch.
    """
    return _resolve(df, batch_id, options, key_columns(df, options.upsert_key))


def _resolve(
    df: DataFrame,
    batch_id: int,
    options: SinkOptions,
    keys: Sequence[str],
    *,
    tables: Sequence[str] | None = None,
    row_hash: Column | None = None,
) -> ResolvedBatch:
    """:func:`resolve` over the key columns ``keys``. ``tables`` (option route-by, :func:`resolve_routed`): the rows carry
    their table's number among ``tables`` in :data:`ROUTED_TABLE_COLUMN`, each (table, key) is resolved on its own, an
    error names the table, and the keys come back with the table's number first. ``row_hash``: each row's hash, returned
    with the keys as :data:`lakesink.sink.spark.routed.HASH_COLUMN` (the written rows' digests, :func:`resolve_routed`)."""
    by = [F.col(ROUTED_TABLE_COLUMN)] if tables is not None else []
    group = [*by, *[F.col(k) for k in keys]]
    if options.history is not None and tables is None:
        return _resolve_with_history(df, batch_id, options, keys)
    candidate = df
    order: str | None = None
    if options.order_by is not None:
        order = _column(df, options.order_by, ORDER_BY)
        top = F.max(F.col(order)).over(Window.partitionBy(*group))
        candidate = df.withColumn(_TOP, top).where(F.col(order).eqNullSafe(F.col(_TOP))).drop(_TOP)
    # with order-by, each key's order value too: the commit compares it with the one the table holds
    ordered = [F.col(order).alias(ORDER)] if order is not None else []
    hashed = [row_hash.alias(spark_routed.HASH_COLUMN)] if row_hash is not None else []
    try:
        flag = _deleted_flag(options)
        cached = candidate.withColumn(DELETED, flag).persist()
        # the batch's one job: every key it changes (a key twice, or a null key, is found in them: no job of its own)
        changed = cached.select(*group, F.col(DELETED), *ordered, *hashed).toArrow()
    except (AnalysisException, ParseException) as e:
        _check_delete_when(df, options, e)
        raise
    bad = _first_bad(changed, [*([ROUTED_TABLE_COLUMN] if tables is not None else []), *keys], keys)
    if bad is not None:
        cached.unpersist()
        _raise_bad(bad, batch_id, options, keys, tables=tables)
    rows = cached.where(~F.col(DELETED)).drop(DELETED)
    return ResolvedBatch(rows=rows, keys=changed, cached=cached)


def _raise_bad(
    bad: tuple[dict[str, Any], int], batch_id: int, options: SinkOptions, keys: Sequence[str], *, tables: Sequence[str] | None
) -> NoReturn:
    """The UpsertKeyError of a resolved batch's first bad key (:func:`_first_bad`): a null key column, or several rows of
    one key (with the same greatest order-by value, or without order-by)."""
    row, count = bad
    number = row[ROUTED_TABLE_COLUMN] if tables is not None else None
    where = f" for table {tables[number]}" if tables is not None and number is not None else ""
    nulls = [k for k in keys if row[k] is None]
    if nulls:
        raise UpsertKeyError(
            f"batch {batch_id} has a row{where} whose key column {nulls[0]!r} is null; option '{UPSERT_KEY}' "
            f"({', '.join(keys)}) needs a value in every key column. Nothing was committed; filter or fill the "
            "null keys before the sink"
        )
    key = ", ".join(f"{k}={row[k]!r}" for k in keys)
    if options.order_by is None:
        raise UpsertKeyError(
            f"batch {batch_id} has {count} rows for key ({key}){where}: with option '{UPSERT_KEY}' and no "
            f"option '{ORDER_BY}', a batch may hold one row per key. Nothing was committed; give option '{ORDER_BY}' "
            "(a column whose greatest value wins, e.g. an event time or sequence number) or de-duplicate the stream"
        )
    raise UpsertKeyError(
        f"batch {batch_id} has {count} rows for key ({key}){where} with the same greatest '{ORDER_BY}' value "
        f"({options.order_by}): lakesink cannot tell which one wins. Nothing was committed; order by a column "
        "whose values are unique per key (e.g. a sequence number)"
    )


def _resolve_with_history(df: DataFrame, batch_id: int, options: SinkOptions, keys: Sequence[str]) -> ResolvedBatch:
    """:func:`resolve` with option history, in the same one job: every change of the batch is collected (the history
    table's versions need them all, lakesink.driver.actions.history), each flagged whether it wins its key (the
    greatest order-by value, as Spark compares it); the keys are the winners', taken from them on the driver."""
    order, history_columns = _history_columns(df, batch_id, options)
    wins = F.lit(True)
    if order is not None:
        wins = F.col(f"`{order}`").eqNullSafe(F.max(F.col(f"`{order}`")).over(Window.partitionBy(*[F.col(k) for k in keys])))
    try:
        flag = _deleted_flag(options)
        cached = df.withColumn(DELETED, flag).withColumn(WINS_COLUMN, wins).persist()
        selected = cached.select(*[F.col(f"`{c}`") for c in df.columns], F.col(DELETED), F.col(WINS_COLUMN), *history_columns)
        collected = driver_write.collect(selected, table=str(options.table), batch_id=batch_id)
    except (AnalysisException, ParseException) as e:
        _check_delete_when(df, options, e)
        raise
    if collected is None:
        cached.unpersist()
        raise LakesinkError(
            f"batch {batch_id}: its changes for the history of {options.table} do not fit on the driver "
            "(spark.driver.maxResultSize); nothing was committed. Raise spark.driver.maxResultSize or make batches smaller "
            "(maxOffsetsPerTrigger)"
        )
    won = collected.filter(collected.column(WINS_COLUMN))
    changed = won.select([*keys, DELETED])
    if order is not None:
        changed = changed.append_column(ORDER, won.column(order))
    bad = _first_bad(changed, keys, keys)
    if bad is not None:
        cached.unpersist()
        _raise_bad(bad, batch_id, options, keys, tables=None)
    try:
        history = checked_changes(
            collected.drop_columns([WINS_COLUMN]), keys, options, batch_id=batch_id, table=str(options.table)
        )
    except BaseException:
        cached.unpersist()
        raise
    rows = cached.where(F.col(WINS_COLUMN) & ~F.col(DELETED)).drop(DELETED, WINS_COLUMN)
    kept = pc.and_(collected.column(WINS_COLUMN), pc.invert(collected.column(DELETED)))
    as_arrow = collected.filter(kept).select(list(df.columns))
    return ResolvedBatch(rows=rows, keys=changed, cached=cached, history=history, collected_rows=as_arrow)


@dataclass(frozen=True)
class RoutedResolution:
    """A routed batch of changes resolved to one row per (table, key) in Spark (option route-by with writer='spark')."""

    rows: DataFrame
    """The rows to write: the last row of every (table, key) the batch does not delete (the batch's columns)."""
    keys: Mapping[str, pa.Table]
    """Each table's keys the batch changes, as :attr:`ResolvedBatch.keys` (the table's key columns as the batch spells them)."""
    cached: tuple[DataFrame, ...]
    digests: Mapping[str, RowsDigest]
    """Each table's rows to write: their count and digest (lakesink.sink.spark.routed: the write job then observes none)."""
    history: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    """Option history: each table's every change (not one per key), as a routed task of the Arrow path returns them
    (Arrow IPC, lakesink.executor.upsert_task.history_rows; :func:`_routed_history`)."""

    def with_keys(self, results: Sequence[RoutedTaskResult]) -> list[RoutedTaskResult]:
        """The written batch's results, each table's with the keys the batch changes there (Arrow IPC, as a routed
        task of the Arrow path returns them: lakesink.executor.upsert_task.to_ipc). The routed commit then makes each
        table's part of the unit the single-table upsert's action (lakesink.driver.actions.batch.UpsertBatch: the
        files holding the keys rewritten without them, the order file of order-by), in the one unit commit."""
        out = []
        for r in results:
            tables = []
            for t in r.tables:
                keys = self.keys.get(t.table)
                changes = upsert_task.to_ipc(keys) if keys is not None else None
                history = self.history.get(t.table)
                tables.append(dataclasses.replace(t, result=dataclasses.replace(t.result, changes=changes, history=history)))
            out.append(dataclasses.replace(r, tables=tuple(tables)))
        return out

    def release(self) -> None:
        for cached in self.cached:
            cached.unpersist()


def resolve_routed(
    df: DataFrame,
    batch_id: int,
    options: SinkOptions,
    *,
    column: str,
    tables: Mapping[str, str],
    keys: Mapping[str, Sequence[str]],
) -> RoutedResolution:
    """Option route-by with writer='spark': the batch resolved as :func:`resolve` resolves one table's, each (table, key)
    on its own, by Spark (no row passes through a Python worker). ``tables``: each routing value of the batch and the
    table it names (two values may name one table: ``t`` and ``db.t`` with namespace ``db``); ``keys``: each table's key
    (lakesink.driver.tables.routed_keys: an existing table's identifier fields, else option upsert-key). Tables keyed
    by the same columns are resolved together (one window over the table's number and the key). Call
    :meth:`RoutedResolution.release` when the batch is done."""
    if ROUTED_TABLE_COLUMN in df.columns:
        raise InvalidOptionError(
            f"the stream has a column {ROUTED_TABLE_COLUMN!r}, which route-by with writer='spark' and upserts uses "
            "itself; rename it"
        )
    names = sorted(set(tables.values()))
    pairs: list[Column] = []
    for value, name in sorted(tables.items()):
        pairs += [F.lit(value), F.lit(names.index(name))]
    routing = F.col("`" + column.replace("`", "``") + "`").cast("string")
    numbered = df.withColumn(ROUTED_TABLE_COLUMN, F.element_at(F.create_map(*pairs), routing) if pairs else F.lit(None))
    by_key: dict[tuple[str, ...], list[int]] = {}
    for i, name in enumerate(names):
        by_key.setdefault(tuple(keys.get(name) or options.upsert_key), []).append(i)
    resolved: list[ResolvedBatch] = []
    changed: dict[str, pa.Table] = {}
    digests: dict[str, RowsDigest] = {}
    # each row's hash as the routed write job would observe it (the written columns, the routing column aside)
    hashed = spark_routed.row_hash(df, column)
    try:
        for key, numbers in by_key.items():
            part = numbered if len(by_key) == 1 else numbered.where(F.col(ROUTED_TABLE_COLUMN).isin(numbers))
            done = _resolve(part, batch_id, options, key_columns(part, key), tables=names, row_hash=hashed)
            resolved.append(done)
            number = done.keys.column(ROUTED_TABLE_COLUMN)
            for i in numbers:
                mine = done.keys.filter(pc.equal(number, i))
                digests[names[i]] = _digest(mine)
                changed[names[i]] = mine.drop_columns([ROUTED_TABLE_COLUMN, spark_routed.HASH_COLUMN])
        # option history: read from the same cached batch as the resolution (``df``: lakesink.sink.foreach_spark's
        # read_once), so that a source read twice, or a nondeterministic column, gives the history no other rows
        history = _routed_history(numbered, batch_id, options, column, names) if options.history is not None else {}
    except BaseException:
        for r in resolved:
            release(r)
        raise
    rows = reduce(DataFrame.unionByName, [r.rows for r in resolved]).drop(ROUTED_TABLE_COLUMN)
    return RoutedResolution(rows=rows, keys=changed, cached=tuple(r.cached for r in resolved), digests=digests, history=history)


def _routed_history(
    numbered: DataFrame, batch_id: int, options: SinkOptions, column: str, names: Sequence[str]
) -> dict[str, bytes]:
    """Option history with route-by and writer='spark': every change of each table (the history's versions need them
    all, not one per key), collected in one more Spark job, as a routed task of the Arrow path returns them
    (lakesink.executor.upsert_task.history_rows): the table's columns (the routing column is not written),
    :data:`DELETED`, the order value (option order-by's, else the batch id) and the change's source time. ``numbered``:
    the batch with each row's table number among ``names`` (:data:`ROUTED_TABLE_COLUMN`)."""
    _, history_columns = _history_columns(numbered, batch_id, options)
    written = [c for c in numbered.columns if c not in (column, ROUTED_TABLE_COLUMN)]
    selected = numbered.select(
        *[F.col(f"`{c}`") for c in written],
        F.col(ROUTED_TABLE_COLUMN),
        _deleted_flag(options).alias(DELETED),
        *history_columns,
    )
    collected = driver_write.collect(selected, table=", ".join(names), batch_id=batch_id)
    if collected is None:
        raise LakesinkError(
            f"batch {batch_id}: its changes for the histories of {', '.join(names)} do not fit on the driver "
            "(spark.driver.maxResultSize); nothing was committed. Raise spark.driver.maxResultSize, make batches smaller "
            "(maxOffsetsPerTrigger), or use writer='auto' (its tasks return each table's changes)"
        )
    number = collected.column(ROUTED_TABLE_COLUMN)
    out: dict[str, bytes] = {}
    for i, name in enumerate(names):
        ipc = upsert_task.to_ipc(collected.filter(pc.equal(number, i)).drop_columns([ROUTED_TABLE_COLUMN]))
        if ipc is not None:
            out[name] = ipc
    return out


def _history_columns(df: DataFrame, batch_id: int, options: SinkOptions) -> tuple[str | None, list[Column]]:
    """Option history: the columns every change carries to its history's versions besides its own -- its order value
    (option order-by's column, else the batch id) as :data:`HISTORY_CHANGE_ORDER` and its source time (option
    history-time's column) as :data:`HISTORY_VALID_FROM` -- and the order-by column as ``df`` spells it (None without)."""
    assert options.history_time is not None
    order = _column(df, options.order_by, ORDER_BY) if options.order_by is not None else None
    time = _column(df, options.history_time, HISTORY_TIME)
    ordered = F.col(f"`{order}`") if order is not None else F.lit(batch_id).cast("long")
    return order, [ordered.alias(HISTORY_CHANGE_ORDER), F.col(f"`{time}`").alias(HISTORY_VALID_FROM)]


def _digest(keys: pa.Table) -> RowsDigest:
    """The count and digest of a table's rows to write (its resolved changes that are not deletes), from their hashes
    (:data:`lakesink.sink.spark.routed.HASH_COLUMN`) as :func:`lakesink.sink.spark.routed.digest_aggregates` sums them:
    two sums of the hashes' 32-bit halves."""
    kept = keys.filter(pc.invert(keys.column(DELETED)))
    # each 64-bit hash as unsigned (its bits), halves below 2**32: their sums fit in 64 bits
    hashes = pc.cast(kept.column(spark_routed.HASH_COLUMN), pa.uint64(), safe=False)
    high = pc.sum(pc.shift_right(hashes, pa.scalar(32, pa.uint64()))).as_py()
    low = pc.sum(pc.bit_wise_and(hashes, pa.scalar(0xFFFFFFFF, pa.uint64()))).as_py()
    return spark_routed.digest_of(kept.num_rows, high, low)


def for_tasks(df: DataFrame, options: SinkOptions) -> tuple[DataFrame, bool]:
    """One table with option dead-letter-table: the batch as its tasks resolve it (:func:`for_routed_tasks` without a
    route): every row of a key in one task, whose writer sorts the key's changes into dead letters first and resolves
    the ones that fit (lakesink.executor.task_writer), as format("lakesink")'s and a routed table's tasks do."""
    return for_routed_tasks(df, None, options)


def for_routed_tasks(
    df: DataFrame,
    route_column: str | None,
    options: SinkOptions,
    keys: Mapping[str, Sequence[str]] | None = None,
    tables: Mapping[str, str] | None = None,
    *,
    one_task: bool = False,
) -> tuple[DataFrame, bool]:
    """Option route-by: the batch as the routed tasks resolve it, each table's rows by key (lakesink.executor.upsert_task,
    the resolution of format("lakesink")): every row of one (table, key) in one task (a repartition by the routing
    column and the key), ``delete-when`` evaluated here by Spark into :data:`DELETED` (any Spark SQL expression, as
    :func:`resolve` takes). Returns the batch and whether it carries :data:`DELETED`. Checks as :func:`resolve` does:
    the key columns and their types, the ``order-by`` column, the expression. ``keys``: each routing value's own key
    (tables keyed differently: lakesink.driver.tables.routed_keys); a value not in it is keyed by option upsert-key.
    ``tables``: each routing value's table, partitioned by instead of the value (two values naming one table, ``t``
    and ``db.t`` with namespace ``db``: one key's rows of both in one task, else two tasks would each resolve a row
    of the key); a value not in it (an invalid route) is partitioned by itself. ``one_task``: the batch for one writer
    that receives every row (the driver's, lakesink.sink.driver_write): the checks and the delete column, no
    repartition."""
    parts = [_key_value(df, options, options.upsert_key)] if options.upsert_key else []
    default = tuple(options.upsert_key) if options.upsert_key else None
    by_key: dict[tuple[str, ...], list[str]] = {}  # the routing values of each key other than option upsert-key's
    for value, key in sorted((keys or {}).items()):
        if tuple(key) != default:
            by_key.setdefault(tuple(key), []).append(value)
    # the key value of each row's own table: one CASE branch per key (100 tables of one key: none)
    if by_key and route_column is not None:
        route = F.col(f"`{route_column}`")
        case: Column | None = None
        for key, values in sorted(by_key.items()):
            branch = _key_value(df, options, key)
            hit = route.isin(*values)
            case = F.when(hit, branch) if case is None else case.when(hit, branch)
        assert case is not None
        parts = [case.otherwise(parts[0]) if parts else case]
    if options.order_by is not None:
        _column(df, options.order_by, ORDER_BY)
    computed = options.delete_when is not None
    if options.delete_when is not None:
        try:
            df = df.withColumn(DELETED, F.coalesce(F.expr(options.delete_when).cast("boolean"), F.lit(False)))
        except (AnalysisException, ParseException) as e:
            raise InvalidOptionError(
                f"option '{DELETE_WHEN}' {options.delete_when!r} is not a Spark SQL boolean expression over the batch's "
                f"columns ({', '.join(df.columns)}): {str(e).splitlines()[0]}"
            ) from None
    if one_task:
        return df, computed
    if route_column is None:
        return df.repartition(*parts), computed
    route_of: Column = F.col(f"`{route_column}`")
    named: dict[str, list[str]] = {}
    for value, table in sorted((tables or {}).items()):
        named.setdefault(table, []).append(value)
    # only the values that share their table with another value are mapped to it: every other table's rows carry one
    # value, which groups them as its table does (a batch of 100 tables named one way each: no map)
    shared = [(value, table) for table, values in sorted(named.items()) if len(values) > 1 for value in values]
    if shared:
        pairs = [c for value, table in shared for c in (F.lit(value), F.lit(table))]
        route_of = F.coalesce(F.element_at(F.create_map(*pairs), route_of.cast("string")), route_of.cast("string"))
    return df.repartition(route_of, *parts), computed


def _key_value(df: DataFrame, options: SinkOptions, key: Sequence[str]) -> Column:
    """A row's key as one string (to partition by: every row of a key in one task; two keys sharing it only share
    a task). With option payload the key columns are payload fields."""
    if options.payload is not None:
        payload = F.col(f"`{options.payload}`")
        parts = [F.get_json_object(payload, "$." + k) for k in key]
    else:
        parts = [F.col(f"`{k}`").cast("string") for k in key_columns(df, key)]
    return F.concat_ws("\u0000", *(F.coalesce(p, F.lit("\u0001")) for p in parts))


def release(resolved: ResolvedBatch) -> None:
    resolved.cached.unpersist()


def key_columns(df: DataFrame, names: Sequence[str]) -> list[str]:
    """The batch's key columns (as the batch spells them), each of a type Iceberg allows in an identifier field."""
    out = []
    for name in names:
        column = _column(df, name, UPSERT_KEY)
        data_type = df.schema[column].dataType
        if not isinstance(data_type, _KEY_TYPES):
            raise InvalidOptionError(
                f"option '{UPSERT_KEY}': column {column!r} has type {data_type.simpleString()}, which cannot be a key "
                "(Iceberg identifier fields are primitive columns other than float and double)"
            )
        out.append(column)
    return out


def _column(df: DataFrame, name: str, option: str) -> str:
    for column in df.columns:
        if column == name or column.lower() == name.lower():
            return column
    raise InvalidOptionError(
        f"option '{option}' names column {name!r}, which the batch does not have (columns: {', '.join(df.columns)})"
    )


def _first_bad(changed: pa.Table, group: Sequence[str], keys: Sequence[str]) -> tuple[dict[str, Any], int] | None:
    """The first of the resolved ``changed`` rows whose key has a null column, or that a second row of its ``group``
    ((table,) key) follows -- several rows of one key share the greatest order value, or there is no order-by --, with
    the number of rows of its group; None: every key once, none null."""
    nulls = [pc.is_null(changed.column(k)) for k in keys]
    null = reduce(pc.or_, nulls) if nulls else None
    if null is not None and pc.any(null).as_py():
        first = pc.index(null, True).as_py()
        return changed.slice(first, 1).to_pylist()[0], 1
    counted = changed.select(list(group)).group_by(list(group), use_threads=False).aggregate([([], "count_all")])
    twice = counted.filter(pc.greater(counted.column("count_all"), 1))
    if not twice.num_rows:
        return None
    row = twice.slice(0, 1).to_pylist()[0]
    return {k: row[k] for k in group}, int(row["count_all"])


def _deleted_flag(options: SinkOptions) -> Column:
    """Option delete-when as each row's flag (a null is false)."""
    if options.delete_when is None:
        return F.lit(False)
    return F.coalesce(F.expr(options.delete_when).cast("boolean"), F.lit(False))


def _check_delete_when(df: DataFrame, options: SinkOptions, error: Exception) -> None:
    """InvalidOptionError when ``error`` (Spark's, analysing the batch's job) is option delete-when's expression's."""
    if options.delete_when is not None and _mentions_expression(df, options.delete_when):
        raise InvalidOptionError(
            f"option '{DELETE_WHEN}' {options.delete_when!r} is not a Spark SQL boolean expression over the batch's "
            f"columns ({', '.join(df.columns)}): {str(error).splitlines()[0]}"
        ) from None


def _mentions_expression(df: DataFrame, expression: str) -> bool:
    """True when ``expression`` alone fails to analyse over the batch (the user's expression is what is wrong)."""
    try:
        df.select(F.expr(expression)).schema  # noqa: B018 (analysis only, nothing runs)
    except (AnalysisException, ParseException):
        return True
    return False
