"""The replay-marker ledger: where lakesink records which batches of which query are in a table, and how it
reads that back (runs anywhere; no catalog, only the table's metadata).

Every batch commit writes its keys into the snapshot summary (``lakesink.query-id``, ``lakesink.batch-id``,
``lakesink.source-offsets``, ... :func:`batch_summary`; the keys and what each holds: :mod:`lakesink.table.keys`)
and moves the sink's replay marker in the same atomic commit.

Table property (updated in the same atomic commit as the snapshot):

- ``lakesink.last-batch.<query-id>`` (``lakesink.last-batch.<query-id>.<sink-id>`` for a sink with a
  ``sink_id``): JSON ``{"batch-id", "snapshot-id", "commit-id", "branch", "run-id", "offsets"}`` of the
  sink's last committed batch (``offsets``: a digest of the batch's source offsets, to tell a faithful replay
  from a batch re-planned over other input) (``"empty": true`` and the branch head as ``snapshot-id`` when that batch was
  empty: an empty batch is recorded by a properties-only commit). The replay check reads this one property, so its cost does not
  grow with the number of snapshots, it survives snapshot expiry, and other writers' commits and
  other queries' batch ids cannot fool it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from lakesink.table.keys import (
    ICEBERG_EPOCH_ID,
    ICEBERG_QUERY_ID,
    LAST_BATCH_PREFIX,
    MAIN_BRANCH,
    SUMMARY_BATCH_ID,
    SUMMARY_BATCH_ROWS_DIGEST,
    SUMMARY_BATCH_TABLES_DIGEST,
    SUMMARY_COMMIT_ID,
    SUMMARY_COMMIT_STARTED_MS,
    SUMMARY_EVENT_TIME_MAX,
    SUMMARY_PREVIOUS_BATCH_ID,
    SUMMARY_QUERY_ID,
    SUMMARY_RUN_ID,
    SUMMARY_SINK_ID,
    SUMMARY_SOURCE_OFFSETS,
    SUMMARY_WATERMARK,
)

_RECHECK_DEPTH = 1000


@dataclass(frozen=True)
class CommittedBatch:
    """The last batch a query committed to a table."""

    batch_id: int
    snapshot_id: int
    commit_id: str
    branch: str = MAIN_BRANCH
    empty: bool = False
    """True when the batch had no rows: nothing was committed but this marker (``snapshot_id`` is the branch head then)."""
    run_id: str | None = None
    """Spark's run id of the query run that committed the batch (None when unknown, e.g. ``format("lakesink")``)."""
    offsets: str | None = None
    """:func:`offsets_digest` of the batch's source offsets (None when they were not readable)."""
    watermark: int | None = None
    """The watermark recorded with the batch (``lakesink.watermark``, ms; None: the query has none): empty batches
    record theirs here only."""
    event_time_max: int | None = None
    """The largest event time (ms) the query committed through this batch (option ``event-time``)."""
    tables: str | None = None
    """Option route-by: the digest of the set of tables the batch was committed to
    (:func:`lakesink.table.routes.tables_digest`, ``lakesink.batch-tables-digest``); None: a single-table sink's batch,
    or a marker written before lakesink recorded it here."""
    rows: str | None = None
    """Option route-by: the digest of the rows the batch routed to this table (``lakesink.batch-rows-digest``,
    lakesink.executor.row_digest); None: a single-table sink's batch, an empty batch, or a marker written before
    lakesink recorded it."""

    def to_property(self) -> str:
        value: dict[str, object] = {"batch-id": self.batch_id, "snapshot-id": self.snapshot_id, "commit-id": self.commit_id}
        if self.branch != MAIN_BRANCH:
            value["branch"] = self.branch
        if self.empty:
            value["empty"] = True
        optional = {
            "run-id": self.run_id,
            "offsets": self.offsets,
            "watermark": self.watermark,
            "event-time-max": self.event_time_max,
            "tables": self.tables,
            "rows": self.rows,
        }
        value.update((key, v) for key, v in optional.items() if v is not None)  # a field that is None: no key
        return json.dumps(value)


def last_batch_key(query_id: str, sink_id: str | None = None) -> str:
    """The table property holding the replay marker of one sink of a query."""
    return f"{LAST_BATCH_PREFIX}{query_id}" + (f".{sink_id}" if sink_id else "")


def parse_last_batch_key(key: str) -> tuple[str, str | None] | None:
    """(query id, sink id) of a replay marker's property key; None when ``key`` is not a marker."""
    if not key.startswith(LAST_BATCH_PREFIX):
        return None
    query_id, _, sink_id = key[len(LAST_BATCH_PREFIX) :].partition(".")
    return query_id, sink_id or None


