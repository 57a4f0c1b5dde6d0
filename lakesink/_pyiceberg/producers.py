"""Snapshot producers: a batch's snapshot (append, overwrite, an upsert's rewrite), a compaction's replace,
metadata-only commits (``prepare_staged``), schema evolution staged in a commit, each prepared for exactly one
compare-and-swap (:class:`lakesink._pyiceberg.commit.PreparedCommit`). Driver side.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pyiceberg.exceptions import ValidationException
from pyiceberg.expressions import AlwaysFalse, And, BooleanExpression, EqualTo, IsNaN, IsNull, Or, Reference
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.statistics import StatisticsFile
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    SetStatisticsUpdate,
    TableRequirement,
    update_table_metadata,
)
from pyiceberg.table.update.schema import UpdateSchema
from pyiceberg.table.update.snapshot import (
    ManageSnapshots,
    UpdateSnapshot,
    _ManifestMergeManager,
    _MergeAppendFiles,
    _new_manifest_list_file_name,
    _OverwriteFiles,
    _SnapshotProducer,
)
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.utils.bin_packing import ListPacker

from lakesink._pyiceberg.commit import PreparedCommit
from lakesink._pyiceberg.io import live_entries, partition_of
from lakesink._pyiceberg.io.metadata import (
    DeleteManifestWriter,
    keeping_ref_retention,
    snapshot_manifests,
    write_manifest,
    write_manifest_list,
)
from lakesink.table import floats, names, state_files
from lakesink.table.keys import STATE_PROPERTY_PREFIXES


def apply_schema_changes(update: UpdateSchema, changes: Sequence[Any]) -> None:
    """Stage lakesink.driver.tables.schema.SchemaChange's on a pyiceberg UpdateSchema (public API; new columns optional)."""
    for change in changes:
        if change.kind == "add":
            update.add_column(change.path, change.field_type, required=False)
        else:
            update.update_column(change.path, field_type=change.field_type)


def evolved_schema(table: Table, changes: Sequence[Any]) -> Schema:
    """The table's schema after ``changes`` (nothing is committed): field ids as the commit will assign them."""
    update = table.transaction().update_schema()
    apply_schema_changes(update, changes)
    return update._apply()


def data_file(
    *, path: str, size_in_bytes: int, statistics: Mapping[str, Any], spec_id: int, partition: Sequence[Any] = ()
) -> DataFile:
    """A DataFile for a Parquet file written by an executor (``partition``: its partition values)."""
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        file_size_in_bytes=size_in_bytes,
        sort_order_id=None,
        spec_id=spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics,
    )
    data_file.spec_id = spec_id  # from_args does not keep it (pyiceberg 0.12); a scan of the file reads it
    return data_file


