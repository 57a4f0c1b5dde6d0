"""The driver part of the seam to pyiceberg's private API (see :mod:`lakesink._pyiceberg`).

Commits prepared for exactly one compare-and-swap (:class:`PreparedCommit`: a batch's snapshot, a marker-only
commit, and the maintenance snapshots -- replace, expire, manifest rewrite), the swap and the reload on a
pyiceberg SQL catalog from the metadata already read, and schema evolution staged in a commit. pyiceberg's own
commit loop retries a conflicting snapshot by rebasing it without asking us (which would skip lakesink's replay
re-check, the way iceberg#14425 duplicated data): every commit here is one swap, and lakesink's one loop
(:mod:`lakesink.driver.swap`) decides about retries. Runs on the driver only. Tested against pyiceberg 0.12.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import Field
from pyiceberg.catalog import TOKEN, WAREHOUSE_LOCATION, Catalog
from pyiceberg.catalog.rest import _RETRY_ARGS, Endpoint, HttpMethod, RestCatalog
from pyiceberg.catalog.rest.response import _handle_non_200_response
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    CommitStateUnknownException,
    ForbiddenError,
    NoSuchTableError,
    UnauthorizedError,
    ValidationException,
)
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
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.serializers import Compressor
from pyiceberg.table import CommitTableRequest, Table, TableIdentifier, Transaction
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.refs import SnapshotRef, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    _apply_table_update,
    _TableMetadataUpdateContext,
    _update_table_metadata_log,
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
from pyiceberg.typedef import EMPTY_DICT, IcebergBaseModel, Record
from pyiceberg.utils.bin_packing import ListPacker
from pyiceberg.utils.config import Config
from requests import HTTPError
from sqlalchemy import bindparam, select
from sqlalchemy import delete as sql_delete
from sqlalchemy import update as sql_update
from sqlalchemy.orm import Session
from tenacity import retry

from lakesink._pyiceberg.io import live_entries, partition_of
from lakesink._pyiceberg.manifests import DeleteManifestWriter, snapshot_manifests, write_manifest, write_manifest_list
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, CATALOG_FAILS_AFTER_APPLY, CATALOG_FAILS_BEFORE_APPLY, fault_point
from lakesink.table import floats, names, storage
from lakesink.table.keys import AVRO_CODEC, AVRO_CODEC_DEFAULT, FORMAT_VERSION, UNIT_THREADS_FROM
from lakesink.table.keys import SUMMARY_RESTORED_FROM as RESTORED_FROM
from lakesink.table.keys import SUMMARY_RESTORED_REF as RESTORED_REF

log = logging.getLogger("lakesink")

# --- schema evolution, staged in a commit ------------------------------------------------------


def apply_schema_changes(update: UpdateSchema, changes: Sequence[Any]) -> None:
    """Stage lakesink.driver.schema.SchemaChange's on a pyiceberg UpdateSchema (public API; new columns optional)."""
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


# --- driver side: commit ------------------------------------------------------------------------


