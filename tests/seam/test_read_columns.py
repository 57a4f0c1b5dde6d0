"""The merge-on-read lookup's read of a data file's key and order-by columns (lakesink._pyiceberg.io.read_columns): what
pyiceberg's scan reads (``read_data_file``, small types), value for value and type for type, for every file of a table
whose schema evolved -- a column renamed, one added, one promoted -- and the files a table holds after them; the
file's own columns read directly only where that is the same read."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg.io import deletes as seam_deletes
from lakesink._pyiceberg.io import reads
from lakesink.table import kept as kept_store

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType(), required=False),
    NestedField(3, "small", IntegerType(), required=False),
    NestedField(4, "at", TimestamptzType(), required=False),
    NestedField(5, "amount", DecimalType(10, 2), required=False),
    NestedField(6, "nested", StructType(NestedField(7, "k", StringType(), required=False)), required=False),
    identifier_field_ids=[1],
)

AT = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def _rows(ids: list[int], *, renamed: bool = False, extra: bool = False, promoted: bool = False) -> pa.Table:
    n = len(ids)
    columns: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        ("label" if renamed else "name"): pa.array([f"n{i}" if i % 3 else None for i in ids], pa.string()),
        "small": pa.array([i * 7 for i in ids], pa.int64() if promoted else pa.int32()),
        "at": pa.array([AT] * n, pa.timestamp("us", tz="UTC")),
        "amount": pa.array([Decimal(i) / 4 for i in ids], pa.decimal128(10, 2)),
        "nested": pa.array([{"k": str(i)} for i in ids], pa.struct([pa.field("k", pa.string())])),
    }
    if extra:
        columns["extra"] = pa.array([f"e{i}" for i in ids], pa.string())
    return pa.table(columns)


def test_a_lookups_columns_read_as_pyicebergs_scan_reads_them_before_and_after_schema_changes(
    catalog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.create_namespace_if_not_exists(("db",))
    table = catalog.create_table(("db", "lookup"), schema=SCHEMA)
    table.append(_rows([1, 2, 3, 4, 5]).cast(table.schema().as_arrow()))
    with table.update_schema() as update:
        update.rename_column("name", "label")
        update.add_column("extra", StringType())
        update.update_column("small", LongType())
    table = catalog.load_table(("db", "lookup"))
    table.append(_rows([6, 7, 8], renamed=True, extra=True, promoted=True).cast(table.schema().as_arrow()))
    table = catalog.load_table(("db", "lookup"))
    old, new = sorted(seam.live_data_files(table, "main"), key=lambda f: f.record_count, reverse=True)
    schema = table.schema()
    reads_ = [("id",), ("id", "label"), ("label", "id"), ("id", "extra"), ("id", "small"), ("id", "at"), ("id", "amount")]
    reads_ += [("id", "nested.k")]
    for data_file in (old, new):
        for names in reads_:
            wanted = schema.select(*names)
            theirs = seam.with_small_types(seam.read_data_file(table, data_file, wanted))
            mine = seam.read_columns(table, data_file, wanted)
            assert mine.schema.equals(theirs.schema), (data_file.file_path, names, mine.schema, theirs.schema)
            assert mine.equals(theirs), (data_file.file_path, names)

    # the direct read is taken where it is the same read: the new file's columns (a renamed one among them), and the
    # old file's columns but the one added after it and the one promoted since
    calls: list[tuple[str, tuple[str, ...]]] = []
    scan = reads.read_data_file

    def counted(table_: Any, data_file: Any, schema_: Schema | None = None) -> pa.Table:
        assert schema_ is not None
        calls.append((data_file.file_path, tuple(f.name for f in schema_.fields)))
        return scan(table_, data_file, schema_)

    monkeypatch.setattr(reads, "read_data_file", counted)
    kept_store._kept.clear()  # what the reads above kept (each file's contents are kept: the test after this one)
    for data_file in (old, new):
        for names in reads_:
            seam.read_columns(table, data_file, schema.select(*names))
    scanned = {(path == old.file_path, fields) for path, fields in calls}
    assert scanned == {
        (True, ("id", "extra")),  # the old file lacks the column added after it
        (True, ("id", "small")),  # the old file stores int, the table long
        (True, ("id", "nested")),  # a nested column
        (False, ("id", "nested")),
    }


def _opened(table: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Any]:
    """The locations ``table``'s FileIO opens from now on (appended to the list), and the counting ``new_input``."""
    opened: list[str] = []
    new_input = table.io.new_input

    def counted(location: str) -> Any:
        opened.append(location)
        return new_input(location)

    monkeypatch.setattr(table.io, "new_input", counted)
    return opened, counted


