"""Driver side, the small-batch write path of :func:`lakesink.foreach_batch`: the rows to the driver as Arrow.

A micro-batch of a few rows costs Spark far more to write as files than to collect: Spark 4's file-write job
(a V1 write with its commit protocol, ``_temporary`` directories, a broadcast Hadoop configuration, one task
per partition that opens a Parquet writer in the JVM, and on a local disk a ``chmod`` fork per file and
directory) against one ``collect`` of Arrow batches (``DataFrame.toArrow()``: Spark's own Arrow collect, no
Python worker). Measured at a 1-second trigger, 10 rows per batch (docs/performance.md, "Where a small batch's
time goes"): the file-write job is most of lakesink's time per batch, the collect a fraction of it.

So for a small batch the driver collects the rows and writes them with the same
:class:`~lakesink.executor.task_writer.TaskWriter` as the Arrow path's tasks (projection onto the table's
schema, NOT NULL checks, partitioning, row groups and file rolling, column statistics; unique file names; its
files deleted when it fails), and hands the one :class:`~lakesink.executor.messages.TaskResult` to the same
commit. Nothing else changes: the replay check comes before (a replayed batch collects nothing), the commit
and the abort are the other paths', and a driver killed after writing leaves files named like the Arrow
path's, which the orphan clean-up keeps while the batch may still commit.

``writer="auto"`` takes this path when the previous batch of the same query run held at most
:data:`SMALL_BATCH_ROWS` rows (the first batch of a run, often a backlog, takes the Spark or Arrow path; with
``route_by``, when the batch is cached for its several jobs, it is counted instead and collected when small). A
batch that turns out larger than Spark lets a collect bring to the driver (``spark.driver.maxResultSize``) is
written by the other paths instead (:func:`collect` returns None; nothing was written yet).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from lakesink.driver.tables.schema import chars_as_strings, nullable_everywhere
from lakesink.executor.messages import TaskIds, TaskResult, WritePlan
from lakesink.executor.routed_writer import RoutedPlan, RoutedTaskResult, RoutedTaskWriter, routing_values_of
from lakesink.executor.task_writer import TaskWriter, lookup_columns

log = logging.getLogger("lakesink")

SMALL_BATCH_ROWS = 10_000
"""``writer="auto"`` writes a batch on the driver when the run's previous batch held at most this many rows.

About 1 MB of Arrow for narrow rows: a batch 100 times larger than the one before it still fits a driver
comfortably; far larger ones meet ``spark.driver.maxResultSize`` and go to the other paths (:func:`collect`)."""

_RESULT_TOO_LARGE = "spark.driver.maxResultSize"


def collect(df: DataFrame, *, table: str, batch_id: int) -> pa.Table | None:
    """The batch's rows as one Arrow table on the driver, or None when Spark refuses to bring that much to the
    driver (``spark.driver.maxResultSize``): then nothing was written and the batch can take another path (said in the
    log, naming the table and the batch)."""
    # char(n)/varchar(n) kept by spark.sql.preserveCharVarcharTypeInfo: pyspark's toArrow() refuses them (the Arrow
    # path's tasks receive them as strings); Spark has padded and checked the values already. Every field nullable:
    # toArrow() casts to the DataFrame's schema, which pyarrow refuses for a NOT NULL field of a null struct
    collected = nullable_everywhere(chars_as_strings(df.schema))
    if collected != df.schema:
        df = df.to(collected)  # type: ignore[arg-type]
    try:
        return df.toArrow()
    except Exception as e:
        if _RESULT_TOO_LARGE in str(e):
            log.warning(
                "lakesink: table=%s batch=%s too large to collect on the driver (%s); nothing written, the batch is "
                "written by Spark's tasks instead",
                table,
                batch_id,
                _RESULT_TOO_LARGE,
            )
            return None
        raise


def write_batch(
    rows: pa.Table, plan: WritePlan, *, batch_id: int, run_id: str | None, key: Sequence[str] = (), order_by: str | None = None
) -> TaskResult:
    """Write the collected rows as the table's data files (one writer, on the driver); nothing is committed.

    On any failure the files written so far are deleted before the error propagates (TaskWriter). A merge-on-read
    table's files keep their ``key`` and ``order_by`` columns for the next batch's lookup in this process
    (TaskWriter's ``keep``)."""
    keep = lookup_columns(plan, key, order_by)
    return TaskWriter(plan, _one_task(plan.query_id, batch_id, run_id), keep=keep).write(rows.to_batches())


def write_routed(rows: pa.Table, plan: RoutedPlan, *, batch_id: int, run_id: str | None) -> RoutedTaskResult:
    """Option route-by: write the collected rows into their tables' data files with the routed tasks' own writer, as
    one task that holds every row (its upserts resolved across the whole batch); nothing is committed.

    On any failure the files written so far are deleted before the error propagates (RoutedTaskWriter). A merge-on-read
    table's files keep their key and order-by columns for the next batch's lookup in this process (TaskWriter's
    ``keep``)."""
    return RoutedTaskWriter(plan, _one_task(plan.query_id, batch_id, run_id), keep=True).write(rows.to_batches())


def routing_values(rows: pa.Table, column: str) -> list[object]:
    """Option route-by: the distinct values of the collected rows' routing ``column`` (a string), each read from its
    bytes as the routed writer splits the rows (lakesink.executor.routed_writer.split_by_route: a value that is not
    UTF-8 stays bytes, an invalid route) and as the Spark job over the batch finds them
    (lakesink.sink.spark.routed.routing_values); a null value once, as None."""
    return routing_values_of(pc.unique(rows.column(column)))


def _one_task(query_id: str | None, batch_id: int, run_id: str | None) -> TaskIds:
    """The ids of the driver's one task of a batch (partition 0, attempt 0: its files named like the Arrow path's)."""
    return TaskIds(query_id=query_id or "", batch_id=batch_id, partition_id=0, task_attempt_id=0, run_id=run_id)
