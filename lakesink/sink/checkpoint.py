"""Read what lakesink needs from a Spark streaming checkpoint (driver side), through fsspec.

- ``<checkpoint>/metadata``: ``{"id": "<query id>"}``, written when a query first starts;
- ``<checkpoint>/offsets/<batch id>``: written before the batch runs: a version line, a JSON line of
  batch metadata (``batchWatermarkMs``: the event-time watermark Spark computed for the batch, 0 before the first
  one), then one line per source with its end offset (``-`` when a source has none).
"""

from __future__ import annotations

import json
import re

import fsspec
from pyspark.sql.types import StructType

from lakesink._pyspark import QueryCheckpoint
from lakesink.driver.actions.completeness import BatchTime, event_time_field
from lakesink.errors import PROGRAMMING_ERRORS, CheckpointError
from lakesink.executor.messages import WritePlan
from lakesink.options import SinkOptions


def _read_text(url: str) -> str | None:
    try:
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            return None
        with fs.open(path, "r", encoding="utf-8") as f:
            text: str = f.read()
            return text
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise CheckpointError(f"cannot read {url}: {type(e).__name__}: {e}") from e


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def read_query_id(checkpoint_location: str) -> str | None:
    """The streaming query id of a checkpoint, or None before the query first started."""
    text = _read_text(_join(checkpoint_location, "metadata"))
    if text is None:
        return None
    try:
        return str(json.loads(text.splitlines()[0])["id"])
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise CheckpointError(f"checkpoint metadata {checkpoint_location}/metadata has no query id") from e


def read_source_offsets(checkpoint_location: str, batch_id: int) -> str | None:
    """The batch's end offsets, one JSON value per source, as a JSON list; None when not recorded."""
    text = _read_text(_join(checkpoint_location, "offsets", str(batch_id)))
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise CheckpointError(f"unexpected offset log format in {checkpoint_location}/offsets/{batch_id}")
    offsets: list[object] = []
    for line in lines[2:]:
        if line == "-":
            offsets.append(None)
            continue
        try:
            offsets.append(json.loads(line))
        except ValueError:
            offsets.append(line)
    return json.dumps(offsets, separators=(",", ":"))


def read_batch_watermark(checkpoint_location: str, batch_id: int) -> int | None:
    """Spark's event-time watermark for the batch (``batchWatermarkMs`` of its offset log entry, ms since the
    epoch; 0 before the query has seen an event, and for a query without ``withWatermark``); None when the entry
    is missing."""
    text = _read_text(_join(checkpoint_location, "offsets", str(batch_id)))
    if text is None:
        return None
    lines = text.splitlines()
    try:
        metadata = json.loads(lines[1])
        return int(metadata.get("batchWatermarkMs", 0))
    except (ValueError, IndexError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"unexpected offset log format in {checkpoint_location}/offsets/{batch_id}: no batch metadata"
        ) from e


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _path_of(uri: str) -> str:
    """``file:/x/y/`` and ``/x/y`` alike: the path, without a local scheme or a trailing slash."""
    for scheme in ("file://", "file:"):
        if uri.startswith(scheme):
            uri = uri[len(scheme) :]
            break
    return uri.rstrip("/")


def not_found_by_a_restart(origin: QueryCheckpoint) -> str | None:
    """Why the next start of the query will not find this checkpoint (so it is a new query, with a new query id, and
    lakesink cannot recognise the batches it replays), or None when it will.

    - a temporary checkpoint: no ``checkpointLocation`` option and no ``spark.sql.streaming.checkpointLocation``;
      Spark made a folder and deletes it when the query stops;
    - ``spark.sql.streaming.checkpointLocation`` without a ``queryName``: Spark puts the checkpoint under a random
      folder name, a new one at every start.
    """
    if origin.temporary:
        return (
            f"it runs on a temporary checkpoint ({origin.root}) that Spark made because the query has no "
            "checkpointLocation option, and deletes when the query stops"
        )
    if origin.query_name is None and origin.session_root is not None:
        parent, _, leaf = _path_of(origin.root).rpartition("/")
        if _UUID.fullmatch(leaf) and parent.endswith(_path_of(origin.session_root)):
            return (
                f"its checkpoint {origin.root} is a random folder under spark.sql.streaming.checkpointLocation="
                f"{origin.session_root} (the query has no checkpointLocation option and no queryName): every start "
                "gets a new one"
            )
    return None


# --- the batch's event time --------------------------------------------------------------------------

WATERMARK_DELAY_METADATA = "spark.watermarkDelayMs"
"""The field metadata key Spark's ``withWatermark`` puts on the event-time column."""


def watermarked(schema: StructType) -> bool:
    """Whether the stream's schema carries a ``withWatermark`` column."""
    return any(WATERMARK_DELAY_METADATA in (f.metadata or {}) for f in schema.fields)


def batch_time(options: SinkOptions, checkpoint: str | None, batch_id: int, *, has_watermark: bool) -> BatchTime | None:
    """The batch's :class:`BatchTime`: Spark's watermark for it when the query has one, and option ``event-time``;
    None when it has neither (the commit then records nothing about event time)."""
    spark = read_batch_watermark(checkpoint, batch_id) if checkpoint else None
    if spark is not None and not has_watermark and spark <= 0:
        spark = None  # no withWatermark column in the stream, and Spark never moved a watermark: the query has none
    if spark is None and options.event_time is None:
        return None
    return BatchTime(watermark_ms=spark, event_time=options.event_time)


def check_event_time(options: SinkOptions, plan: WritePlan) -> None:
    """At query start: option ``event-time`` names a timestamp or date column of the table whose bounds the files
    record (else InvalidOptionError naming the fix)."""
    if options.event_time is not None:
        event_time_field(plan.schema, options.event_time, plan.table, plan.properties)