def test_a_files_contents_are_kept_between_reads_and_read_again_when_asked_differently(
    catalog: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Iceberg never changes a file once written: a lookup's second read of a data file's columns, or of a position
    delete file, is what the first read returned, without opening the file again; the same file read under a renamed
    column, or another file, is read."""
    catalog.create_namespace_if_not_exists(("db",))
    table = catalog.create_table(("db", "kept"), schema=SCHEMA)
    table.append(_rows([1, 2, 3]).cast(table.schema().as_arrow()))
    table.append(_rows([4, 5]).cast(table.schema().as_arrow()))
    first, second = sorted(seam.live_data_files(table, "main"), key=lambda f: f.record_count, reverse=True)
    opened, counted = _opened(table, monkeypatch)
    kept_store._kept.clear()
    wanted = table.schema().select("id", "name")
    once = seam.read_columns(table, first, wanted)
    again = seam.read_columns(table, first, wanted)
    assert again.equals(once) and once.column("id").to_pylist() == [1, 2, 3]
    assert opened == [first.file_path]  # the second read kept
    assert seam.read_columns(table, second, wanted).column("id").to_pylist() == [4, 5]
    assert opened == [first.file_path, second.file_path]
    with table.update_schema() as update:
        update.rename_column("name", "label")
    renamed = catalog.load_table(("db", "kept"))
    monkeypatch.setattr(renamed.io, "new_input", counted)
    after = seam.read_columns(renamed, first, renamed.schema().select("id", "label"))
    assert after.column_names == ["id", "label"] and after.column("label").equals(once.column("name"))
    assert opened[-1] == first.file_path and len(opened) == 3  # read again: the key names the columns as asked

    rows = seam_deletes.sorted_positions(
        pa.array([second.file_path, first.file_path, first.file_path]), pa.array([0, 2, 0], pa.int64())
    )
    location = str(tmp_path / "deletes.parquet")
    written = seam_deletes.write_position_deletes(table.io, location, rows, {})
    delete_file = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=written.path,
        file_format=FileFormat.PARQUET,
        file_size_in_bytes=written.size_in_bytes,
        **written.statistics,
    )
    opened.clear()
    by_file = seam.deleted_positions(table.io, delete_file)
    assert {p: a.to_pylist() for p, a in by_file.items()} == {first.file_path: [0, 2], second.file_path: [0]}
    assert seam.deleted_positions(table.io, delete_file) is by_file
    assert opened == [location]
    with pytest.raises(TypeError):
        by_file[first.file_path] = pa.array([], pa.int64())  # type: ignore[index]  # kept: nobody changes it


def test_live_entries_kept_are_the_live_entries_after_every_commit(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup's live entries (``kept=True``): each manifest decoded once, and still exactly the branch's live entries
    after appends, a delete that rewrites a file and an overwrite -- new manifests are read, removed files are gone."""
    catalog.create_namespace_if_not_exists(("db",))
    table = catalog.create_table(("db", "entries"), schema=SCHEMA)
    kept_store._kept.clear()
    decoded: list[str] = []
    entries_of = seam.manifest_entries

    def counted(manifest: Any, io: Any, *, discard_deleted: bool = False) -> Any:
        decoded.append(manifest.manifest_path)
        return entries_of(manifest, io, discard_deleted=discard_deleted)

    monkeypatch.setattr(reads, "manifest_entries", counted)

    def both() -> tuple[list[str], list[str]]:
        t = catalog.load_table(("db", "entries"))
        mine = sorted(e.data_file.file_path for e in seam.live_entries(t, "main", kept=True))
        theirs = sorted(e.data_file.file_path for e in seam.live_entries(t, "main"))
        return mine, theirs

    for ids in ([1, 2], [3], [4, 5, 6]):
        table.append(_rows(ids).cast(table.schema().as_arrow()))
        mine, theirs = both()
        assert mine == theirs and len(mine) == len(set(mine))
    decoded.clear()
    mine, theirs = both()
    assert len(decoded) == len(mine)  # the plain read decoded each manifest; the kept read none
    table = catalog.load_table(("db", "entries"))
    table.delete("id = 3")
    mine, theirs = both()
    assert mine == theirs and len(mine) == 2
    table = catalog.load_table(("db", "entries"))
    table.overwrite(_rows([9]).cast(table.schema().as_arrow()))
    mine, theirs = both()
    assert mine == theirs and len(mine) == 1


@pytest.mark.parametrize("keep", [True, False])
def test_a_delete_file_this_process_wrote_for_its_lookup_is_kept_as_reading_it_back_gives(
    catalog: Any, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """A lookup on the driver (lakesink.executor.position_deletes.lookup_result) keeps the positions of the delete
    files it writes: the next batch's lookup, which must apply them, finds exactly what reading the file back gives
    (keyed by the location and size its manifest entry will carry), without opening it. Spark's tasks (keep=False)
    keep nothing: they never look keys up again."""
    from lakesink._pyiceberg.row_delta import delete_file
    from lakesink.driver.actions.row_delta import delete_target
    from lakesink.executor.messages import TaskIds
    from lakesink.executor.position_deletes import PositionDeleteWriter

    catalog.create_namespace_if_not_exists(("db",))
    table = catalog.create_table(("db", "written"), schema=SCHEMA)
    table.append(_rows([1, 2, 3, 4]).cast(table.schema().as_arrow()))
    table.append(_rows([5, 6]).cast(table.schema().as_arrow()))
    first, second = sorted(seam.live_data_files(table, "main"), key=lambda f: f.record_count, reverse=True)
    kept_store._kept.clear()
    writer = PositionDeleteWriter(TaskIds("q", 7, 0, 0, None), {"db.written": delete_target(table)}, keep=keep)
    writer.add("db.written", [first.file_path, second.file_path, first.file_path, first.file_path], [3, 1, 0, 3])
    (result,) = writer.finish()
    (written,) = result.files
    entry = delete_file(
        path=written.path,
        size_in_bytes=written.size_in_bytes,
        statistics=written.statistics,
        spec_id=written.spec_id,
        partition=written.partition,
    )
    opened, _ = _opened(table, monkeypatch)
    kept = {p: a.to_pylist() for p, a in seam.deleted_positions(table.io, entry).items()}
    assert opened == ([] if keep else [written.path])
    kept_store._kept.clear()
    read_back = {p: a.to_pylist() for p, a in seam.deleted_positions(table.io, entry).items()}
    assert kept == read_back == {first.file_path: [0, 3], second.file_path: [1]}


@pytest.mark.parametrize("keep", [True, False])
def test_a_data_file_this_process_wrote_for_an_upsert_is_kept_as_reading_it_back_gives(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """The driver's write of a small batch (lakesink.sink.driver_write: TaskWriter's ``keep``) keeps each file's key
    and order-by columns: the next batch's lookup reads exactly what reading the file back gives (keyed by the
    location, the size and the columns asked for), without opening it -- for a file of several row groups too. Spark's
    tasks (keep=False) keep nothing. Asked for other columns (the key alone), the file is read."""
    from pyiceberg.manifest import DataFile

    from lakesink.executor.messages import TaskIds
    from lakesink.executor.task_writer import TaskWriter, lookup_columns
    from lakesink.options import Maintenance, SinkOptions, TableName
    from tests.support.helpers import sink_committer

    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "kept"),
            catalog_properties=catalog_properties,
            table_properties={"write.parquet.row-group-limit": "3", "write.merge.mode": "merge-on-read"},
            maintenance=Maintenance.OFF,
        )
    )
    ids = list(range(10, 0, -1))
    rows = pa.table({
        "ID": pa.array(ids, pa.int64()),
        "seq": pa.array([f"s{i:03d}" for i in ids], pa.string()),
        "at": pa.array([AT] * len(ids), pa.timestamp("us", tz="UTC")),
    })  # fmt: skip
    table = c.table.open_table(rows.schema)
    plan = c.write_plan(table, "q")
    schema = lookup_columns(plan, ("id",), "SEQ")  # the lookup's read: the key and the order-by column, the table's names
    assert schema is not None and [f.name for f in schema.fields] == ["ID", "seq"]
    kept_store._kept.clear()
    result = TaskWriter(plan, TaskIds("q", 0, 0, 0, None), keep=schema if keep else None).write(rows.to_batches())
    (written,) = result.files
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=written.path,
        file_format=FileFormat.PARQUET,
        file_size_in_bytes=written.size_in_bytes,
        record_count=written.record_count,
    )
    opened, _ = _opened(table, monkeypatch)
    mine = seam.read_columns(table, data_file, schema)
    assert opened == ([] if keep else [written.path])
    kept_store._kept.clear()
    read_back = seam.read_columns(table, data_file, schema)
    assert mine.schema.equals(read_back.schema) and mine.equals(read_back)
    assert read_back.column("ID").to_pylist() == ids  # the rows in the file's order, whatever its row groups
    opened.clear()
    seam.read_columns(table, data_file, plan.schema.select("ID"))  # asked differently: read from the file
    assert opened == [written.path]