def data_file(
    *, path: str, size_in_bytes: int, statistics: Mapping[str, Any], spec_id: int, partition: Sequence[Any] = ()
) -> DataFile:
    """A DataFile for a Parquet file written by an executor (``partition``: its partition values)."""
    return DataFile.from_args(
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


@dataclass
class PreparedCommit:
    """One commit of a batch, prepared (its manifests written), ready for exactly one compare-and-swap.

    The same shape for a data snapshot (:func:`prepare_snapshot`) and for a marker-only commit
    (:func:`prepare_properties_at_head`), so that lakesink has one compare-and-swap loop for both.
    """

    table: Table
    snapshot_id: int
    """The new snapshot's id; for a marker-only commit the branch head it asserts (-1: none)."""
    _updates: tuple[Any, ...]
    _requirements: tuple[Any, ...]
    _producer: Any = None
    _owned_files: tuple[str, ...] = ()
    """Data files written for this commit attempt alone (an upsert's rewritten files), deleted by :meth:`discard`."""
    files_since_ms: int | None = None
    """When the oldest file this commit writes into the table (and that the table does not reference yet) was
    written, ms since the epoch; None: only files written by this attempt (checked by lakesink.driver.swap against
    lakesink.table.names.COMMIT_DEADLINE_MS)."""
    generic: bool = False
    """Set by :meth:`commit`: the swap went through pyiceberg's ``Table._do_commit`` (the catalog applied the
    updates to its current metadata, which may not be the metadata they were prepared on)."""
    swapped_on_base: bool = False
    """Set by :meth:`commit`: the swap landed as a compare-and-swap from the very metadata the commit was prepared on."""

    def commit(self) -> None:
        """Swap the table's metadata pointer once. Raises CommitFailedException when the base moved.

        pyiceberg's own commit loop is bypassed on purpose: it would rebase and retry without
        lakesink re-checking whether the batch is already in the table.

        On a SQL catalog the swap replaces exactly the metadata the commit was prepared and validated on (the
        pointer it read); when the pointer moved, whatever moved it, the swap is a conflict and the caller prepares
        and validates again on the new metadata. It never falls back to applying the prepared updates to metadata it
        did not validate (issue 20). Other catalogs apply them to their current metadata after checking the
        requirements atomically (the branch head, the table's identity): there, what a commit validates must be
        determined by what its requirements pin (docs/maintenance.md, "What each commit validates").
        """
        fault_point(CATALOG_FAILS_BEFORE_APPLY)
        if _sql_swap_applies(self.table):
            _swap_on_sql_catalog(self.table, self._updates, self._requirements)  # a moved pointer: CommitFailedException
            self.swapped_on_base = True
        else:
            self.generic = True
            with idempotency_key(self.table.catalog):  # one key per attempt, where the REST server supports them
                self.table._do_commit(updates=self._updates, requirements=self._requirements)
        fault_point(CATALOG_FAILS_AFTER_APPLY)

    def could_land_on(self, metadata: TableMetadata) -> bool:
        """Whether this commit's requirements still hold on ``metadata``: a request of it that a catalog server
        has not processed yet (a timed-out request still queued, a re-sent one) could still land. Once the branch
        head (or the table, schema, spec) moved away from what it asserts, it never can: it is fenced."""
        try:
            for requirement in self._requirements:
                requirement.validate(metadata)
        except CommitFailedException:
            return False
        return True

    def discard(self) -> None:
        """Delete the manifests written for this commit (only when it certainly did not land)."""
        if self._producer is not None:
            self._producer._clean_all_uncommitted()
        for path in self._owned_files:
            storage.delete_file(self.table.io, path)


class _PreparedManifests(_SnapshotProducer[Any]):
    """The part of every snapshot producer lakesink commits through: its manifests and its manifest list written, and
    the parent's manifest list read, by :mod:`lakesink._pyiceberg.manifests` (pyiceberg's own encoder and decoder, their
    Avro schemas prepared once per process instead of once per file: the same files for about 2 ms less CPU a commit).

    ``_commit`` is pyiceberg 0.12's ``_SnapshotProducer._commit`` with the manifest list written by
    :func:`lakesink._pyiceberg.manifests.write_manifest_list` (pyiceberg's takes the function from its module's globals).
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
        # lakesink's own pool (lakesink.driver.swap) only pays for in thread hand-offs (measured: 0.9 ms of CPU per
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
    (lakesink.driver.swap) pays that in thread hand-offs only, once per table of a routed unit, where the usual bin is
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
    overwrite: bool,
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Write the manifests of one snapshot (append, merging manifests as Iceberg does, or overwrite of the whole table).

    ``properties(snapshot_id)`` gives table properties to set in the same atomic commit, and
    ``schema_changes`` (lakesink.driver.schema.SchemaChange) evolve the schema in it too. ``commit`` names the
    manifests and the manifest list (lakesink.table.names); ``files_since_ms``: when the oldest of ``data_files`` was
    written.
    """
    tx = _MetadataCachingTransaction(table)
    if schema_changes:
        update_schema = tx.update_schema()
        apply_schema_changes(update_schema, schema_changes)
        update_schema.commit()  # staged in the transaction, like the snapshot below
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
    else:
        producer = _named(_merge_append(update), commit)
        # Iceberg's default for commit.manifest-merge.enabled is true (pyiceberg's is false): without merging,
        # every batch adds a manifest that every later manifest list carries forever
        producer._merge_enabled = manifest_merge
    for f in data_files:
        producer.append_data_file(f)
    return _staged(table, tx, producer, properties, files_since_ms=files_since_ms)


def _staged(
    table: Table,
    tx: Transaction,
    producer: Any,
    properties: Callable[[int], Mapping[str, str]],
    owned: Sequence[str] = (),
    *,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """Stage ``producer``'s snapshot and the properties into ``tx``: the prepared commit of both."""
    producer.commit()  # stages the snapshot into the transaction; nothing reaches the catalog yet
    # staged after the snapshot: while the producer works nothing is staged yet, so the transaction's
    # metadata is the table's own (no copy of the whole history; see _MetadataCachingTransaction)
    if props := properties(producer.snapshot_id):
        tx.set_properties(dict(props))
    # besides the branch head (AssertRefSnapshotId, from the producer): the table, its schema and its
    # partition spec must still be the ones the files were written for
    requirements = (
        *tx._requirements,
        AssertTableUUID(uuid=table.metadata.table_uuid),
        AssertCurrentSchemaId(current_schema_id=table.metadata.current_schema_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=table.metadata.default_spec_id),  # type: ignore[call-arg]
    )
    return PreparedCommit(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=requirements,
        _producer=producer,
        _owned_files=tuple(owned),
        files_since_ms=files_since_ms,
    )


def prepare_rewrite(
    table: Table,
    *,
    removed_files: Sequence[DataFile],
    data_files: Sequence[DataFile],
    rewritten_paths: Sequence[str],
    summary: Mapping[str, str],
    properties: Callable[[int], Mapping[str, str]],
    branch: str,
    schema_changes: Sequence[Any] = (),
    manifest_merge: bool = True,
    commit: names.CommitName | None = None,
    files_since_ms: int | None = None,
) -> PreparedCommit:
    """An upsert batch's snapshot (copy-on-write): remove ``removed_files``, add ``data_files`` (the batch's rows
    and the rewritten files' remaining rows), in one snapshot.

    Without removed files it is an append (merging manifests); with them an overwrite, for which pyiceberg
    checks that every removed file is still live in the branch head the commit asserts. ``rewritten_paths``
    (files written for this attempt only) are deleted by :meth:`PreparedCommit.discard`.
    """
    tx = _MetadataCachingTransaction(table)
    if schema_changes:
        update_schema = tx.update_schema()
        apply_schema_changes(update_schema, schema_changes)
        update_schema.commit()
    update = tx.update_snapshot(snapshot_properties=dict(summary), branch=branch)
    producer: Any
    if removed_files:
        producer = _named(_overwrite(update), commit)
        for removed in removed_files:
            producer.delete_data_file(removed)
    else:
        producer = _named(_merge_append(update), commit)
        producer._merge_enabled = manifest_merge
    for f in data_files:
        producer.append_data_file(f)
    return _staged(table, tx, producer, properties, rewritten_paths, files_since_ms=files_since_ms)


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
# action run by its own loop (lakesink.driver.swap); a metadata-only one is staged on a plain Transaction by
# :func:`prepare_staged` and swapped once per attempt like any other (tests/seam/test_contract.py pins both).


def refused_by_the_catalog(error: BaseException) -> bool:
    """Whether a commit's error is the catalog's definite "no" (the request was evaluated and not applied): a REST
    answer 4xx other than 408 (timeout) and 429 (throttled), which pyiceberg raises chained to the HTTP error
    (``BadRequestError``, ``ForbiddenError``, a ``RESTError`` for 422, ...). Anything else (5xx, a timeout, a reset
    connection) leaves the outcome unknown, and on a catalog reached over HTTP the request may still land later."""
    if refused_for_permission(error) is not None:
        return True  # also AWS's AccessDenied* (Glue), a botocore ClientError of its own
    cause = error.__cause__
    response = getattr(cause, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        return 400 <= status < 500 and status not in (408, 429)
    return isinstance(error, (BadRequestError, UnauthorizedError, ForbiddenError, NoSuchTableError))


#: AWS's error codes for a request its credentials may not make (botocore ``ClientError``, e.g. Glue's UpdateTable)
_AWS_ACCESS_DENIED = ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation")


def refused_for_permission(error: BaseException) -> str | None:
    """The catalog's refusal when a commit's error is a permission refusal, else None: a REST answer 403
    (``ForbiddenError``), or 401 still there after pyiceberg refreshed its token and sent the request again
    (``UnauthorizedError``), or AWS's ``AccessDenied*`` (Glue). Sending the same commit again with the same
    credentials cannot help: the caller fails fast instead of retrying."""
    cause = error.__cause__
    status = getattr(getattr(cause, "response", None), "status_code", None)
    if status in (401, 403) or (status is None and isinstance(error, (UnauthorizedError, ForbiddenError))):
        return f"HTTP {status or (403 if isinstance(error, ForbiddenError) else 401)}: {error}"
    aws = getattr(error, "response", None)
    if isinstance(aws, Mapping):
        code = str((aws.get("Error") or {}).get("Code") or "")
        http = (aws.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if code in _AWS_ACCESS_DENIED or http == 403:
            return f"{code or 'HTTP 403'}: {error}"
    return None


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


# --- audits, empty batches and branches (issue 6) -----------------------------------------------


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
    return PreparedCommit(
        table=table,
        snapshot_id=head.snapshot_id if head else -1,
        _updates=(SetPropertiesUpdate(updates=dict(properties)),),
        _requirements=requirements,
    )


# --- maintenance: compaction and snapshot expiry (issue 11) -------------------------------------


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
    requirements = (*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid))
    return PreparedCommit(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=requirements,
        _producer=producer,
        files_since_ms=files_since_ms,
    )


def prepare_remove_snapshots(table: Table, snapshot_ids: Sequence[int]) -> PreparedCommit:
    """Stage the removal of snapshots from the metadata; the swap requires every branch and tag to still point
    where it was read (so no ref can have moved onto a snapshot being removed)."""
    requirements: list[Any] = [AssertTableUUID(uuid=table.metadata.table_uuid)]
    for name, ref in table.metadata.refs.items():
        requirements.append(AssertRefSnapshotId(snapshot_id=ref.snapshot_id, ref=name))  # type: ignore[call-arg]
    return PreparedCommit(
        table=table,
        snapshot_id=-1,
        _updates=(RemoveSnapshotsUpdate(snapshot_ids=list(snapshot_ids)),),  # type: ignore[call-arg]
        _requirements=tuple(requirements),
    )


def writes_format_version(version: int) -> bool:
    """Whether this pyiceberg can write table metadata of ``version`` (0.12 reads v3 but cannot write it:
    apache/iceberg-python#1551)."""
    try:
        new_table_metadata(
            Schema(), UNPARTITIONED_PARTITION_SPEC, UNSORTED_SORT_ORDER, "file:///probe", {FORMAT_VERSION: str(version)}
        ).model_dump_json()
    except NotImplementedError:
        return False
    return True


# --- the commit's metadata from one parse: a compare-and-swap on the table read (issue 11) ----------


def updated_metadata(base: TableMetadata, updates: Sequence[Any], base_location: str) -> TableMetadata:
    """pyiceberg's ``update_table_metadata`` without its final deep copy of the whole metadata.

    The deep copy costs O(history) per commit (38,000 objects copied at 600 snapshots: about half of a commit's
    time on this machine; pyiceberg #3784, closed unmerged). Metadata models are immutable (every update makes
    a new object with ``model_copy(update=...)``), so sharing the unchanged parts with ``base`` is safe.
    """
    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        new = _update_table_metadata_log(new, base_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": int(time.time() * 1000)})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


def write_table_metadata(metadata: TableMetadata, io: Any, location: str) -> None:
    """Write a new metadata file: pyiceberg's ``SqlCatalog._write_metadata`` (``ToOutputFile.table_metadata``: the
    JSON, gzipped for a ``.gz.metadata.json`` name, never overwriting), with pyiceberg's ``legacy-current-snapshot-id``
    setting read once per process; pyiceberg reads its configuration again at every file (its YAML file and every
    environment variable: 0.1 ms, a tenth of a routed table's share of a batch's commit)."""
    data = metadata.model_dump_json(exclude_none=not _legacy_current_snapshot_id()).encode("utf-8")
    with io.new_output(location).create(overwrite=False) as out:
        out.write(Compressor.get_compressor(location).bytes_compressor()(data))


@functools.cache
def _legacy_current_snapshot_id() -> bool:
    """pyiceberg's ``legacy-current-snapshot-id`` (write a table without a snapshot as ``current-snapshot-id: -1``)."""
    return bool(Config().get_bool("legacy-current-snapshot-id"))


def _sql_swap_applies(table: Table) -> bool:
    """Whether :func:`_swap_on_sql_catalog` can commit to ``table``: a pyiceberg SQL catalog whose database reports
    the rows an UPDATE matched, and a table read from a metadata file."""
    catalog = table.catalog
    return bool(isinstance(catalog, SqlCatalog) and table.metadata_location and catalog.engine.dialect.supports_sane_rowcount)


def _swap_on_sql_catalog(table: Table, updates: Sequence[Any], requirements: Sequence[Any]) -> bool:
    """Commit on a pyiceberg SQL catalog from the metadata already read: one compare-and-swap of the pointer
    from ``table.metadata_location`` to a metadata file built from ``table.metadata``.

    pyiceberg's ``SqlCatalog.commit_table`` re-reads and re-parses the table's metadata.json, then deep-copies
    it, at every commit; both cost O(history). Here the requirements are checked against the metadata lakesink
    already read (the table the commit was prepared on), and the swap only lands if the catalog still points
    at it. Returns False, leaving nothing behind, when this path does not apply (another catalog type, or a
    database without reliable row counts: the caller commits through pyiceberg). Raises CommitFailedException,
    leaving nothing behind, when the pointer moved: the caller prepares the commit again on the new metadata
    (falling back to pyiceberg's commit there would apply the updates to metadata this commit did not validate:
    an empty batch's marker, a tag, another branch's snapshot). An error of the swap itself is raised as from
    pyiceberg's own commit. The new metadata file is named by :func:`lakesink.table.names.metadata_file_name`.
    """
    if not _sql_swap_applies(table):
        return False
    _swap_rows_on_sql_catalog([(table, updates, requirements)])
    return True


def catalog_commits_atomically(catalog: Catalog | None) -> bool:
    """Whether ``catalog`` can commit several of its tables as one unit (:func:`commit_together`): a pyiceberg SQL
    catalog on a database that reports the rows an UPDATE matched (one database transaction), or a REST catalog whose
    ``/v1/config`` lists ``POST /v1/{prefix}/transactions/commit`` (one request the server applies to every table or
    none). For ``atomic=required``: say at start, naming the catalog, when a catalog cannot."""
    if isinstance(catalog, SqlCatalog):
        return bool(catalog.engine.dialect.supports_sane_rowcount)
    if isinstance(catalog, RestCatalog):
        return _rest_lists_transactions(catalog)
    return False


#: the REST spec's multi-table commit (apache/iceberg open-api/rest-catalog-open-api.yaml, since Iceberg 1.4)
REST_TRANSACTIONS_ENDPOINT = Endpoint(http_method=HttpMethod.POST, path="/v1/{prefix}/transactions/commit")


def _rest_lists_transactions(catalog: RestCatalog) -> bool:
    """Whether the server's ``/v1/config`` listed the transactions endpoint.

    pyiceberg 0.12 reads ``/v1/config`` once, when the catalog is made, and keeps the listed endpoints in
    ``_supported_endpoints`` (no request here). A server that sends no ``endpoints`` gets pyiceberg's
    ``DEFAULT_ENDPOINTS``, which do not include it: the spec says such a server is assumed to serve it, but servers
    that omit the list exist without the route (lakana 0.20), and a unit sent there would fail at every batch. Only a
    server that lists it is sent units; the others commit one table after the other.
    """
    endpoints = getattr(catalog, "_supported_endpoints", None)
    return bool(endpoints) and REST_TRANSACTIONS_ENDPOINT in endpoints  # type: ignore[operator]


def commits_atomically(prepared: Sequence[PreparedCommit]) -> bool:
    """Whether :func:`commit_together` swaps ``prepared`` (commits of distinct tables) as one unit: one commit; every
    table on one pyiceberg SQL catalog's database, whose rows are swapped in one database transaction; or every table
    on one REST catalog (the same server, prefix and credentials) that lists ``POST /v1/{prefix}/transactions/commit``
    (:func:`catalog_commits_atomically`), none with a token of its own (the request carries one set of credentials).

    Other catalogs have no multi-table commit (Glue, Hive): lakesink.driver.swap commits their tables one after the
    other."""
    if len(prepared) < 2:
        return True
    first = prepared[0].table.catalog
    if isinstance(first, RestCatalog):
        return _rest_lists_transactions(first) and all(
            isinstance(p.table.catalog, RestCatalog)
            and (p.table.catalog is first or p.table.catalog.properties == first.properties)
            and not p.table.config.get(TOKEN)
            for p in prepared
        )
    if not isinstance(first, SqlCatalog):
        return False
    return all(
        _sql_swap_applies(p.table)
        and isinstance(p.table.catalog, SqlCatalog)
        and p.table.catalog.name == first.name
        and str(p.table.catalog.engine.url) == str(first.engine.url)
        for p in prepared
    )


def commit_together(prepared: Sequence[PreparedCommit]) -> None:
    """Swap every commit of ``prepared`` (distinct tables) or none: one commit's :meth:`PreparedCommit.commit`, or,
    when :func:`commits_atomically`, the SQL catalog's rows in one database transaction, each with its
    compare-and-swap on the metadata location its commit was prepared on, or one REST ``transactions/commit`` request
    (:func:`_commit_transaction_on_rest_catalog`). Raises CommitFailedException, leaving nothing behind, when any
    table's pointer moved or requirement failed (the whole unit is prepared again); any other error leaves every
    table's outcome to be settled by reading it (all landed or none, the catalog being atomic).

    The fault point ``CATALOG_BETWEEN_TABLE_SWAPS`` is inside the SQL transaction only: a REST unit is one request,
    there is no moment between two tables' swaps on the client side."""
    if len(prepared) == 1:
        prepared[0].commit()
        return
    if not commits_atomically(prepared):
        raise ValueError(
            "these commits cannot be swapped as one unit (not all on one pyiceberg SQL catalog, nor on one REST catalog "
            "that lists POST /v1/{prefix}/transactions/commit)"
        )
    fault_point(CATALOG_FAILS_BEFORE_APPLY)
    if isinstance(prepared[0].table.catalog, RestCatalog):
        _commit_transaction_on_rest_catalog(prepared)
    else:
        _swap_tables_on_sql_catalog(prepared)
        for p in prepared:
            p.swapped_on_base = True
    fault_point(CATALOG_FAILS_AFTER_APPLY)


class _CommitTransactionRequest(IcebergBaseModel):
    """The REST spec's ``CommitTransactionRequest`` (pyiceberg 0.12 has none: apache/iceberg-python#4123 is open)."""

    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


def _commit_transaction_on_rest_catalog(prepared: Sequence[PreparedCommit]) -> None:
    """One ``POST /v1/{prefix}/transactions/commit`` with every table's identifier, requirements and updates, exactly
    as pyiceberg's ``RestCatalog.commit_table`` sends one table's (``CommitTableRequest``), through the catalog's own
    HTTP session (its auth manager, headers, SigV4 signing, lakesink's request timeout); a 401/419 refreshes the
    token and sends it again, as pyiceberg does for a table commit.

    The server validates every requirement and applies every table's updates, or none (spec: 204 on success, 409 when
    a requirement failed). Errors as from ``commit_table``: 409 CommitFailedException (nothing applied: the loop
    prepares the unit again), 500/502/504 CommitStateUnknownException, other 5xx, timeouts and reset connections as
    raised by pyiceberg or ``requests``: an unknown outcome the loop settles per table by reading it.

    A 204 carries no metadata: each table's ``metadata`` becomes its commit applied to the metadata it was prepared
    on (the head is the snapshot that landed: what the requirements pinned), ``generic`` is set (the server applied
    the updates to its current metadata, as on any REST commit), and ``metadata_location`` stays the one read (the
    server's new file is known at the next load, which a REST catalog always makes)."""
    catalog = prepared[0].table.catalog
    assert isinstance(catalog, RestCatalog)
    request = _CommitTransactionRequest(
        **{
            "table-changes": [
                CommitTableRequest(
                    identifier=TableIdentifier(namespace=p.table.name()[:-1], name=p.table.name()[-1]),  # type: ignore[arg-type]
                    requirements=p._requirements,
                    updates=p._updates,
                )
                for p in prepared
            ]
        }
    )
    with idempotency_key(catalog):
        _post_transaction(catalog, request.model_dump_json().encode("utf-8"))
    for p in prepared:
        p.generic = True
        p.table.metadata = updated_metadata(p.table.metadata, p._updates, p.table.metadata_location)


#: pyiceberg's retry of a REST request whose token expired (401/419): refresh the token, send once more
_retry_on_expired_token: Callable[[Callable[[RestCatalog, bytes], None]], Callable[[RestCatalog, bytes], None]] = retry(
    **_RETRY_ARGS  # type: ignore[call-overload]
)


@_retry_on_expired_token
def _post_transaction(catalog: RestCatalog, body: bytes) -> None:
    response = catalog._session.post(catalog.url("transactions/commit", prefixed=True), data=body)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(
            exc,
            {
                404: NoSuchTableError,
                409: CommitFailedException,
                500: CommitStateUnknownException,
                502: CommitStateUnknownException,
                504: CommitStateUnknownException,
            },
        )


def _swap_tables_on_sql_catalog(prepared: Sequence[PreparedCommit]) -> None:
    """:func:`_swap_on_sql_catalog` for several tables of one SQL catalog in one database transaction: a table's
    row moves only if every row does (SQLite and PostgreSQL roll the whole transaction back otherwise, and a
    process killed inside it leaves it uncommitted). Iceberg Java's JdbcCatalog reads the same rows."""
    _swap_rows_on_sql_catalog([(p.table, p._updates, p._requirements) for p in prepared])


def _swap_rows_on_sql_catalog(items: Sequence[tuple[Table, Sequence[Any], Sequence[Any]]]) -> None:
    """The SQL catalog's compare-and-swap of one table or several (``items``: each table as read, its updates and
    requirements), all in one database transaction: every requirement checked against the metadata read, every new
    metadata file written, then one ``UPDATE iceberg_tables ... WHERE metadata_location = <read>`` per table; a row
    that matches nothing rolls all of them back (CommitFailedException, leaving nothing behind). On success each
    table holds its new metadata and location."""
    catalog = items[0][0].catalog
    assert isinstance(catalog, SqlCatalog)
    for table, _, requirements in items:
        for requirement in requirements:
            requirement.validate(table.metadata)  # CommitFailedException: a clean conflict, as from the catalog

    def stage(item: tuple[Table, Sequence[Any], Sequence[Any]]) -> tuple[Table, TableMetadata, str]:
        table, updates, _ = item
        base_location = table.metadata_location
        new = updated_metadata(table.metadata, updates, base_location)
        version = SqlCatalog._parse_metadata_version(base_location) + 1
        location = load_location_provider(new.location, new.properties).new_metadata_location(names.metadata_file_name(version))
        write_table_metadata(new, table.io, location)
        return table, new, location

    staged: list[tuple[Table, TableMetadata, str]] = []
    threads = unit_threads([t for t, _, _ in items]) if len(items) >= UNIT_THREADS_FROM else 1
    if threads == 1:
        try:
            for item in items:
                staged.append(stage(item))
        except BaseException:
            for table, _, written in staged:
                table.io.delete(written)
            raise
    else:  # each table's metadata file written beside the others' (the unit's largest cost after its manifests)
        with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="lakesink-stage") as pool:
            futures = [pool.submit(stage, item) for item in items]
        errors = [f.exception() for f in futures if f.exception() is not None]
        staged = [f.result() for f in futures if f.exception() is None]
        if errors:
            for table, _, written in staged:
                table.io.delete(written)
            raise errors[0]  # type: ignore[misc]

    def moved(table: Table, session: Session) -> CommitFailedException:
        session.rollback()
        for t, _, written in staged:
            t.io.delete(written)  # certainly referenced by nothing: no pointer moved to it
        # a conflict, never a fallback onto the new metadata: what this commit validated (a compaction's history, the
        # replay marker) was read from the metadata it was prepared on (issue 20)
        unit = f" (a unit of {len(staged)} tables: none was committed)" if len(staged) > 1 else ""
        return CommitFailedException(
            f"the metadata pointer of table {'.'.join(table.name())} moved since {table.metadata_location} was read{unit}"
        )

    rows_table: Any = IcebergTables.__table__  # the Core table: one statement executed for many parameter sets
    rows = rows_table.c
    with Session(catalog.engine) as session:
        first, _, location = staged[0]
        result = session.execute(
            sql_update(IcebergTables)
            .where(*_row_of(catalog, first), IcebergTables.metadata_location == first.metadata_location)
            .values(metadata_location=location, previous_metadata_location=first.metadata_location)
        )
        if result.rowcount < 1:  # type: ignore[attr-defined]
            raise moved(first, session)
        rest = staged[1:]
        if rest:
            fault_point(CATALOG_BETWEEN_TABLE_SWAPS)
        if rest and catalog.engine.dialect.supports_sane_multi_rowcount:
            # the other rows in one statement, executed for each (each row's own compare-and-swap): the driver
            # reports the rows matched in total, and each matches at most one, so all moved iff the total is theirs
            stmt = (
                sql_update(rows_table)
                .where(
                    rows.catalog_name == bindparam("b_catalog"),
                    rows.table_namespace == bindparam("b_namespace"),
                    rows.table_name == bindparam("b_name"),
                    rows.metadata_location == bindparam("b_old"),
                )
                .values(metadata_location=bindparam("b_new"), previous_metadata_location=bindparam("b_old"))
            )
            params = [
                {
                    "b_catalog": catalog.name,
                    "b_namespace": Catalog.namespace_to_string(Catalog.namespace_from(t.name())),
                    "b_name": Catalog.table_name_from(t.name()),
                    "b_old": t.metadata_location,
                    "b_new": loc,
                }
                for t, _, loc in rest
            ]
            result = session.connection().execute(stmt, params)
            if result.rowcount != len(rest):
                raise moved(rest[0][0], session)
        else:
            for t, _, loc in rest:
                result = session.execute(
                    sql_update(IcebergTables)
                    .where(*_row_of(catalog, t), IcebergTables.metadata_location == t.metadata_location)
                    .values(metadata_location=loc, previous_metadata_location=t.metadata_location)
                )
                if result.rowcount < 1:  # type: ignore[attr-defined]
                    raise moved(t, session)
        session.commit()
    for table, new, location in staged:
        try:
            catalog._delete_old_metadata(table.io, table.metadata, new)  # write.metadata.delete-after-commit.enabled
        except Exception as e:
            warnings.warn(f"Failed to delete old metadata after commit: {e}", stacklevel=2)
        table.metadata = new
        table.metadata_location = location


#: The threads a unit of tables on object storage (S3, GCS, ADLS, ...) is prepared on: each table's manifest, manifest
#: list and metadata file is a round trip to the store, which the pool overlaps.
_REMOTE_THREADS = 8


def unit_threads(tables: Sequence[Table]) -> int:
    """How many threads prepare (or stage the metadata files of) a unit of commits of ``tables``: on object storage
    :data:`_REMOTE_THREADS`, whose round trips they overlap; when every table is on the local filesystem, the
    machine's cores (at most :data:`_REMOTE_THREADS`), since the work is then CPU under one GIL, which more threads
    only hand back and forth (measured, docs/performance.md "One stream, many tables": 100 tables a batch on 2 cores,
    quiet, median batch 232-276 ms on 2 threads against 347-357 ms on 8 and 297-340 ms on the calling thread alone).
    1: on the calling thread."""
    if tables and all(storage.local_path(t.metadata_location or t.metadata.location) is not None for t in tables):
        return max(1, min(os.cpu_count() or 1, _REMOTE_THREADS))
    return _REMOTE_THREADS


def _row_of(catalog: SqlCatalog, table: Table) -> tuple[Any, ...]:
    """The WHERE terms of a table's row in pyiceberg's ``iceberg_tables`` (without its compare-and-swap)."""
    identifier = table.name()
    return (
        IcebergTables.catalog_name == catalog.name,
        IcebergTables.table_namespace == Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
        IcebergTables.table_name == Catalog.table_name_from(identifier),
    )


def set_request_timeout(catalog: Any, seconds: float) -> bool:
    """Give every HTTP request of a REST catalog a timeout of ``seconds``; False when ``catalog`` is not one.

    pyiceberg 0.12's REST client sets none (``requests`` without ``timeout=``): a catalog server that accepts the
    connection and never answers hangs the commit, and the streaming query, forever (apache/iceberg-python#2772;
    the ``connection.timeout`` property of #3418 is not in 0.12). The timeout is applied to the session's
    transport adapters (also SigV4's), so it covers every call: config, token, load, commit.
    """
    if not isinstance(catalog, RestCatalog):
        return False
    adapter: Any
    for adapter in catalog._session.adapters.values():
        if getattr(adapter, "_lakesink_timeout", None) is not None:
            adapter._lakesink_timeout = seconds
            continue
        original = adapter.send

        def send(request: Any, *args: Any, _send: Any = original, _adapter: Any = adapter, **kwargs: Any) -> Any:
            if kwargs.get("timeout") is None:
                kwargs["timeout"] = _adapter._lakesink_timeout
            return _send(request, *args, **kwargs)

        adapter._lakesink_timeout = seconds
        adapter.send = send
    return True


# --- the REST spec's Idempotency-Key (apache/iceberg open-api/rest-catalog-open-api.yaml) -----------------------------
#
# The spec lets a client send ``Idempotency-Key: <UUIDv7>`` on every mutation endpoint (table commit,
# transactions/commit, create, drop, ...) of a server whose ``/v1/config`` carries ``idempotency-key-lifetime`` (an
# ISO-8601 duration; absent: the client MUST assume no support). The server then applies a request with a given key
# at most once and answers every later request with the same key with the first one's final answer (2xx and
# terminal 4xx such as 409 are replayed; 5xx are not stored). Clients MUST reuse the key when they retry the same
# logical operation and MUST use a new one for a different operation. Iceberg Java (RESTSessionCatalog
# ``mutationHeaders``) sends a new key per request when the server advertises the lifetime; pyiceberg 0.12 neither
# reads the lifetime nor sends the header.
#
# lakesink sends one key per commit *attempt*: every attempt of its loop is a different operation (prepared again
# on the table as read, with a new snapshot id and other requirements), while a resend of one attempt's request
# (pyiceberg sending it again after a token refresh, a gateway or proxy re-sending after losing the answer) is the
# same operation and carries the same key: the server applies it once and answers the resend with the true first
# answer instead of a 409 that hides a commit that landed.

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_LIFETIME = "idempotency-key-lifetime"
_key_of_this_thread = threading.local()


def uuid7() -> str:
    """A UUIDv7 (RFC 9562, section 5.7: 48 bits of Unix time in ms, version 7, variant 10, 74 random bits), the
    form the spec asks of an idempotency key (Python's ``uuid.uuid7`` arrives with 3.14)."""
    made = getattr(uuid, "uuid7", None)
    if made is not None:  # pragma: no cover - Python >= 3.14
        return str(made())
    value = (time.time_ns() // 1_000_000 & (1 << 48) - 1) << 80 | int.from_bytes(os.urandom(10), "big") & (1 << 80) - 1
    value = value & ~(0xF << 76) | 0x7 << 76  # version 7
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant 10
    return str(uuid.UUID(int=value))


def idempotency_key_lifetime(catalog: Any) -> str | None:
    """The ``idempotency-key-lifetime`` a REST catalog's ``/v1/config`` advertises (None: no Idempotency-Key support,
    or not a REST catalog). pyiceberg 0.12 drops the field when it reads the config, so it is read here with one more
    ``GET /v1/config`` through the catalog's own session (its timeout, auth and signing), once per catalog object, at
    its first commit (reads never need it). When that read fails, the commit goes without a key (what every server
    without support gets) and the next commit asks again: a failed config read never fails a commit."""
    if not isinstance(catalog, RestCatalog):
        return None
    known = catalog.__dict__.get("_lakesink_idempotency_lifetime", _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[no-any-return]
    try:
        lifetime = _get_config(catalog).get(IDEMPOTENCY_KEY_LIFETIME)
    except (TypeError, AttributeError, NameError, AssertionError):
        raise  # a bug, or pyiceberg's API changed under the seam
    except Exception as e:  # the commit goes without a key this time (as to any server without support); asked again next time
        log.info("lakesink: cannot read the REST catalog's /v1/config for idempotency-key-lifetime (%s)", type(e).__name__)
        return None
    found = str(lifetime) if isinstance(lifetime, str) and lifetime.strip() else None
    catalog.__dict__["_lakesink_idempotency_lifetime"] = found
    return found


_UNKNOWN = object()

_ConfigRead = Callable[[RestCatalog], dict[str, Any]]
_retry_config_on_expired_token: Callable[[_ConfigRead], _ConfigRead] = retry(**_RETRY_ARGS)  # type: ignore[call-overload]


@_retry_config_on_expired_token
def _get_config(catalog: RestCatalog) -> dict[str, Any]:
    """``GET /v1/config`` as pyiceberg sends it (with the warehouse, when set), refreshing an expired token once."""
    params = {WAREHOUSE_LOCATION: catalog.properties[WAREHOUSE_LOCATION]} if catalog.properties.get(WAREHOUSE_LOCATION) else {}
    response = catalog._session.get(catalog.url("config", prefixed=False), params=params)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(exc, {})
    doc = response.json()
    return doc if isinstance(doc, dict) else {}


@contextmanager
def idempotency_key(catalog: Any) -> Iterator[str | None]:
    """Send every commit request of this thread inside the block with one new Idempotency-Key, when ``catalog`` is a
    REST catalog whose server advertises support (:func:`idempotency_key_lifetime`); else send none."""
    if idempotency_key_lifetime(catalog) is None:
        yield None
        return
    _send_keys_through(catalog)
    key = uuid7()
    _key_of_this_thread.key = (key, catalog.url("", prefixed=False))
    try:
        yield key
    finally:
        _key_of_this_thread.key = None


def _send_keys_through(catalog: RestCatalog) -> None:
    """Wrap the send of the catalog session's transport adapters (once): a POST to the catalog's ``/v1/`` routes sent
    while this thread holds a key (:func:`idempotency_key`) carries it, resent or not; token requests (the catalog's
    ``oauth/tokens``, an external ``oauth2-server-uri``) never do."""
    adapter: Any
    for adapter in catalog._session.adapters.values():
        if getattr(adapter, "_lakesink_idempotency", False):
            continue
        original = adapter.send

        def send(request: Any, *args: Any, _send: Any = original, **kwargs: Any) -> Any:
            held = getattr(_key_of_this_thread, "key", None)
            url = str(request.url).split("?")[0]
            if held and request.method == "POST" and url.startswith(held[1]) and not url.endswith("/oauth/tokens"):
                request.headers[IDEMPOTENCY_KEY_HEADER] = held[0]
            return _send(request, *args, **kwargs)

        adapter.send = send
        adapter._lakesink_idempotency = True


def reload_from_sql_catalog(catalog: Any, identifier: tuple[str, ...], known: Table) -> Table | None:
    """Read a table's metadata pointer from a SQL catalog; when it still names ``known.metadata_location``,
    return a Table over ``known``'s already parsed metadata, else the table loaded and parsed as pyiceberg does.

    Returns None when this does not apply (not a pyiceberg SQL catalog): the caller loads the table itself.
    Metadata files are immutable and written once, so a pointer equal to the known location means the same
    metadata; the models are frozen, so sharing them is safe. This saves parsing the whole metadata.json
    (O(history)) at every batch's reads (the replay check before writing, the commit). NoSuchTableError as
    from ``load_table``.
    """
    if not isinstance(catalog, SqlCatalog):
        return None
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    with Session(catalog.engine) as session:
        stmt = select(IcebergTables).where(
            IcebergTables.catalog_name == catalog.name,
            IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == name,
        )
        if (type_filter := catalog._iceberg_type_filter()) is not None:
            stmt = stmt.where(type_filter)
        row = session.scalar(stmt)
        if row is None:
            raise NoSuchTableError(f"Table does not exist: {namespace}.{name}")
        if row.metadata_location and row.metadata_location == known.metadata_location:
            return Table(
                identifier=known.name(),
                metadata=known.metadata,
                metadata_location=known.metadata_location,
                io=known.io,
                catalog=catalog,
            )
        return catalog._convert_orm_to_iceberg(row)


def pointers_on_sql_catalog(catalog: Any, identifiers: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], str] | None:
    """The metadata pointers of ``identifiers`` in a SQL catalog, read in one query (tables that do not exist are
    absent); None when ``catalog`` is not a pyiceberg SQL catalog."""
    if not isinstance(catalog, SqlCatalog):
        return None
    wanted = {(Catalog.namespace_to_string(Catalog.namespace_from(i)), Catalog.table_name_from(i)): tuple(i) for i in identifiers}
    out: dict[tuple[str, ...], str] = {}
    names_ = sorted({name for _, name in wanted})
    with Session(catalog.engine) as session:
        for start in range(0, len(names_), 500):  # bounded IN lists
            stmt = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
                IcebergTables.catalog_name == catalog.name, IcebergTables.table_name.in_(names_[start : start + 500])
            )
            if (type_filter := catalog._iceberg_type_filter()) is not None:
                stmt = stmt.where(type_filter)
            for namespace, name, location in session.execute(stmt):
                ident = wanted.get((namespace, name))
                if ident is not None and location:
                    out[ident] = location
    return out


def drop_unchanged_on_sql_catalog(catalog: Any, identifier: tuple[str, ...], metadata_location: str) -> bool | None:
    """Drop a table of a SQL catalog (its row; no file) only if its metadata pointer is still ``metadata_location``:
    one ``DELETE ... WHERE metadata_location = <read>``, so that a commit landing meanwhile is never dropped.
    True when dropped, False when the pointer moved (or the table is gone); None when ``catalog`` is not a pyiceberg
    SQL catalog."""
    if not isinstance(catalog, SqlCatalog):
        return None
    rows: Any = IcebergTables.__table__
    with Session(catalog.engine) as session:
        result = session.execute(
            sql_delete(rows).where(
                rows.c.catalog_name == catalog.name,
                rows.c.table_namespace == Catalog.namespace_to_string(Catalog.namespace_from(identifier)),
                rows.c.table_name == Catalog.table_name_from(identifier),
                rows.c.metadata_location == metadata_location,
            )
        )
        session.commit()
        return bool(result.rowcount)  # type: ignore[attr-defined]


def all_pointers_on_sql_catalog(catalog: Any) -> list[tuple[tuple[str, ...], str]] | None:
    """Every table of a SQL catalog with its current metadata location, in one query (its rows, nothing loaded);
    None when ``catalog`` is not a pyiceberg SQL catalog."""
    if not isinstance(catalog, SqlCatalog):
        return None
    stmt = select(IcebergTables.table_namespace, IcebergTables.table_name, IcebergTables.metadata_location).where(
        IcebergTables.catalog_name == catalog.name
    )
    if (type_filter := catalog._iceberg_type_filter()) is not None:
        stmt = stmt.where(type_filter)
    with Session(catalog.engine) as session:
        return [
            ((*Catalog.identifier_to_tuple(namespace), name), location)
            for namespace, name, location in session.execute(stmt)
            if location
        ]


# --- maintenance: manifest rewrite (issue 11) ----------------------------------------------------


class _RewriteManifests(_PreparedManifests, _SnapshotProducer["_RewriteManifests"]):
    """A snapshot with the same data files as the branch head, their manifests rewritten: Iceberg's
    ``RewriteManifests`` (``BaseRewriteManifests`` in Java). pyiceberg 0.12 has no rewrite action.

    Every live entry of the head's data manifests is written again as an ``EXISTING`` entry through pyiceberg's
    ``ManifestWriter.existing``, which keeps the entry's snapshot id, data sequence number and file sequence number
    (as Java's ``ManifestWriter.existing`` / ``wrapExisting`` do): the rows keep the snapshot that added them, and
    time travel and equality/position delete semantics are unchanged. Entries are clustered by partition and rolled
    into a new manifest every ``entries_per_manifest`` entries. Delete manifests are kept as they are (as in Java).
    """

    def __init__(self, *args: Any, entries_per_manifest: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entries_per_manifest = max(1, entries_per_manifest)
        self.replaced: list[ManifestFile] = []
        self.created: list[ManifestFile] = []
        self.kept: list[ManifestFile] = []
        self.entries = 0

    def _deleted_entries(self) -> list[ManifestEntry]:
        return []

    def _existing_manifests(self) -> list[ManifestFile]:
        self.replaced, self.created, self.kept, self.entries = [], [], [], 0
        head = self._transaction.table_metadata.snapshot_by_name(self._target_branch)
        if head is None:
            return []
        by_spec: dict[int, list[ManifestEntry]] = {}
        for manifest in head.manifests(io=self._io):
            if manifest.content != ManifestContent.DATA:
                self.kept.append(manifest)
                continue
            self.replaced.append(manifest)
            by_spec.setdefault(manifest.partition_spec_id, []).extend(
                manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            )
        for spec_id, entries in sorted(by_spec.items()):
            entries.sort(key=lambda e: (_partition_sort_key(e.data_file.partition), e.data_file.file_path))
            for start in range(0, len(entries), self._entries_per_manifest):
                with self.new_manifest_writer(self.spec(spec_id)) as writer:
                    for entry in entries[start : start + self._entries_per_manifest]:
                        writer.existing(entry)
                self.created.append(writer.to_manifest_file())
            self.entries += len(entries)
        return self.created + self.kept

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id else None
        totals = {
            k: v
            for k, v in (parent.summary.additional_properties if parent and parent.summary else {}).items()
            if k.startswith("total-")
        }
        return Summary(
            operation=Operation.REPLACE,
            **totals,
            **{
                "manifests-created": str(len(self.created)),
                "manifests-kept": str(len(self.kept)),
                "manifests-replaced": str(len(self.replaced)),
                "entries-processed": str(self.entries),
            },
            **snapshot_properties,
        )


def _partition_sort_key(partition: Record) -> tuple[tuple[bool, str], ...]:
    """A total order of partition values (nulls first), for clustering manifest entries by partition."""
    return tuple((v is not None, repr(v)) for v in partition)  # type: ignore[attr-defined]  # Record iterates over its values


@dataclass
class PreparedManifestRewrite(PreparedCommit):
    """A prepared manifest rewrite, with what it replaces and creates (for the report)."""

    replaced: tuple[str, ...] = ()
    created: tuple[str, ...] = ()
    kept: int = 0
    entries: int = 0


def prepare_rewrite_manifests(
    table: Table, *, branch: str, entries_per_manifest: int, summary: Mapping[str, str], commit: names.CommitName | None = None
) -> PreparedManifestRewrite:
    """Stage a ``replace`` snapshot on ``branch`` whose data manifests are the head's, rewritten (see
    :class:`_RewriteManifests`). The swap requires the branch head (and the table) to be the ones read."""
    tx = _MetadataCachingTransaction(table)
    producer = _RewriteManifests(
        operation=Operation.REPLACE,
        transaction=tx,
        io=table.io,
        commit_uuid=commit,
        branch=branch,
        snapshot_properties=dict(summary),
        entries_per_manifest=entries_per_manifest,
    )
    producer.commit()
    return PreparedManifestRewrite(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _requirements=(*tx._requirements, AssertTableUUID(uuid=table.metadata.table_uuid)),
        _producer=producer,
        replaced=tuple(m.manifest_path for m in producer.replaced),
        created=tuple(m.manifest_path for m in producer.created),
        kept=len(producer.kept),
        entries=producer.entries,
    )


def prepare_expire(table: Table, snapshot_ids: Sequence[int], refs: Sequence[str]) -> PreparedCommit:
    """:func:`prepare_remove_snapshots` that also removes the branches and tags ``refs`` (Iceberg's ExpireSnapshots
    removing refs older than their max-ref-age), in the same compare-and-swap."""
    prepared = prepare_remove_snapshots(table, snapshot_ids)
    removals = tuple(RemoveSnapshotRefUpdate(ref_name=name) for name in refs)  # type: ignore[call-arg]
    prepared._updates = (*removals, *(prepared._updates if snapshot_ids else ()))
    # which refs and snapshots to keep was decided on this metadata: applied to other metadata, the removal would
    # drop any ref created meanwhile on a removed snapshot (pyiceberg and Iceberg Java drop a ref whose snapshot
    # is removed). A SQL catalog's swap applies it to exactly this metadata (PreparedCommit.commit); see
    # lakesink.maintenance.expiry for catalogs that always apply updates to their current metadata.
    return prepared


def prepare_restore_refs(
    table: Table, lost: Mapping[str, tuple[SnapshotRef, Snapshot]], *, commit: names.CommitName
) -> PreparedCommit:
    """Put back refs that a snapshot expiry dropped together with their snapshot (``lost``: name -> (the ref, the
    snapshot it named), as in the metadata the expiry replaced).

    A removed snapshot cannot be added back as it was: Iceberg sets the table's last sequence number to the added
    snapshot's, so an old one would move it backwards. Each lost snapshot comes back **under its own id** (the id
    the user tagged, which an audit may have recorded: ``read_at(snapshot_id=...)`` reads the same rows again) with
    the next sequence number, whose manifest list lists exactly the lost snapshot's manifests (their own sequence
    numbers are in the list, so every row and delete reads as before); its parent is the lost snapshot's parent (gone
    too, as after any expiry in Iceberg Java; for a snapshot without a parent, an id no snapshot of the table has,
    so that the catalog still checks the sequence number, which Iceberg skips for a snapshot without parent), and its
    summary says it was restored (:data:`RESTORED_FROM`). A lost snapshot that exists again (put back by another
    process) is not added twice. Each ref is set to it with its own retention. The swap requires each ref still to
    be absent, and (through the parent) the catalog refuses the new sequence number when another snapshot was added
    meanwhile: a conflict, prepared again on the new metadata.
    """
    md = table.metadata
    provider = load_location_provider(table_location=table.location(), table_properties=md.properties)
    compression = md.properties.get(AVRO_CODEC, AVRO_CODEC_DEFAULT)
    updates: list[Any] = []
    requirements: list[Any] = [AssertTableUUID(uuid=md.table_uuid)]
    written: list[str] = []
    sequence = md.next_sequence_number()
    used: set[int] = set()
    made: dict[int, int] = {}  # lost snapshot id -> the snapshot its refs are set to (its own id)
    try:
        for name, (ref, snapshot) in sorted(lost.items()):
            requirements.append(AssertRefSnapshotId(snapshot_id=None, ref=name))  # type: ignore[call-arg]
            if snapshot.snapshot_id not in made and md.snapshot_by_id(snapshot.snapshot_id) is not None:
                made[snapshot.snapshot_id] = snapshot.snapshot_id  # back already (another process): only the ref
            if snapshot.snapshot_id not in made:
                new_id = snapshot.snapshot_id  # its own id again: the id the user tagged
                parent = snapshot.parent_snapshot_id
                if parent is None:  # an id of no snapshot, never the snapshot's own (a lineage walk would loop)
                    parent = md.new_snapshot_id()
                    while parent in used or parent == new_id or md.snapshot_by_id(parent) is not None:
                        parent = md.new_snapshot_id()
                    used.add(parent)
                path = provider.new_metadata_location(names.manifest_list_name(commit, new_id))
                written.append(path)
                with write_manifest_list(
                    format_version=md.format_version,
                    output_file=table.io.new_output(path),
                    snapshot_id=new_id,
                    parent_snapshot_id=parent,
                    sequence_number=sequence,
                    avro_compression=compression,
                ) as writer:
                    writer.add_manifests(list(snapshot_manifests(table.io, snapshot)))
                refs = sorted(n for n, (_, s) in lost.items() if s.snapshot_id == snapshot.snapshot_id)
                props = snapshot.summary.additional_properties if snapshot.summary else {}
                kept = {k: v for k, v in props.items() if not k.startswith(("lakesink.", "spark."))}
                summary = Summary(
                    operation=snapshot.summary.operation if snapshot.summary else Operation.APPEND,
                    **kept,
                    **{RESTORED_FROM: str(snapshot.snapshot_id), RESTORED_REF: ",".join(refs)},
                )
                restored = Snapshot(  # type: ignore[call-arg]
                    snapshot_id=new_id,
                    parent_snapshot_id=parent,
                    sequence_number=sequence if md.format_version > 1 else snapshot.sequence_number,
                    manifest_list=path,
                    summary=summary,
                    schema_id=snapshot.schema_id,
                )
                updates.append(AddSnapshotUpdate(snapshot=restored))
                made[snapshot.snapshot_id] = new_id
                if md.format_version > 1:
                    sequence += 1
            updates.append(
                SetSnapshotRefUpdate(  # type: ignore[call-arg]
                    ref_name=name,
                    type=ref.snapshot_ref_type,
                    snapshot_id=made[snapshot.snapshot_id],
                    max_ref_age_ms=ref.max_ref_age_ms,
                    max_snapshot_age_ms=ref.max_snapshot_age_ms,
                    min_snapshots_to_keep=ref.min_snapshots_to_keep,
                )
            )
    except BaseException:
        for path in written:
            storage.delete_file(table.io, path)
        raise
    return PreparedCommit(
        table=table,
        snapshot_id=-1,
        _updates=tuple(updates),
        _requirements=tuple(requirements),
        _owned_files=tuple(written),
    )


def keeping_ref_retention(metadata: TableMetadata, updates: Sequence[Any]) -> tuple[Any, ...]:
    """``updates`` with every branch move keeping the branch's own retention (``min-snapshots-to-keep``,
    ``max-snapshot-age-ms``, ``max-ref-age-ms``).

    pyiceberg's snapshot producers move a branch with a ``SetSnapshotRefUpdate`` that carries none of them, and
    applying it replaces the ref: every commit to a branch wiped its retention. Java keeps them
    (``TableMetadata.Builder.setBranchSnapshot`` builds the ref with ``SnapshotRef.builderFrom(ref, snapshotId)``).
    """
    out = []
    for update in updates:
        ref = metadata.refs.get(update.ref_name) if isinstance(update, SetSnapshotRefUpdate) else None
        if ref is not None and update.type == ref.snapshot_ref_type:
            kept = {
                field: getattr(ref, field)
                for field in ("min_snapshots_to_keep", "max_snapshot_age_ms", "max_ref_age_ms")
                if getattr(update, field) is None and getattr(ref, field) is not None
            }
            if kept:
                update = update.model_copy(update=kept)
        out.append(update)
    return tuple(out)