def offsets_digest(source_offsets: str | None) -> str | None:
    """A short digest of a batch's source offsets (a JSON list), independent of JSON formatting."""
    if source_offsets is None:
        return None
    try:
        canonical = json.dumps(json.loads(source_offsets), sort_keys=True, separators=(",", ":"))
    except ValueError:
        canonical = source_offsets
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


def last_committed_batch(table_properties: Mapping[str, str], query_id: str, sink_id: str | None = None) -> CommittedBatch | None:
    """The sink's last committed batch, read from the table's properties."""
    raw = table_properties.get(last_batch_key(query_id, sink_id))
    if raw is None:
        return None
    value = json.loads(raw)
    return CommittedBatch(
        batch_id=int(value["batch-id"]),
        snapshot_id=int(value["snapshot-id"]),
        commit_id=str(value["commit-id"]),
        branch=str(value.get("branch", MAIN_BRANCH)),
        empty=bool(value.get("empty", False)),
        run_id=value.get("run-id"),
        offsets=value.get("offsets"),
        watermark=_int_or_none(value.get("watermark")),
        event_time_max=_int_or_none(value.get("event-time-max")),
        tables=value.get("tables"),
        rows=value.get("rows"),
    )


def _int_or_none(value: object) -> int | None:
    return int(str(value)) if value is not None else None


class SnapshotIndex:
    """Snapshots of one table metadata by id, indexed lazily from the newest end of the list.

    pyiceberg's ``snapshot_by_id`` (and ``snapshot_by_name``, which uses it) is a linear search from the
    oldest snapshot, so finding the branch head costs O(history) and walking an ancestry with it
    O(history²). Snapshots are appended in commit order, so the head and its recent ancestors are at the
    end of the list: filling the index from there costs what the walk visits, not the history.
    """

    def __init__(self, metadata: TableMetadata):
        self.metadata = metadata
        self._snapshots = metadata.snapshots
        self._unindexed = len(self._snapshots)  # snapshots[:_unindexed] are not in by_id yet
        self.by_id: dict[int, Snapshot] = {}

    def get(self, snapshot_id: int | None) -> Snapshot | None:
        if snapshot_id is None:
            return None
        found = self.by_id.get(snapshot_id)
        while found is None and self._unindexed > 0:
            self._unindexed -= 1
            s = self._snapshots[self._unindexed]
            self.by_id[s.snapshot_id] = s
            if s.snapshot_id == snapshot_id:
                found = s
        return found

    def head(self, branch: str) -> Snapshot | None:
        ref = self.metadata.refs.get(branch)
        return self.get(ref.snapshot_id) if ref is not None else None

    def ancestors(self, head: Snapshot | None) -> Iterator[Snapshot]:
        """``head`` and its ancestors, newest first (stops at an expired parent)."""
        current = head
        while current is not None:
            yield current
            current = self.get(current.parent_snapshot_id)

    def is_ancestor(self, snapshot_id: int, head: Snapshot | None) -> bool:
        """Whether ``snapshot_id`` is ``head`` or one of its ancestors; the walk stops at the first snapshot older
        than it (sequence numbers fall along an ancestry), so its cost follows the commits made since, not the
        history."""
        target = self.get(snapshot_id)
        if target is None:
            return False
        floor = target.sequence_number or 0
        for s in self.ancestors(head):
            if s.snapshot_id == snapshot_id:
                return True
            if floor and (s.sequence_number or 0) < floor:
                return False
        return False


def summary_sink_id(props: Mapping[str, str]) -> str | None:
    return props.get(SUMMARY_SINK_ID) or None


