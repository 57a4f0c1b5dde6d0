"""lakesink's manifest and manifest-list writers (lakesink/_pyiceberg/io/metadata.py) write the files pyiceberg writes.

The same entries are written with pyiceberg 0.12's writers and with lakesink's, for v1 and v2 tables, unpartitioned
and partitioned (identity on string, date, decimal, double with NaN, long; days, bucket, truncate), with bounds,
value/null/NaN counts, column sizes, split offsets, key metadata absent, ADDED/EXISTING/DELETED entries, and each
Avro codec lakesink writes. The two files must be the same bytes once the random sync marker is set aside (so the
same Avro schema, field ids, logical types, required/optional, and the same file metadata keys), and pyiceberg's
reader (and lakesink's prepared reader) must read back the same values, field by field. The engines that are not
pyiceberg read tables committed through these writers in tests/driver/test_routing_interop.py.
"""

from __future__ import annotations

import math
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.conversions import to_bytes
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    read_manifest_list,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
    UUIDType,
)

from lakesink._pyiceberg import maintenance as seam_maintenance
from lakesink._pyiceberg import producers as seam_producers
from lakesink._pyiceberg.io import metadata as manifests
from tests.support.row_deletes import DeleteManifestWriter as ReferenceDeleteManifestWriter  # what lakesink wrote before its own

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=False),
    NestedField(3, "user", StringType(), required=False),
    NestedField(4, "amount", DoubleType(), required=False),
    NestedField(5, "day", DateType(), required=False),
    NestedField(6, "price", DecimalType(12, 2), required=False),
    NestedField(7, "ok", BooleanType(), required=False),
    NestedField(8, "key", UUIDType(), required=False),
    schema_id=3,
)

SPECS = {
    "unpartitioned": UNPARTITIONED_PARTITION_SPEC,
    "identity": PartitionSpec(
        PartitionField(3, 1000, IdentityTransform(), "user"),
        PartitionField(5, 1001, IdentityTransform(), "day"),
        PartitionField(6, 1002, IdentityTransform(), "price"),
        PartitionField(4, 1003, IdentityTransform(), "amount"),
        PartitionField(1, 1004, IdentityTransform(), "id"),
        spec_id=1,
    ),
    "days-bucket-truncate": PartitionSpec(
        PartitionField(2, 1000, DayTransform(), "ts_day"),
        PartitionField(1, 1001, BucketTransform(16), "id_bucket"),
        PartitionField(3, 1002, TruncateTransform(4), "user_trunc"),
        spec_id=2,
    ),
}

SNAPSHOT = 4_711_000_001
OLD_SNAPSHOT = 4_711_000_000
TS = datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc)


def _partition(spec: str, i: int) -> Record:
    if spec == "unpartitioned":
        return Record()
    if spec == "identity":
        values: tuple[Any, ...] = (
            None if i == 2 else f"u{i}",
            19_000 + i,
            Decimal(f"{i}.25"),
            math.nan if i == 1 else i / 3,
            i,
        )
        return Record(*values)
    return Record(19_844 + i, i % 16, None if i == 2 else f"us{i}"[:4])


def _data_file(spec: str, i: int, content: DataFileContent = DataFileContent.DATA) -> DataFile:
    lower = {
        1: to_bytes(LongType(), i),
        2: to_bytes(TimestamptzType(), int(TS.timestamp() * 1_000_000) + i),
        3: to_bytes(StringType(), f"a{i}"),
        4: to_bytes(DoubleType(), -1.5 * i),
        5: to_bytes(DateType(), (date(2024, 5, 1) - date(1970, 1, 1)).days),
        6: to_bytes(DecimalType(12, 2), Decimal("-3.50")),
        7: to_bytes(BooleanType(), False),
        8: to_bytes(UUIDType(), uuid.UUID(int=i)),
    }
    upper = {**lower, 1: to_bytes(LongType(), 10 * i + 9), 3: to_bytes(StringType(), f"z{i}"), 7: to_bytes(BooleanType(), True)}
    return DataFile.from_args(
        content=content,
        file_path=f"file:///warehouse/db/t/data/{spec}-{i:05d}.parquet",
        file_format=FileFormat.PARQUET,
        partition=_partition(spec, i),
        record_count=100 + i,
        file_size_in_bytes=4_096 + i,
        column_sizes={f: 10 * f + i for f in range(1, 9)},
        value_counts={f: 100 + i for f in range(1, 9)},
        null_value_counts={f: (i + f) % 3 for f in range(1, 9)},
        nan_value_counts={4: i},
        lower_bounds=lower,
        upper_bounds=upper,
        key_metadata=None,
        split_offsets=[4, 2_048 + i],
        equality_ids=None,
        sort_order_id=0,
        spec_id=SPECS[spec].spec_id,
    )