class _PreparedManifests(_SnapshotProducer[Any]):
    """The part of every snapshot producer lakesink commits through: its manifests and its manifest list written, and
    the parent's manifest list read, by :mod:`lakesink._pyiceberg.io.metadata` (pyiceberg's own encoder and decoder, their
    Avro schemas prepared once per process instead of once per file: the same files for about 2 ms less CPU a commit).

    ``_commit`` is pyiceberg 0.12's ``_SnapshotProducer._commit`` with the manifest list written by
    :func:`lakesink._pyiceberg.io.metadata.write_manifest_list` (pyiceberg's takes the function from its module's globals).
    """

    def new_manifest_writer(self, spec: Any) -> ManifestWriter:
        return write_manifest(
            format_version=self._transaction.table_metadata.format_version,
            spec=spec,
            schema=self.schema(),
            output_file=self.new_manifest_output(),
            snapshot_id=self._snapshot_id,
            avro_compression=self._compression,
        )

    def _manifests(self) -> list[ManifestFile]:
        # pyiceberg's _SnapshotProducer._manifests on the calling thread: pyiceberg hands its three parts (the added
        # manifest, the delete manifests, the existing manifests) to its shared thread pool, which a commit prepared on
        # lakesink's own pool (lakesink.driver.loop.swap) only pays for in thread hand-offs (measured: 0.9 ms of CPU per
        # table at 100 tables a batch); the parts in pyiceberg's order
        self._build_delete_files_partition_predicate()
        deleted_entries = self._deleted_entries()  # planned first: a failed validation leaves no manifest behind
        added: list[ManifestFile] = []
        if self._added_data_files:
            with self.new_manifest_writer(spec=self._transaction.table_metadata.spec()) as writer:
                for data_file in self._added_data_files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=None,
                            file_sequence_number=None,
                            data_file=data_file,
                        )
                    )
            added.append(writer.to_manifest_file())
        deletes: list[ManifestFile] = []
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in deleted_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        for spec_id, entries in by_spec.items():
            with self.new_manifest_writer(self.spec(spec_id)) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            deletes.append(writer.to_manifest_file())
        return self._process_manifests(added + deletes + self._existing_manifests())

    def _commit(self) -> Any:
        new_manifests = self._manifests()
        metadata = self._transaction.table_metadata
        next_sequence_number = metadata.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        file_name = _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        manifest_list_file_path = self._transaction._table.location_provider().new_metadata_location(file_name)
        self._written_manifest_lists.append(manifest_list_file_path)
        with write_manifest_list(
            format_version=metadata.format_version,
            output_file=self._io.new_output(manifest_list_file_path),
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            sequence_number=next_sequence_number,
            avro_compression=self._compression,
        ) as writer:
            writer.add_manifests(new_manifests)
        snapshot = Snapshot(  # type: ignore[call-arg]
            snapshot_id=self._snapshot_id,
            parent_snapshot_id=self._parent_snapshot_id,
            manifest_list=manifest_list_file_path,
            sequence_number=next_sequence_number,
            summary=summary,
            schema_id=metadata.current_schema_id,
            first_row_id=getattr(metadata, "next_row_id", None) if metadata.format_version >= 3 else None,
        )
        add_snapshot_update = AddSnapshotUpdate(snapshot=snapshot)
        if self._target_branch is None:
            return (add_snapshot_update,), ()
        return (
            (
                add_snapshot_update,
                SetSnapshotRefUpdate(  # type: ignore[call-arg]
                    snapshot_id=self._snapshot_id,
                    parent_snapshot_id=self._parent_snapshot_id,
                    ref_name=self._target_branch,
                    type=SnapshotRefType.BRANCH,
                ),
            ),
            (
                AssertRefSnapshotId(  # type: ignore[call-arg]
                    snapshot_id=metadata.refs[self._target_branch].snapshot_id if self._target_branch in metadata.refs else None,
                    ref=self._target_branch,
                ),
            ),
        )


class _MergeOnCallingThread(_ManifestMergeManager[Any]):
    """pyiceberg's ``_ManifestMergeManager`` with its bins merged on the calling thread, in pyiceberg's order.

    pyiceberg submits every bin to its shared thread pool and waits for it; a commit prepared on lakesink's own pool
    (lakesink.driver.loop.swap) pays that in thread hand-offs only, once per table of a routed unit, where the usual bin is
    one manifest list's manifests left as they are (fewer than ``commit.manifest.min-count-to-merge``)."""

    def _merge_group(self, first_manifest: ManifestFile, spec_id: int, manifests: list[ManifestFile]) -> list[ManifestFile]:
        # pyiceberg 0.12's _ManifestMergeManager._merge_group, its executor.submit(...).result() a plain call
        packer: ListPacker[ManifestFile] = ListPacker(target_weight=self._target_size_bytes, lookback=1, largest_bin_first=False)
        bins: list[list[ManifestFile]] = packer.pack_end(manifests, lambda m: m.manifest_length)
        merged: list[ManifestFile] = []
        for manifest_bin in bins:
            if len(manifest_bin) == 1:
                merged.append(manifest_bin[0])
            elif first_manifest in manifest_bin and len(manifest_bin) < self._min_count_to_merge:
                # a bin holding the new manifest is merged only from the minimum count on (pyiceberg's comment)
                merged.extend(manifest_bin)
            else:
                merged.append(self._create_manifest(spec_id, manifest_bin))
        return merged


