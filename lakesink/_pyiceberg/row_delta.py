"""Row deltas: one snapshot that adds data files and position delete files (and may remove delete files, or data
files for a rewrite), prepared for exactly one compare-and-swap. Driver side (part of the seam).

pyiceberg 0.12 has no such producer: its snapshot producers write data manifests only (its v2 manifest writer is
hard-wired to ``content=data``), and its overwrite rewrites a delete manifest as a data manifest. This is Iceberg
Java's ``BaseRowDelta`` (``addRows``, ``addDeletes``, ``removeDeletes``) as far as the files go, on pyiceberg's
snapshot producer:

- **manifests**: the added data files in one data manifest (merged with the parent's as the table's
  ``commit.manifest-merge.*`` say, as every lakesink append); the added delete files in one delete manifest per
  partition spec (:class:`lakesink._pyiceberg.io.metadata.DeleteManifestWriter`: ``content=deletes`` in the manifest
  list and in the file's metadata); a parent manifest that holds a removed file rewritten with its other entries as
  ``existing`` and the removed one recorded ``deleted`` in a manifest of its own content;
- **sequence numbers**: every added entry leaves its sequence numbers unassigned and inherits the new snapshot's from
  the manifest list (the spec's "Sequence Number Inheritance"), so the new position deletes apply to every data file
  committed before them (data sequence number <= theirs), and a rewritten entry keeps its own; a rewrite of position
  deletes gives its new delete files the largest data sequence number of the files they replace (Java's
  ``RewritePositionDeletesCommitManager``) and inherits only the file sequence number;
- **operation** as Java's ``BaseRowDelta.operation()``: ``append`` when only data files are added, ``delete`` when
  delete files are added and no data file, ``overwrite`` otherwise; a rewrite (:func:`prepare_rewrite`) is ``replace``;
- **summary** as Java's ``SnapshotSummary``: ``added-data-files``, ``added-records``, ``added-delete-files``,
  ``added-position-delete-files``, ``added-position-deletes``, their ``removed-*`` and ``deleted-*`` counterparts,
  ``added-files-size``/``removed-files-size`` and the totals (``total-delete-files``, ``total-position-deletes``, ...)
  carried on from the parent (pyiceberg's ``SnapshotSummaryCollector``, each file counted under its own spec).

What a row delta must be validated against (the data files its deletes point at still live, no other engine's deletes
on them, ...) is the caller's, on every attempt: lakesink.driver.loop.validation.validate_row_delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyiceberg.exceptions import ValidationException
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.typedef import EMPTY_DICT, Record

from lakesink._pyiceberg.commit import PreparedCommit
from lakesink._pyiceberg.io.metadata import DeleteManifestWriter, manifest_entries, snapshot_manifests
from lakesink._pyiceberg.producers import _MergeAppend, _named, _prepared, _staged, _transaction
from lakesink.table import names


def delete_file(
    *, path: str, size_in_bytes: int, statistics: Mapping[str, Any], spec_id: int, partition: Sequence[Any] = ()
) -> DataFile:
    """A position delete file written by an executor (lakesink._pyiceberg.io.deletes), as its manifest entry holds it:
    content ``position deletes``, the partition (``spec_id``, ``partition``) of the data files it deletes rows of."""
    f = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        file_size_in_bytes=size_in_bytes,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **statistics,
    )
    f.spec_id = spec_id  # not a field of pyiceberg's model: from_args drops it (pyiceberg 0.12)
    return f


def row_delta_operation(*, adds_data: bool, adds_deletes: bool, removes_data: bool = False) -> Operation:
    """Iceberg Java's ``BaseRowDelta.operation()``."""
    if adds_data and not adds_deletes and not removes_data:
        return Operation.APPEND
    if adds_deletes and not adds_data:
        return Operation.DELETE
    return Operation.OVERWRITE


