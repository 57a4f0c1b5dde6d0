"""Contract tests of the pyiceberg internals that the seam (``lakesink/_pyiceberg/``) relies on: one test per hook.

pyiceberg has no public "write files now, commit later" API, so the seam uses private names and
behaviours. Each test below pins one of them (the name imports, the signature lakesink calls, the
behaviour lakesink depends on) and fails with a message naming the hook and the seam function that
uses it, so that a pyiceberg upgrade fails here, in one obvious place, before any Spark test.
Checked on pyiceberg 0.12.0.
"""

from __future__ import annotations

import gzip
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import IntegerType, ListType, LongType, MapType, NestedField, StringType, StructType

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import maintenance as seam_maintenance
from lakesink._pyiceberg import producers as seam_producers
from lakesink._pyiceberg import rest as seam_rest
from lakesink._pyiceberg import sql_catalog as seam_sql
from lakesink._pyiceberg.io import floats as seam_floats
from lakesink._pyiceberg.io import metadata as seam_metadata


@contextmanager
def hook(name: str, used_by: str) -> Iterator[None]:
    """Turn any failure into one naming the pyiceberg hook and the seam function that depends on it."""
    try:
        yield
    except Exception as e:  # an AssertionError too: the behaviour changed
        pytest.fail(
            f"pyiceberg hook {name} (used by lakesink._pyiceberg: {used_by}) changed in this pyiceberg version: "
            f"{type(e).__name__}: {e}. Update lakesink/_pyiceberg/ (the module defining it, and this test) for the new API.",
            pytrace=True,
        )


def private(path: str) -> Any:
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def params(func: Any) -> list[str]:
    return list(inspect.signature(func).parameters)


ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "user": pa.array(["a", None, "c"], pa.string())})


@pytest.fixture
def table(catalog: Catalog) -> Table:
    catalog.create_namespace_if_not_exists(("db",))
    t = catalog.create_table(("db", "contract"), schema=ROWS.schema)
    t.append(ROWS)
    return catalog.load_table(("db", "contract"))


# --- executor side ------------------------------------------------------------------------------


def test_convert_to_iceberg_without_ids() -> None:
    with hook("pyiceberg.io.pyarrow._ConvertToIcebergWithoutIDs", "new_table_schema / iceberg_type"):
        private("pyiceberg.io.pyarrow._ConvertToIcebergWithoutIDs")
        schema = seam.new_table_schema(ROWS.schema)
        assert [f.name for f in schema.fields] == ["id", "user"]
        assert [f.field_id for f in schema.fields] == [1, 2]
        assert seam.iceberg_type(pa.int32()) == IntegerType()


def test_get_parquet_writer_kwargs() -> None:
    with hook("pyiceberg.io.pyarrow._get_parquet_writer_kwargs", "parquet_writer_options"):
        func = private("pyiceberg.io.pyarrow._get_parquet_writer_kwargs")
        assert params(func) == ["table_properties"]
        options = seam.parquet_writer_options({"write.parquet.compression-codec": "snappy"})
        assert options["compression"] == "snappy"
        pq.ParquetWriter(pa.BufferOutputStream(), ROWS.schema, **options).close()  # pyarrow accepts every key


def test_arrow_projection_visitor_list_and_map() -> None:
    with hook("pyiceberg.io.pyarrow.ArrowProjectionVisitor (list/map, format_model)", "_ProjectionKeepingNulls"):
        visitor = private("pyiceberg.io.pyarrow.ArrowProjectionVisitor")
        assert {"file_schema", "include_field_ids", "format_model"} <= set(params(visitor.__init__))
        assert params(visitor.list) == ["self", "list_type", "list_array", "value_array"]
        assert params(visitor.map) == ["self", "map_type", "map_array", "key_result", "value_result"]
        private("pyiceberg.io.pyarrow.ParquetFormatModel")()
        assert params(private("pyiceberg.io.pyarrow.ArrowAccessor").__init__) == ["self", "file_schema"]
        # the behaviour lakesink depends on: projection reorders, keeps a null list of structs null, adds field ids
        element = pa.struct([pa.field("x", pa.int64())])
        batch = pa.record_batch({"b": pa.array([[{"x": 1}], None], pa.list_(element)), "a": pa.array([1, 2], pa.int64())})
        table_schema = Schema(
            NestedField(1, "a", LongType(), required=False),
            NestedField(2, "b", ListType(3, StructType(NestedField(4, "x", LongType(), required=False)), element_required=False)),
        )
        source = seam.stream_schema(batch.schema, table_schema)  # the stream's order, the table's field ids
        projected = seam.project_batch(batch, target=table_schema, source=source)
        assert projected.schema.names == ["a", "b"]
        assert projected.column("b").to_pylist() == [[{"x": 1}], None]
        assert projected.schema.field("a").metadata == {b"PARQUET:field_id": b"1"}