class _MergeAppend(_PreparedManifests, _MergeAppendFiles):
    """pyiceberg's merge-append producer (merging manifests when enabled), with :class:`_PreparedManifests`."""

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        # pyiceberg's _MergeAppendFiles._process_manifests with :class:`_MergeOnCallingThread`
        data = [m for m in manifests if m.content == ManifestContent.DATA]
        deletes = [m for m in manifests if m.content == ManifestContent.DELETES]
        merger = _MergeOnCallingThread(
            target_size_bytes=self._target_size_bytes,
            min_count_to_merge=self._min_count_to_merge,
            merge_enabled=self._merge_enabled,
            snapshot_producer=self,
        )
        return merger.merge_manifests(data) + deletes

    def _existing_manifests(self) -> list[ManifestFile]:
        # pyiceberg's _FastAppendFiles._existing_manifests, the parent's manifest list read by the prepared reader
        if self._parent_snapshot_id is None:
            return []
        previous = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id)
        if previous is None:
            raise ValueError(f"Snapshot could not be found: {self._parent_snapshot_id}")
        return [
            m
            for m in snapshot_manifests(self._io, previous)
            if m.has_added_files() or m.has_existing_files() or m.added_snapshot_id == self._snapshot_id
        ]


def _merge_append(update: UpdateSnapshot) -> _MergeAppend:
    """pyiceberg's ``UpdateSnapshot.merge_append``, as :class:`_MergeAppend`."""
    return _MergeAppend(
        operation=Operation.APPEND,
        transaction=update._transaction,
        io=update._io,
        branch=update._branch,
        snapshot_properties=update._snapshot_properties,
    )


def _named(producer: Any, commit: names.CommitName | None) -> Any:
    """``producer`` writing its manifests and manifest list under lakesink's commit name (pyiceberg's ``commit_uuid``,
    which it only formats into those names): the orphan clean-up recognises them by it (lakesink.table.names)."""
    if commit is not None:
        producer.commit_uuid = commit
    return producer


class _MetadataCachingTransaction(Transaction):
    """A Transaction that computes its staged metadata once per set of staged updates.

    pyiceberg's ``Transaction.table_metadata`` re-applies every staged update and deep-copies the whole
    table metadata on each access, and a snapshot producer reads it a dozen times per commit: with every
    snapshot of the table's history in the metadata, that made each commit cost O(history) many times
    over (measured: 13 deep copies per batch, 9 ms each at 100 snapshots; docs/performance.md).
    Metadata objects are immutable (frozen pydantic models), so the result can be shared.
    """

    _cached_for: tuple[Any, ...] | None = None
    _cached: TableMetadata | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        if not self._updates:
            return self._table.metadata
        if self._cached is None or self._cached_for is not self._updates:
            self._cached = update_table_metadata(self._table.metadata, self._updates)
            self._cached_for = self._updates
        return self._cached


def prepare_snapshot(
    table: Table,
    *,
    data_files: Sequence[DataFile],
    overwrite: bool = False,
    removed_files: Sequence[DataFile] = (),
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
    owned: Sequence[str] = (),
) -> PreparedCommit:
    """Write the manifests of one snapshot: an append (merging manifests as Iceberg does), an overwrite of the whole
    table (``overwrite``: complete mode), or an upsert batch's copy-on-write (``removed_files`` removed, ``data_files``
    -- the batch's rows and the rewritten files' remaining rows -- added: an overwrite, for which pyiceberg checks
    that every removed file is still live in the branch head the commit asserts; an append without removed files).

    ``properties(snapshot_id)`` gives table properties to set in the same atomic commit, and
    ``schema_changes`` (lakesink.driver.tables.schema.SchemaChange) evolve the schema in it too. ``commit`` names the
    manifests and the manifest list (lakesink.table.names); ``files_since_ms``: when the oldest of ``data_files`` was
    written; ``owned``: files written for this attempt alone (a truncate's order file, an upsert's rewritten files),
    deleted by :meth:`PreparedCommit.discard`.
    """
    tx = _transaction(table, schema_changes)
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if overwrite:
        # complete mode: everything live at the head this attempt read goes, delete files included (another
        # engine's merge-on-read deletes would otherwise stay live, dangling, for ever; Java's overwrite of the
        # whole table removes them too); the swap asserts that head
        producer = _named(
            _OverwriteLive(
                operation=Operation.OVERWRITE if table.metadata.snapshot_by_name(branch) is not None else Operation.APPEND,
                transaction=tx,
                io=table.io,
                branch=branch,
                snapshot_properties=dict(summary),
                live=live_entries(table, branch),
            ),
            commit,
        )
    elif removed_files:
        producer = _named(_overwrite(update), commit)
        for removed in removed_files:
            producer.delete_data_file(removed)
    else:
        producer = _merging_append(update, commit, manifest_merge)
    return _staged(table, tx, producer, data_files, properties, owned, files_since_ms=files_since_ms, commit=commit)


