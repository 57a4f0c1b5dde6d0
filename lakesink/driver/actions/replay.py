"""A batch found committed: skipped only when it is a faithful replay of the committed one (another run of the query,
over the same source offsets) -- for every committer and every action that finds its batch landed by another call
(lakesink.driver.committers.table: a table's commit, a replay found at plan time, a routed unit's member)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from pyiceberg.table import Table

from lakesink.errors import DuplicateSinkError, ReplayMismatchError
from lakesink.options import SINK_ID, SinkOptions
from lakesink.table.keys import SUMMARY_SOURCE_OFFSETS
from lakesink.table.markers import CommittedBatch, find_batch_snapshot, offsets_digest, recorded_rows

log = logging.getLogger("lakesink")


class Sink(Protocol):
    """What a replay check reads of the sink (lakesink.driver.actions.batch.SinkContext)."""

    @property
    def name(self) -> str: ...

    @property
    def sink_id(self) -> str | None: ...


class Call(Protocol):
    """What a replay check reads of the batch (lakesink.driver.actions.batch.Batch)."""

    @property
    def query_id(self) -> str: ...

    @property
    def batch_id(self) -> int: ...

    @property
    def run_id(self) -> str | None: ...

    @property
    def source_offsets(self) -> str | None: ...


class Options(Protocol):
    """A table's sink as :func:`counted_only` reads it (its options)."""

    @property
    def options(self) -> SinkOptions: ...


def check_replay(c: Sink, table: Table, batch: Call, done: CommittedBatch) -> None:
    """A batch found committed is skipped only when it is a faithful replay of the committed one.

    Raises DuplicateSinkError when the batch was committed by the same run of the query (a second sink with
    the same sink id), and ReplayMismatchError when it was committed over other source offsets.
    """
    if batch.run_id is not None and done.batch_id == batch.batch_id and done.run_id == batch.run_id:
        raise DuplicateSinkError(
            f"batch {batch.batch_id} of query {batch.query_id} was already committed to {c.name} by this "
            f"same run of the query under sink id {c.sink_id or '(default)'}: two sinks of one query "
            "write this table in the same batch (two lakesink calls in one foreachBatch function, or two "
            "foreach_batch objects). Each would be taken for a replay of the other and skipped. Give each sink its "
            f"own sink_id (foreach_batch(..., sink_id='audit') / option '{SINK_ID}'): keep the sink that committed "
            "first as it is, so that a restart finds its batches, and give the other one a new id; the rows of "
            "this call were not committed, and a restart writes them once the sinks have ids of their own (a restart "
            "without would take them for a replay)"
        )
    committed, digest = _committed_offsets(c, table, batch, done)
    mine = offsets_digest(batch.source_offsets)
    if digest is None or mine is None:
        log.warning(
            "lakesink: table=%s query=%s batch=%s is already committed; its source offsets cannot be compared "
            "(%s), so it is skipped as a replay of the same input",
            c.name,
            batch.query_id,
            batch.batch_id,
            "the checkpoint's offsets of the batch are not readable"
            if mine is None
            else "the committing snapshot records none or has expired",
        )
        return
    if digest != mine:
        raise ReplayMismatchError(
            f"Spark replays batch {batch.batch_id} of query {batch.query_id} over other source offsets than the "
            f"batch committed to {c.name}: committed {committed or '(digest ' + digest + ')'}, replayed "
            f"{batch.source_offsets}. The checkpoint was changed by hand (offsets/{batch.batch_id} rewritten) or a "
            "source's rate limit changed: skipping the batch would lose the new rows, committing it would duplicate "
            "the committed ones. Nothing was committed or deleted. To recover: restore the checkpoint's "
            f"offsets/{batch.batch_id} to the committed offsets and restart, or start a new query (new checkpoint) "
            "from the committed offsets (docs/protocol.md, 'replay over other input')"
        )


def _committed_offsets(c: Sink, table: Table, batch: Call, done: CommittedBatch) -> tuple[str | None, str | None]:
    """The committed batch's source offsets (full text when its snapshot is still there) and their digest."""
    if done.batch_id == batch.batch_id:
        snapshot = None if done.empty else table.metadata.snapshot_by_id(done.snapshot_id)
        props = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
        return props.get(SUMMARY_SOURCE_OFFSETS), done.offsets
    snapshot = find_batch_snapshot(table.metadata, batch.query_id, batch.batch_id, c.sink_id)
    if snapshot is None:
        return None, None
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    text = props.get(SUMMARY_SOURCE_OFFSETS)
    return text, offsets_digest(text)


def counted_only(
    held: Sequence[tuple[str, Options, Table, CommittedBatch]], missing: Sequence[str], query_id: str, batch_id: int
) -> list[str]:
    """Of the tables holding a batch that a replay finds in some of its tables only (``missing``: the others), those
    whose commit recorded its rows as a count alone (``lakesink.batch-rows-digest`` ``<rows>``: route-by with
    writer='spark' committing the batch's tables as one unit, lakesink.sink.spark.split), which no replay can be
    compared with. Empty when the batch is in every table or in none."""
    if not held or not missing:
        return []
    out = []
    for name, c, table, done in held:
        recorded = recorded_rows(table.metadata, done, query_id, batch_id, c.options.sink_id)
        if recorded is not None and ":" not in recorded:
            out.append(name)
    return out


def counted_only_error(query_id: str, batch_id: int, counted: Sequence[str], missing: Sequence[str]) -> ReplayMismatchError:
    return ReplayMismatchError(
        f"Spark replays batch {batch_id} of query {query_id}, which is in some of its tables only "
        f"({', '.join(sorted(counted))} hold it; {', '.join(sorted(missing))} not), and the tables that hold it recorded "
        "the batch's rows as a count alone (route-by with writer='spark' on a catalog that committed the batch's tables "
        "as one unit: lakesink.batch-rows-digest '<rows>'). As one unit the batch was committed to all its tables, so "
        "the others lost it since (a table dropped and created again, or rolled back), and a count cannot tell whether "
        "this replay routes every row as the batch did: a route computed from something that changed since (a lookup) "
        "would put a row in two tables and lose another. Nothing was committed in any table and this replay's files "
        "were deleted. To go on, either leave the batch as it is -- in the tables that hold it and not in the others, as "
        f"a run without the restart would have left it -- by recording batch {batch_id} done in Spark's checkpoint "
        f"(write <checkpoint>/commits/{batch_id} as Spark writes it: the line 'v1', then "
        "'{\"nextBatchWatermarkMs\":0}', or a copy of the previous batch's commits file) and restarting; or restore the "
        "tables that lost it; or start a new query (new checkpoint) from the committed offsets (docs/routing.md, "
        "'The row digest on this path')"
    )
