"""Partitioned tables: the partitioned-by option, one partition per data file, evolved specs, bounded files."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform, TruncateTransform

from lakesink.audit import interop
from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import TaskIds, WritePlan
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import OutputMode, SinkOptions, TableName
from tests.support.helpers import Stream, assert_snapshot_invariants, sink_committer


def _files(table: Any) -> list[Any]:
    table.refresh()
    snapshot = table.current_snapshot()
    out = []
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            out.append(entry.data_file)
    return out


def _assert_one_partition_per_file(table: Any) -> int:
    """Every data file's rows, transformed by the spec the file was written for, give its partition record."""
    files = _files(table)
    schema = table.schema()
    for f in files:
        spec = table.specs()[f.spec_id]
        rows = pq.ParquetFile(f.file_path.removeprefix("file://")).read().to_pylist()
        assert rows, f.file_path
        for pos, pf in enumerate(spec.fields):
            name = schema.find_column_name(pf.source_id)
            source_type = schema.find_field(pf.source_id).field_type
            expected = {_transform(pf.transform, source_type, r[name]) for r in rows}
            assert expected == {f.partition[pos]}, (f.file_path, pf.name, expected, f.partition[pos])
    return len(files)


def _transform(transform: Any, source_type: Any, value: Any) -> Any:
    from pyiceberg.partitioning import _to_partition_representation

    raw = _to_partition_representation(source_type, value) if value is not None else None
    if isinstance(transform, IdentityTransform):
        return raw
    return transform.transform(source_type)(raw)


@pytest.mark.spark
def test_partitioned_by_creates_the_spec_and_writes_one_partition_per_file(stream: Stream) -> None:
    stream.add_input(files=3, rows_per_file=200)
    stream.run(partitioned_by="days(ts), bucket(4, id), truncate(user, 6)")
    table = stream.table
    spec = table.spec()
    assert [(f.name, f.transform) for f in spec.fields] == [
        ("ts_day", DayTransform()),
        ("id_bucket_4", BucketTransform(4)),
        ("user_truncate_6", TruncateTransform(6)),
    ]
    stream.assert_exactly_once()
    n_files = _assert_one_partition_per_file(table)
    # ids 10000..10599 spread over 28 days x 4 buckets x 2 user prefixes ('user-1', 'user-2'...)
    partitions = {tuple(f.partition) for f in _files(table)}
    assert len(partitions) > 50
    # a fanout writer: at most one file per (task, partition); 3 batches of one input file (one task) each
    assert n_files <= 3 * len(partitions)
    # files sit under Hive-style partition folders, as Iceberg writers lay them out
    paths = [f.file_path for f in _files(table)]
    assert all(re.search(r"/ts_day=2024-0[23]-\d\d/", p) and "/id_bucket_4=" in p for p in paths), paths[:3]


@pytest.mark.spark
def test_duckdb_partition_filter_returns_what_a_full_scan_filtered_returns(stream: Stream) -> None:
    stream.add_input(files=2, rows_per_file=300)
    stream.run(partitioned_by="days(ts), bucket(8, id)")
    table = stream.table
    location = table.metadata_location
    everything = interop.duckdb_query(location, "SELECT id, ts FROM t")
    assert Counter(everything.column("id").to_pylist()) == Counter(stream.sent)
    wanted = {r["id"] for r in everything.to_pylist() if r["ts"].date().isoformat() == "2024-03-05"}
    assert wanted
    day = "ts >= TIMESTAMPTZ '2024-03-05 00:00:00+00' AND ts < TIMESTAMPTZ '2024-03-06 00:00:00+00'"
    filtered = interop.duckdb_query(location, f"SELECT id FROM t WHERE {day}")
    assert Counter(filtered.column("id").to_pylist()) == Counter(wanted)
    one = sorted(wanted)[0]
    assert interop.duckdb_query(location, f"SELECT id FROM t WHERE id = {one}").column("id").to_pylist() == [one]


@pytest.mark.spark
def test_writing_into_a_table_whose_spec_evolved_uses_the_current_spec(stream: Stream, catalog: Any) -> None:
    stream.add_input(files=1, rows_per_file=100)
    stream.run(partitioned_by="days(ts)")
    table = stream.table
    with table.update_spec() as update:
        update.add_field("kind", IdentityTransform(), "kind")
    stream.add_input(files=1, rows_per_file=100)
    stream.run()  # no option: the table's current spec
    table = stream.table
    specs = Counter(f.spec_id for f in _files(table))
    assert set(specs) == {0, 1}, specs
    assert table.spec().spec_id == 1
    _assert_one_partition_per_file(table)
    stream.assert_exactly_once()