def _set_statistics(statistics: Any) -> SetStatisticsUpdate:
    """The update that attaches ``statistics`` to its snapshot (pyiceberg fills the deprecated ``snapshot-id`` from it)."""
    return SetStatisticsUpdate(statistics=statistics)  # type: ignore[call-arg]


def _transaction(table: Table, schema_changes: Sequence[Any]) -> _MetadataCachingTransaction:
    """The transaction of one snapshot of ``table``, its ``schema_changes`` staged in it first."""
    tx = _MetadataCachingTransaction(table)
    if schema_changes:
        update_schema = tx.update_schema()
        apply_schema_changes(update_schema, schema_changes)
        update_schema.commit()  # staged in the transaction, like the snapshot after it
    return tx


def _merging_append(update: UpdateSnapshot, commit: names.CommitName | None, manifest_merge: bool) -> Any:
    """An append that merges manifests as Iceberg does (``manifest_merge``: the table's commit.manifest-merge.enabled)."""
    producer = _named(_merge_append(update), commit)
    # Iceberg's default for commit.manifest-merge.enabled is true (pyiceberg's is false): without merging,
    # every batch adds a manifest that every later manifest list carries forever
    producer._merge_enabled = manifest_merge
    return producer


def _staged(
    table: Table,
    tx: Transaction,
    producer: Any,
    data_files: Sequence[DataFile],
    properties: Callable[[int], Mapping[str, str]],
    owned: Sequence[str] = (),
    *,
    files_since_ms: int | None = None,
    commit: names.CommitName | None = None,
) -> PreparedCommit:
    """Add ``data_files`` to ``producer``'s snapshot and stage it and the properties into ``tx``: the prepared commit
    of both, with the table's state file attached to the snapshot (lakesink.table.state_files)."""
    for f in data_files:
        producer.append_data_file(f)
    producer.commit()  # stages the snapshot into the transaction; nothing reaches the catalog yet
    # staged after the snapshot: while the producer works nothing is staged yet, so the transaction's
    # metadata is the table's own (no copy of the whole history; see _MetadataCachingTransaction)
    props = dict(properties(producer.snapshot_id))
    owned = list(owned)
    statistics, more, written = _attach_state(table, {**table.properties, **props}, producer.snapshot_id, commit)
    props.update(more)
    if written is not None:
        owned.append(written)
    if props:
        tx.set_properties(props)
    if statistics is not None:
        tx._apply((_set_statistics(statistics),))
    # besides the branch head (AssertRefSnapshotId, from the producer): the table, its schema and its
    # partition spec must still be the ones the files were written for
    return _prepared(
        table,
        tx,
        producer,
        AssertCurrentSchemaId(current_schema_id=table.metadata.current_schema_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=table.metadata.default_spec_id),  # type: ignore[call-arg]
        owned=owned,
        files_since_ms=files_since_ms,
    )


def _prepared(
    table: Table,
    tx: Transaction,
    producer: Any,
    *requirements: TableRequirement,
    owned: Sequence[str] = (),
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """The prepared commit of ``producer``'s staged snapshot: ``tx``'s updates (the refs' retention kept) under its
    requirements (the branch head), the table's uuid and ``requirements``."""
    return PreparedCommit(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=(*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid), *requirements),
        _producer=producer,
        _owned_files=tuple(owned),
        files_since_ms=files_since_ms,
    )


class _OverwriteRemovedFiles(_PreparedManifests, _OverwriteFiles):
    """pyiceberg's overwrite producer, finding the manifests of the removed files by a predicate that takes NaN.

    pyiceberg 0.12 narrows the manifests it reads to the removed files' partitions with ``EqualTo(field, value)``,
    which raises "Cannot create expression literal from NaN" for a file of a NaN partition (float/double identity):
    a compaction or an upsert that rewrites such a file failed at every attempt. A NaN value is matched with
    ``IsNaN``, as Iceberg's Java engines do; the rest is pyiceberg's own predicate.
    """

    def _build_delete_files_partition_predicate(self) -> None:
        by_spec: dict[int, dict[tuple[Any, ...], Record]] = {}
        for data_file in self._deleted_data_files:
            by_spec.setdefault(data_file.spec_id, {})[floats.partition_key(partition_of(data_file))] = data_file.partition
        for spec_id, records in by_spec.items():
            field_names = [field.name for field in self.spec(spec_id).fields]
            self.partition_filters[spec_id] = Or(
                self.partition_filters[spec_id], _partition_predicate(list(records.values()), field_names)
            )