class _RowDeltaProducer(_MergeAppend):
    """The row delta's snapshot (the module's docstring). ``removed``: live files of the parent (data or delete files)
    the snapshot removes; each must be live there (pyiceberg's rule for an overwrite's removed files)."""

    def __init__(
        self,
        *args: Any,
        added_deletes: Sequence[DataFile],
        removed: Sequence[DataFile],
        replace: bool = False,
        data_sequence_numbers: Mapping[str, int] = EMPTY_DICT,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._added_deletes = list(added_deletes)
        self._removed = {f.file_path: f for f in removed}
        self._replace = replace
        self._data_sequence_numbers = dict(data_sequence_numbers)

    def _manifests(self) -> list[ManifestFile]:
        kept, removed_entries = self._parent_without_removed()  # planned first: a failed check writes nothing
        added: list[ManifestFile] = []
        if self._added_data_files:
            with self.new_manifest_writer(spec=self._transaction.table_metadata.spec()) as writer:
                for f in self._added_data_files:
                    writer.add(
                        ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=f)
                    )
            added.append(writer.to_manifest_file())
        for spec_id, files in sorted(_by_spec(self._added_deletes).items()):
            with self._delete_manifest_writer(spec_id) as writer:
                for f in files:
                    # an explicit data sequence number (a rewrite's: Java's RewriteFiles.addFile(file, dataSequenceNumber))
                    # or none: inherited from the manifest list (the new snapshot's)
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=self._data_sequence_numbers.get(f.file_path),
                            data_file=f,
                        )
                    )
            added.append(writer.to_manifest_file())
        by_kind: dict[tuple[bool, int], list[ManifestEntry]] = {}
        for entry in removed_entries:
            by_kind.setdefault((entry.data_file.content == DataFileContent.DATA, entry.data_file.spec_id), []).append(entry)
        for (data, spec_id), entries in sorted(by_kind.items()):
            with self.new_manifest_writer(self.spec(spec_id)) if data else self._delete_manifest_writer(spec_id) as writer:
                for entry in entries:
                    writer.delete(entry)
            added.append(writer.to_manifest_file())
        return self._process_manifests(added + kept)

    def _delete_manifest_writer(self, spec_id: int) -> DeleteManifestWriter:
        return DeleteManifestWriter(
            self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
        )

    def _parent_without_removed(self) -> tuple[list[ManifestFile], list[ManifestEntry]]:
        """The parent's manifests to keep (one holding a removed file rewritten without it) and the removed files'
        live entries. Raises ValidationException when a removed file is not live in the parent."""
        if not self._removed:
            return self._existing_manifests(), []
        parent = (
            self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
            if self._parent_snapshot_id is not None
            else None
        )
        kept: list[ManifestFile] = []
        removed: list[ManifestEntry] = []
        for manifest in snapshot_manifests(self._io, parent) if parent is not None else []:
            entries = manifest_entries(manifest, self._io, discard_deleted=True)
            gone = [e for e in entries if e.data_file.file_path in self._removed]
            if not gone:
                if manifest.has_added_files() or manifest.has_existing_files() or manifest.added_snapshot_id == self._snapshot_id:
                    kept.append(manifest)
                continue
            removed.extend(gone)
            rest = [e for e in entries if e.data_file.file_path not in self._removed]
            if not rest:
                continue
            deletes = manifest.content == ManifestContent.DELETES
            spec = self.spec(manifest.partition_spec_id)
            with self._delete_manifest_writer(spec.spec_id) if deletes else self.new_manifest_writer(spec) as writer:
                for e in rest:
                    writer.existing(e)
            kept.append(writer.to_manifest_file())
        if missing := sorted(set(self._removed) - {e.data_file.file_path for e in removed}):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")
        return kept, removed

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        metadata = self._transaction.table_metadata
        schema, specs = metadata.schema(), metadata.specs()
        collector = SnapshotSummaryCollector(
            partition_summary_limit=int(
                metadata.properties.get(
                    TableProperties.WRITE_PARTITION_SUMMARY_LIMIT, TableProperties.WRITE_PARTITION_SUMMARY_LIMIT_DEFAULT
                )
            )
        )
        for f in self._added_data_files:
            collector.add_file(f, schema, metadata.spec())
        for f in self._added_deletes:
            collector.add_file(f, schema, specs[f.spec_id])
        for f in self._removed.values():
            collector.remove_file(f, schema, specs[f.spec_id])
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        # pyiceberg's totals know append/overwrite/delete only: a replace is computed as an overwrite, then relabelled
        operation = Operation.OVERWRITE if self._replace else self._operation
        summary = update_snapshot_summaries(
            summary=Summary(operation=operation, **collector.build(), **snapshot_properties),
            previous_summary=parent.summary if parent is not None else None,
        )
        if self._replace:
            return Summary(operation=Operation.REPLACE, **summary.additional_properties)
        return summary