def test_arrow_projection_visitor_construct_field() -> None:
    with hook("pyiceberg.io.pyarrow.ArrowProjectionVisitor._construct_field", "_ProjectionKeepingNulls"):
        visitor = private("pyiceberg.io.pyarrow.ArrowProjectionVisitor")
        assert params(visitor._construct_field) == ["self", "field", "arrow_type"]
        # the behaviour lakesink depends on: every field it builds goes through _construct_field, so that the
        # projection of a required field inside a null struct (its slot null, as Spark sends it) is nullable everywhere
        # (map keys excepted), with the field ids
        city = pa.struct([pa.field("city", pa.string())])
        batch = pa.record_batch(
            {
                "s": pa.StructArray.from_arrays([pa.array(["x", None])], fields=list(city), mask=pa.array([False, True])),
                "l": pa.array([[{"city": "y"}, None]], pa.list_(city)).take([0, 0]),
                "m": pa.array([[("k", {"city": "z"})], None], pa.map_(pa.string(), city)),
            }
        )
        required_city = StructType(NestedField(2, "city", StringType(), required=True))
        table_schema = Schema(
            NestedField(1, "s", required_city, required=False),
            NestedField(
                3, "l", ListType(4, StructType(NestedField(5, "city", StringType(), required=True)), element_required=False)
            ),
            NestedField(
                6, "m", MapType(7, StringType(), 8, StructType(NestedField(9, "city", StringType(), required=True)), False)
            ),
        )
        projected = seam.project_batch(batch, target=table_schema, source=seam.stream_schema(batch.schema, table_schema))
        assert projected.to_pylist() == batch.to_pylist()
        s, lst, m = projected.schema
        assert s.type.field("city").nullable and s.type.field("city").metadata == {b"PARQUET:field_id": b"2"}
        assert lst.type.value_field.nullable and lst.type.value_type.field("city").nullable
        assert not m.type.key_field.nullable and m.type.item_type.field("city").nullable


def test_statistics_from_parquet_metadata(tmp_path: Path) -> None:
    with hook(
        "pyiceberg.io.pyarrow.data_file_statistics_from_parquet_metadata / compute_statistics_plan / parquet_path_to_id_mapping",
        "file_statistics",
    ):
        func = private("pyiceberg.io.pyarrow.data_file_statistics_from_parquet_metadata")
        assert params(func) == ["parquet_metadata", "stats_columns", "parquet_column_mapping"]
        schema = seam.new_table_schema(ROWS.schema)
        path = tmp_path / "f.parquet"
        pq.write_table(ROWS.cast(seam.arrow_schema(schema)), path)
        stats = seam.file_statistics(pq.read_metadata(path), schema, {})
        assert stats["record_count"] == 3
        assert stats["null_value_counts"] == {1: 0, 2: 1}
        data_file = seam_producers.data_file(path=str(path), size_in_bytes=path.stat().st_size, statistics=stats, spec_id=0)
        assert data_file.record_count == 3  # DataFile.from_args takes every key of the statistics


def test_to_partition_representation() -> None:
    with hook("pyiceberg.partitioning._to_partition_representation", "partition_record_values"):
        func = private("pyiceberg.partitioning._to_partition_representation")
        assert params(func) == ["type", "value"]
        from datetime import date

        from pyiceberg.types import DateType

        assert func(DateType(), date(1970, 1, 2)) == 1


def test_location_provider_reads_only_the_partition_path() -> None:
    with hook("pyiceberg.table.locations.load_location_provider / LocationProvider.new_data_location", "new_data_location"):
        assert params(private("pyiceberg.table.locations.load_location_provider")) == ["table_location", "table_properties"]
        location = seam.new_data_location("file:///w/db/t", {}, "f.parquet", "day=2024-01-01")
        assert location == "file:///w/db/t/data/day=2024-01-01/f.parquet"


# --- driver side: commit --------------------------------------------------------------------------


def test_transaction_internals_for_the_metadata_cache(table: Table) -> None:
    with hook("pyiceberg.table.Transaction._table / _updates / table_metadata", "_MetadataCachingTransaction"):
        tx = seam_producers._MetadataCachingTransaction(table)
        assert tx._table is table and tx._updates == ()
        assert tx.table_metadata is table.metadata  # nothing staged: no copy
        tx.set_properties({"k": "v"})
        assert tx._updates, "set_properties no longer stages into Transaction._updates"
        first = tx.table_metadata
        assert first.properties["k"] == "v"
        assert tx.table_metadata is first  # computed once per set of staged updates
        assert private("pyiceberg.table.update.update_table_metadata")(table.metadata, tx._updates).properties["k"] == "v"