def _partition_predicate(records: Sequence[Record], names: Sequence[str]) -> BooleanExpression:
    """Rows of any of ``records`` (pyiceberg's ``Transaction._build_partition_predicate``, with IsNaN for NaN)."""
    if not records or not names:
        return AlwaysFalse()

    def term(name: str, value: Any) -> BooleanExpression:
        if value is None:
            return IsNull(Reference(name))  # type: ignore[call-arg]  # pydantic model, positional as pyiceberg calls it
        if isinstance(value, float) and math.isnan(value):
            return IsNaN(Reference(name))  # type: ignore[call-arg]
        return EqualTo(Reference(name), value)  # type: ignore[call-arg]

    per_record = [
        And(*terms) if len(terms) > 1 else terms[0] for terms in ([term(n, r[i]) for i, n in enumerate(names)] for r in records)
    ]
    return Or(*per_record) if len(per_record) > 1 else per_record[0]


def _overwrite(update: UpdateSnapshot) -> _OverwriteRemovedFiles:
    """``update.overwrite()``, as :class:`_OverwriteRemovedFiles`."""
    return _OverwriteRemovedFiles(
        operation=Operation.OVERWRITE
        if update._transaction.table_metadata.snapshot_by_name(name=update._branch) is not None
        else Operation.APPEND,
        transaction=update._transaction,
        io=update._io,
        branch=update._branch,
        snapshot_properties=update._snapshot_properties,
    )


