"""foreach_batch's side of option ``dead-letter-table`` (driver process; Spark plans, the executors sort the rows).

The rows go through the Arrow path (``mapInArrow`` and :class:`~lakesink.executor.task_writer.TaskWriter`, the same
code as ``format("lakesink")``), whose :class:`~lakesink.executor.dead_letters.RowSorter` turns each row that does not
fit into a dead letter: Spark's own Parquet writer has no way to divert single rows. Option ``reject-when`` is Spark SQL
here: Spark computes it into a boolean column the sorter reads. With option ``upsert-key`` the batch is not resolved by
Spark: every row of a key goes to one task (:func:`lakesink.sink.upsert_batch.for_tasks`), whose writer sorts the rows
first and resolves the ones that fit (format("lakesink")'s and a routed table's rule, on one path): a dead-lettered
change is not applied, its key resolves from the batch's other changes or keeps its row. (Before issue 31 Spark
resolved the batch first and the sorter checked the winning rows: a key whose latest change was a dead letter lost
its row and the batch's earlier change of it.)
"""

from __future__ import annotations

from dataclasses import replace

from pyspark.errors import AnalysisException
from pyspark.errors.exceptions.captured import ParseException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakesink._pyspark import why_computed_twice_differs
from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import WritePlan
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.options import REJECT_WHEN, UPSERT_KEY, WRITER, SinkOptions, WriterKind
from lakesink.sink import upsert_batch
from lakesink.table.dead_letters import REJECT_COLUMN


def check_writer(options: SinkOptions) -> None:
    """At ``foreach_batch(...)``: dead letters need the Arrow path (rows sorted in Python workers)."""
    if options.dead_letter_table is not None and options.writer is WriterKind.SPARK:
        raise InvalidOptionError(
            f"option '{WRITER}'='spark' cannot divert single rows to a dead-letter table: Spark's Parquet writer writes "
            "every row or fails; use writer='auto' or 'arrow' with dead_letter_table (docs/dead-letters.md)"
        )
    if options.dead_letter_table is not None and options.writer is WriterKind.DRIVER:
        raise InvalidOptionError(
            f"option '{WRITER}'='driver' does not sort rows into a dead-letter table (a batch's rows are sorted in "
            "Python workers, and with upsert-key some are taken out before the upsert resolution); use writer='auto' "
            "or 'arrow' with dead_letter_table (docs/dead-letters.md)"
        )


def with_reject_column(df: DataFrame, options: SinkOptions) -> DataFrame:
    """The batch's rows with the reject column (option ``reject-when``, computed by Spark), analysed here: a bad
    expression fails the batch before any job."""
    if options.reject_when is None:
        return df
    try:
        df = df.withColumn(REJECT_COLUMN, F.expr(options.reject_when).cast("boolean"))
        df.schema  # noqa: B018 (analysed here)
    except (AnalysisException, ParseException) as e:
        raise InvalidOptionError(
            f"option '{REJECT_WHEN}' {options.reject_when!r} is not a Spark SQL boolean expression over the batch's "
            f"columns ({', '.join(c for c in df.columns if c != REJECT_COLUMN)}): {str(e).splitlines()[0]}"
        ) from None
    return df


def prepare(df: DataFrame, plan: WritePlan, options: SinkOptions) -> tuple[DataFrame, WritePlan]:
    """The batch's rows with the reject column and the plan whose row checks read it; with ``upsert-key``, the rows
    partitioned by key (``delete-when`` computed by Spark) and the plan's tasks resolving each key's changes after they
    sorted them (:class:`~lakesink.executor.upsert_task.UpsertSpec`)."""
    assert plan.row_checks is not None
    # the reject column, when there is one, is the verdict (the expression stays for the dead letters' message)
    checks = replace(plan.row_checks, reject_column=options.reject_when is not None)
    plan = replace(plan, row_checks=checks)
    df = with_reject_column(df, options)
    if not options.upsert_key:
        return df, plan
    if options.reject_when is not None:
        df = _verdicts_computed_once(df, options)
    df, computed = upsert_batch.for_tasks(df, options)
    delete_when = None if computed else options.delete_when
    # option history: the tasks also return the changes that fit, for the history table (never a dead letter's)
    upsert = UpsertSpec(tuple(options.upsert_key), delete_when, options.order_by, history_time=options.history_time)
    return df, replace(plan, upsert=upsert)


def _verdicts_computed_once(df: DataFrame, options: SinkOptions) -> DataFrame:
    """``df``, whose reject column holds one answer per row whatever Spark computes again. InvalidOptionError, before
    any job, for a ``reject-when`` whose verdict may change when Spark computes a row again: with option ``upsert-key``
    the verdict is computed before the batch is repartitioned by key, and a stage Spark runs again (a lost shuffle
    block, a retried task) would sort the row anew. (Before issue 31 the dead letters and the rows were two filters,
    two jobs: such a verdict put a row in both tables or in neither.) Spark's analysed plan tells
    (:func:`lakesink._pyspark.why_computed_twice_differs`); where it cannot (Spark Connect), the batch with its verdicts
    is materialised once instead (a lost block then fails the job, it is never computed again)."""
    try:
        why = why_computed_twice_differs(df, REJECT_COLUMN)
    except LookupError:
        return df.localCheckpoint(eager=True)
    if why is not None:
        raise InvalidOptionError(
            f"option '{REJECT_WHEN}' {options.reject_when!r} is not deterministic: {why}. With option "
            f"'{UPSERT_KEY}', the verdict is computed before the batch is repartitioned by key, and a stage Spark runs "
            "again would sort a row anew: a row's verdict must be a property of the row. "
            "Use a deterministic expression over the batch's columns (compare an event time with a literal time, not "
            "with current_timestamp(); no rand(), uuid() or non-deterministic UDF)"
        )
    return df