def test_do_commit_is_one_compare_and_swap(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg.table.Table._do_commit", "PreparedCommit.commit (prepare_snapshot / prepare_properties_at_head)"):
        assert params(Table._do_commit) == ["self", "updates", "requirements"]
        stale = catalog.load_table(("db", "contract"))
        seam_producers.prepare_properties_at_head(table, {"lakesink.contract": "1"}, branch="main").commit()
        assert catalog.load_table(("db", "contract")).properties["lakesink.contract"] == "1"
        catalog.load_table(("db", "contract")).append(ROWS)  # the head moves
        prepared = seam_producers.prepare_properties_at_head(stale, {"lakesink.contract": "2"}, branch="main")
        with pytest.raises(CommitFailedException):  # no rebase, no retry: the stale base fails
            prepared.commit()
        # the path of catalogs without lakesink's own swap: pyiceberg's commit checks the requirements
        with pytest.raises(CommitFailedException):
            stale._do_commit(updates=prepared._updates, requirements=prepared._requirements)
        assert catalog.load_table(("db", "contract")).properties["lakesink.contract"] == "1"


def test_snapshot_producer_merge_flag_and_cleanup(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg snapshot producer _merge_enabled / _clean_all_uncommitted / snapshot_id, Transaction._requirements",
        "prepare_snapshot / PreparedCommit.discard",
    ):
        files = list(seam.live_data_files(table, "main"))
        prepared = seam_producers.prepare_snapshot(
            table, data_files=files, overwrite=False, summary={"lakesink.contract": "x"}, properties=lambda _: {}, branch="main"
        )
        assert isinstance(prepared._producer._merge_enabled, bool)
        staged = [u.snapshot for u in prepared._updates if getattr(u, "snapshot", None) is not None]
        assert [s.snapshot_id for s in staged] == [prepared.snapshot_id]
        manifest_list = staged[0].manifest_list
        assert table.io.new_input(manifest_list).exists()  # written before the swap
        prepared.discard()  # deletes what it wrote, commits nothing
        assert not table.io.new_input(manifest_list).exists()
        assert catalog.load_table(("db", "contract")).metadata.snapshot_by_id(prepared.snapshot_id) is None
        prepared = seam_producers.prepare_snapshot(
            table, data_files=files, overwrite=False, summary={"lakesink.contract": "y"}, properties=lambda _: {}, branch="main"
        )
        prepared.commit()
        committed = catalog.load_table(("db", "contract")).metadata.snapshot_by_id(prepared.snapshot_id)
        assert committed is not None and committed.summary is not None
        assert committed.summary.additional_properties["lakesink.contract"] == "y"


def test_merge_enabled_flag_is_read_when_manifests_are_processed(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg _MergeAppendFiles._merge_enabled (read in _process_manifests)", "prepare_snapshot"):
        table.transaction().set_properties({"commit.manifest.min-count-to-merge": "2"}).commit_transaction()
        for _ in range(3):
            table = catalog.load_table(("db", "contract"))
            seam_producers.prepare_snapshot(
                table,
                data_files=list(seam.live_data_files(table, "main"))[:1],
                overwrite=False,
                summary={},
                properties=lambda _: {},
                branch="main",
            ).commit()
        table = catalog.load_table(("db", "contract"))
        snapshot = table.current_snapshot()
        assert snapshot is not None
        assert len(snapshot.manifests(table.io)) == 1, "manifest merging was not switched on by _merge_enabled"


def test_update_schema_apply(table: Table) -> None:
    with hook("pyiceberg.table.update.schema.UpdateSchema._apply", "evolved_schema"):
        from lakesink.driver.tables.schema import SchemaChange

        schema = seam_producers.evolved_schema(table, [SchemaChange("add", ("extra",), StringType())])
        assert schema.find_field("extra").field_id == 3
        assert "extra" not in table.schema().column_names  # nothing committed


def test_requirement_constructors_by_field_name(table: Table) -> None:
    with hook("pyiceberg.table.update.AssertCurrentSchemaId / AssertDefaultSpecId (populate by name)", "prepare_snapshot"):
        from pyiceberg.table.update import AssertCurrentSchemaId, AssertDefaultSpecId

        AssertCurrentSchemaId(current_schema_id=table.metadata.current_schema_id).validate(table.metadata)  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=table.metadata.default_spec_id).validate(table.metadata)  # type: ignore[call-arg]


def test_arrow_scan_reads_given_files(table: Table) -> None:
    with hook("pyiceberg.io.pyarrow.ArrowScan(metadata, io, schema, row_filter).to_record_batches", "scan_files"):
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.table import FileScanTask

        tasks = [FileScanTask(f) for f in seam.live_data_files(table, "main")]
        batches = list(seam.scan_files(table.metadata, table.io, tasks, schema=table.schema(), row_filter=AlwaysTrue()))
        assert sum(b.num_rows for b in batches) == 3


# --- driver side: the commit's one parse on SQL catalogs, maintenance (issue 11) ---------------------


def test_sql_catalog_parse_metadata_version_and_write_metadata(table: Table) -> None:
    with hook(
        "pyiceberg SqlCatalog._parse_metadata_version (static), ToOutputFile.table_metadata / Compressor / Config",
        "_swap_on_sql_catalog, write_table_metadata",
    ):
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.serializers import FromInputFile

        assert params(SqlCatalog._parse_metadata_version) == ["metadata_location"]
        name = "00007-6f1c9a2e-1b2c-4d5e-8f90-0123456789ab.metadata.json"
        assert SqlCatalog._parse_metadata_version(f"file:///w/db/t/metadata/{name}") == 7
        assert SqlCatalog._parse_metadata_version(table.metadata_location) >= 1
        # lakesink writes a metadata file as pyiceberg's catalogs do, byte for byte (gzipped for a .gz name)
        for suffix in ("metadata.json", "gz.metadata.json"):
            theirs = f"{table.location()}/metadata/99998-contract.{suffix}"
            ours = f"{table.location()}/metadata/99999-contract.{suffix}"
            SqlCatalog._write_metadata(metadata=table.metadata, io=table.io, metadata_path=theirs)
            seam_metadata.write_table_metadata(table.metadata, table.io, ours)
            with table.io.new_input(theirs).open() as a, table.io.new_input(ours).open() as b:
                got, want = b.read(), a.read()
            if suffix.startswith("gz."):  # gzip's header carries the time it was written
                got, want = gzip.decompress(got), gzip.decompress(want)
            assert got == want
            assert FromInputFile.table_metadata(table.io.new_input(ours)).table_uuid == table.metadata.table_uuid
            with pytest.raises(FileExistsError):  # never overwritten
                seam_metadata.write_table_metadata(table.metadata, table.io, ours)


def test_sql_catalog_iceberg_tables_row_is_the_pointer(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg.catalog.sql.IcebergTables (columns) and SqlCatalog.engine", "_swap_on_sql_catalog"):
        from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        assert isinstance(catalog, SqlCatalog)
        columns = set(IcebergTables.__table__.columns.keys())
        assert {"catalog_name", "table_namespace", "table_name", "metadata_location", "previous_metadata_location"} <= columns
        with Session(catalog.engine) as session:
            row = session.execute(
                select(IcebergTables.metadata_location).where(
                    IcebergTables.catalog_name == catalog.name, IcebergTables.table_name == "contract"
                )
            ).scalar_one()
        assert row == table.metadata_location  # the row's metadata_location is the table's pointer
        assert catalog.engine.dialect.supports_sane_rowcount  # the compare-and-swap counts the rows it updated


def test_sql_catalog_swap_from_the_table_read_and_delete_old_metadata(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg Catalog._delete_old_metadata(io, base, metadata)", "_swap_on_sql_catalog"):
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.table.update import SetPropertiesUpdate

        assert params(SqlCatalog._delete_old_metadata) == ["io", "base", "metadata"]
        stale = catalog.load_table(("db", "contract"))
        seam_producers.prepare_properties_at_head(table, {"lakesink.contract": "1"}, branch="main").commit()
        fresh = catalog.load_table(("db", "contract"))
        assert fresh.metadata_location == table.metadata_location  # the swap moved the pointer to what it wrote
        assert fresh.properties["lakesink.contract"] == "1"
        assert fresh.metadata.metadata_log[-1].metadata_file == stale.metadata_location
        # from a stale table (the pointer moved) the swap is a conflict, never a fallback onto metadata it did not
        # read: nothing is written or moved (issue 20)
        folder = Path(fresh.metadata_location.removeprefix("file://")).parent
        before = sorted(folder.iterdir())
        with pytest.raises(CommitFailedException, match="moved"):
            seam_sql._swap_on_sql_catalog(stale, (SetPropertiesUpdate(updates={"lakesink.contract": "2"}),), ())
        assert catalog.load_table(("db", "contract")).metadata_location == fresh.metadata_location
        assert sorted(folder.iterdir()) == before


def test_apply_table_update_context_and_metadata_log(table: Table) -> None:
    with hook(
        "pyiceberg.table.update._apply_table_update / _TableMetadataUpdateContext / _update_table_metadata_log",
        "updated_metadata",
    ):
        from pyiceberg.table.update import SetPropertiesUpdate, update_table_metadata

        assert params(private("pyiceberg.table.update._apply_table_update")) == ["update", "base_metadata", "context"]
        assert params(private("pyiceberg.table.update._update_table_metadata_log")) == [
            "base_metadata",
            "metadata_location",
            "last_updated_ms",
        ]
        context = private("pyiceberg.table.update._TableMetadataUpdateContext")()
        assert not context.has_changes()
        updates = (SetPropertiesUpdate(updates={"k": "v"}),)
        ours = seam_metadata.updated_metadata(table.metadata, updates, table.metadata_location)
        theirs = update_table_metadata(table.metadata, updates, metadata_location=table.metadata_location)
        assert ours.properties == theirs.properties
        assert ours.metadata_log == theirs.metadata_log and ours.metadata_log[-1].metadata_file == table.metadata_location
        assert ours.last_updated_ms >= table.metadata.last_updated_ms


def test_overwrite_files_producer_relabelled_as_replace(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg.table.update.snapshot._OverwriteFiles (constructor, _summary, delete/append_data_file)", "prepare_replace"
    ):
        from pyiceberg.table.update.snapshot import _OverwriteFiles

        assert {"operation", "transaction", "io", "branch", "snapshot_properties"} <= set(params(_OverwriteFiles.__init__))
        assert params(_OverwriteFiles._summary) == ["self", "snapshot_properties"]
        old = list(seam.live_data_files(table, "main"))
        prepared = seam_producers.prepare_replace(
            table, deleted=old, added=old[:0] + old, summary={"lakesink.contract": "r"}, branch="main"
        )
        prepared.commit()
        head = catalog.load_table(("db", "contract")).current_snapshot()
        assert head is not None and head.summary is not None and head.summary.operation.value == "replace"
        assert head.summary.additional_properties["lakesink.contract"] == "r"


def test_overwrite_of_every_live_entry_removes_delete_files_into_a_delete_manifest(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg _OverwriteFiles._validate_required_deletes / _SnapshotProducer._process_manifests / "
        "ManifestWriterV2 (content, _meta, delete)",
        "_OverwriteLive, _DeleteManifestWriter (prepare_snapshot with overwrite)",
    ):
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus, ManifestWriterV2
        from pyiceberg.table.update.snapshot import _OverwriteFiles, _SnapshotProducer

        from tests.support.row_deletes import commit_deletes, position_delete_files

        assert params(_OverwriteFiles._validate_required_deletes) == ["self", "deleted_entries"]
        assert params(_SnapshotProducer._process_manifests) == ["self", "manifests"]
        assert params(ManifestWriterV2.delete) == ["self", "entry"] and isinstance(ManifestWriterV2.__dict__["_meta"], property)
        commit_deletes(table, position_delete_files(table, [2]))
        table = catalog.load_table(("db", "contract"))
        assert seam.has_delete_files(table, "main")
        # both from one read of the manifest list (an upsert's copy-on-write): the same answers as each on its own
        deletes_too, files = seam.branch_data_files(table, "main")
        assert deletes_too and [f.file_path for f in files] == [f.file_path for f in seam.live_data_files(table, "main")]
        assert files
        prepared = seam_producers.prepare_snapshot(
            table, data_files=[], overwrite=True, summary={"lakesink.contract": "o"}, properties=lambda _: {}, branch="main"
        )
        prepared.commit()
        table = catalog.load_table(("db", "contract"))
        head = table.current_snapshot()
        assert head is not None and not seam.has_delete_files(table, "main") and table.scan().to_arrow().num_rows == 0
        assert seam.branch_data_files(table, "main") == (False, [])
        deletes = [m for m in head.manifests(table.io) if m.content == ManifestContent.DELETES]
        assert [e.status for m in deletes for e in seam.manifest_entries(m, table.io)] == [ManifestEntryStatus.DELETED]


def test_pyarrow_small_types() -> None:
    with hook("pyiceberg.io.pyarrow._pyarrow_schema_ensure_small_types", "with_small_types (upsert rewrite)"):
        rows = pa.table({"s": pa.array(["x"], pa.large_string()), "l": pa.array([[1]], pa.large_list(pa.int64()))})
        assert seam.with_small_types(rows).schema == pa.schema([("s", pa.string()), ("l", pa.list_(pa.int64()))])


def test_snapshot_producer_for_a_manifest_rewrite_keeps_entry_ids(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg.table.update.snapshot._SnapshotProducer (_existing_manifests / _deleted_entries / new_manifest_writer) "
        "and ManifestWriter.existing (keeps snapshot id and sequence numbers)",
        "_RewriteManifests / prepare_rewrite_manifests",
    ):
        from pyiceberg.table.update.snapshot import _SnapshotProducer

        assert {"_existing_manifests", "_deleted_entries", "_summary", "new_manifest_writer", "spec"} <= set(
            dir(_SnapshotProducer)
        )
        catalog.load_table(("db", "contract")).append(ROWS)  # a second manifest
        table = catalog.load_table(("db", "contract"))
        head = table.current_snapshot()
        assert head is not None

        def entries(t: Table) -> set[tuple[str, int | None, int | None, int | None]]:
            s = t.current_snapshot()
            assert s is not None
            return {
                (e.data_file.file_path, e.snapshot_id, e.sequence_number, e.file_sequence_number)
                for m in seam.data_manifests(t, s)
                for e in m.fetch_manifest_entry(t.io)
            }

        before = entries(table)
        assert len(seam.data_manifests(table, head)) == 2
        prepared = seam_maintenance.prepare_rewrite_manifests(table, branch="main", entries_per_manifest=100, summary={})
        assert len(prepared.replaced) == 2 and len(prepared.created) == 1 and prepared.entries == 2
        prepared.commit()
        after = catalog.load_table(("db", "contract"))
        assert len(seam.data_manifests(after, after.current_snapshot())) == 1
        summary = after.current_snapshot().summary  # type: ignore[union-attr]
        assert summary is not None and summary.operation.value == "replace"
        # _commit computes the summary after the manifests: the rewrite's counts are in it
        assert summary.additional_properties["manifests-created"] == "1"
        assert summary.additional_properties["total-records"] == "6"
        assert entries(after) == before  # each entry keeps the snapshot that added it and its sequence numbers


def test_branch_updates_keep_retention_and_refs_can_be_removed(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg.table.update.SetSnapshotRefUpdate (type, retention fields) / RemoveSnapshotRefUpdate",
        "keeping_ref_retention / prepare_expire",
    ):
        from pyiceberg.table.update import SetSnapshotRefUpdate

        assert {"ref_name", "type", "snapshot_id", "max_ref_age_ms", "max_snapshot_age_ms", "min_snapshots_to_keep"} <= set(
            SetSnapshotRefUpdate.model_fields
        )
        head = table.current_snapshot()
        assert head is not None
        table.manage_snapshots().create_branch(head.snapshot_id, "b", min_snapshots_to_keep=4).create_tag(
            head.snapshot_id, "t"
        ).commit()
        table = catalog.load_table(("db", "contract"))
        files = list(seam.live_data_files(table, "b"))
        prepared = seam_producers.prepare_snapshot(
            table, data_files=files, overwrite=False, summary={}, properties=lambda _: {}, branch="b"
        )
        moves = [u for u in prepared._updates if isinstance(u, SetSnapshotRefUpdate)]
        assert [u.min_snapshots_to_keep for u in moves] == [4]  # put back by keeping_ref_retention
        prepared.commit()
        table = catalog.load_table(("db", "contract"))
        assert table.metadata.refs["b"].min_snapshots_to_keep == 4
        seam_maintenance.prepare_expire(table, [], ["t"]).commit()  # a ref removed, no snapshot
        assert set(catalog.load_table(("db", "contract")).metadata.refs) == {"main", "b"}


def test_snapshot_producers_name_their_files_from_commit_uuid(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg _SnapshotProducer.commit_uuid, _new_manifest_file_name, _new_manifest_list_file_name",
        "_named (prepare_snapshot / prepare_rewrite / prepare_replace / prepare_rewrite_manifests)",
    ):
        from pyiceberg.table.update.snapshot import _new_manifest_file_name, _new_manifest_list_file_name

        from lakesink.table import names

        commit = names.commit_name(names.BATCH, query_id="1964bb6e-59a8", batch_id=3)
        # the names pyiceberg formats from a commit_uuid are the ones lakesink.table.names makes and parses back
        assert _new_manifest_file_name(num=2, commit_uuid=commit) == names.manifest_name(commit, 2)  # type: ignore[arg-type]
        list_name = _new_manifest_list_file_name(snapshot_id=-5, attempt=0, commit_uuid=commit)  # type: ignore[arg-type]
        assert list_name == names.manifest_list_name(commit, -5)
        assert names.commit_of(list_name) == commit == names.commit_of(names.manifest_name(commit, 2))
        files = list(seam.live_data_files(table, "main"))
        for overwrite in (False, True):  # merge_append and overwrite producers
            prepared = seam_producers.prepare_snapshot(
                table, data_files=files, overwrite=overwrite, summary={}, properties=lambda _: {}, branch="main", commit=commit
            )
            assert prepared._producer.commit_uuid is commit
            written = [*prepared._producer._written_manifests, *prepared._producer._written_manifest_lists]
            assert written and all(names.commit_of(p.rsplit("/", 1)[-1]) == commit for p in written), written
            prepared.discard()


def test_added_snapshot_with_a_parent_and_an_old_sequence_number_is_refused(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg AddSnapshotUpdate (sequence number check) / write_manifest_list", "prepare_restore_refs"):
        from pyiceberg.manifest import write_manifest_list
        from pyiceberg.table.update import AddSnapshotUpdate, update_table_metadata

        assert params(write_manifest_list) == [
            "format_version",
            "output_file",
            "snapshot_id",
            "parent_snapshot_id",
            "sequence_number",
            "avro_compression",
        ]
        head = table.current_snapshot()
        assert head is not None
        # a snapshot brought back with a parent and a sequence number not above the table's is refused: the check
        # that makes prepare_restore_refs conflict when another snapshot landed meanwhile
        stale = head.model_copy(update={"snapshot_id": head.snapshot_id + 1, "parent_snapshot_id": head.snapshot_id})
        with pytest.raises(ValueError, match="older than last sequence number"):
            update_table_metadata(table.metadata, (AddSnapshotUpdate(snapshot=stale),))


def test_sql_catalog_type_filter_and_orm_conversion(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg SqlCatalog._iceberg_type_filter / _convert_orm_to_iceberg", "reload_from_sql_catalog"):
        from pyiceberg.catalog.sql import SqlCatalog

        assert isinstance(catalog, SqlCatalog)
        assert params(SqlCatalog._iceberg_type_filter) == ["self"]
        assert params(SqlCatalog._convert_orm_to_iceberg) == ["self", "orm_table"]
        # the pointer has not moved: the already parsed metadata is reused (the same object)
        same = seam_sql.reload_from_sql_catalog(catalog, ("db", "contract"), table)
        assert same is not None and same.metadata is table.metadata
        # it moved: the table is loaded and parsed afresh, as pyiceberg's load_table does
        catalog.load_table(("db", "contract")).append(ROWS)
        moved = seam_sql.reload_from_sql_catalog(catalog, ("db", "contract"), table)
        assert moved is not None and moved.metadata_location != table.metadata_location
        assert moved.metadata_location == catalog.load_table(("db", "contract")).metadata_location
        assert len(moved.snapshots()) == len(table.snapshots()) + 1


# --- pyspark internals (lakesink/_pyspark.py) -----------------------------------------------------


def test_streaming_sink_runner_makes_the_writer_for_commit_and_abort() -> None:
    with hook("pyspark.sql.worker.python_streaming_sink_runner._main (calls streamWriter)", "in_streaming_sink_runner"):
        from lakesink import _pyspark

        runner = importlib.import_module(_pyspark.STREAMING_SINK_RUNNER)
        # the function that makes the writer: _main on pyspark 4.3 (main wraps it), main on pyspark 4.1
        source = inspect.getsource(getattr(runner, "_main", None) or runner.main)
        assert ".streamWriter(" in source and ".commit(" in source and ".abort(" in source
        assert not _pyspark.in_streaming_sink_runner()  # not from the runner: False


def test_the_context_keeps_the_python_its_workers_run() -> None:
    with hook("pyspark SparkContext.pythonExec (PYSPARK_PYTHON, default python3)", "local_worker_python"):
        from pyspark import SparkContext

        source = inspect.getsource(SparkContext._do_init)
        assert 'self.pythonExec = os.environ.get("PYSPARK_PYTHON", "python3")' in source, source


def test_streaming_query_jvm_object_and_first_session() -> None:
    with hook("pyspark StreamingQuery._jsq, SparkSession._instantiatedSession", "running_query_checkpoint"):
        from pyspark.sql import SparkSession
        from pyspark.sql.streaming.query import StreamingQuery

        assert "self._jsq = " in inspect.getsource(StreamingQuery.__init__)
        assert hasattr(SparkSession, "_instantiatedSession")


def test_statistics_follow_javas_inferred_column_limit(tmp_path: Path) -> None:
    """Iceberg Java's MetricsConfig keeps metrics for the first ``write.metadata.metrics.max-inferred-column-defaults``
    (100) top-level columns of a wider table unless ``write.metadata.metrics.default`` is set; pyiceberg 0.12 has
    no such limit, so 4,000 files of 1,000 columns carried 1,000 columns of bounds each into the driver and the
    manifest. ``seam.file_statistics`` applies the limit (``seam.metrics_properties``)."""
    with hook("pyiceberg.io.pyarrow.compute_statistics_plan (write.metadata.metrics.column.*)", "metrics_properties"):
        wide = pa.table(
            {
                **{f"c{i}": pa.array([i, i + 1], pa.int64()) for i in range(150)},
                "s": pa.array([{"a": 1}, {"a": 2}], pa.struct([("a", pa.int32())])),
            }
        )
        schema = seam.new_table_schema(wide.schema)
        path = tmp_path / "wide.parquet"
        pq.write_table(wide.cast(seam.arrow_schema(schema)), path)
        metadata = pq.read_metadata(path)
        ids = {schema.find_column_name(f.field_id): f.field_id for f in schema.fields}

        stats = seam.file_statistics(metadata, schema, {})
        assert len(stats["lower_bounds"]) == 100 and len(stats["value_counts"]) == 100
        assert ids["c99"] in stats["lower_bounds"] and ids["c100"] not in stats["value_counts"]
        assert len(stats["column_sizes"]) == 100  # no metric at all for a column in mode none (as newer Iceberg)

        every = seam.file_statistics(metadata, schema, {"write.metadata.metrics.default": "truncate(16)"})
        assert len(every["lower_bounds"]) == 150  # an explicit default applies to every column (the struct: counts)

        raised = seam.file_statistics(metadata, schema, {"write.metadata.metrics.max-inferred-column-defaults": "200"})
        assert len(raised["lower_bounds"]) == 150

        one = seam.file_statistics(metadata, schema, {"write.metadata.metrics.column.c120": "full"})
        assert len(one["lower_bounds"]) == 101 and ids["c120"] in one["lower_bounds"]

        narrow = seam.metrics_properties(seam.new_table_schema(ROWS.schema), {"k": "v"})
        assert narrow == {"k": "v"}  # at most 100 columns: the properties as they are

    from lakesink.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="max-inferred-column-defaults must be a whole number"):
        seam.check_write_properties("db.wide", schema, {"write.metadata.metrics.max-inferred-column-defaults": "many"})


# --- float and double partition values (RELIABILITY row 32) ----------------------------------------


def _double_partitioned(catalog: Catalog, values: list[float]) -> Table:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import DoubleType

    catalog.create_namespace_if_not_exists(("db",))
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "v", DoubleType(), required=False))
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="v"))
    t = catalog.create_table(("db", "doubles"), schema=schema, partition_spec=spec)
    # one file per value, registered as lakesink's executors do (pyiceberg 0.12.0's own partitioned append
    # cannot write a NaN partition: its grouping by Arrow equality leaves the NaN rows out)
    files = []
    for i, v in enumerate(values):
        path = f"{t.location()}/data/v-{i}.parquet"
        rows = pa.table({"id": pa.array([i], pa.int64()), "v": pa.array([v], pa.float64())})
        rows = rows.cast(seam.arrow_schema(seam.file_schema(schema)))
        Path(path.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, path.removeprefix("file://"))
        metadata = pq.read_metadata(path.removeprefix("file://"))
        stats = seam.file_statistics(metadata, seam.file_schema(schema), t.properties)
        size = Path(path.removeprefix("file://")).stat().st_size
        files.append(
            seam_producers.data_file(path=path, size_in_bytes=size, statistics=stats, spec_id=spec.spec_id, partition=(v,))
        )
    with t.transaction() as tx, tx.update_snapshot().fast_append() as append:
        for f in files:
            append.append_data_file(f)
    return catalog.load_table(("db", "doubles"))