def test_only_a_merge_on_read_tables_lookup_columns_are_kept(catalog_properties: dict[str, str]) -> None:
    """A copy-on-write table's lookups never read key columns: its files keep nothing; nor does a key the table lacks."""
    from lakesink.executor.task_writer import lookup_columns
    from lakesink.options import Maintenance, SinkOptions, TableName
    from tests.support.helpers import sink_committer

    rows = pa.table({"id": pa.array([1], pa.int64()), "v": pa.array(["a"], pa.string())})
    plans = {}
    for mode in ("copy-on-write", "merge-on-read"):
        c = sink_committer(
            SinkOptions(
                table=TableName(("db",), mode.replace("-", "_")),
                catalog_properties=catalog_properties,
                table_properties={"write.merge.mode": mode},
                maintenance=Maintenance.OFF,
            )
        )
        plans[mode] = c.write_plan(c.table.open_table(rows.schema), "q")
    assert lookup_columns(plans["copy-on-write"], ("id",), None) is None
    found = lookup_columns(plans["merge-on-read"], ("id",), "not_a_column")  # an order-by the table lacks: the key alone
    assert found is not None and [f.name for f in found.fields] == ["id"]
    assert lookup_columns(plans["merge-on-read"], ("nope",), None) is None
    assert lookup_columns(plans["merge-on-read"], (), None) is None