def _entries(spec: str, version: int, content: DataFileContent = DataFileContent.DATA) -> list[tuple[str, ManifestEntry]]:
    """(how the writer takes it, the entry): one added by this snapshot, one existing, one deleted."""
    existing_seq = 3 if version > 1 else None

    def older(status: ManifestEntryStatus, n: int) -> ManifestEntry:
        """Entry ``n``, of an older snapshot."""
        return ManifestEntry.from_args(
            status=status,
            snapshot_id=OLD_SNAPSHOT,
            sequence_number=existing_seq,
            file_sequence_number=existing_seq,
            data_file=_data_file(spec, n, content),
        )

    new = _data_file(spec, 0, content)
    added = ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=SNAPSHOT, data_file=new)
    return [("add", added), ("existing", older(ManifestEntryStatus.EXISTING, 1)), ("delete", older(ManifestEntryStatus.ADDED, 2))]


def plain(value: Any) -> Any:
    """A Record's values as nested plain values (NaN made comparable), for field-by-field equality."""
    if isinstance(value, Record):
        return tuple(plain(value[i]) for i in range(len(value)))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return value


def _header(path: Path) -> tuple[dict[str, str], bytes]:
    with AvroFile[Any](PyArrowFileIO().new_input(str(path))) as f:
        return dict(f.header.meta), f.header.sync


def assert_same_file(theirs: Path, ours: Path) -> None:
    """The same header (schema text, file metadata) and the same blocks: equal bytes once the sync marker is swapped."""
    meta_theirs, sync_theirs = _header(theirs)
    meta_ours, sync_ours = _header(ours)
    assert meta_ours == meta_theirs
    assert sync_ours != sync_theirs  # each file its own random marker, as pyiceberg writes them
    assert ours.read_bytes().replace(sync_ours, sync_theirs) == theirs.read_bytes()


def _write_manifest(factory: Any, path: Path, version: int, spec: str, codec: str) -> ManifestFile:
    writer = factory(
        format_version=version,
        spec=SPECS[spec],
        schema=SCHEMA,
        output_file=PyArrowFileIO().new_output(str(path)),
        snapshot_id=SNAPSHOT,
        avro_compression=codec,
    )
    with writer:
        for how, entry in _entries(spec, version):
            getattr(writer, how)(entry)
    return writer.to_manifest_file()  # type: ignore[no-any-return]


@pytest.mark.parametrize("codec", ["gzip", "null"])
@pytest.mark.parametrize("spec", sorted(SPECS))
@pytest.mark.parametrize("version", [1, 2])
def test_a_manifest_is_the_file_pyiceberg_writes(tmp_path: Path, version: int, spec: str, codec: str) -> None:
    theirs = _write_manifest(write_manifest, tmp_path / "theirs.avro", version, spec, codec)
    ours = _write_manifest(manifests.write_manifest, tmp_path / "ours.avro", version, spec, codec)
    assert_same_file(tmp_path / "theirs.avro", tmp_path / "ours.avro")
    meta, _ = _header(tmp_path / "ours.avro")
    assert {"schema", "partition-spec", "partition-spec-id", "format-version", "avro.schema", "avro.codec"} <= set(meta)
    assert meta["format-version"] == str(version) and meta.get("content") == ("data" if version > 1 else None)
    # what the manifest list will say about it (counts, partition summaries), but for its own path
    assert ours.manifest_path.endswith("ours.avro")
    assert plain(_with(ours, manifest_path=theirs.manifest_path)) == plain(theirs)
    # what pyiceberg's reader reads back, every field of every entry
    io = PyArrowFileIO()
    read_theirs = theirs.fetch_manifest_entry(io, discard_deleted=False)
    read_ours = _with(theirs, manifest_path=str(tmp_path / "ours.avro")).fetch_manifest_entry(io, discard_deleted=False)
    assert len(read_ours) == 3
    assert [plain(e) for e in read_ours] == [plain(e) for e in read_theirs]
    assert [e.status for e in read_ours] == [ManifestEntryStatus.ADDED, ManifestEntryStatus.EXISTING, ManifestEntryStatus.DELETED]
    assert all(e.data_file.key_metadata is None for e in read_ours)
    # lakesink's prepared reader (its reader tree taken from the cache at the second file) reads what pyiceberg's reads
    for manifest in (theirs, _with(theirs, manifest_path=str(tmp_path / "ours.avro"))):
        for live in (False, True):
            assert [plain(e) for e in manifests.manifest_entries(manifest, io, discard_deleted=live)] == [
                plain(e) for e in manifest.fetch_manifest_entry(io, discard_deleted=live)
            ]


