"""Driver side: what an entry point knows of a batch's event time, for the commit to record
(:mod:`lakesink.driver.actions.completeness`): Spark's watermark for the batch, read from the checkpoint's offset log, and
the ``event-time`` option.

A query defines a watermark with ``withWatermark(column, delay)``; Spark marks that column in the stream's schema
(field metadata ``spark.watermarkDelayMs``, seen by both entry points: the batch DataFrame of ``foreachBatch`` and the
schema Spark hands ``streamWriter``). The mark is lost when the query drops the column before the sink; a watermark
Spark has moved past 0 is recorded then too (before its first move, a query that dropped the column records none).
"""

from __future__ import annotations

from pyspark.sql.types import StructType

from lakesink.driver.actions.completeness import BatchTime, event_time_field
from lakesink.executor.messages import WritePlan
from lakesink.options import SinkOptions
from lakesink.sink.checkpoint import read_batch_watermark

WATERMARK_DELAY_METADATA = "spark.watermarkDelayMs"
"""The field metadata key Spark's ``withWatermark`` puts on the event-time column."""


def watermarked(schema: StructType) -> bool:
    """Whether the stream's schema carries a ``withWatermark`` column."""
    return any(WATERMARK_DELAY_METADATA in (f.metadata or {}) for f in schema.fields)


def batch_time(options: SinkOptions, checkpoint: str | None, batch_id: int, *, has_watermark: bool) -> BatchTime:
    """The batch's :class:`BatchTime`: Spark's watermark for it when the query has one, and option ``event-time``."""
    spark = read_batch_watermark(checkpoint, batch_id) if checkpoint else None
    if spark is not None and not has_watermark and spark <= 0:
        spark = None  # no withWatermark column in the stream, and Spark never moved a watermark: the query has none
    return BatchTime(watermark_ms=spark, event_time=options.event_time)


def check_event_time(options: SinkOptions, plan: WritePlan) -> None:
    """At query start: option ``event-time`` names a timestamp or date column of the table whose bounds the files
    record (else InvalidOptionError naming the fix)."""
    if options.event_time is not None:
        event_time_field(plan.schema, options.event_time, plan.table, plan.properties)
