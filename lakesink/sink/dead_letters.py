"""foreach_batch's side of option ``dead-letter-table`` (driver process; Spark plans, the executors sort the rows).

The rows go through the Arrow path (``mapInArrow`` and :class:`~lakesink.executor.task_writer.TaskWriter`, the same
code as ``format("lakesink")``), whose :class:`~lakesink.executor.dead_letters.RowSorter` turns each row that does not
fit into a dead letter: Spark's own Parquet writer has no way to divert single rows. Option ``reject-when`` is Spark SQL
here: Spark computes it into a boolean column the sorter reads. With option ``upsert-key``, rows with a null key or
matching ``reject-when`` are taken out of the batch before Spark resolves it to one row per key, and go to the sorter
on their own (every one of them a dead letter).
"""

from __future__ import annotations

from dataclasses import replace
from functools import reduce

from pyspark.errors import AnalysisException
from pyspark.errors.exceptions.captured import ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakesink._pyspark import why_computed_twice_differs
from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import WritePlan
from lakesink.options import REJECT_WHEN, UPSERT_KEY, WRITER, SinkOptions, WriterKind
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


def batch_rows(df: DataFrame, options: SinkOptions) -> int | None:
    """With ``upsert-key``: how many rows the batch holds, counted by Spark before its rows are resolved to one per key
    (the writers see only the resolved rows, and the deleted keys' rows not at all), so that option
    ``max-rejected-fraction`` is a fraction of the batch's rows. One more Spark job over the batch, only with both
    options. None without ``upsert-key``: the writers see every row of the batch and count them."""
    if not options.upsert_key:
        return None
    return df.count()


def prepare(df: DataFrame, plan: WritePlan, options: SinkOptions) -> tuple[DataFrame, WritePlan, DataFrame | None]:
    """The batch's rows with the reject column, the plan whose row checks read it, and (with ``upsert-key``) the
    rows taken out before the upsert resolution because they are certainly dead letters (else None)."""
    assert plan.row_checks is not None
    # the reject column, when there is one, is the verdict (the expression stays for the dead letters' message)
    checks = replace(plan.row_checks, reject_column=options.reject_when is not None)
    plan = replace(plan, row_checks=checks)
    df = with_reject_column(df, options)
    if not options.upsert_key:
        return df, plan, None
    certain: list[Column] = [F.col(f"`{k}`").isNull() for k in options.upsert_key if k in df.columns]
    if options.reject_when is not None:
        certain.append(F.coalesce(F.col(REJECT_COLUMN), F.lit(False)))
    if not certain:
        return df, plan, None
    if options.reject_when is not None:
        df = _verdicts_computed_once(df, options)
    bad = reduce(lambda a, b: a | b, certain)
    letters = df.where(bad)
    rows = df.where(~bad)
    if options.reject_when is not None:
        rows = rows.drop(REJECT_COLUMN)
    return rows, plan, letters


def _verdicts_computed_once(df: DataFrame, options: SinkOptions) -> DataFrame:
    """``df``, whose reject column two jobs read with one answer per row. InvalidOptionError, before any job, for a
    ``reject-when`` whose verdict may differ between the two filters that split an upsert batch (its dead letters,
    then its rows: two Spark jobs, each computing the expression): a row would land in both tables or in neither.
    Spark's analysed plan tells (:func:`lakesink._pyspark.why_computed_twice_differs`); where it cannot (Spark
    Connect), the batch with its verdicts is materialised once instead (a lost block then fails the job, it is never
    computed again)."""
    try:
        why = why_computed_twice_differs(df, REJECT_COLUMN)
    except LookupError:
        return df.localCheckpoint(eager=True)
    if why is not None:
        raise InvalidOptionError(
            f"option '{REJECT_WHEN}' {options.reject_when!r} is not deterministic: {why}. With option "
            f"'{UPSERT_KEY}', the dead letters are taken out of the batch before its upsert resolution, by a filter of "
            "their own, so such a verdict would put a row in the table and in the dead-letter table, or in neither. "
            "Use a deterministic expression over the batch's columns (compare an event time with a literal time, not "
            "with current_timestamp(); no rand(), uuid() or non-deterministic UDF)"
        )
    return df