def _with(manifest: ManifestFile, **changes: Any) -> ManifestFile:
    """``manifest`` with some fields changed."""
    fields = {f.name: manifest[i] for i, f in enumerate(MANIFEST_LIST_FILE_SCHEMAS[2].fields)}
    return ManifestFile.from_args(**{**fields, **changes})


def _listed(tmp_path: Path, version: int) -> list[ManifestFile]:
    """Manifests for a list: this snapshot's (sequence numbers unassigned, as a producer hands them over) and older
    ones, of every spec."""
    out = []
    for spec in sorted(SPECS):
        for who in ("new", "old"):
            m = _write_manifest(manifests.write_manifest, tmp_path / f"{who}-{spec}.avro", version, spec, "gzip")
            if who == "old":
                seq = 2 if version > 1 else 0
                m = _with(m, added_snapshot_id=OLD_SNAPSHOT, sequence_number=seq, min_sequence_number=seq)
            out.append(m)
    return out


@pytest.mark.parametrize("codec", ["gzip", "null"])
@pytest.mark.parametrize("version", [1, 2])
def test_a_manifest_list_is_the_file_pyiceberg_writes_and_reads_back_the_same(tmp_path: Path, version: int, codec: str) -> None:
    listed = _listed(tmp_path, version)
    io = PyArrowFileIO()
    factories: tuple[tuple[Any, str], ...] = ((write_manifest_list, "theirs"), (manifests.write_manifest_list, "ours"))
    for factory, name in factories:
        with factory(
            format_version=version,
            output_file=io.new_output(str(tmp_path / f"{name}-list.avro")),
            snapshot_id=SNAPSHOT,
            parent_snapshot_id=OLD_SNAPSHOT,
            sequence_number=7 if version > 1 else None,
            avro_compression=codec,
        ) as writer:
            writer.add_manifests(listed)
    assert_same_file(tmp_path / "theirs-list.avro", tmp_path / "ours-list.avro")
    theirs = list(read_manifest_list(io.new_input(str(tmp_path / "theirs-list.avro"))))
    assert len(theirs) == len(listed)
    if version > 1:  # this snapshot's manifests got its sequence number
        assert {m.sequence_number for m in theirs if m.added_snapshot_id == SNAPSHOT} == {7}
    for path in ("theirs-list.avro", "ours-list.avro"):
        # lakesink's prepared reader reads what pyiceberg's reads, from either file
        assert [plain(m) for m in manifests.read_manifest_list(io, str(tmp_path / path))] == [plain(m) for m in theirs]
        assert [plain(m) for m in read_manifest_list(io.new_input(str(tmp_path / path)))] == [plain(m) for m in theirs]
    # each listed manifest's entries, with what they inherit from the list (snapshot id, sequence numbers, spec id)
    for manifest in theirs:
        for live in (False, True):
            mine = manifests.manifest_entries(manifest, io, discard_deleted=live)
            assert [plain(e) for e in mine] == [plain(e) for e in manifest.fetch_manifest_entry(io, discard_deleted=live)]
            if version > 1 and manifest.added_snapshot_id == SNAPSHOT:
                assert {e.sequence_number for e in mine if e.status == ManifestEntryStatus.ADDED} == {7}


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_a_delete_manifest_is_the_file_pyiceberg_writes(tmp_path: Path, spec: str) -> None:
    io = PyArrowFileIO()
    written = {}
    classes: tuple[tuple[Any, str], ...] = ((ReferenceDeleteManifestWriter, "theirs"), (manifests.DeleteManifestWriter, "ours"))
    for cls, name in classes:
        writer = cls(SPECS[spec], SCHEMA, io.new_output(str(tmp_path / f"{name}.avro")), SNAPSHOT, "gzip")
        with writer:
            for _, entry in _entries(spec, 2, DataFileContent.POSITION_DELETES)[1:]:  # entries with a sequence number
                writer.delete(entry)
        written[name] = writer.to_manifest_file()
    assert_same_file(tmp_path / "theirs.avro", tmp_path / "ours.avro")
    assert _header(tmp_path / "ours.avro")[0]["content"] == "deletes"
    assert written["ours"].content == ManifestContent.DELETES
    assert plain(_with(written["ours"], manifest_path=written["theirs"].manifest_path)) == plain(written["theirs"])


