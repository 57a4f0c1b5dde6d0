"""Audit the tables lakesink writes: which batch wrote what, when (driver side, catalog only).

Every snapshot lakesink commits carries its streaming query id, batch id and source offsets in the
snapshot summary (:mod:`lakesink.properties`); :func:`history` turns the table's snapshots into one
record per snapshot, marking those written by other writers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pyiceberg.table import Table

from lakesink.properties import SUMMARY_BATCH_ID, SUMMARY_COMMIT_ATTEMPT, SUMMARY_QUERY_ID, SUMMARY_SOURCE_OFFSETS

LAKESINK = "lakesink"
OTHER = "other writer"


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(props: dict[str, str], key: str) -> int:
    value = props.get(key)
    return int(value) if value is not None else 0


def history(table: Table) -> list[SnapshotRecord]:
    """Every snapshot still in the table's metadata, oldest first."""
    main_ancestry: set[int] = set()
    snapshot = table.metadata.snapshot_by_name("main")
    while snapshot is not None:
        main_ancestry.add(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.metadata.snapshot_by_id(parent) if parent is not None else None
    records = []
    for s in sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms)):
        props = dict(s.summary.additional_properties) if s.summary else {}
        query_id = props.get(SUMMARY_QUERY_ID)
        batch = props.get(SUMMARY_BATCH_ID)
        attempt = props.get(SUMMARY_COMMIT_ATTEMPT)
        records.append(
            SnapshotRecord(
                snapshot_id=s.snapshot_id,
                parent_id=s.parent_snapshot_id,
                sequence_number=s.sequence_number,
                timestamp_ms=s.timestamp_ms,
                operation=s.summary.operation.value if s.summary else None,
                writer=LAKESINK if query_id is not None and batch is not None else OTHER,
                query_id=query_id,
                batch_id=int(batch) if batch is not None else None,
                source_offsets=props.get(SUMMARY_SOURCE_OFFSETS),
                commit_attempt=int(attempt) if attempt is not None else None,
                added_records=_int(props, "added-records"),
                deleted_records=_int(props, "deleted-records"),
                added_files=_int(props, "added-data-files"),
                deleted_files=_int(props, "deleted-data-files"),
                added_bytes=_int(props, "added-files-size"),
                on_main=s.snapshot_id in main_ancestry,
            )
        )
    return records
