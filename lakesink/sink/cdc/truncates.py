"""Option cdc-format: a batch's truncates (Debezium's op ``t``) applied at their position in the source log.

The payload inference job (lakesink.executor.payload) finds, per table, the position (``cdc_order``) of the batch's
last truncate. Here, on the driver, before the batch's tables are planned: every change of that table at an earlier
position is dropped from the batch (and the truncates themselves), and the table is marked in the batch's facts
(``BatchFacts.truncating``, lakesink.driver.committers.facts) for the unit, whose part for it then replaces everything
live with the rows that remain (actions.batch.action_for). A truncate of a table that does not exist, with no change
after it, changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakesink._pyiceberg import io as seam
from lakesink.cdc import debezium
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.executor.payload import Found
from lakesink.options import CDC_PREFIX, Routing
from lakesink.table.keys import UNDONE_COLUMN
from lakesink.table.routes import Route, parse_route

OP, ORDER = f"{CDC_PREFIX}{debezium.OP}", f"{CDC_PREFIX}{debezium.ORDER}"


def apply(
    df: DataFrame,
    routed: RoutedCommitter,
    routing: Routing,
    found: Mapping[object, Found],
    values: Sequence[object],
    facts: BatchFacts,
    cuts: Mapping[str, Decimal] | None = None,
) -> tuple[DataFrame, list[object], BatchFacts]:
    """The batch without the changes its truncates undo (and those before ``cuts``, a routing value's position below
    which its changes are dropped as well: lakesink.sink.cdc.key_change.merged), the routing values left to plan, and
    ``facts`` with the tables the batch truncates (:func:`mark`)."""
    truncates = positions(found)
    left, facts = mark(routed, routing, truncates, values, facts, times(found))
    dropped = truncates if cuts is None else cuts
    if not dropped:
        return df, left, facts
    kept = truncates if routed.options.history is not None else {}  # option history: its versions, marked undone
    route, op, order = F.col(f"`{routing.column}`"), F.col(f"`{OP}`"), F.col(f"`{ORDER}`")
    drop: Column = F.lit(False)
    undo: Column = F.lit(False)
    for value, position in sorted(dropped.items()):
        before = F.coalesce(order < F.lit(position).cast("decimal(38,0)"), F.lit(False))
        mine = route == F.lit(value)
        if kept.get(value) == position:
            drop = drop | (mine & (op == F.lit("t")))
            undo = undo | (mine & before)
        else:
            drop = drop | (mine & ((op == F.lit("t")) | before))
    out = df.where(~drop)
    return (out.withColumn(UNDONE_COLUMN, undo) if kept else out), left, facts


def positions(found: Mapping[object, Found]) -> dict[str, Decimal]:
    """Each routing value's last truncate (its source position), of the values the batch truncates."""
    return {v: f.truncate for v, f in found.items() if f.truncate is not None and isinstance(v, str)}


def times(found: Mapping[object, Found]) -> dict[str, Any]:
    """Each routing value's last truncate's source time (option history), of the values the batch truncates."""
    return {v: f.truncate_time for v, f in found.items() if f.truncate is not None and isinstance(v, str)}


def mark(
    routed: RoutedCommitter,
    routing: Routing,
    truncates: Mapping[str, Decimal],
    values: Sequence[object],
    facts: BatchFacts,
    when: Mapping[str, Any] | None = None,
) -> tuple[list[object], BatchFacts]:
    """No Spark (format("lakesink")'s commit runs without a session): the routing values left to plan (a truncate of a
    table that does not exist, with no change after it, makes no table), and ``facts`` with the tables the batch
    truncates, their positions, and the columns of a table only truncated (its own)."""
    columns_of = dict(facts.table_columns)
    truncated_at: dict[str, Decimal] = {}
    truncated_time: dict[str, Any] = {}
    left = list(values)
    for value in sorted(truncates):
        target = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if not isinstance(target, Route):
            continue
        name = str(target)
        columns = columns_of.get(name)
        try:
            table = routed.committer(name).table.load()
        except NoSuchTableError:
            if columns is None or not columns.names:
                left.remove(value)  # nothing to truncate, nothing after it: the table is not made
            continue
        if columns is None or not columns.names:  # only truncates: the batch takes the table's own columns
            columns_of[name] = seam.arrow_schema(table.schema())
        truncated_at[name] = truncates[value]
        if when is not None and when.get(value) is not None:
            truncated_time[name] = when[value]
    return left, replace(
        facts,
        table_columns=columns_of,
        truncating=frozenset(truncated_at),
        truncated_at=truncated_at,
        truncated_time=truncated_time,
    )


def undone(
    rows: pa.RecordBatch, routing: Routing, truncates: Mapping[str, Decimal], kept: Mapping[str, Decimal] | None = None
) -> pa.RecordBatch:
    """format("lakesink"): the staged rows without the changes the batch's truncates undo (and the truncates), as
    :func:`apply` filters foreach_batch's DataFrame. ``kept`` (option history: each value's truncate position): the
    changes before such a truncate are kept, marked in :data:`UNDONE_COLUMN` (versions of the history only)."""
    if not truncates or not rows.num_rows:
        return rows
    kept = kept or {}
    route, op, order = rows.column(routing.column), rows.column(OP), rows.column(ORDER)
    drop = pa.array([False] * rows.num_rows)
    undo = pa.array([False] * rows.num_rows)
    for value, position in truncates.items():
        before = pc.fill_null(pc.less(order, pa.scalar(position, order.type)), False)
        mine = pc.fill_null(pc.equal(route, value), False)
        truncate = pc.fill_null(pc.equal(op, "t"), False)
        if kept.get(value) == position:
            drop = pc.or_(drop, pc.and_(mine, truncate))
            undo = pc.or_(undo, pc.and_(mine, before))
        else:
            drop = pc.or_(drop, pc.and_(mine, pc.or_(truncate, before)))
    if kept:
        rows = rows.append_column(UNDONE_COLUMN, undo)
    return rows.filter(pc.invert(drop))