def test_an_unassigned_sequence_number_is_refused_as_pyiceberg_refuses_it(tmp_path: Path) -> None:
    m = _with(_listed(tmp_path, 2)[0], added_snapshot_id=OLD_SNAPSHOT)
    assert m.sequence_number == UNASSIGNED_SEQ
    factories: tuple[Any, ...] = (write_manifest_list, manifests.write_manifest_list)
    for factory in factories:
        with pytest.raises(ValueError, match="unassigned sequence number"):
            with factory(
                format_version=2,
                output_file=PyArrowFileIO().new_output(str(tmp_path / f"{factory.__module__}.avro")),
                snapshot_id=SNAPSHOT,
                parent_snapshot_id=None,
                sequence_number=1,
                avro_compression="gzip",
            ) as writer:
                writer.add_manifests([m])


def test_every_producer_lakesink_commits_through_writes_with_the_prepared_writers() -> None:
    producers = [
        seam_producers._MergeAppend,
        seam_producers._OverwriteRemovedFiles,
        seam_producers._OverwriteLive,
        seam_producers._ReplaceFiles,
        seam_maintenance._RewriteManifests,
    ]
    for producer in producers:
        assert issubclass(producer, seam_producers._PreparedManifests), producer
        assert producer.new_manifest_writer is seam_producers._PreparedManifests.new_manifest_writer, producer
        assert producer._commit is seam_producers._PreparedManifests._commit, producer


@pytest.mark.parametrize("version", [1, 2])
def test_the_prepared_merge_append_stages_what_pyicebergs_stages(catalog: Any, version: int) -> None:
    """pyiceberg's merge-append producer and lakesink's (its ``_manifests`` and ``_commit`` re-implemented in the seam)
    on the same table, with the same snapshot id: the same updates and requirements, the same snapshot (summary,
    parent, sequence number, schema) and manifest lists that read back the same, but for the files' own paths."""
    from pyiceberg.table.update import AddSnapshotUpdate
    from pyiceberg.table.update.snapshot import _MergeAppendFiles

    catalog.create_namespace_if_not_exists(("db",))
    spec = SPECS["days-bucket-truncate"]
    name = ("db", f"twin{version}")
    table = catalog.create_table(name, schema=SCHEMA, partition_spec=spec, properties={"format-version": str(version)})
    for b in range(2):  # a history: existing manifests to carry over
        with table.transaction() as tx:
            with tx.update_snapshot().fast_append() as append:
                append.append_data_file(_data_file("days-bucket-truncate", 10 + b))
    table = catalog.load_table(name)
    staged = {}
    for who, cls in (("theirs", _MergeAppendFiles), ("ours", seam_producers._MergeAppend)):
        staged[who] = _staged_merge_append(table, cls)
    theirs, ours = staged["theirs"], staged["ours"]
    assert [type(u) for u in ours._updates] == [type(u) for u in theirs._updates]
    assert ours._requirements == theirs._requirements
    added_theirs, added_ours = theirs._updates[0], ours._updates[0]
    assert isinstance(added_theirs, AddSnapshotUpdate) and isinstance(added_ours, AddSnapshotUpdate)
    snap_theirs, snap_ours = added_theirs.snapshot, added_ours.snapshot
    assert snap_ours.manifest_list != snap_theirs.manifest_list
    assert snap_ours.model_copy(update={"manifest_list": "", "timestamp_ms": 0}) == snap_theirs.model_copy(
        update={"manifest_list": "", "timestamp_ms": 0}
    )
    assert ours._updates[1:] == theirs._updates[1:]  # the branch moved to it
    read_theirs, read_ours = snap_theirs.manifests(table.io), snap_ours.manifests(table.io)
    assert len(read_ours) == len(read_theirs) == 3
    new = [m.manifest_path for m in read_ours if m.added_snapshot_id == SNAPSHOT]
    assert len(new) == 1 and new[0] not in {m.manifest_path for m in read_theirs}
    assert [plain(_with(m, manifest_path="")) for m in read_ours] == [plain(_with(m, manifest_path="")) for m in read_theirs]
    for mine, pyicebergs in zip(read_ours, read_theirs, strict=True):
        assert [plain(e) for e in mine.fetch_manifest_entry(table.io, discard_deleted=False)] == [
            plain(e) for e in pyicebergs.fetch_manifest_entry(table.io, discard_deleted=False)
        ]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("bins", ["one bin", "two bins"])
