"""Maintenance snapshot producers: a manifest rewrite, a snapshot expiry (and the refs it removes), and the refs an
expiry dropped put back. Each prepared for exactly one compare-and-swap (:class:`lakesink._pyiceberg.commit.PreparedCommit`).
Driver side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestFile
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.refs import SnapshotRef
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetSnapshotRefUpdate,
    SetStatisticsUpdate,
)
from pyiceberg.table.update.snapshot import _SnapshotProducer
from pyiceberg.typedef import EMPTY_DICT, Record

from lakesink._pyiceberg.commit import PreparedCommit
from lakesink._pyiceberg.io.metadata import keeping_ref_retention, manifest_entries, snapshot_manifests, write_manifest_list
from lakesink._pyiceberg.producers import _MetadataCachingTransaction, _PreparedManifests
from lakesink.table import names, state_files, storage
from lakesink.table.keys import AVRO_CODEC, AVRO_CODEC_DEFAULT
from lakesink.table.keys import SUMMARY_RESTORED_FROM as RESTORED_FROM
from lakesink.table.keys import SUMMARY_RESTORED_REF as RESTORED_REF


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
        for manifest in snapshot_manifests(self._io, head):
            if manifest.content != ManifestContent.DATA:
                self.kept.append(manifest)
                continue
            self.replaced.append(manifest)
            by_spec.setdefault(manifest.partition_spec_id, []).extend(manifest_entries(manifest, self._io, discard_deleted=True))
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
    # the table's state file attached to the new snapshot too (lakesink.table.state_files): the properties do not
    # change, so it is the current one (a state file that is written here is a commit file of this attempt)
    statistics, more, written = state_files.attach(table, table.properties, producer.snapshot_id, commit)
    if more:
        tx.set_properties(more)
    if statistics is not None:
        tx._apply((SetStatisticsUpdate(statistics=statistics),))  # type: ignore[call-arg]
    return PreparedManifestRewrite(
        table=table,
        snapshot_id=producer.snapshot_id,
        _updates=keeping_ref_retention(table.metadata, tx._updates),
        _owned_files=() if written is None else (written,),
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
