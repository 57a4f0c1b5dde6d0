"""How far a table is complete: the event-time watermark its lakesink queries recorded (driver side, catalog only).

Every batch of a query with ``withWatermark`` records ``lakesink.watermark`` (:mod:`lakesink.driver.actions.completeness`):
in its snapshot's summary and in the query's replay marker (an empty batch, which has no snapshot, in the marker
only). A table's watermark on a branch is the **smallest** of the watermarks of the queries that write that
branch: rows with an event time before it are in the table, as far as each query's watermark promises
(docs/auditing.md, "Completeness": late rows, several queries, idle source partitions). A query that records no
watermark (no ``withWatermark``) promises nothing about event times: while it writes the branch, the table has no
watermark (complete through no time), it is not left out. A query that no longer writes the table holds it back until
it is forgotten (``lakesink forget-query`` removes its replay marker), or leave it out with ``queries``.

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
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_BATCH_ID, SUMMARY_QUERY_ID, SUMMARY_WATERMARK
from lakesink.table.markers import SnapshotIndex, last_committed_on_branch, parse_last_batch_key, summary_sink_id


@dataclass(frozen=True)
class QueryWatermark:
    """One query's (and sink's) latest recorded watermark on a branch."""

    query_id: str
    sink_id: str | None
    watermark_ms: int | None
    """None: the query's last batch on the branch records no watermark (the query has no ``withWatermark``)."""
    batch_id: int


