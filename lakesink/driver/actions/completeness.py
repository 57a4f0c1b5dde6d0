"""Driver side: what a batch's commit records about event time, so that readers and schedulers know what is complete.

Two things, both in the batch's own atomic commit (snapshot summary and replay marker):

- ``lakesink.watermark``: when the query defines an event-time watermark (``withWatermark``), the watermark Spark
  computed for the batch (``batchWatermarkMs`` of ``<checkpoint>/offsets/<batch>``, read by the entry point), as
  lakesink records it:

  ``recorded(N) = max(recorded(previous batch), min(spark(N), newest event time committed through N))``

  so it never decreases along a query's batches (Spark can move it back: a restart from an older checkpoint, a
  changed ``withWatermark``; the summary then says so in ``lakesink.watermark-note`` and keeps Spark's value in
  ``lakesink.spark-watermark``), and it is never past the newest event time the query has committed, as far as
  lakesink knows it (option ``event-time``: from the written files' column bounds; without it Spark's value is
  bounded only by what Spark saw). Empty batches record theirs in the replay marker (no snapshot).
- ``lakesink.event-time-min`` / ``-max``: with option ``event-time``, the smallest and largest event time of the rows
  the snapshot adds, read from the Iceberg column bounds of the batch's data files (the statistics the executors
  computed from the Parquet footers: no extra Spark job).

It never touches rows. :mod:`lakesink.audit.completeness` reads it back (``lakesink wait``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    NestedField,
    PrimitiveType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
)

from lakesink._pyiceberg import io as seam
from lakesink.errors import InvalidOptionError
from lakesink.options import EVENT_TIME
from lakesink.table.keys import (
    METRICS_COLUMN_PREFIX,
    SUMMARY_EVENT_TIME_COLUMN,
    SUMMARY_EVENT_TIME_MAX,
    SUMMARY_EVENT_TIME_MIN,
    SUMMARY_SPARK_WATERMARK,
    SUMMARY_WATERMARK,
    SUMMARY_WATERMARK_NOTE,
)
from lakesink.table.markers import CommittedBatch

#: Iceberg types an event-time column may have, and how many of their units make a millisecond (dates: per day).
_UNITS_PER_MS: dict[type[PrimitiveType], float] = {
    TimestampType: 1_000,
    TimestamptzType: 1_000,
    TimestampNanoType: 1_000_000,
    TimestamptzNanoType: 1_000_000,
    DateType: 1 / 86_400_000,
}


@dataclass(frozen=True)
class BatchTime:
    """What an entry point knows of a batch's event time (picklable, no catalog)."""

    watermark_ms: int | None = None
    """Spark's watermark for the batch (ms since the epoch); None when the query defines none."""
    event_time: str | None = None
    """Option ``event-time``: the column whose smallest and largest values each snapshot records."""


@dataclass(frozen=True)
class Recorded:
    """What one commit records: its summary entries, and the marker's watermark and newest event time."""

    summary: Mapping[str, str]
    watermark: int | None
    event_time_max: int | None


def event_time_field(schema: Schema, column: str, table: str, properties: Mapping[str, str]) -> NestedField:
    """The table's field of option ``event-time``, checked: a top-level timestamp or date column whose bounds the
    written files record (its metrics mode is not ``none`` or ``counts``)."""
    try:
        field = schema.find_field(column, case_sensitive=True)
    except ValueError:
        raise InvalidOptionError(
            f"option '{EVENT_TIME}': table {table} has no column {column!r}; columns: {', '.join(schema.column_names)}"
        ) from None
    if not any(isinstance(field.field_type, t) for t in _UNITS_PER_MS):
        raise InvalidOptionError(
            f"option '{EVENT_TIME}': column {column!r} of table {table} is {field.field_type}; it must be a timestamp, "
            "timestamptz or date column"
        )
    if not seam.records_bounds(schema, properties, field.field_id):
        raise InvalidOptionError(
            f"option '{EVENT_TIME}': table {table} records no bounds of column {column!r} in its data files (its metrics "
            f"mode is 'none' or 'counts'), so the event times of a batch cannot be read from them; set the table property "
            f"{METRICS_COLUMN_PREFIX}{column}=full"
        )
    return field


def _to_ms(value: Any, field: NestedField) -> int:
    if isinstance(field.field_type, DateType):
        return int(value) * 86_400_000
    units = next(u for t, u in _UNITS_PER_MS.items() if isinstance(field.field_type, t))
    return int(value) // int(units)


def event_time_bounds(statistics: Iterable[Mapping[str, Any]], field: NestedField) -> tuple[int, int] | None:
    """The smallest and largest event time (ms, rounded down) over data files' statistics; None: no value."""
    lows, highs = [], []
    assert isinstance(field.field_type, PrimitiveType)
    for stats in statistics:
        low = seam.bound_value(stats, field.field_id, field.field_type, upper=False)
        high = seam.bound_value(stats, field.field_id, field.field_type, upper=True)
        if low is not None:
            lows.append(_to_ms(low, field))
        if high is not None:
            highs.append(_to_ms(high, field))
    if not lows or not highs:
        return None
    return min(lows), max(highs)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record(time: BatchTime | None, previous: CommittedBatch | None, bounds: tuple[int, int] | None, *, batch_id: int) -> Recorded:
    """What batch ``batch_id`` records, given the query's previous batch on the branch (its marker) and the event
    times of the rows it adds (``bounds``)."""
    summary: dict[str, str] = {}
    committed_max = previous.event_time_max if previous is not None else None
    if time is not None and time.event_time is not None and bounds is not None:
        summary[SUMMARY_EVENT_TIME_COLUMN] = time.event_time
        summary[SUMMARY_EVENT_TIME_MIN] = str(bounds[0])
        summary[SUMMARY_EVENT_TIME_MAX] = str(bounds[1])
        committed_max = bounds[1] if committed_max is None else max(committed_max, bounds[1])
    if time is None or time.watermark_ms is None:
        return Recorded(summary, None, committed_max)
    spark = time.watermark_ms
    value, notes = spark, []
    if time.event_time is not None and committed_max is not None and value > committed_max:
        notes.append(
            f"Spark's watermark {iso(spark)} is past the newest event time committed ({iso(committed_max)}, column "
            f"{time.event_time!r}: rows Spark saw were not written here); recorded the newest event time"
        )
        value = committed_max
    before = previous.watermark if previous is not None else None
    if before is not None and value < before:
        notes.append(
            f"Spark's watermark for batch {batch_id} ({iso(value)}) is behind the {iso(before)} recorded with batch "
            f"{previous.batch_id if previous else '?'} (Spark moves it back after a restart from an older checkpoint or a "
            "changed withWatermark); kept the recorded one, a watermark never moves back"
        )
        value = before
    summary[SUMMARY_WATERMARK] = str(value)
    if value != spark:
        summary[SUMMARY_SPARK_WATERMARK] = str(spark)
        summary[SUMMARY_WATERMARK_NOTE] = "; ".join(notes)
    return Recorded(summary, value, committed_max)
