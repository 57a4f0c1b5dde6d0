"""One record per snapshot of a table, as an auditor reads it (:func:`history`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pyiceberg.table import Table

from lakesink.audit.key_diff import upsert_counts
from lakesink.audit.snapshots import (
    LAKESINK,
    MAINTENANCE_WRITERS,
    OTHER,
    ancestry,
    int_property,
    lakesink_key,
    opt_int_property,
    sink_of,
    summary_of,
)
from lakesink.errors import AuditError
from lakesink.table.keys import (
    MAIN_BRANCH,
    SUMMARY_COMMIT_ATTEMPT,
    SUMMARY_COMMIT_STARTED_MS,
    SUMMARY_DEAD_LETTER_TABLE,
    SUMMARY_DEAD_LETTERS,
    SUMMARY_OPERATION,
    SUMMARY_PREVIOUS_BATCH_ID,
    SUMMARY_RUN_ID,
    SUMMARY_SOURCE_OFFSETS,
)


@dataclass(frozen=True)
class SnapshotRecord:
    """One snapshot of a table, as an auditor reads it."""

    snapshot_id: int
    parent_id: int | None
    sequence_number: int | None
    timestamp_ms: int
    operation: str | None
    writer: str
    """``lakesink`` for a snapshot committed by lakesink, ``other writer`` otherwise."""
    query_id: str | None
    batch_id: int | None
    source_offsets: str | None
    commit_attempt: int | None
    added_records: int
    deleted_records: int
    added_files: int
    deleted_files: int
    added_bytes: int
    on_main: bool
    """Whether the snapshot is in the history of the ``main`` branch (not only of another branch or tag)."""
    previous_batch_id: int | None = None
    """The last batch id the query processed before this batch (empty batches included), when recorded."""
    commit_latency_ms: int | None = None
    """From the driver starting the commit to the snapshot's timestamp (re-check, manifests), when recorded."""
    total_records: int | None = None
    total_files: int | None = None
    branches: tuple[str, ...] = ()
    """The branches whose history contains the snapshot."""
    upserted: tuple[int, int, int] | None = None
    """An upsert batch's rows (inserted, updated, deleted), from its summary (docs/upserts.md); None otherwise."""
    dead_letters: int | None = None
    """Option dead-letter-table: the batch's rows that went to the dead-letter table (docs/dead-letters.md)."""
    dead_letter_table: str | None = None
    run_id: str | None = None
    """Spark's run id of the query run that committed the batch (a new one at every restart), when recorded."""
    restarted: bool = False
    """The first batch of its query (and sink) committed by another run than the query's previous batch in this
    table: the query was restarted between the two. A batch Spark replays after a restart and lakesink skips (the
    table holds it) commits nothing, so it has no record of its own."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def history(table: Table, branch: str | None = None) -> list[SnapshotRecord]:
    """Every snapshot still in the table's metadata, oldest first; with ``branch``, only those in that branch's
    history (AuditError naming the branches when the table has no such branch)."""
    if branch is not None:
        known = sorted(n for n, r in table.metadata.refs.items() if r.snapshot_ref_type.value == "branch")
        if branch not in known:
            raise AuditError(
                f"table {'.'.join(table.name())} has no branch {branch!r}; its branches: {', '.join(known) or 'none'}"
            )
    on_branches: dict[int, list[str]] = {}
    for name, ref in sorted(table.metadata.refs.items()):
        if ref.snapshot_ref_type.value == "branch":
            for s in ancestry(table, name):
                on_branches.setdefault(s.snapshot_id, []).append(name)
    records = []
    runs: dict[tuple[str, str | None], str] = {}  # (query id, sink id) -> the run id of its last batch so far
    for s in sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        props = summary_of(s)
        key = lakesink_key(s)
        started = opt_int_property(props, SUMMARY_COMMIT_STARTED_MS)
        branches = tuple(on_branches.get(s.snapshot_id, ()))
        run_id = props.get(SUMMARY_RUN_ID) or None
        restarted = False
        if key is not None and run_id is not None:
            before = runs.get((key[0], sink_of(s)))
            restarted = before is not None and before != run_id
            runs[(key[0], sink_of(s))] = run_id
        records.append(
            SnapshotRecord(
                snapshot_id=s.snapshot_id,
                parent_id=s.parent_snapshot_id,
                sequence_number=s.sequence_number,
                timestamp_ms=s.timestamp_ms,
                operation=s.summary.operation.value if s.summary else None,
                writer=LAKESINK if key is not None else MAINTENANCE_WRITERS.get(props.get(SUMMARY_OPERATION, ""), OTHER),
                query_id=key[0] if key else None,
                batch_id=key[1] if key else None,
                source_offsets=props.get(SUMMARY_SOURCE_OFFSETS),
                commit_attempt=opt_int_property(props, SUMMARY_COMMIT_ATTEMPT),
                added_records=int_property(props, "added-records"),
                deleted_records=int_property(props, "deleted-records"),
                added_files=int_property(props, "added-data-files"),
                deleted_files=int_property(props, "deleted-data-files"),
                added_bytes=int_property(props, "added-files-size"),
                on_main=MAIN_BRANCH in branches,
                previous_batch_id=opt_int_property(props, SUMMARY_PREVIOUS_BATCH_ID),
                commit_latency_ms=s.timestamp_ms - started if started is not None else None,
                total_records=opt_int_property(props, "total-records"),
                total_files=opt_int_property(props, "total-data-files"),
                branches=branches,
                upserted=upsert_counts(props),
                dead_letters=opt_int_property(props, SUMMARY_DEAD_LETTERS),
                dead_letter_table=props.get(SUMMARY_DEAD_LETTER_TABLE),
                run_id=run_id,
                restarted=restarted,
            )
        )
    return records if branch is None else [r for r in records if branch in r.branches]
