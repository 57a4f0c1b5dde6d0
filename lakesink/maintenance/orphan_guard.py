"""What the orphan-file clean-up (:mod:`lakesink.maintenance.orphans`) must keep: every file the table's metadata
references, and the files a lakesink commit in flight may still reference (the in-flight guard: see that module's
docstring and docs/maintenance.md).
"""

from __future__ import annotations

import posixpath
from datetime import datetime, timedelta, timezone
from typing import Protocol

from pyiceberg.manifest import ManifestContent, ManifestFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table

from lakesink._pyiceberg import io as seam
from lakesink.driver.actions import held
from lakesink.errors import LakesinkError
from lakesink.redaction import redact_secrets_in
from lakesink.table import names, storage
from lakesink.table.keys import PROPERTY_UPSERT_ORDER_FILE, SUMMARY_QUERY_ID, SUMMARY_UPSERT_ORDER_FILE
from lakesink.table.markers import last_committed_batch, parse_last_batch_key


class ListedFile(Protocol):
    """What the guard reads of a file the orphan listing found (orphans.py's listing entries)."""

    @property
    def uri(self) -> str: ...
    @property
    def relative(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def modified(self) -> datetime | None: ...


def safe_error(table: Table, e: BaseException) -> str:
    """``e`` as text, without the catalog's secrets or passwords in URLs."""
    return redact_secrets_in(f"{type(e).__name__}: {e}", getattr(table.catalog, "properties", {}) or {})


def ago(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}".replace(".0", "")
    return f"{seconds}s"


# --- what the table references ------------------------------------------------------------------


def referenced_keys(table: Table, name: str) -> set[str]:
    """Every file reachable from the table's metadata (all snapshots of all branches and tags), as keys."""
    md = table.metadata
    io = table.io
    keys = {storage.key(table.metadata_location)}
    keys.add(storage.key(f"{posixpath.dirname(table.metadata_location)}/{names.VERSION_HINT}"))
    keys.update(storage.key(e.metadata_file) for e in md.metadata_log)
    keys.update(storage.key(s.statistics_path) for s in md.statistics)
    keys.update(storage.key(s.statistics_path) for s in md.partition_statistics)
    # option order-by: the order file of each branch, named by a table property (lakesink.driver.actions.upsert_order)
    keys.update(
        storage.key(value)
        for key, value in md.properties.items()
        if key == PROPERTY_UPSERT_ORDER_FILE or key.startswith(f"{PROPERTY_UPSERT_ORDER_FILE}.")
    )
    # option cdc-transactions: the changes a sink's batch held back, named by a table property (lakesink.driver.actions.held)
    keys.update(storage.key(path) for path in held.held_files(md.properties))
    seen: set[str] = set()
    for snapshot in md.snapshots:
        keys.add(storage.key(snapshot.manifest_list))
        # and the order file each snapshot went with: after a rollback the head's lineage's is the one in force
        if snapshot.summary is not None and (order_file := snapshot.summary.get(SUMMARY_UPSERT_ORDER_FILE)):
            keys.add(storage.key(order_file))
        try:
            manifests = seam.snapshot_manifests(io, snapshot)
        except Exception as e:
            raise LakesinkError(
                f"table {name}: cannot read the manifest list {snapshot.manifest_list} of snapshot "
                f"{snapshot.snapshot_id} ({safe_error(table, e)}); nothing was removed"
            ) from e
        for manifest in manifests:
            key = storage.key(manifest.manifest_path)
            keys.add(key)
            if key in seen:
                continue
            seen.add(key)
            try:
                entries = seam.manifest_entries(manifest, io)
            except Exception as e:
                raise LakesinkError(
                    f"table {name}: cannot read the manifest {manifest.manifest_path} ({safe_error(table, e)}); "
                    "nothing was removed"
                ) from e
            keys.update(storage.key(entry.data_file.file_path) for entry in entries)
    return keys


# --- the in-flight guard ------------------------------------------------------------------------


class InFlightGuard:
    """Decides whether an unreferenced file may still be referenced by a commit in flight."""

    def __init__(self, table: Table, referenced: set[str], started: datetime):
        self._table = table
        self._referenced = referenced
        self._started = started
        self._current = storage.key(table.metadata_location)
        self._queries: dict[str, set[str]] = {}  # query id prefix (8 chars) -> query ids
        # query id -> the last batch committed by every sink of the query (the lowest of its sinks' markers: a
        # file of a later batch may still be committed by the sink that is behind); None: a marker is unreadable
        self._last: dict[str, int | None] = {}
        for key, _ in table.properties.items():
            parsed = parse_last_batch_key(key)
            if parsed is None:
                continue
            query_id, sink_id = parsed
            self._queries.setdefault(names.query_prefix(query_id), set()).add(query_id)
            try:
                marker = last_committed_batch(table.properties, query_id, sink_id)
            except (ValueError, KeyError, TypeError):
                marker = None
            batch = marker.batch_id if marker else None
            if query_id not in self._last:
                self._last[query_id] = batch
            else:
                known = self._last[query_id]
                self._last[query_id] = None if known is None or batch is None else min(known, batch)
        for snapshot in table.metadata.snapshots:
            summary = snapshot.summary.additional_properties if snapshot.summary else {}
            if committed_by := summary.get(SUMMARY_QUERY_ID):
                self._queries.setdefault(names.query_prefix(committed_by), set()).add(committed_by)
        self._manifests: dict[str, str | None] = {}

    def reason(self, f: ListedFile, window_cutoff: datetime) -> str | None:
        """Why ``f`` may still be committed, or None. Only while it is in the in-flight window: modified after
        ``window_cutoff``, or, for a file whose name says when lakesink began writing it, begun after it."""
        found = names.classify(f.relative)
        begun = datetime.fromtimestamp(found.stamp_ms / 1000, timezone.utc) if found.stamp_ms is not None else None
        if (f.modified is None or f.modified < window_cutoff) and (begun is None or begun < window_cutoff):
            return None
        if found.kind == "metadata":
            return self._metadata_reason(f.uri)
        if found.commit is not None:
            return self._commit_reason(found.commit, found.kind, begun)
        if found.kind == "manifest-list":
            return self._manifest_list_reason(f.uri)
        if found.kind == "manifest":
            return self._manifest_reason(f.uri, f.size)
        return self._data_file_reason(f.relative)

    def _commit_reason(self, commit: names.CommitName, kind: str, begun: datetime | None) -> str | None:
        """Why a file that lakesink wrote for ``commit`` (its name says so: lakesink.table.names) may still be committed.

        A batch's commit can still land while the batch is not committed (the replay marker's rule, as for the
        batch's data files); any other lakesink commit (a compaction, a manifest rewrite) while it is in the window,
        which the commit side keeps too: it never swaps files older than lakesink.table.names.COMMIT_DEADLINE_MS.
        """
        if commit.query_prefix is not None and commit.batch_id is not None:
            why = self._batch_reason(commit.query_prefix, commit.batch_id)
            return None if why is None else f"a {kind} of the commit of {why}"
        since = f", begun {ago(self._started - begun)} ago" if begun is not None else ""
        return f"a {kind} of a lakesink {commit.kind} commit that may still land{since}"

    def _data_file_reason(self, path: str) -> str | None:
        """Why the data file at ``path`` (relative to the table, or a full location) may still be committed.

        Its batch is known from its whole path: a file of the Spark path carries Spark's name, only the
        directory holding it is lakesink's.
        """
        batch_of = names.batch_of(path)
        if batch_of is None:
            return None
        return self._batch_reason(batch_of.query_prefix, batch_of.batch_id)

    def _batch_reason(self, prefix: str, batch: int) -> str | None:
        """Why batch ``batch`` of the query whose id starts with ``prefix`` may still be committed, or None."""
        queries = self._queries.get(prefix, set())
        if not queries:
            return f"lakesink batch {batch} of a query {prefix}... that has committed nothing yet"
        if len(queries) > 1:
            return f"lakesink batch {batch}; several queries start with {prefix} ({', '.join(sorted(queries))})"
        (query_id,) = queries
        last = self._last.get(query_id)
        if last is None:
            return f"lakesink batch {batch} of query {query_id}, whose replay marker is missing or unreadable"
        if batch > last:
            return f"lakesink batch {batch} of query {query_id} is not committed yet (last committed batch: {last})"
        return None

    def _manifest_reason(self, uri: str, size: int) -> str | None:
        key = storage.key(uri)
        if key in self._referenced:
            return None
        if key not in self._manifests:
            self._manifests[key] = self._read_manifest(uri, size)
        return self._manifests[key]

    def _read_manifest(self, uri: str, size: int) -> str | None:
        manifest = ManifestFile.from_args(
            manifest_path=uri,
            manifest_length=size,
            partition_spec_id=0,
            content=ManifestContent.DATA,
            sequence_number=0,
            min_sequence_number=0,
            added_snapshot_id=None,
        )
        try:
            entries = seam.manifest_entries(manifest, self._table.io)
        except Exception as e:
            return f"a manifest that cannot be read (it may be being written): {safe_error(self._table, e)}"
        for entry in entries:
            path = entry.data_file.file_path
            if storage.key(path) in self._referenced:
                continue
            if (why := self._data_file_reason(path)) is not None:  # the whole path: a Spark-path file's batch is its folder's
                return f"a manifest listing {'/'.join(path.rsplit('/', 2)[-2:])}: {why}"
        return None

    def _manifest_list_reason(self, uri: str) -> str | None:
        try:
            manifests = seam.read_manifest_list(self._table.io, uri)
        except Exception as e:
            return f"a manifest list that cannot be read (it may be being written): {safe_error(self._table, e)}"
        for manifest in manifests:
            if (why := self._manifest_reason(manifest.manifest_path, manifest.manifest_length)) is not None:
                return f"a manifest list naming {manifest.manifest_path.rsplit('/', 1)[-1]}, {why}"
        return None

    def _metadata_reason(self, uri: str) -> str | None:
        try:
            metadata = FromInputFile.table_metadata(self._table.io.new_input(uri))
        except Exception as e:
            return f"a metadata file that cannot be read (it may be being written): {safe_error(self._table, e)}"
        log_ = metadata.metadata_log
        if log_ and storage.key(log_[-1].metadata_file) == self._current:
            return "a possible next metadata version of the table (its metadata log ends with the current one)"
        return None