def test_double_partition_values_are_read_exactly_from_manifests(catalog: Catalog) -> None:
    with hook("pyiceberg.avro.reader.DoubleReader.read(decoder) and BinaryDecoder.read(n)", "_read_double_exactly"):
        from pyiceberg.avro.reader import DoubleReader

        assert params(DoubleReader.read) == ["self", "decoder"]
        if seam.fast_avro_reads_doubles_as_float32():
            assert DoubleReader.read is seam_floats._read_double_exactly
        table = _double_partitioned(catalog, [0.1, 1e300, 5e-324])
        values = sorted(task.file.partition[0] for task in table.scan().plan_files())
        assert values == [5e-324, 0.1, 1e300]  # pyiceberg 0.12.0's own reader: 0.0, 0.10000000149011612, inf


def test_partition_summaries_bound_signed_zeros_in_icebergs_order() -> None:
    with hook("pyiceberg.manifest.PartitionFieldStats (update, _min, _max, to_summary)", "_update_in_iceberg_order"):
        from pyiceberg.conversions import from_bytes
        from pyiceberg.manifest import PartitionFieldStats
        from pyiceberg.types import DoubleType

        for order in ([0.0, -0.0], [-0.0, 0.0]):
            stats = PartitionFieldStats(DoubleType())
            for v in [*order, float("nan"), None]:
                stats.update(v)
            summary = stats.to_summary()
            assert summary.contains_nan and summary.contains_null
            assert summary.lower_bound is not None and summary.upper_bound is not None
            lower = from_bytes(DoubleType(), summary.lower_bound)
            upper = from_bytes(DoubleType(), summary.upper_bound)
            assert (str(lower), str(upper)) == ("-0.0", "0.0"), order  # pyiceberg 0.12.0's own: both the first seen


