"""Manifest reads shared by one audit, and reading data files as pyiceberg's scan does."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestEntryStatus, ManifestFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Snapshot

from lakesink._pyiceberg import io as seam


class Manifests:
    """Manifest reads shared by one audit (each manifest file is read once)."""

    def __init__(self, table: Table, *, show_progress: bool | None = None):
        self.table = table
        self.show_progress = show_progress
        self._entries: dict[str, list[ManifestEntry]] = {}

    def entries(self, manifest: ManifestFile) -> list[ManifestEntry]:
        if manifest.manifest_path not in self._entries:
            self._entries[manifest.manifest_path] = seam.manifest_entries(manifest, self.table.io)
        return self._entries[manifest.manifest_path]

    def live_files(self, snapshot: Snapshot) -> dict[str, tuple[DataFile, int | None]]:
        """path -> (data file, id of the snapshot that added it) of the snapshot's live data files."""
        return self._live(snapshot, ManifestContent.DATA)

    def live_delete_files(self, snapshot: Snapshot) -> dict[str, tuple[DataFile, int | None]]:
        """path -> (delete file, id of the snapshot that added it) of the snapshot's live delete files."""
        return self._live(snapshot, ManifestContent.DELETES)

    def _live(self, snapshot: Snapshot, content: ManifestContent) -> dict[str, tuple[DataFile, int | None]]:
        out: dict[str, tuple[DataFile, int | None]] = {}
        for manifest in seam.snapshot_manifests(self.table.io, snapshot):
            if manifest.content != content:
                continue
            for entry in self.entries(manifest):
                if entry.status != ManifestEntryStatus.DELETED:
                    out[entry.data_file.file_path] = (entry.data_file, entry.snapshot_id)
        return out

    def has_deletes(self, snapshot: Snapshot) -> bool:
        return any(m.content == ManifestContent.DELETES for m in seam.snapshot_manifests(self.table.io, snapshot))

    def changes(self, snapshot: Snapshot) -> tuple[list[DataFile], list[DataFile]]:
        """(data files added, data files deleted) by the snapshot itself, from the manifests it wrote."""
        return self._changes(snapshot, ManifestContent.DATA)

    def delete_changes(self, snapshot: Snapshot) -> tuple[list[DataFile], list[DataFile]]:
        """(delete files added, delete files removed) by the snapshot itself, from the delete manifests it wrote."""
        return self._changes(snapshot, ManifestContent.DELETES)

    def _changes(self, snapshot: Snapshot, content: ManifestContent) -> tuple[list[DataFile], list[DataFile]]:
        added: list[DataFile] = []
        deleted: list[DataFile] = []
        for manifest in seam.snapshot_manifests(self.table.io, snapshot):
            if manifest.content != content or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in self.entries(manifest):
                if entry.snapshot_id != snapshot.snapshot_id:
                    continue
                if entry.status == ManifestEntryStatus.ADDED:
                    added.append(entry.data_file)
                elif entry.status == ManifestEntryStatus.DELETED:
                    deleted.append(entry.data_file)
        return added, deleted


def read_files(table: Table, files: Iterable[DataFile], *, row_filter: BooleanExpression | None = None) -> pa.Table:
    """The rows of data files, read as pyiceberg's scan reads them (current schema)."""
    schema = table.schema()
    tasks = [FileScanTask(f) for f in files]
    batches = list(seam.scan_files(table.metadata, table.io, tasks, schema=schema, row_filter=row_filter or AlwaysTrue()))
    target = seam.arrow_schema(schema)
    if not batches:
        return target.empty_table()
    return pa.Table.from_batches(batches).cast(pa.schema([f.with_metadata(None) for f in batches[0].schema]))
