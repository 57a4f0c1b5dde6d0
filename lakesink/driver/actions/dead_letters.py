"""Driver side of option ``dead-letter-table``: the dead-letter table's sink options, the batch-level check of option
``max-rejected-fraction``, and the replay point of a sink with a dead-letter table. It never touches rows (the
executors sort them: :mod:`lakesink.executor.dead_letters`); the commit of a batch's dead letters together with its
good rows, as one unit, is :class:`lakesink.driver.committers.table.TableCommitter`'s (docs/dead-letters.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pyarrow as pa

from lakesink._pyiceberg import io as seam
from lakesink.errors import InvalidOptionError, TooManyRejectedError
from lakesink.executor.messages import TaskResult, WritePlan
from lakesink.options import MAX_REJECTED_FRACTION, REJECT_WHEN, Maintenance, SinkOptions
from lakesink.table.keys import MAIN_BRANCH

#: How many rejections the error of max-rejected-fraction names
REASONS_SHOWN = 5


def dead_letter_options(options: SinkOptions) -> SinkOptions:
    """The options of the sink that writes ``options``' dead letters: the dead-letter table in the same catalog, on
    ``main``, created when missing, with a sink id of its own so that several sinks (tables) of one query can share
    one dead-letter table, each exactly once (its replay marker ``lakesink.last-batch.<query>.<sink id>``).

    The sink id is derived from what the marker marks: the sink's table, or, for a routed sink (whose ``table`` is a
    placeholder every routed sink shares), its routing column and namespace -- so that two routed sinks of one query
    sharing a dead-letter table keep one marker each."""
    assert options.dead_letter_table is not None
    origin = f"{options.table}|{options.sink_id or ''}"
    if options.routing is not None:
        routing = options.routing
        origin = f"route-by|{routing.column}|{'.'.join(routing.namespace)}|{options.sink_id or ''}"
    sink_id = "dead-letters-" + hashlib.sha256(origin.encode("utf-8")).hexdigest()[:16]
    return SinkOptions(
        table=options.dead_letter_table,
        catalog_name=options.catalog_name,
        catalog_properties=options.catalog_properties,
        checkpoint_location=options.checkpoint_location,
        branch=MAIN_BRANCH,
        sink_id=sink_id,
        maintenance=Maintenance.OFF,
    )


def check_rejected(options: SinkOptions, results: Sequence[TaskResult], *, batch_id: int) -> tuple[int, int]:
    """(rows received, rows rejected) of the batch; raises TooManyRejectedError (nothing is committed) when the rejected
    fraction is above option ``max-rejected-fraction``, with the count and the first reasons. The tasks see every row of
    the batch (with ``upsert-key`` too: they sort a key's changes before they resolve them), so the rows they received
    are the batch's."""
    received = sum(r.rows_in for r in results)
    rejected = sum(r.rejected for r in results)
    if received and rejected / received > options.max_rejected_fraction:
        reasons = [reason for r in results for reason in r.reasons][:REASONS_SHOWN]
        raise TooManyRejectedError(
            f"batch {batch_id}: {rejected} of {received} row(s) were rejected as dead letters ({rejected / received:.1%}), "
            f"more than option '{MAX_REJECTED_FRACTION}'={options.max_rejected_fraction:g} allows; nothing was committed "
            f"(restarting the query replays the batch). First reasons:\n  - " + "\n  - ".join(reasons)
        )
    return received, rejected


def check_reject_when(options: SinkOptions, stream: pa.Schema, plan: WritePlan | None) -> None:
    """format("lakesink") at query start: option ``reject-when`` is read by Iceberg's expression parser and evaluated
    on Arrow in the writers (no Spark there); what it cannot read or bind fails here, naming what it reads. ``plan``
    None (option payload: no table yet): over the stream's columns alone."""
    if options.reject_when is None:
        return
    try:
        schema = seam.new_table_schema(stream) if plan is None else seam.stream_schema(stream, plan.schema)
        seam.bind_row_filter(options.reject_when, schema)
    except ValueError as e:
        raise InvalidOptionError(
            f"option '{REJECT_WHEN}' {options.reject_when!r} cannot be evaluated by format('lakesink') ({e}). Its writers "
            "get Arrow batches without Spark, and read the expression with Iceberg's parser: comparisons (=, !=, <, <=, >, "
            ">=) of a column with a literal, IS [NOT] NULL, IS [NOT] NAN, [NOT] IN (...), [NOT] LIKE 'prefix%', AND, OR, "
            "NOT, parentheses. Use that subset, or lakesink.foreach_batch(..., reject_when=...), which takes any Spark SQL"
        ) from None