@pytest.mark.spark
def test_partitioned_by_that_differs_from_the_existing_table_fails_at_start(stream: Stream) -> None:
    stream.add_input(files=1, rows_per_file=10)
    stream.run(partitioned_by="days(ts)")
    before = stream.table.metadata_location
    stream.add_input(files=1, rows_per_file=10)
    message = stream.run_failing(partitioned_by="hours(ts)")
    assert "option 'partitioned-by' is 'hours(ts)' but table db.events is partitioned by 'days(ts)'" in message
    assert stream.table.metadata_location == before


@pytest.mark.spark
def test_partitioned_by_naming_a_missing_column_or_a_wrong_type_fails_before_the_table_exists(
    stream: Stream, catalog: Any
) -> None:
    stream.add_input(files=1, rows_per_file=10)
    message = stream.run_failing(partitioned_by="days(nope), bucket(4, amount), days(user)")
    assert "days(nope): no column 'nope' in the stream" in message
    assert "days(user): transform days cannot be applied to column 'user' of type string" in message
    assert not catalog.table_exists(("db", "events"))


# --- the executor's fanout writer --------------------------------------------------------------------


def _plan(tmp_path: Path, terms: str, properties: dict[str, str] | None = None) -> WritePlan:
    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": f"file://{tmp_path}/wh"}
    (tmp_path / "wh").mkdir()
    catalog_options = {f"catalog.{k}": v for k, v in props.items()}
    options = SinkOptions.from_mapping({"table": "db.t", "partitioned-by": terms, **catalog_options})
    committer = sink_committer(options)
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("k", pa.string())])
    table = committer.table.open_table(schema)
    if properties:
        with table.transaction() as tx:
            tx.set_properties(properties)
        table = committer.table.reload_table()
    assert options.output_mode is OutputMode.APPEND and options.table == TableName(("db",), "t")
    return committer.write_plan(table, "q-1", schema)


def test_fanout_writer_keeps_a_bounded_number_of_files_open(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "k", {"write.lakesink.max-open-files": "2"})
    writer = TaskWriter(plan, TaskIds(query_id="q-1", batch_id=0, partition_id=0, task_attempt_id=0))
    # partitions a, b, c interleaved row by row: with 2 open files, c evicts a, then a evicts b...
    ids = list(range(30))
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "k": pa.array(["abc"[i % 3] for i in ids])})
    result = writer.write([batch.slice(i, 3) for i in range(0, 30, 3)])
    assert sum(f.record_count for f in result.files) == 30
    by_partition = Counter(f.partition for f in result.files)
    assert set(by_partition) == {("a",), ("b",), ("c",)}
    assert len(result.files) > 3  # evictions reopened partitions
    for f in result.files:
        # the file alone (pq.read_table of a path under k=a/ also reads the folder name as a partition column,
        # which pyarrow 18 refuses to merge with the file's own column k)
        values = pq.ParquetFile(f.path.removeprefix("file://")).read().column("k").to_pylist()
        assert set(values) == set(f.partition)


def test_fanout_writer_without_eviction_writes_one_file_per_partition(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "bucket(5, id), k")
    writer = TaskWriter(plan, TaskIds(query_id="q-1", batch_id=0, partition_id=0, task_attempt_id=0))
    ids = list(range(1000))
    batch = pa.record_batch({"id": pa.array(ids, pa.int64()), "k": pa.array([None if i % 10 == 0 else "xy"[i % 2] for i in ids])})
    result = writer.write([batch.slice(i, 100) for i in range(0, 1000, 100)])
    keys = Counter(f.partition for f in result.files)
    assert all(n == 1 for n in keys.values())
    assert {k[1] for k in keys} == {"x", "y", None}
    assert sum(f.record_count for f in result.files) == 1000


def test_bad_partitioned_by_syntax_is_rejected_when_options_are_parsed() -> None:
    with pytest.raises(InvalidOptionError) as e:
        SinkOptions.from_mapping({"table": "db.t", "partitioned-by": "bucket(id)"})
    assert str(e.value) == "option 'partitioned-by': bucket() takes a number and a column, e.g. bucket(16, id); got 'bucket(id)'"


@pytest.mark.spark
def test_ids_survive_partitioned_complete_mode(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    s = Stream(spark, tmp_path, catalog_properties, "foreach", mode="complete")
    s.add_input(files=2, rows_per_file=50)
    s.run(partitioned_by="kind")
    table = s.table
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["kind"] for r in rows) == [0, 1, 2, 3, 4]
    assert sum(r["rows"] for r in rows) == 100
    _assert_one_partition_per_file(table)
    assert_snapshot_invariants(table)