def _by_spec(files: Iterable[DataFile]) -> dict[int, list[DataFile]]:
    out: dict[int, list[DataFile]] = {}
    for f in files:
        out.setdefault(f.spec_id, []).append(f)
    return out


def prepare_row_delta(
    table: Table,
    *,
    data_files: Sequence[DataFile] = (),
    delete_files: Sequence[DataFile] = (),
    removed_delete_files: Sequence[DataFile] = (),
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]] = lambda _: {},
    branch: str,
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
    owned: Sequence[str] = (),
) -> PreparedCommit:
    """One snapshot of ``table``'s ``branch`` adding ``data_files`` (rows) and ``delete_files`` (position deletes, each
    of its data files' spec and partition) and removing ``removed_delete_files`` (live delete files whose deletes the
    added ones hold: Java's ``removeDeletes``), with ``properties(snapshot_id)`` and ``schema_changes`` in the same
    commit. The swap asserts the branch head, the table, its schema and its default spec (as every batch's snapshot).
    ``commit``, ``files_since_ms`` and ``owned`` as lakesink._pyiceberg.producers.prepare_snapshot's."""
    if table.metadata.format_version < 2 and (delete_files or removed_delete_files):
        raise ValueError(f"table {'.'.join(table.name())} is format version 1: it cannot hold delete files (v2 and above)")
    if any(f.content != DataFileContent.POSITION_DELETES for f in delete_files):
        raise ValueError("a row delta adds position delete files only")
    tx = _transaction(table, schema_changes)
    producer = _named(
        _RowDeltaProducer(
            operation=row_delta_operation(adds_data=bool(data_files), adds_deletes=bool(delete_files)),
            transaction=tx,
            io=table.io,
            branch=branch,
            snapshot_properties=dict(summary),
            added_deletes=delete_files,
            removed=removed_delete_files,
        ),
        commit,
    )
    producer._merge_enabled = manifest_merge
    return _staged(table, tx, producer, data_files, properties, owned, files_since_ms=files_since_ms)


def prepare_rewrite(
    table: Table,
    *,
    removed: Sequence[DataFile],
    added: Sequence[DataFile] = (),
    summary: Mapping[str, str],
    branch: str,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
    data_sequence_numbers: Mapping[str, int] = EMPTY_DICT,
) -> PreparedCommit:
    """A ``replace`` snapshot: ``removed`` (live data and delete files of the branch head) rewritten as ``added`` (data
    files, or position delete files) -- rows unchanged. A compaction that applies delete files, or rewrites position
    deletes (Java's ``RewriteFiles``: ``rewrite_data_files``, ``rewrite_position_delete_files``). The swap asserts the
    branch head and the table (not the schema: a rewrite keeps the files' own). ``data_sequence_numbers``: an added
    delete file's data sequence number by its path, written into its manifest entry (Java's ``RewriteFiles.addFile(file,
    dataSequenceNumber)``: a rewrite of position deletes keeps the largest of the files it replaces); a file not in it
    inherits the new snapshot's."""
    tx = _transaction(table, ())
    producer = _named(
        _RowDeltaProducer(
            operation=Operation.OVERWRITE,  # relabelled replace in its summary
            transaction=tx,
            io=table.io,
            branch=branch,
            snapshot_properties=dict(summary),
            added_deletes=[f for f in added if f.content == DataFileContent.POSITION_DELETES],
            removed=removed,
            replace=True,
            data_sequence_numbers=data_sequence_numbers,
        ),
        commit,
    )
    producer._merge_enabled = False  # a rewrite leaves the manifests it does not touch as they are
    for f in added:
        if f.content == DataFileContent.DATA:
            producer.append_data_file(f)
    producer.commit()
    return _prepared(table, tx, producer, files_since_ms=files_since_ms)
