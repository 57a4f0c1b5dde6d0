"""Reading lakesink's snapshots: summary properties, (query id, batch id) keys, a branch's ancestry."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

from lakesink.errors import AuditError
from lakesink.table.keys import (
    MAIN_BRANCH,
    OPERATION_COMPACT,
    OPERATION_REWRITE_MANIFESTS,
    OPERATION_REWRITE_POSITION_DELETES,
    SUMMARY_BATCH_ID,
    SUMMARY_QUERY_ID,
    SUMMARY_SINK_ID,
)

LAKESINK = "lakesink"
OTHER = "other writer"
#: The writer of a snapshot of lakesink's compaction (``lakesink.operation=compact``, an Iceberg replace).
COMPACTION = "lakesink compaction"
#: The writer of a snapshot of lakesink's manifest rewrite (``lakesink.operation=rewrite-manifests``, a replace).
MANIFEST_REWRITE = "lakesink manifest rewrite"
#: The writer of a snapshot of lakesink's rewrite of position deletes (``lakesink.operation=rewrite-position-deletes``).
POSITION_DELETE_REWRITE = "lakesink position delete rewrite"
#: ``lakesink.operation`` of lakesink's maintenance snapshots -> their writer.
MAINTENANCE_WRITERS = {
    OPERATION_COMPACT: COMPACTION,
    OPERATION_REWRITE_MANIFESTS: MANIFEST_REWRITE,
    OPERATION_REWRITE_POSITION_DELETES: POSITION_DELETE_REWRITE,
}

T = TypeVar("T")


def int_property(props: dict[str, str], key: str) -> int:
    """An integer snapshot summary value, 0 when absent."""
    value = props.get(key)
    return int(value) if value is not None else 0


def opt_int_property(props: dict[str, str], key: str) -> int | None:
    """An integer snapshot summary value, None when absent."""
    value = props.get(key)
    return int(value) if value is not None else None


def summary_of(snapshot: Snapshot) -> dict[str, str]:
    """A snapshot's summary properties (empty when it has no summary)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def lakesink_key(snapshot: Snapshot) -> tuple[str, int] | None:
    """(query id, batch id) of a snapshot lakesink committed, None for other writers' snapshots."""
    props = summary_of(snapshot)
    query_id, batch = props.get(SUMMARY_QUERY_ID), props.get(SUMMARY_BATCH_ID)
    return (query_id, int(batch)) if query_id is not None and batch is not None else None


def sink_of(snapshot: Snapshot) -> str | None:
    """The ``sink_id`` of the lakesink sink that committed a snapshot (None: the query's default sink)."""
    return summary_of(snapshot).get(SUMMARY_SINK_ID) or None


def ancestry(table: Table, branch: str = MAIN_BRANCH) -> list[Snapshot]:
    """The snapshots in the history of ``branch``, oldest first (empty when the branch has none)."""
    return list(reversed(list(ancestors_of(table.metadata.snapshot_by_name(branch), table.metadata))))


def progress(items: Sequence[T], description: str, *, enabled: bool | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr when it is a terminal (``enabled=None``) and there is much to do."""
    show = (sys.stderr.isatty() if enabled is None else enabled) and len(items) > 1
    if not show:
        yield from items
        return
    from rich.console import Console
    from rich.progress import track

    yield from track(items, description=description, total=len(items), console=Console(stderr=True), transient=True)


def match_query_id(given: str, known: Iterable[str]) -> str | None:
    """The query id that ``given`` names among ``known``: itself, or the one id that starts with it (``lakesink
    history`` prints a query id's first 8 characters); None when no id is or starts with it. A prefix that starts
    several ids is an AuditError listing them."""
    ids = sorted(set(known))
    if given in ids:
        return given
    hits = [q for q in ids if given and q.startswith(given)]
    if len(hits) > 1:
        raise AuditError(
            f"query id {given!r} is ambiguous: {len(hits)} queries start with it: {', '.join(hits)}; give more of the id"
        )
    return hits[0] if hits else None