@dataclass(frozen=True)
class TableWatermark:
    """A table's watermark on a branch: the smallest of its queries'. None when no query wrote the branch, or when one
    of them records no watermark (:attr:`without_watermark`): then the table is complete through no time."""

    branch: str
    watermark_ms: int | None
    queries: tuple[QueryWatermark, ...] = field(default=())

    @property
    def without_watermark(self) -> tuple[QueryWatermark, ...]:
        """The queries writing the branch that record no watermark (each keeps the table's watermark at None)."""
        return tuple(q for q in self.queries if q.watermark_ms is None)

    def why_none(self) -> str | None:
        """Why the table has no watermark (None when it has one)."""
        if self.watermark_ms is not None:
            return None
        if not self.queries:
            return f"no lakesink query has committed to branch {self.branch!r} (with a replay marker) yet"
        who = ", ".join(q.query_id + (f" (sink {q.sink_id})" if q.sink_id else "") for q in self.without_watermark)
        return (
            f"query(ies) {who} write branch {self.branch!r} without recording a watermark (no withWatermark): they promise "
            "nothing about event times. Define a watermark in the query, forget a query that no longer writes the table "
            "(lakesink forget-query), or ask about the other queries only (--query / queries=)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "why_none": self.why_none()}


#: :attr:`WaitResult.outcome`: the watermark is at or past the target.
REACHED = "reached"
#: :attr:`WaitResult.outcome`: the timeout passed with the watermark before the target.
TIMED_OUT = "timed-out"
#: :attr:`WaitResult.outcome`: the table has no watermark (:meth:`TableWatermark.why_none`); without a timeout,
#: :func:`wait_for_watermark` says so at once instead of waiting for ever.
NO_WATERMARK = "no-watermark"


@dataclass(frozen=True)
class WaitResult:
    """What :func:`wait_for_watermark` saw: whether the table reached ``target_ms``, and its watermark when it stopped."""

    reached: bool
    target_ms: int
    watermark: TableWatermark
    polls: int
    outcome: str = REACHED
    """:data:`REACHED`, :data:`TIMED_OUT` or :data:`NO_WATERMARK`."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "watermark": self.watermark.to_dict()}


def _result(mark: TableWatermark, target_ms: int, polls: int) -> WaitResult:
    reached = mark.watermark_ms is not None and mark.watermark_ms >= target_ms
    outcome = REACHED if reached else TIMED_OUT if mark.watermark_ms is not None else NO_WATERMARK
    return WaitResult(reached, target_ms, mark, polls, outcome)


def table_watermark(table: Table, *, branch: str = MAIN_BRANCH, queries: Collection[str] | None = None) -> TableWatermark:
    """The table's watermark on ``branch``: for every lakesink query (and sink) of the table -- those with a replay
    marker: ``lakesink forget-query`` retires one -- that committed a batch on the branch, the watermark its last batch
    there recorded (the replay marker when it names this branch and is in its history, so empty batches count; else
    the newest snapshot of the query in the branch's history, e.g. on ``main`` after a publish); the smallest of them,
    None when one of them recorded none (a query without a watermark promises nothing). ``queries``: only these
    query ids."""
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
        if done is not None:  # None: the query never committed to this branch (it writes another one)
            found.append(QueryWatermark(query_id, sink_id, done.watermark, done.batch_id))
    missing = sorted(set(queries or ()) - {q.query_id for q in found})
    if missing:
        raise AuditError(f"no batch committed on branch {branch!r} by query(ies) {', '.join(missing)}")
    return TableWatermark(branch, _smallest([q.watermark_ms for q in found]), tuple(found))


def wait_for_watermark(
    table: Table,
    target_ms: int,
    *,
    timeout_s: float | None = None,
    poll_s: float = 5.0,
    branch: str = MAIN_BRANCH,
    queries: Collection[str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[TableWatermark], None] | None = None,
) -> WaitResult:
    """Wait until the table's watermark on ``branch`` (:func:`table_watermark`) is at or past ``target_ms`` (ms since
    the epoch): every row with an earlier event time is then committed, as far as the queries' watermarks promise.

    Reads the table's metadata from its catalog every ``poll_s`` seconds; gives up after ``timeout_s`` seconds
    (0: look once). ``timeout_s=None``: no time limit while the table has a watermark; a table without one (no query
    wrote the branch yet, or one writes it without a watermark: :meth:`TableWatermark.why_none`) is answered at once,
    outcome :data:`NO_WATERMARK`, instead of waiting for ever -- give a timeout to wait for a query to start.
    ``on_wait``: called with the watermark read, each time before a pause. Returns a :class:`WaitResult` (``reached``
    False on timeout or without a watermark) -- an Airflow or Dagster sensor's poke is
    ``wait_for_watermark(table, t, timeout_s=0).reached``.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    polls = 0
    while True:
        polls += 1
        if polls > 1:
            table = table.refresh()
        mark = table_watermark(table, branch=branch, queries=queries)
        if mark.watermark_ms is not None and mark.watermark_ms >= target_ms:
            return _result(mark, target_ms, polls)
        if deadline is None and mark.watermark_ms is None:
            return _result(mark, target_ms, polls)  # nothing to wait for: say so now
        if deadline is not None and time.monotonic() + poll_s > deadline:
            if time.monotonic() < deadline:
                if on_wait is not None:
                    on_wait(mark)
                sleep(max(0.0, deadline - time.monotonic()))
                table = table.refresh()
                polls += 1
                mark = table_watermark(table, branch=branch, queries=queries)
            return _result(mark, target_ms, polls)
        if on_wait is not None:
            on_wait(mark)
        sleep(poll_s)


def first_snapshot_through(table: Table, branch: str, target_ms: int, *, after: int | None) -> tuple[int | None, int | None]:
    """The oldest snapshot of ``branch``'s history after snapshot ``after`` (exclusive; None: from the start) whose
    watermark -- the smallest over the queries of its history, from its own ancestry's summaries; none while the last
    batch there of a query that still has a replay marker recorded none -- is at or past ``target_ms``: (its id or
    None, the branch head's watermark so computed)."""
    writers = {p for key in table.metadata.properties if (p := parse_last_batch_key(key)) is not None}
    index = SnapshotIndex(table.metadata)
    chain = list(index.ancestors(index.head(branch)))
    chain.reverse()  # oldest first
    latest: dict[tuple[str, str | None], int | None] = {}
    found: int | None = None
    started = after is None
    for snapshot in chain:
        props = summary_of(snapshot)
        sink = (props.get(SUMMARY_QUERY_ID, ""), summary_sink_id(props))
        if SUMMARY_WATERMARK in props and SUMMARY_QUERY_ID in props:
            latest[sink] = int(props[SUMMARY_WATERMARK])
        elif SUMMARY_QUERY_ID in props and SUMMARY_BATCH_ID in props and sink in writers:
            latest[sink] = None  # a query without a watermark, not forgotten: complete through no time
        now = _smallest(latest.values())
        if started and found is None and now is not None and now >= target_ms:
            found = snapshot.snapshot_id
        if snapshot.snapshot_id == after:
            started = True
    return found, _smallest(latest.values())


def _smallest(marks: Collection[int | None]) -> int | None:
    """The smallest watermark; None when there is none or one of them is None (a query that promises nothing)."""
    if not marks or None in marks:
        return None
    return min(m for m in marks if m is not None)
