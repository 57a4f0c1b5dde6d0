"""Audit the tables lakesink writes: which batch wrote what, when (driver side, catalog only).

Every snapshot lakesink commits carries its streaming query id, batch id and source offsets in the
snapshot summary (:mod:`lakesink.table.markers`). From the catalog alone this package answers:

- :func:`history` (:mod:`.timeline`): one record per snapshot, marking those written by other writers;
- :func:`resolve` / :func:`read_at` (:mod:`.points`): the table as of a batch, a snapshot id or a timestamp;
- :func:`diff` (:mod:`.changes`): the rows added and removed between two points, from the snapshots'
  manifests (only the data files that differ are read);
- :func:`locate` (:mod:`.provenance`): which snapshot, query and batch wrote the rows matching a filter, or a file;
- :func:`verify` (:mod:`.invariants`): the exactly-once invariants, with one :class:`Violation` per problem found;
- :func:`publish` (:mod:`.publishing`): fast-forward ``main`` to an audited branch (write-audit-publish).

Shared by them: :mod:`.snapshots` (summary keys, a branch's ancestry) and :mod:`.manifests` (each
manifest read once per audit).
"""

from __future__ import annotations

from lakesink.audit.invariants import (
    BATCH_GAP,
    DUPLICATE_BATCH,
    FILE_SIZE,
    MARKER_BEHIND,
    MISSING_FILE,
    SUMMARY_MISMATCH,
    UNREADABLE_MANIFEST,
    QueryBatches,
    VerifyReport,
    Violation,
    verify,
)
from lakesink.audit.manifests import Manifests, read_files
from lakesink.audit.points import (
    Point,
    dataframe_at,
    format_ms,
    parse_timestamp_ms,
    query_ids,
    read_at,
    resolve,
    scan_at,
    the_query,
)
from lakesink.audit.provenance import locate
from lakesink.audit.publishing import PublishResult, publish
from lakesink.audit.row_diff import Diff, diff
from lakesink.audit.snapshots import LAKESINK, OTHER, ancestry, lakesink_key, progress, summary_of
from lakesink.audit.timeline import SnapshotRecord, history

__all__ = [
    "BATCH_GAP",
    "DUPLICATE_BATCH",
    "FILE_SIZE",
    "LAKESINK",
    "MARKER_BEHIND",
    "MISSING_FILE",
    "OTHER",
    "SUMMARY_MISMATCH",
    "UNREADABLE_MANIFEST",
    "Diff",
    "Manifests",
    "Point",
    "PublishResult",
    "QueryBatches",
    "SnapshotRecord",
    "VerifyReport",
    "Violation",
    "ancestry",
    "dataframe_at",
    "diff",
    "format_ms",
    "history",
    "lakesink_key",
    "locate",
    "parse_timestamp_ms",
    "progress",
    "publish",
    "query_ids",
    "read_at",
    "read_files",
    "resolve",
    "scan_at",
    "summary_of",
    "the_query",
    "verify",
]
