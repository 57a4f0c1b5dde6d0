"""Names lakesink writes into Iceberg metadata (snapshot summaries and table properties).

Snapshot summary (every batch commit; string values):

- ``lakesink.query-id``: Spark's streaming query id, stable across restarts of one checkpoint;
- ``lakesink.batch-id``: the micro-batch id;
- ``lakesink.source-offsets``: the batch's end offsets as Spark recorded them in the
  checkpoint's offset log (a JSON list, one entry per source);
- ``lakesink.commit-id``: a random id of the commit call, to settle unknown outcomes;
- ``lakesink.commit-attempt``: which attempt of the compare-and-swap landed (1 when no other writer
  got in between; each conflict adds one);
- ``lakesink.previous-batch-id``: the last batch id the query processed before this one, empty batches
  included (read from the replay marker); batch ids between it and this batch's id were *lost*, batch ids
  up to it that have no snapshot were empty (``lakesink verify`` tells the two apart);
- ``lakesink.commit-started-ms``: wall-clock time the driver started committing the batch (the snapshot's
  own timestamp minus this is the commit latency that ``lakesink report`` plots);
- ``spark.sql.streaming.queryId`` / ``spark.sql.streaming.epochId``: the keys Iceberg's own Spark
  sink writes, for engines and tools that already know them.

Table property (updated in the same atomic commit as the snapshot):

- ``lakesink.last-batch.<query-id>``: JSON ``{"batch-id", "snapshot-id", "commit-id", "branch"}`` of the
  query's last committed batch (``"empty": true`` and the branch head as ``snapshot-id`` when that batch was
  empty: an empty batch is recorded by a properties-only commit). The replay check reads this one property, so its cost does not
  grow with the number of snapshots, it survives snapshot expiry, and other writers' commits and
  other queries' batch ids cannot fool it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import ancestors_of

SUMMARY_QUERY_ID = "lakesink.query-id"
SUMMARY_BATCH_ID = "lakesink.batch-id"
SUMMARY_SOURCE_OFFSETS = "lakesink.source-offsets"
SUMMARY_COMMIT_ID = "lakesink.commit-id"
SUMMARY_COMMIT_ATTEMPT = "lakesink.commit-attempt"
SUMMARY_PREVIOUS_BATCH_ID = "lakesink.previous-batch-id"
SUMMARY_COMMIT_STARTED_MS = "lakesink.commit-started-ms"
ICEBERG_QUERY_ID = "spark.sql.streaming.queryId"
ICEBERG_EPOCH_ID = "spark.sql.streaming.epochId"

LAST_BATCH_PREFIX = "lakesink.last-batch."
MAIN_BRANCH = "main"


@dataclass(frozen=True)
class CommittedBatch:
    """The last batch a query committed to a table."""

    batch_id: int
    snapshot_id: int
    commit_id: str
    branch: str = MAIN_BRANCH
    empty: bool = False
    """True when the batch had no rows: nothing was committed but this marker (``snapshot_id`` is the branch head then)."""

    def to_property(self) -> str:
        value: dict[str, object] = {"batch-id": self.batch_id, "snapshot-id": self.snapshot_id, "commit-id": self.commit_id}
        if self.branch != MAIN_BRANCH:
            value["branch"] = self.branch
        if self.empty:
            value["empty"] = True
        return json.dumps(value)


def last_batch_key(query_id: str) -> str:
    return f"{LAST_BATCH_PREFIX}{query_id}"


def last_committed_batch(table_properties: Mapping[str, str], query_id: str) -> CommittedBatch | None:
    """The query's last committed batch, read from the table's properties."""
    raw = table_properties.get(last_batch_key(query_id))
    if raw is None:
        return None
    value = json.loads(raw)
    return CommittedBatch(
        batch_id=int(value["batch-id"]),
        snapshot_id=int(value["snapshot-id"]),
        commit_id=str(value["commit-id"]),
        branch=str(value.get("branch", MAIN_BRANCH)),
        empty=bool(value.get("empty", False)),
    )


def last_committed_on_branch(metadata: TableMetadata, query_id: str, branch: str) -> CommittedBatch | None:
    """The query's last batch in the history of ``branch``.

    The marker property answers when it was written for this branch and its snapshot is still an ancestor of
    the branch head (or has expired: the marker survives snapshot expiry on purpose). Otherwise (the marker is
    another branch's, or the branch was reset behind it) the branch's ancestry is walked for the snapshot
    summaries of the query -- what Iceberg's own Spark sink does, but on the branch written, not on ``main``.
    """
    marker = last_committed_batch(metadata.properties, query_id)
    head = metadata.snapshot_by_name(branch)
    if marker is not None and marker.branch == branch:
        if metadata.snapshot_by_id(marker.snapshot_id) is None:
            return marker  # expired: trust the marker
        if head is not None and any(s.snapshot_id == marker.snapshot_id for s in ancestors_of(head, metadata)):
            return marker
    for snapshot in ancestors_of(head, metadata):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(SUMMARY_QUERY_ID) == query_id and SUMMARY_BATCH_ID in props:
            commit_id = props.get(SUMMARY_COMMIT_ID, "")
            return CommittedBatch(int(props[SUMMARY_BATCH_ID]), snapshot.snapshot_id, commit_id, branch=branch)
    return None


def batch_summary(
    query_id: str,
    batch_id: int,
    commit_id: str,
    source_offsets: str | None,
    *,
    previous_batch_id: int | None = None,
    started_ms: int | None = None,
) -> dict[str, str]:
    summary = {
        SUMMARY_QUERY_ID: query_id,
        SUMMARY_BATCH_ID: str(batch_id),
        SUMMARY_COMMIT_ID: commit_id,
        ICEBERG_QUERY_ID: query_id,
        ICEBERG_EPOCH_ID: str(batch_id),
    }
    if source_offsets is not None:
        summary[SUMMARY_SOURCE_OFFSETS] = source_offsets
    if previous_batch_id is not None:
        summary[SUMMARY_PREVIOUS_BATCH_ID] = str(previous_batch_id)
    if started_ms is not None:
        summary[SUMMARY_COMMIT_STARTED_MS] = str(started_ms)
    return summary