def test_the_prepared_merge_append_merges_manifests_as_pyiceberg_does(
    catalog: Any, version: int, bins: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With manifest merging on (``commit.manifest-merge.enabled``, a minimum count of 2), lakesink's merge-append
    producer (its bins merged on the calling thread, not on pyiceberg's pool) gives what pyiceberg's gives: the same
    manifests in the same order, a merged one holding the same entries (EXISTING for the carried-over files, ADDED for
    the new one), whether every manifest fits one bin or the target size splits them into two. lakesink's never asks
    for pyiceberg's executor (a thread hand-off per table of a routed unit: docs/performance.md)."""
    from pyiceberg.table.update import AddSnapshotUpdate
    from pyiceberg.table.update.snapshot import _MergeAppendFiles
    from pyiceberg.utils.concurrent import ExecutorFactory

    catalog.create_namespace_if_not_exists(("db",))
    spec = SPECS["days-bucket-truncate"]
    name = ("db", f"merged{version}{bins[0:3]}")
    table = catalog.create_table(name, schema=SCHEMA, partition_spec=spec, properties={"format-version": str(version)})
    for b in range(4):  # a history: four manifests to merge
        with table.transaction() as tx:
            with tx.update_snapshot().fast_append() as append:
                append.append_data_file(_data_file("days-bucket-truncate", 10 + b))
    table = catalog.load_table(name)
    head = table.current_snapshot()
    assert head is not None
    lengths = sorted(m.manifest_length for m in head.manifests(table.io))
    target = sum(lengths) * 10 if bins == "one bin" else lengths[-1] + lengths[-2] + 1
    with table.transaction() as tx:
        tx.set_properties(
            {
                "commit.manifest-merge.enabled": "true",
                "commit.manifest.min-count-to-merge": "2",
                "commit.manifest.target-size-bytes": str(target),
            }
        )
    table = catalog.load_table(name)
    staged = {}
    for who, cls in (("theirs", _MergeAppendFiles), ("ours", seam_producers._MergeAppend)):
        if who == "ours":
            monkeypatch.setattr(ExecutorFactory, "get_or_create", staticmethod(_no_executor))
        staged[who] = _staged_merge_append(table, cls)
    theirs, ours = staged["theirs"], staged["ours"]
    assert ours._requirements == theirs._requirements
    added_theirs, added_ours = theirs._updates[0], ours._updates[0]
    assert isinstance(added_theirs, AddSnapshotUpdate) and isinstance(added_ours, AddSnapshotUpdate)
    snap_theirs, snap_ours = added_theirs.snapshot, added_ours.snapshot
    assert snap_ours.model_copy(update={"manifest_list": "", "timestamp_ms": 0}) == snap_theirs.model_copy(
        update={"manifest_list": "", "timestamp_ms": 0}
    )
    read_theirs, read_ours = snap_theirs.manifests(table.io), snap_ours.manifests(table.io)
    assert len(read_ours) == len(read_theirs)
    assert (len(read_ours) == 1) if bins == "one bin" else (1 < len(read_ours) < 5)  # merged, as configured
    assert [plain(_with(m, manifest_path="")) for m in read_ours] == [plain(_with(m, manifest_path="")) for m in read_theirs]
    for mine, pyicebergs in zip(read_ours, read_theirs, strict=True):
        assert [plain(e) for e in mine.fetch_manifest_entry(table.io, discard_deleted=False)] == [
            plain(e) for e in pyicebergs.fetch_manifest_entry(table.io, discard_deleted=False)
        ]


def _staged_merge_append(table: Any, producer_class: Any) -> Any:
    """A transaction of ``table`` staging one data file's merge append, made by ``producer_class`` (pyiceberg's or
    lakesink's), not committed."""
    from pyiceberg.table import Transaction
    from pyiceberg.table.snapshots import Operation

    tx = Transaction(table, autocommit=False)
    producer = producer_class(operation=Operation.APPEND, transaction=tx, io=table.io, snapshot_properties={"k": "v"})
    producer._snapshot_id = SNAPSHOT
    producer.append_data_file(_data_file("days-bucket-truncate", 3))
    producer.commit()
    return tx


def _no_executor() -> None:
    raise AssertionError("pyiceberg's shared executor was asked for")