class _OverwriteLive(_OverwriteRemovedFiles):
    """pyiceberg's overwrite producer removing every live entry of the branch head: its data files, and its delete
    files too, recorded as ``DELETED`` entries of a delete manifest (pyiceberg's overwrite drops a delete manifest
    whose files all go but records their removal in no manifest, or in a data manifest)."""

    def __init__(self, *args: Any, live: Sequence[ManifestEntry], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._removed_delete_entries = [e for e in live if e.data_file.content != DataFileContent.DATA]
        for entry in live:
            self.delete_data_file(entry.data_file)

    def _validate_required_deletes(self, deleted_entries: list[ManifestEntry]) -> None:
        # pyiceberg checks that every removed file has a DELETED entry among the data manifests' entries; the
        # delete files get theirs in a delete manifest (below)
        found = {e.data_file for e in deleted_entries} | {e.data_file for e in self._removed_delete_entries}
        if missing := sorted(f.file_path for f in self._deleted_data_files if f not in found):
            raise ValidationException(f"Missing required files to delete: {', '.join(missing)}")

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in self._removed_delete_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        out = list(manifests)
        for spec_id, entries in sorted(by_spec.items()):
            writer = DeleteManifestWriter(
                self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression
            )
            with writer:
                for entry in entries:
                    writer.delete(entry)
            out.append(writer.to_manifest_file())
        return super()._process_manifests(out)


# --- metadata-only commits (a branch, forget-query, publish): staged, then lakesink's loop ---------------------
#
# pyiceberg 0.12's ``Transaction.commit_transaction`` (what ``with table.transaction()``, ``manage_snapshots()...
# .commit()`` and every autocommit update end in) catches CommitFailedException, refreshes the table, rebuilds its
# snapshot producers on the new head and commits again, up to ``commit.retry.num-retries`` times (apache/iceberg-
# python#3320, validated since #3811). It recognises a landed attempt only by its own snapshot id, so behind
# lakesink's back it could commit what another driver already committed. Every commit lakesink makes is a commit
# action run by its own loop (lakesink.driver.loop.swap); a metadata-only one is staged on a plain Transaction by
# :func:`prepare_staged` and swapped once per attempt like any other (tests/seam/test_contract.py pins both).


def manage_snapshots(tx: Transaction) -> Any:
    """pyiceberg's ManageSnapshots (create_branch, set_current_snapshot, ...), staging into ``tx``."""
    return ManageSnapshots(transaction=tx)


def prepare_staged(table: Table, stage: Callable[[Transaction], object]) -> PreparedCommit:
    """A metadata-only commit (refs, properties) staged by ``stage`` on a transaction of ``table`` as read, with the
    requirements pyiceberg's own commit adds (the table's uuid) and those the staging adds (a ref's head): one
    compare-and-swap per attempt of lakesink's loop (:meth:`PreparedCommit.commit`), never pyiceberg's
    ``commit_transaction``. Raises ValueError when the staging does not change anything."""
    tx = Transaction(table, autocommit=False)
    stage(tx)
    if not tx._updates:
        raise ValueError("the staged commit changes nothing")
    requirements = (*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
    return PreparedCommit(table=table, snapshot_id=-1, _updates=tuple(tx._updates), _requirements=requirements)


def prepare_properties_at_head(table: Table, properties: Mapping[str, str], *, branch: str) -> PreparedCommit:
    """Set table properties in one compare-and-swap that also asserts the branch head is still the one read.

    pyiceberg's public ``set_properties`` asserts only the table's identity, so a marker could move back
    behind a batch committed meanwhile; the swap raises CommitFailedException when the head moved.
    """
    head = table.metadata.snapshot_by_name(branch)
    requirements = (
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertRefSnapshotId(snapshot_id=head.snapshot_id if head else None, ref=branch),  # type: ignore[call-arg]
    )
    props = dict(properties)
    updates: list[Any] = []
    written = None
    if head is not None:  # the table's state file attached to the head (lakesink.table.state_files)
        statistics, more, written = _attach_state(table, {**table.properties, **props}, head.snapshot_id, None)
        props.update(more)
        if statistics is not None:
            updates.append(_set_statistics(statistics))
    return PreparedCommit(
        table=table,
        snapshot_id=head.snapshot_id if head else -1,
        _updates=(SetPropertiesUpdate(updates=props), *updates),
        _requirements=requirements,
        _owned_files=() if written is None else (written,),
    )


class _ReplaceFiles(_OverwriteRemovedFiles):
    """pyiceberg's overwrite producer, recorded as Iceberg's ``replace`` operation (files rewritten, rows
    unchanged). pyiceberg 0.12 has no rewrite action; its summary code knows only append/overwrite/delete,
    so the summary is computed as an overwrite's and relabelled."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        summary = super()._summary(snapshot_properties)
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)


def prepare_replace(
    table: Table,
    *,
    deleted: Sequence[DataFile],
    added: Sequence[DataFile],
    summary: Mapping[str, str],
    branch: str,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Stage a ``replace`` snapshot on ``table``'s ``branch``: ``deleted`` (live in its head) rewritten as ``added``.

    The swap requires the branch head to be the one read: a commit landing in between makes it conflict, and
    the caller re-prepares on the new head (checking the rewritten files are all still live first).
    """
    tx = _MetadataCachingTransaction(table)
    producer = _ReplaceFiles(
        operation=Operation.OVERWRITE,  # relabelled REPLACE in its summary
        transaction=tx,
        io=table.io,
        commit_uuid=commit,  # type: ignore[arg-type]  # formatted into names only (lakesink.table.names)
        branch=branch,
        snapshot_properties=dict(summary),
    )
    for f in deleted:
        producer.delete_data_file(f)
    for f in added:
        producer.append_data_file(f)
    producer.commit()
    statistics, more, written = _attach_state(table, table.properties, producer.snapshot_id, commit)
    if more:
        tx.set_properties(more)
    if statistics is not None:
        tx._apply((_set_statistics(statistics),))
    return _prepared(table, tx, producer, files_since_ms=files_since_ms, owned=() if written is None else (written,))


def _attach_state(
    table: Table, properties: Mapping[str, str], snapshot_id: int, commit: names.CommitName | None
) -> tuple[StatisticsFile | None, dict[str, str], str | None]:
    """:func:`lakesink.table.state_files.attach` for a table whose ``properties`` name a state file; a table without one
    (no order-by, no held changes: most tables) attaches nothing and reads nothing."""
    if not any(key.startswith(STATE_PROPERTY_PREFIXES) for key in properties):
        return None, {}, None
    return state_files.attach(table, properties, snapshot_id, commit)