def test_overwrite_of_files_in_a_nan_partition(catalog: Catalog) -> None:
    with hook(
        "pyiceberg.table.update.snapshot._OverwriteFiles._build_delete_files_partition_predicate "
        "(_deleted_data_files, partition_filters)",
        "_OverwriteRemovedFiles",
    ):
        from pyiceberg.table.update.snapshot import _OverwriteFiles

        assert params(_OverwriteFiles._build_delete_files_partition_predicate) == ["self"]
        table = _double_partitioned(catalog, [float("nan"), -0.0, 0.0])
        old = list(seam.live_data_files(table, "main"))
        assert len(old) == 3
        seam_producers.prepare_replace(table, deleted=old, added=old, summary={}, branch="main").commit()
        after = catalog.load_table(("db", "doubles"))
        assert after.current_snapshot().summary.operation.value == "replace"  # type: ignore[union-attr]
        assert sorted(str(t.file.partition[0]) for t in after.scan().plan_files()) == ["-0.0", "0.0", "nan"]


# --- pyiceberg never commits twice for one lakesink attempt (issue 24: "the next pyiceberg") ---------------------
#
# pyiceberg 0.12's Transaction.commit_transaction retries a conflicting commit by itself (refresh, rebuild the
# snapshot producers on the new head, commit again: apache/iceberg-python#3320, #3811). lakesink must never go
# through it: every lakesink commit is either one Table._do_commit per attempt of lakesink's own loop
# (PreparedCommit.commit), metadata-only commits included (prepare_staged). The tests below count the requests that
# reach the catalog (Catalog.commit_table, the one entry point of every pyiceberg commit, SQL, REST or Glue), with
# the catalog made to refuse the commit: a fault injected at that one call.


