"""How far a table is complete: the event-time watermark its lakesink queries recorded (driver side, catalog only).

Every batch of a query with ``withWatermark`` records ``lakesink.watermark`` (:mod:`lakesink.driver.completeness`):
in its snapshot's summary and in the query's replay marker (an empty batch, which has no snapshot, in the marker
only). A table's watermark on a branch is the **smallest** of the watermarks of the queries that recorded one on
that branch: rows with an event time before it are in the table, as far as each query's watermark promises
(docs/auditing.md, "Completeness": late rows, several queries, idle source partitions). A query that no longer
writes the table holds it back until it is forgotten (``lakesink forget-query`` removes its replay marker), or leave it
out with ``queries``.

:func:`wait_for_watermark` is the sensor: ``lakesink wait``, or an Airflow / Dagster sensor's poke.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from pyiceberg.table import Table

from lakesink.audit.snapshots import summary_of
from lakesink.errors import AuditError
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_QUERY_ID, SUMMARY_WATERMARK
from lakesink.table.markers import SnapshotIndex, last_committed_on_branch, parse_last_batch_key, summary_sink_id


@dataclass(frozen=True)
class QueryWatermark:
    """One query's (and sink's) latest recorded watermark on a branch."""

    query_id: str
    sink_id: str | None
    watermark_ms: int
    batch_id: int


@dataclass(frozen=True)
class TableWatermark:
    """A table's watermark on a branch: the smallest of its queries' (None: no query recorded one)."""

    branch: str
    watermark_ms: int | None
    queries: tuple[QueryWatermark, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WaitResult:
    """What :func:`wait_for_watermark` saw: whether the table reached ``target_ms``, and its watermark when it stopped."""

    reached: bool
    target_ms: int
    watermark: TableWatermark
    polls: int

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "watermark": self.watermark.to_dict()}


def table_watermark(table: Table, *, branch: str = MAIN_BRANCH, queries: Collection[str] | None = None) -> TableWatermark:
    """The table's watermark on ``branch``: for every lakesink query (and sink) of the table -- those with a replay
    marker: ``lakesink forget-query`` retires one -- whose batches on the branch recorded a watermark, the one its last
    batch there recorded (the replay marker when it names this branch and is in its history, so empty batches count;
    else the newest snapshot of the query in the branch's history, e.g. on ``main`` after a publish); the smallest of
    them. ``queries``: only these query ids."""
    metadata = table.metadata
    if branch != MAIN_BRANCH and metadata.refs.get(branch) is None:
        raise AuditError(f"branch {branch!r} of the table does not exist")
    index = SnapshotIndex(metadata)
    sinks: set[tuple[str, str | None]] = set()
    for key in metadata.properties:
        parsed = parse_last_batch_key(key)
        if parsed is not None:
            sinks.add(parsed)
    found = []
    for query_id, sink_id in sorted(sinks, key=lambda s: (s[0], s[1] or "")):
        if queries is not None and query_id not in queries:
            continue
        done = last_committed_on_branch(metadata, query_id, branch, sink_id, index=index)
        if done is not None and done.watermark is not None:
            found.append(QueryWatermark(query_id, sink_id, done.watermark, done.batch_id))
    missing = sorted(set(queries or ()) - {q.query_id for q in found})
    if missing:
        raise AuditError(f"no watermark recorded on branch {branch!r} by query(ies) {', '.join(missing)}")
    return TableWatermark(branch, min((q.watermark_ms for q in found), default=None), tuple(found))


def wait_for_watermark(
    table: Table,
    target_ms: int,
    *,
    timeout_s: float | None = None,
    poll_s: float = 5.0,
    branch: str = MAIN_BRANCH,
    queries: Collection[str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> WaitResult:
    """Wait until the table's watermark on ``branch`` (:func:`table_watermark`) is at or past ``target_ms`` (ms since
    the epoch): every row with an earlier event time is then committed, as far as the queries' watermarks promise.

    Reads the table's metadata from its catalog every ``poll_s`` seconds; gives up after ``timeout_s`` seconds
    (None: never; 0: look once). Returns a :class:`WaitResult` (``reached`` False on timeout) -- an Airflow or
    Dagster sensor's poke is ``wait_for_watermark(table, t, timeout_s=0).reached``.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    polls = 0
    while True:
        polls += 1
        if polls > 1:
            table = table.refresh()
        mark = table_watermark(table, branch=branch, queries=queries)
        if mark.watermark_ms is not None and mark.watermark_ms >= target_ms:
            return WaitResult(True, target_ms, mark, polls)
        if deadline is not None and time.monotonic() + poll_s > deadline:
            if time.monotonic() < deadline:
                sleep(max(0.0, deadline - time.monotonic()))
                table = table.refresh()
                polls += 1
                mark = table_watermark(table, branch=branch, queries=queries)
            return WaitResult(mark.watermark_ms is not None and mark.watermark_ms >= target_ms, target_ms, mark, polls)
        sleep(poll_s)


def first_snapshot_through(table: Table, branch: str, target_ms: int, *, after: int | None) -> tuple[int | None, int | None]:
    """The oldest snapshot of ``branch``'s history after snapshot ``after`` (exclusive; None: from the start) whose
    watermark -- the smallest over the queries that recorded one in its history, from its own ancestry's summaries --
    is at or past ``target_ms``: (its id or None, the branch head's watermark so computed)."""
    index = SnapshotIndex(table.metadata)
    chain = list(index.ancestors(index.head(branch)))
    chain.reverse()  # oldest first
    latest: dict[tuple[str, str | None], int] = {}
    found: int | None = None
    started = after is None
    for snapshot in chain:
        props = summary_of(snapshot)
        if SUMMARY_WATERMARK in props and SUMMARY_QUERY_ID in props:
            latest[(props[SUMMARY_QUERY_ID], summary_sink_id(props))] = int(props[SUMMARY_WATERMARK])
        if started and found is None and latest and min(latest.values()) >= target_ms:
            found = snapshot.snapshot_id
        if snapshot.snapshot_id == after:
            started = True
    return found, min(latest.values()) if latest else None
