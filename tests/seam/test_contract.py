"""Contract tests of the pyiceberg internals that the seam (``lakesink/_pyiceberg/``) relies on: one test per hook.

pyiceberg has no public "write files now, commit later" API, so the seam uses private names and
behaviours. Each test below pins one of them (the name imports, the signature lakesink calls, the
behaviour lakesink depends on) and fails with a message naming the hook and the seam function that
uses it, so that a pyiceberg upgrade fails here, in one obvious place, before any Spark test.
Checked on pyiceberg 0.12.0.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
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
from pyiceberg.types import IntegerType, ListType, LongType, NestedField, StringType, StructType

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam


@contextmanager
def hook(name: str, used_by: str) -> Iterator[None]:
    """Turn any failure into one naming the pyiceberg hook and the seam function that depends on it."""
    try:
        yield
    except Exception as e:  # an AssertionError too: the behaviour changed
        pytest.fail(
            f"pyiceberg hook {name} (used by lakesink._pyiceberg: {used_by}) changed in this pyiceberg version: "
            f"{type(e).__name__}: {e}. Update lakesink/_pyiceberg/ (io.py or commit.py, and this test) for the new API.",
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
        data_file = seam_commit.data_file(path=str(path), size_in_bytes=path.stat().st_size, statistics=stats, spec_id=0)
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
        tx = seam_commit._MetadataCachingTransaction(table)
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
        seam_commit.prepare_properties_at_head(table, {"lakesink.contract": "1"}, branch="main").commit()
        assert catalog.load_table(("db", "contract")).properties["lakesink.contract"] == "1"
        catalog.load_table(("db", "contract")).append(ROWS)  # the head moves
        with pytest.raises(CommitFailedException):  # no rebase, no retry: the stale base fails
            seam_commit.prepare_properties_at_head(stale, {"lakesink.contract": "2"}, branch="main").commit()


def test_snapshot_producer_merge_flag_and_cleanup(table: Table, catalog: Catalog) -> None:
    with hook(
        "pyiceberg snapshot producer _merge_enabled / _clean_all_uncommitted / snapshot_id, Transaction._requirements",
        "prepare_snapshot / PreparedCommit.discard",
    ):
        files = list(seam.live_data_files(table, "main"))
        prepared = seam_commit.prepare_snapshot(
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
        prepared = seam_commit.prepare_snapshot(
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
            seam_commit.prepare_snapshot(
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
        from lakesink.driver.schema import SchemaChange

        schema = seam_commit.evolved_schema(table, [SchemaChange("add", ("extra",), StringType())])
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
    with hook("pyiceberg SqlCatalog._parse_metadata_version / _write_metadata (static)", "_swap_on_sql_catalog"):
        from pyiceberg.catalog.sql import SqlCatalog

        assert params(SqlCatalog._parse_metadata_version) == ["metadata_location"]
        assert params(SqlCatalog._write_metadata) == ["metadata", "io", "metadata_path"]
        name = "00007-6f1c9a2e-1b2c-4d5e-8f90-0123456789ab.metadata.json"
        assert SqlCatalog._parse_metadata_version(f"file:///w/db/t/metadata/{name}") == 7
        assert SqlCatalog._parse_metadata_version(table.metadata_location) >= 1
        path = f"{table.location()}/metadata/99999-contract.metadata.json"
        SqlCatalog._write_metadata(metadata=table.metadata, io=table.io, metadata_path=path)
        from pyiceberg.serializers import FromInputFile

        assert FromInputFile.table_metadata(table.io.new_input(path)).table_uuid == table.metadata.table_uuid


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

        assert params(SqlCatalog._delete_old_metadata) == ["io", "base", "metadata"]
        stale = catalog.load_table(("db", "contract"))
        seam_commit.prepare_properties_at_head(table, {"lakesink.contract": "1"}, branch="main").commit()
        fresh = catalog.load_table(("db", "contract"))
        assert fresh.metadata_location == table.metadata_location  # the swap moved the pointer to what it wrote
        assert fresh.properties["lakesink.contract"] == "1"
        assert fresh.metadata.metadata_log[-1].metadata_file == stale.metadata_location
        # from a stale table the one-parse swap does not apply (the pointer moved): nothing is written or moved
        assert seam_commit._swap_on_sql_catalog(stale, (), ()) is False
        assert catalog.load_table(("db", "contract")).metadata_location == fresh.metadata_location


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
        ours = seam_commit.updated_metadata(table.metadata, updates, table.metadata_location)
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
        prepared = seam_commit.prepare_replace(
            table, deleted=old, added=old[:0] + old, summary={"lakesink.contract": "r"}, branch="main"
        )
        prepared.commit()
        head = catalog.load_table(("db", "contract")).current_snapshot()
        assert head is not None and head.summary is not None and head.summary.operation.value == "replace"
        assert head.summary.additional_properties["lakesink.contract"] == "r"


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
        prepared = seam_commit.prepare_rewrite_manifests(table, branch="main", entries_per_manifest=100, summary={})
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
        prepared = seam_commit.prepare_snapshot(
            table, data_files=files, overwrite=False, summary={}, properties=lambda _: {}, branch="b"
        )
        moves = [u for u in prepared._updates if isinstance(u, SetSnapshotRefUpdate)]
        assert [u.min_snapshots_to_keep for u in moves] == [4]  # put back by keeping_ref_retention
        prepared.commit()
        table = catalog.load_table(("db", "contract"))
        assert table.metadata.refs["b"].min_snapshots_to_keep == 4
        seam_commit.prepare_expire(table, [], ["t"]).commit()  # a ref removed, no snapshot
        assert set(catalog.load_table(("db", "contract")).metadata.refs) == {"main", "b"}


def test_sql_catalog_type_filter_and_orm_conversion(table: Table, catalog: Catalog) -> None:
    with hook("pyiceberg SqlCatalog._iceberg_type_filter / _convert_orm_to_iceberg", "reload_from_sql_catalog"):
        from pyiceberg.catalog.sql import SqlCatalog

        assert isinstance(catalog, SqlCatalog)
        assert params(SqlCatalog._iceberg_type_filter) == ["self"]
        assert params(SqlCatalog._convert_orm_to_iceberg) == ["self", "orm_table"]
        # the pointer has not moved: the already parsed metadata is reused (the same object)
        same = seam_commit.reload_from_sql_catalog(catalog, ("db", "contract"), table)
        assert same is not None and same.metadata is table.metadata
        # it moved: the table is loaded and parsed afresh, as pyiceberg's load_table does
        catalog.load_table(("db", "contract")).append(ROWS)
        moved = seam_commit.reload_from_sql_catalog(catalog, ("db", "contract"), table)
        assert moved is not None and moved.metadata_location != table.metadata_location
        assert moved.metadata_location == catalog.load_table(("db", "contract")).metadata_location
        assert len(moved.snapshots()) == len(table.snapshots()) + 1


# --- pyspark internals (lakesink/_pyspark.py) -----------------------------------------------------


def test_streaming_sink_runner_makes_the_writer_for_commit_and_abort() -> None:
    with hook("pyspark.sql.worker.python_streaming_sink_runner._main (calls streamWriter)", "in_streaming_sink_runner"):
        from lakesink import _pyspark

        runner = importlib.import_module(_pyspark.STREAMING_SINK_RUNNER)
        source = inspect.getsource(runner._main)
        assert ".streamWriter(" in source and ".commit(" in source and ".abort(" in source
        assert not _pyspark.in_streaming_sink_runner()  # not from the runner: False


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
