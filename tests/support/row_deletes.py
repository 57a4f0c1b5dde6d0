"""Another engine's merge-on-read DELETE, committed from a test: real delete files (Parquet with Iceberg's delete
schemas), in a delete manifest, in a ``delete`` snapshot, as Iceberg Java's ``RowDelta`` commits them.

pyiceberg 0.12 writes no delete files and no delete manifests: its fast-append producer and v2 manifest writer are
subclassed here (test code; lakesink does not use this). The deletes get the snapshot's sequence number (inherited
from the manifest list), so they apply to every data file committed before them, as in any engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriterV2,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, SnapshotSummaryCollector, Summary, update_snapshot_summaries
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import EMPTY_DICT, Record
from pyiceberg.types import LongType, StringType

#: Iceberg's reserved field ids of a position delete file's columns
FILE_PATH_ID = 2147483546
POS_ID = 2147483545


class DeleteManifestWriter(ManifestWriterV2):
    """A delete manifest written by pyiceberg's own v2 manifest writer (it has no writer for them: subclassed)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _RowDelta(_FastAppendFiles):
    """A snapshot that adds delete files only (Java's RowDelta: operation ``delete``)."""

    def __init__(
        self, *args: Any, delete_files: Sequence[DataFile], sequence_numbers: Mapping[str, int] = EMPTY_DICT, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._delete_files = list(delete_files)
        self._sequence_numbers = dict(sequence_numbers)

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:  # noqa: B006
        """Java's ``SnapshotSummary``: the delete files counted (``added-delete-files``, ``added-position-deletes``, their
        size in ``added-files-size``, ...), the totals carried on from the parent."""
        metadata = self._transaction.table_metadata
        collector = SnapshotSummaryCollector()
        for f in [*self._added_data_files, *self._delete_files]:
            collector.add_file(f, metadata.schema(), metadata.specs()[f.spec_id])
        parent = metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        return update_snapshot_summaries(
            summary=Summary(operation=self._operation, **collector.build(), **snapshot_properties),
            previous_summary=parent.summary if parent is not None else None,
        )

    def _existing_manifests(self) -> list[ManifestFile]:
        existing = super()._existing_manifests()
        by_spec: dict[int, list[DataFile]] = {}
        for f in self._delete_files:
            by_spec.setdefault(f.spec_id, []).append(f)
        added = []
        for spec_id, files in by_spec.items():
            writer = DeleteManifestWriter(
                self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, "deflate"
            )
            with writer:
                for f in files:
                    writer.add(
                        ManifestEntry.from_args(
                            status=ManifestEntryStatus.ADDED,
                            snapshot_id=self._snapshot_id,
                            sequence_number=self._sequence_numbers.get(f.file_path),
                            data_file=f,
                        )
                    )
            added.append(writer.to_manifest_file())
        return [*existing, *added]


def commit_deletes(
    table: Table,
    delete_files: Sequence[DataFile],
    *,
    branch: str = "main",
    sequence_numbers: Mapping[str, int] = EMPTY_DICT,
    operation: Operation = Operation.DELETE,
) -> int:
    """Commit ``delete_files`` in one ``delete`` snapshot (or ``operation``) on ``branch``; its snapshot id.
    ``sequence_numbers``: a file's data sequence number by its path (Java's ``RewriteFiles.addFile(file, seq)``, as a
    rewrite of delete files keeps the old one); the others inherit the snapshot's."""
    tx = table.transaction()
    producer = _RowDelta(
        operation=operation,
        transaction=tx,
        io=table.io,
        branch=branch,
        delete_files=delete_files,
        sequence_numbers=sequence_numbers,
    )
    producer.commit()
    tx.commit_transaction()
    return producer.snapshot_id


def _write(table: Table, rows: pa.Table, name: str) -> tuple[str, int]:
    location = f"{table.location()}/data/{name}-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(location).create() as f:
        pq.write_table(rows, f)
    return location, len(table.io.new_input(location))


def position_delete_files(
    table: Table, ids: Iterable[int], *, branch: str = "main", only_files: Iterable[str] | None = None
) -> list[DataFile]:
    """Position delete files (one per data file) deleting the rows whose ``id`` is in ``ids``, in the branch
    head's live data files (with ``file_path`` and ``pos`` bounds, as Iceberg Java writes them); with
    ``only_files``, only in those of them (the others are not read)."""
    only = None if only_files is None else set(only_files)
    wanted = pa.array(sorted(set(ids)), pa.int64())
    head = table.metadata.snapshot_by_name(branch)
    assert head is not None
    out = []
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
            pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
        ]
    )
    for manifest in head.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data = entry.data_file
            if only is not None and data.file_path not in only:
                continue
            with table.io.new_input(data.file_path).open() as f:
                column = pq.read_table(f, columns=["id"]).column("id")
            positions = pc.indices_nonzero(pc.is_in(column, value_set=wanted)).to_pylist()
            if not positions:
                continue
            rows = pa.table({"file_path": [data.file_path] * len(positions), "pos": positions}, schema=schema)
            location, size = _write(table, rows, "pos-deletes")
            delete = DataFile.from_args(
                content=DataFileContent.POSITION_DELETES,
                file_path=location,
                file_format=FileFormat.PARQUET,
                partition=data.partition,
                record_count=len(positions),
                file_size_in_bytes=size,
                lower_bounds={FILE_PATH_ID: to_bytes(StringType(), data.file_path), POS_ID: to_bytes(LongType(), positions[0])},
                upper_bounds={FILE_PATH_ID: to_bytes(StringType(), data.file_path), POS_ID: to_bytes(LongType(), positions[-1])},
            )
            delete.spec_id = data.spec_id  # not a field: from_args ignores it
            out.append(delete)
    return out


def equality_delete_file(
    table: Table, column: str, values: Sequence[Any], *, partition: Sequence[Any] = (), spec_id: int | None = None
) -> DataFile:
    """One equality delete file deleting every row whose ``column`` equals one of ``values`` (in ``partition`` of
    spec ``spec_id``, default the table's; an unpartitioned spec makes it a global delete)."""
    field = table.schema().find_field(column)
    arrow_type = table.schema().as_arrow().field(field.name).type
    rows = pa.table(
        [pa.array(values, arrow_type)],
        schema=pa.schema(
            [pa.field(field.name, arrow_type, nullable=False, metadata={b"PARQUET:field_id": str(field.field_id).encode()})]
        ),
    )
    location, size = _write(table, rows, "eq-deletes")
    delete = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(*partition),
        record_count=len(values),
        file_size_in_bytes=size,
        equality_ids=[field.field_id],
    )
    delete.spec_id = table.spec().spec_id if spec_id is None else spec_id  # not a field: from_args ignores it
    return delete