def last_committed_on_branch(
    metadata: TableMetadata, query_id: str, branch: str, sink_id: str | None = None, *, index: SnapshotIndex | None = None
) -> CommittedBatch | None:
    """The sink's last batch in the history of ``branch``.

    The marker property answers when it was written for this branch and its snapshot is still an ancestor of
    the branch head (or has expired: the marker survives snapshot expiry on purpose). Otherwise (the marker is
    another branch's, or the branch was reset behind it) the branch's ancestry is walked for the snapshot
    summaries of the query and sink -- what Iceberg's own Spark sink does, but on the branch written, not on
    ``main``.
    """
    marker = last_committed_batch(metadata.properties, query_id, sink_id)
    index = index or SnapshotIndex(metadata)
    head = index.head(branch)
    if marker is not None and marker.branch == branch:
        if index.get(marker.snapshot_id) is None:
            return marker  # expired: trust the marker
        if marker.empty and head is not None and head.snapshot_id == marker.snapshot_id:
            return marker
        if index.is_ancestor(marker.snapshot_id, head):
            return marker
    for snapshot in index.ancestors(head):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(SUMMARY_QUERY_ID) == query_id and SUMMARY_BATCH_ID in props and summary_sink_id(props) == sink_id:
            return CommittedBatch(
                int(props[SUMMARY_BATCH_ID]),
                snapshot.snapshot_id,
                props.get(SUMMARY_COMMIT_ID, ""),
                branch=branch,
                run_id=props.get(SUMMARY_RUN_ID),
                offsets=offsets_digest(props.get(SUMMARY_SOURCE_OFFSETS)),
                watermark=_int_or_none(props.get(SUMMARY_WATERMARK)),
                event_time_max=_int_or_none(props.get(SUMMARY_EVENT_TIME_MAX)),
                tables=props.get(SUMMARY_BATCH_TABLES_DIGEST),
                rows=props.get(SUMMARY_BATCH_ROWS_DIGEST),
            )
    return None


def find_batch_snapshot(metadata: TableMetadata, query_id: str, batch_id: int, sink_id: str | None = None) -> Snapshot | None:
    """The snapshot that committed (query id, sink id, batch id), searched in the metadata (no file read)."""
    for snapshot in reversed(metadata.snapshots):
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if (
            props.get(SUMMARY_QUERY_ID) == query_id
            and props.get(SUMMARY_BATCH_ID) == str(batch_id)
            and summary_sink_id(props) == sink_id
        ):
            return snapshot
    return None


def recorded_tables(
    metadata: TableMetadata, done: CommittedBatch, query_id: str, batch_id: int, sink_id: str | None
) -> str | None:
    """Option route-by: the digest of the set of tables batch ``batch_id`` was committed to, as ``done`` (the sink's
    last batch in the table, at or after ``batch_id``) records it: its marker, else the batch's snapshot summary
    (``lakesink.batch-tables-digest``); None when neither tells (an expired snapshot of an older marker)."""
    if done.batch_id == batch_id and done.tables is not None:
        return done.tables
    return _batch_summary_value(metadata, done, query_id, batch_id, sink_id, SUMMARY_BATCH_TABLES_DIGEST)


def recorded_rows(metadata: TableMetadata, done: CommittedBatch, query_id: str, batch_id: int, sink_id: str | None) -> str | None:
    """Option route-by: the digest of the rows batch ``batch_id`` routed to this table, as :func:`recorded_tables`
    finds the set of tables (the marker, else the batch's snapshot summary, ``lakesink.batch-rows-digest``); None when
    neither tells (a batch committed before lakesink recorded it, or an expired snapshot of an older marker)."""
    if done.batch_id == batch_id and done.rows is not None:
        return done.rows
    return _batch_summary_value(metadata, done, query_id, batch_id, sink_id, SUMMARY_BATCH_ROWS_DIGEST)


def _batch_summary_value(
    metadata: TableMetadata, done: CommittedBatch, query_id: str, batch_id: int, sink_id: str | None, key: str
) -> str | None:
    """``key`` of batch ``batch_id``'s snapshot summary (``done``'s snapshot when it is that batch); None when the
    snapshot is gone, or the batch was empty."""
    if done.batch_id == batch_id:
        snapshot = None if done.empty else SnapshotIndex(metadata).get(done.snapshot_id)
    else:
        snapshot = find_batch_snapshot(metadata, query_id, batch_id, sink_id)
    props = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    return props.get(key)


def batch_summary(
    query_id: str,
    batch_id: int,
    commit_id: str,
    source_offsets: str | None,
    *,
    previous_batch_id: int | None = None,
    started_ms: int | None = None,
    sink_id: str | None = None,
    run_id: str | None = None,
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
    if sink_id is not None:
        summary[SUMMARY_SINK_ID] = sink_id
    if run_id is not None:
        summary[SUMMARY_RUN_ID] = run_id
    return summary


def landed_commit(metadata: TableMetadata, branch: str, commit_id: str) -> CommittedBatch | None:
    """The maintenance commit ``commit_id`` (summary ``lakesink.commit-id``) among the branch head's newest
    ancestors, if it landed: the re-check of a maintenance commit's swap loop."""
    index = SnapshotIndex(metadata)
    for depth, s in enumerate(index.ancestors(metadata.snapshot_by_name(branch))):
        if depth >= _RECHECK_DEPTH:
            break
        props = s.summary.additional_properties if s.summary else {}
        if props.get(SUMMARY_COMMIT_ID) == commit_id:
            return CommittedBatch(0, s.snapshot_id, commit_id, branch=branch)
    return None