class _CountingRefusals:
    """``catalog.commit_table`` refusing the first ``refuse`` requests with CommitFailedException (a 409), counting all."""

    def __init__(self, catalog: Catalog, monkeypatch: pytest.MonkeyPatch, refuse: int = 1):
        self.calls = 0
        self.refuse = refuse
        real = catalog.commit_table

        def commit_table(table: Table, requirements: Any, updates: Any) -> Any:
            self.calls += 1
            if self.calls <= self.refuse:
                raise CommitFailedException(f"refused by the contract test (request {self.calls})")
            return real(table, requirements, updates)

        monkeypatch.setattr(catalog, "commit_table", commit_table)


def test_do_commit_sends_exactly_one_request(table: Table, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    with hook("pyiceberg.table.Table._do_commit (one Catalog.commit_table, no retry)", "PreparedCommit.commit"):
        counting = _CountingRefusals(catalog, monkeypatch, refuse=1)
        with pytest.raises(CommitFailedException):
            table._do_commit(updates=(), requirements=())
        assert counting.calls == 1


def test_commit_transaction_retries_by_itself_so_lakesink_never_calls_it(
    table: Table, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What lakesink avoids, pinned: one ``with table.transaction()`` append sends a second request after a 409.
    If this ever fails because pyiceberg stopped retrying, lakesink's own loop is still the one that must run."""
    counting = _CountingRefusals(catalog, monkeypatch, refuse=1)
    with table.transaction() as tx:
        tx.append(ROWS)
    assert counting.calls == 2, "pyiceberg's commit_transaction no longer retries a conflicting append on its own"


def test_a_staged_commit_sends_one_request_whatever_the_transaction_staged(
    table: Table, catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kind of metadata-only commit lakesink makes (a branch, a property removal, moving main, the refs an expiry
    dropped): staged by ``prepare_staged`` and swapped by ``PreparedCommit.commit`` in one request per attempt of
    lakesink's loop; a refusal is handed back, not retried. Through pyiceberg's generic ``_do_commit`` (the path of
    every catalog but the SQL one) so that the catalog's ``commit_table`` counts the requests."""
    with hook("Transaction(autocommit=False) / ManageSnapshots(transaction=) / Transaction._updates", "prepare_staged"):
        head = table.metadata.snapshot_by_name("main")
        assert head is not None
        stagings: dict[str, Callable[[Any], object]] = {
            "create branch": lambda tx: seam_producers.manage_snapshots(tx).create_branch(head.snapshot_id, "audit").commit(),
            "remove property": lambda tx: tx.remove_properties("write.format.default"),
            "set current snapshot": lambda tx: (
                seam_producers.manage_snapshots(tx).set_current_snapshot(head.snapshot_id).commit()
            ),
        }
        for what, stage in stagings.items():
            monkeypatch.setattr(seam_commit, "_sql_swap_applies", lambda _table: False)
            counting = _CountingRefusals(catalog, monkeypatch, refuse=1)
            prepared = seam_producers.prepare_staged(table, stage)
            assert prepared._updates, what
            with pytest.raises(CommitFailedException):
                prepared.commit()
            assert counting.calls == 1, f"{what}: {counting.calls} requests for one PreparedCommit.commit"
            monkeypatch.undo()
        with pytest.raises(ValueError, match="changes nothing"):
            seam_producers.prepare_staged(table, lambda tx: None)


def test_lakesink_never_commits_through_pyicebergs_retry_loop() -> None:
    """Outside the seam, no lakesink module calls a pyiceberg API that commits through commit_transaction (or
    through a table's own autocommit updates). A new call of one of them fails here, naming the module and line;
    make it a commit action (lakesink.driver.loop.action) whose prepare stages it with ``_pyiceberg.producers.prepare_staged``."""
    import ast

    committing = {
        "transaction", "commit_transaction", "manage_snapshots", "update_schema", "update_spec", "update_sort_order",
        "update_statistics", "upgrade_table_version", "add_files", "upsert", "dynamic_partition_overwrite", "_do_commit",
        "expire_snapshots",
    }  # fmt: skip
    package = Path(seam.__file__).parents[2]
    found = []
    for path in sorted(package.rglob("*.py")):
        if "_pyiceberg" in path.relative_to(package).parts:
            continue  # the seam itself
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in committing:
                receiver = ast.unparse(node.func.value)
                if receiver in ("seam", "seam_commit", "seam_producers", "seam_maintenance"):
                    continue  # the seam's own one-request helpers
                if node.func.attr == "expire_snapshots" and not receiver.endswith("maintenance"):
                    continue  # lakesink's own expiry.expire_snapshots, not pyiceberg's
                if node.func.attr in ("update_schema", "update_spec") and receiver in ("tx",):
                    continue  # staged on a transaction lakesink sends itself
                found.append(f"{path.relative_to(package.parent)}:{node.lineno} {receiver}.{node.func.attr}(...)")
    assert not found, "pyiceberg commits outside lakesink's one-request paths:\n  " + "\n  ".join(found)


def test_rest_catalog_keeps_the_endpoints_its_config_listed(tmp_path: Path) -> None:
    """``RestCatalog._supported_endpoints`` holds what ``/v1/config`` listed (read once, when the catalog is made), as
    ``Endpoint`` models comparable with the seam's ``REST_TRANSACTIONS_ENDPOINT``; without a list, pyiceberg's
    defaults, which do not include the transactions endpoint. And ``_RETRY_ARGS`` / ``_handle_non_200_response`` /
    ``CommitTableRequest`` exist as ``_commit_transaction_on_rest_catalog`` uses them."""
    from pyiceberg.catalog import load_catalog

    from tests.support.txn_rest_server import TxnRestServer

    with hook("RestCatalog._supported_endpoints", "catalog_commits_atomically"):
        for kwargs, expected in (({}, True), ({"transactions": False}, False), ({"list_endpoints": False}, False)):
            server = TxnRestServer(tmp_path / str(len(list(tmp_path.iterdir()))), **kwargs).start()  # type: ignore[arg-type]
            try:
                catalog = load_catalog("contract", **server.catalog_properties())
                assert (seam_rest.REST_TRANSACTIONS_ENDPOINT in catalog._supported_endpoints) is expected  # type: ignore[attr-defined]
                assert seam_commit.catalog_commits_atomically(catalog) is expected
            finally:
                server.stop()
    with hook("pyiceberg.catalog.rest._RETRY_ARGS, response._handle_non_200_response", "_post_transaction"):
        from pyiceberg.catalog.rest import _RETRY_ARGS
        from pyiceberg.catalog.rest.response import _handle_non_200_response

        assert {"retry", "stop", "before_sleep"} <= set(_RETRY_ARGS)
        assert list(inspect.signature(_handle_non_200_response).parameters) == ["exc", "error_handler"]
