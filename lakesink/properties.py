"""Names lakesink writes into Iceberg metadata (snapshot summaries and table properties).

Snapshot summary (every batch commit; string values):

- ``lakesink.query-id``: Spark's streaming query id, stable across restarts of one checkpoint;
- ``lakesink.batch-id``: the micro-batch id;
- ``lakesink.source-offsets``: the batch's end offsets as Spark recorded them in the
  checkpoint's offset log (a JSON list, one entry per source);
- ``lakesink.commit-id``: a random id of the commit call, to settle unknown outcomes;
- ``lakesink.commit-attempt``: which attempt of the compare-and-swap landed (1 when no other writer
  got in between; each conflict adds one);
- ``spark.sql.streaming.queryId`` / ``spark.sql.streaming.epochId``: the keys Iceberg's own Spark
  sink writes, for engines and tools that already know them.

Table property (updated in the same atomic commit as the snapshot):

- ``lakesink.last-batch.<query-id>``: JSON ``{"batch-id", "snapshot-id", "commit-id"}`` of the
  query's last committed batch. The replay check reads this one property, so its cost does not
  grow with the number of snapshots, it survives snapshot expiry, and other writers' commits and
  other queries' batch ids cannot fool it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

SUMMARY_QUERY_ID = "lakesink.query-id"
SUMMARY_BATCH_ID = "lakesink.batch-id"
SUMMARY_SOURCE_OFFSETS = "lakesink.source-offsets"
SUMMARY_COMMIT_ID = "lakesink.commit-id"
SUMMARY_COMMIT_ATTEMPT = "lakesink.commit-attempt"
ICEBERG_QUERY_ID = "spark.sql.streaming.queryId"
ICEBERG_EPOCH_ID = "spark.sql.streaming.epochId"

LAST_BATCH_PREFIX = "lakesink.last-batch."


@dataclass(frozen=True)
class CommittedBatch:
    """The last batch a query committed to a table."""

    batch_id: int
    snapshot_id: int
    commit_id: str

    def to_property(self) -> str:
        return json.dumps({"batch-id": self.batch_id, "snapshot-id": self.snapshot_id, "commit-id": self.commit_id})


def last_batch_key(query_id: str) -> str:
    return f"{LAST_BATCH_PREFIX}{query_id}"


def last_committed_batch(table_properties: Mapping[str, str], query_id: str) -> CommittedBatch | None:
    """The query's last committed batch, read from the table's properties."""
    raw = table_properties.get(last_batch_key(query_id))
    if raw is None:
        return None
    value = json.loads(raw)
    return CommittedBatch(
        batch_id=int(value["batch-id"]), snapshot_id=int(value["snapshot-id"]), commit_id=str(value["commit-id"])
    )


def batch_summary(query_id: str, batch_id: int, commit_id: str, source_offsets: str | None) -> dict[str, str]:
    summary = {
        SUMMARY_QUERY_ID: query_id,
        SUMMARY_BATCH_ID: str(batch_id),
        SUMMARY_COMMIT_ID: commit_id,
        ICEBERG_QUERY_ID: query_id,
        ICEBERG_EPOCH_ID: str(batch_id),
    }
    if source_offsets is not None:
        summary[SUMMARY_SOURCE_OFFSETS] = source_offsets
    return summary
