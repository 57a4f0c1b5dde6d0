"""lakesink.executor.task_writer.TaskWriter: Arrow batches in, Parquet data files of a real table out.

Tables are created in the test's SQLite catalog; the files written are read back with pyarrow.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.conversions import from_bytes
from pyiceberg.types import IntegerType, LongType, PrimitiveType, StringType

from lakesink.errors import InjectedFault, SchemaMismatchError
from lakesink.executor.messages import TaskIds, TaskResult, WritePlan
from lakesink.executor.task_writer import TaskWriter, utc_schema, utc_type
from lakesink.faults import ENV_FAULTS_DIR, EXECUTOR_AFTER_FILE, EXECUTOR_BEFORE_RETURN
from tests.support.files import MakePlan, data_files_on_disk, local_path

EVENTS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("qty", pa.int32()),
        pa.field("name", pa.string()),
    ]
)


@pytest.fixture(autouse=True)
def own_faults_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fault points read this test's own (empty unless armed) folder."""
    folder = tmp_path / "faults"
    folder.mkdir()
    monkeypatch.setenv(ENV_FAULTS_DIR, str(folder))
    return folder


def decoded(field_type: PrimitiveType, value: bytes) -> Any:
    """A column bound decoded (pyiceberg's from_bytes is typed as returning the bound's text form)."""
    return from_bytes(field_type, value)


def writer(plan: WritePlan, *, batch_id: int = 3, partition_id: int = 1, attempt: int = 0) -> TaskWriter:
    return TaskWriter(plan, TaskIds(query_id="q-1", batch_id=batch_id, partition_id=partition_id, task_attempt_id=attempt))


def events(ids: list[int], qty: list[int | None] | None = None, names: list[str | None] | None = None) -> pa.RecordBatch:
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array(qty if qty is not None else [i * 10 for i in ids], pa.int32()),
            pa.array(names if names is not None else [f"n{i}" for i in ids], pa.string()),
        ],
        schema=EVENTS,
    )


def read_rows(result: TaskResult) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for f in result.files:
        rows.extend(pq.read_table(local_path(f.path)).to_pylist())
    return rows


# --- rows, field ids, statistics ------------------------------------------------------------------


def test_rows_round_trip_exactly(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    b1 = events([1, 2, 3], qty=[10, None, -7], names=["a", None, "ü ✓"])
    b2 = events([4, 5])
    result = writer(plan).write([b1, b2])

    assert result.query_id == "q-1"
    assert (result.batch_id, result.partition_id, result.task_attempt_id) == (3, 1, 0)
    assert (result.schema_id, result.spec_id) == (plan.schema_id, plan.spec_id)
    assert result.replay_skipped is False
    assert len(result.files) == 1
    assert result.record_count == 5
    assert read_rows(result) == [
        {"id": 1, "qty": 10, "name": "a"},
        {"id": 2, "qty": None, "name": None},
        {"id": 3, "qty": -7, "name": "ü ✓"},
        {"id": 4, "qty": 40, "name": "n4"},
        {"id": 5, "qty": 50, "name": "n5"},
    ]
    f = result.files[0]
    assert f.path.startswith(f"{plan.location}/data/")
    assert f.path.endswith(".parquet")
    assert f.size_in_bytes == os.path.getsize(local_path(f.path))
    assert result.size_in_bytes == f.size_in_bytes
    assert data_files_on_disk(plan) == [local_path(f.path)]


def test_parquet_field_ids_are_the_table_field_ids(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    result = writer(plan).write([events([1])])
    file_schema = pq.read_schema(local_path(result.files[0].path))
    ids = {field.name: field.metadata[b"PARQUET:field_id"] for field in file_schema}
    assert ids == {f.name: str(f.field_id).encode() for f in plan.schema.fields}
    assert ids == {"id": b"1", "qty": b"2", "name": b"3"}
    assert file_schema.field("id").nullable is False


def test_statistics(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    result = writer(plan).write(
        [events([5, -3, 12], qty=[7, None, -2], names=["m", "b", None]), events([4], qty=[None], names=["z"])]
    )
    (f,) = result.files
    s = f.statistics
    assert f.record_count == 4
    assert s["record_count"] == 4
    assert s["value_counts"] == {1: 4, 2: 4, 3: 4}
    assert s["null_value_counts"] == {1: 0, 2: 2, 3: 1}
    assert decoded(LongType(), s["lower_bounds"][1]) == -3
    assert decoded(LongType(), s["upper_bounds"][1]) == 12
    assert decoded(IntegerType(), s["lower_bounds"][2]) == -2
    assert decoded(IntegerType(), s["upper_bounds"][2]) == 7
    assert from_bytes(StringType(), s["lower_bounds"][3]) == "b"
    assert from_bytes(StringType(), s["upper_bounds"][3]) == "z"
    assert set(s["column_sizes"]) == {1, 2, 3}
    # the statistics match the file itself
    meta = pq.read_metadata(local_path(f.path))
    assert meta.num_rows == 4
    assert s["split_offsets"] == [4]  # one row group, right after the 'PAR1' magic
    assert meta.num_row_groups == 1


# --- conforming the stream to the table -----------------------------------------------------------


def test_columns_in_another_order_and_a_missing_optional_column(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    batch = pa.record_batch({"name": pa.array(["x", "y"]), "id": pa.array([2, 1], pa.int64())})  # no 'qty', other order
    result = writer(plan).write([batch])
    table = pq.read_table(local_path(result.files[0].path))
    assert table.column_names == ["id", "qty", "name"]
    assert table.schema.field("qty").type == pa.int32()
    assert table.to_pylist() == [{"id": 2, "qty": None, "name": "x"}, {"id": 1, "qty": None, "name": "y"}]
    assert result.files[0].statistics["null_value_counts"][2] == 2


def test_batches_with_different_column_orders_in_one_task(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    a = events([1])
    b = pa.record_batch({"name": pa.array(["b"]), "qty": pa.array([2], pa.int32()), "id": pa.array([2], pa.int64())})
    result = writer(plan).write([a, b, a])
    assert read_rows(result) == [
        {"id": 1, "qty": 10, "name": "n1"},
        {"id": 2, "qty": 2, "name": "b"},
        {"id": 1, "qty": 10, "name": "n1"},
    ]


def test_int_stream_column_into_a_long_table_column(make_plan: MakePlan) -> None:
    plan = make_plan(pa.schema([pa.field("n", pa.int64())]))
    big = 2**31 - 1
    batch = pa.record_batch({"n": pa.array([big, -big - 1, None, 0], pa.int32())})
    result = writer(plan).write([batch])
    table = pq.read_table(local_path(result.files[0].path))
    assert table.schema.field("n").type == pa.int64()
    assert table.column("n").to_pylist() == [big, -big - 1, None, 0]
    s = result.files[0].statistics
    assert decoded(LongType(), s["lower_bounds"][1]) == -big - 1
    assert decoded(LongType(), s["upper_bounds"][1]) == big
    assert len(s["upper_bounds"][1]) == 8


def test_zoned_timestamps_are_stored_as_the_same_instants_in_utc(make_plan: MakePlan) -> None:
    plan = make_plan(pa.schema([pa.field("id", pa.int64()), pa.field("ts", pa.timestamp("us", tz="UTC"))]))
    paris = ZoneInfo("Europe/Paris")
    local = [
        dt.datetime(2024, 1, 15, 9, 30, 0, 123456, tzinfo=paris),  # winter, UTC+1
        dt.datetime(2024, 7, 1, 0, 15, tzinfo=paris),  # summer, UTC+2 (the previous day in UTC)
        None,
    ]
    batch = pa.record_batch({"id": pa.array([1, 2, 3], pa.int64()), "ts": pa.array(local, pa.timestamp("us", tz="Europe/Paris"))})
    result = writer(plan).write([batch])
    column = pq.read_table(local_path(result.files[0].path)).column("ts")
    assert column.type == pa.timestamp("us", tz="UTC")
    assert column.to_pylist() == [
        dt.datetime(2024, 1, 15, 8, 30, 0, 123456, tzinfo=dt.timezone.utc),
        dt.datetime(2024, 6, 30, 22, 15, tzinfo=dt.timezone.utc),
        None,
    ]
    # the same instants: identical epoch microseconds
    assert column.cast(pa.int64()).to_pylist() == batch.column("ts").cast(pa.int64()).to_pylist()


def test_utc_type_relabels_zoned_timestamps_at_any_depth() -> None:
    def fields(zoned: pa.DataType) -> list[pa.Field]:
        """``zoned`` at every depth, beside a timestamp without a zone and one in UTC already (both kept as they are)."""
        return [
            pa.field("a", zoned),
            pa.field("b", pa.timestamp("us")),
            pa.field("c", pa.struct([pa.field("x", zoned), pa.field("y", pa.int32())])),
            pa.field("d", pa.list_(zoned)),
            pa.field("e", pa.map_(pa.string(), zoned)),
            pa.field("f", pa.large_list(pa.timestamp("us", tz="UTC"))),
        ]

    schema = pa.schema(fields(pa.timestamp("ms", tz="Europe/Paris")), metadata={b"k": b"v"})
    assert utc_schema(schema) == pa.schema(fields(pa.timestamp("ms", tz="UTC")))
    assert utc_schema(schema).metadata == {b"k": b"v"}
    assert utc_type(pa.int64()) == pa.int64()


# --- files ----------------------------------------------------------------------------------------


def test_files_roll_at_the_target_size(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS, properties={"write.target-file-size-bytes": "1", "write.parquet.row-group-limit": "10"})
    batches = [events(list(range(i, i + 5))) for i in range(0, 35, 5)]  # 7 batches of 5 rows
    result = writer(plan).write(batches)

    assert [f.record_count for f in result.files] == [10, 10, 10, 5]
    assert result.record_count == 35
    assert len({f.path for f in result.files}) == 4
    for f in result.files:
        meta = pq.read_metadata(local_path(f.path))
        assert meta.num_rows == f.record_count == f.statistics["record_count"]
        assert f.size_in_bytes == os.path.getsize(local_path(f.path))
    assert [r["id"] for r in read_rows(result)] == list(range(35))
    assert sorted(data_files_on_disk(plan)) == sorted(local_path(f.path) for f in result.files)


def test_row_groups_follow_the_row_group_limit(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS, properties={"write.parquet.row-group-limit": "4"})
    result = writer(plan).write([events([1, 2]), events([3, 4]), events([5, 6]), events([7])])
    (f,) = result.files
    meta = pq.read_metadata(local_path(f.path))
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 3]
    assert f.record_count == 7
    offsets = f.statistics["split_offsets"]
    assert len(offsets) == 2 and offsets[0] == 4 and offsets[1] > offsets[0]
    first_column = meta.row_group(1).column(0)
    assert offsets[1] == (first_column.dictionary_page_offset or first_column.data_page_offset)


def test_zero_row_batches_produce_no_file(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    empty = events([])
    result = writer(plan).write([empty, empty])
    assert result.files == ()
    assert result.record_count == 0
    assert result.replay_skipped is False
    assert writer(plan).write([]).files == ()
    assert data_files_on_disk(plan) == []


def test_zero_row_batches_between_rows_add_nothing(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    result = writer(plan).write([events([]), events([1]), events([]), events([2])])
    assert [r["id"] for r in read_rows(result)] == [1, 2]
    assert len(result.files) == 1


def test_file_names_are_unique_across_writers_of_the_same_task(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    first = writer(plan, batch_id=9, partition_id=2, attempt=0).write([events([1])])
    second = writer(plan, batch_id=9, partition_id=2, attempt=0).write([events([2])])
    (a,), (b,) = first.files, second.files
    assert a.path != b.path
    name_a, name_b = Path(local_path(a.path)).name, Path(local_path(b.path)).name
    assert name_a.startswith("q-1-00009-00002-0-")
    assert name_b.startswith("q-1-00009-00002-0-")
    assert sorted(data_files_on_disk(plan)) == sorted([local_path(a.path), local_path(b.path)])
    assert [r["id"] for r in read_rows(first)] == [1]
    assert [r["id"] for r in read_rows(second)] == [2]


# --- failures leave nothing behind ----------------------------------------------------------------


@pytest.mark.parametrize(
    "properties",
    [
        {},  # the bad batch arrives while the first rows are only buffered
        {"write.parquet.row-group-limit": "2"},  # ... while a file is open
        {"write.parquet.row-group-limit": "2", "write.target-file-size-bytes": "1"},  # ... after files were closed
    ],
    ids=["buffered", "file-open", "files-closed"],
)
def test_null_in_a_required_column_names_it_and_leaves_no_file(make_plan: MakePlan, properties: dict[str, str]) -> None:
    plan = make_plan(EVENTS, properties=properties)
    good = events([1, 2])
    bad = pa.record_batch(
        {"id": pa.array([3, None, None], pa.int64()), "qty": pa.array([1, 2, 3], pa.int32())}
    )  # 'id' nullable in the stream, as Spark often declares it
    with pytest.raises(SchemaMismatchError) as e:
        writer(plan, batch_id=17, partition_id=4).write([good, good, bad, good])
    assert str(e.value) == (
        "column 'id' is required (NOT NULL) in table db.t, but batch 17 has 2 null value(s) in it (partition 4)"
    )
    assert data_files_on_disk(plan) == []


def test_null_in_a_required_nested_field_names_it_and_leaves_no_file(make_plan: MakePlan) -> None:
    struct = pa.struct([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.string())])
    plan = make_plan(pa.schema([pa.field("id", pa.int64()), pa.field("s", struct)]))
    stream_struct = pa.struct([pa.field("a", pa.int64()), pa.field("b", pa.string())])
    bad = pa.record_batch(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "s": pa.array([{"a": 1, "b": "x"}, {"a": None, "b": "y"}, None], stream_struct),
        }
    )
    with pytest.raises(SchemaMismatchError) as e:
        writer(plan, batch_id=21).write([bad])
    assert "'a'" in str(e.value) or "'s.a'" in str(e.value)
    assert "batch 21" in str(e.value)
    assert data_files_on_disk(plan) == []


@pytest.mark.parametrize(
    "properties",
    [
        {"write.parquet.row-group-limit": "2"},
        {"write.parquet.row-group-limit": "2", "write.target-file-size-bytes": "1"},
    ],
    ids=["file-open", "files-closed"],
)
def test_failing_input_iterator_leaves_no_file(make_plan: MakePlan, properties: dict[str, str]) -> None:
    plan = make_plan(EVENTS, properties=properties)
    seen: list[str] = []

    def batches() -> Iterator[pa.RecordBatch]:
        yield events([1, 2])
        yield events([3, 4])
        yield events([5, 6])
        seen.append(str(data_files_on_disk(plan)))  # files do exist at this point
        raise RuntimeError("upstream task failed")

    with pytest.raises(RuntimeError, match="^upstream task failed$"):
        writer(plan).write(batches())
    assert seen and seen[0] != "[]"
    assert data_files_on_disk(plan) == []


def test_fault_after_a_file_deletes_the_task_files(make_plan: MakePlan, own_faults_dir: Path) -> None:
    plan = make_plan(EVENTS, properties={"write.parquet.row-group-limit": "2", "write.target-file-size-bytes": "1"})
    (own_faults_dir / EXECUTOR_AFTER_FILE).write_text("raise")
    with pytest.raises(InjectedFault, match="^fault injected at executor.after-file$"):
        writer(plan).write([events([1, 2]), events([3, 4])])
    assert data_files_on_disk(plan) == []
    # the retried task (a new writer) runs normally: the fault fired once
    result = writer(plan, attempt=1).write([events([1, 2]), events([3, 4])])
    assert [f.record_count for f in result.files] == [2, 2]


def test_fault_before_return_deletes_the_task_files(make_plan: MakePlan, own_faults_dir: Path) -> None:
    plan = make_plan(EVENTS)
    (own_faults_dir / EXECUTOR_BEFORE_RETURN).write_text("raise")
    with pytest.raises(InjectedFault):
        writer(plan).write([events([1, 2, 3])])
    assert data_files_on_disk(plan) == []


# --- replays --------------------------------------------------------------------------------------


def test_skip_replay_consumes_the_input_and_writes_nothing(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS)
    consumed: list[int] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(4):
            consumed.append(i)
            yield events([i])

    result = writer(plan, batch_id=5, partition_id=3, attempt=2).skip_replay(batches())
    assert consumed == [0, 1, 2, 3]
    assert result == TaskResult(
        query_id="q-1",
        batch_id=5,
        partition_id=3,
        task_attempt_id=2,
        schema_id=plan.schema_id,
        spec_id=plan.spec_id,
        files=(),
        replay_skipped=True,
        table_uuid=plan.table_uuid,
        written_schema=plan.schema_digest,
    )
    assert data_files_on_disk(plan) == []


def test_write_plan_from_the_table(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS, properties={"write.target-file-size-bytes": "1234"})
    assert plan.table == "db.t"
    assert plan.location.startswith("file://") and plan.location.endswith("/warehouse/db/t")
    assert plan.properties == {"write.target-file-size-bytes": "1234"}
    assert [(f.field_id, f.name, f.required) for f in plan.schema.fields] == [
        (1, "id", True),
        (2, "qty", False),
        (3, "name", False),
    ]
    assert (plan.schema_id, plan.spec_id) == (0, 0)
    assert plan.query_id == "q-1"
    assert plan.last_committed_batch is None


@pytest.mark.parametrize(
    ("properties", "codec"),
    [
        ({}, "ZSTD"),
        ({"write.parquet.compression-codec": "snappy"}, "SNAPPY"),
        ({"write.parquet.compression-codec": "gzip"}, "GZIP"),
    ],
)
def test_compression_follows_the_table_property(make_plan: MakePlan, properties: dict[str, str], codec: str) -> None:
    plan = make_plan(EVENTS, properties=properties)
    result = writer(plan).write([events(list(range(100)))])
    meta = pq.ParquetFile(local_path(result.files[0].path)).metadata
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {codec}


def test_row_group_limit_is_a_cap_even_when_batches_straddle_it(make_plan: MakePlan) -> None:
    plan = make_plan(EVENTS, properties={"write.parquet.row-group-limit": "3"})
    batches = [events([2 * i, 2 * i + 1]) for i in range(5)]  # 2-row batches, 10 rows
    result = writer(plan).write(batches)
    meta = pq.ParquetFile(local_path(result.files[0].path)).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [3, 3, 3, 1]
    assert [r["id"] for r in read_rows(result)] == list(range(10))


def test_dictionary_encoding_only_where_it_pays(make_plan: MakePlan) -> None:
    """As parquet-mr decides on a column's first page: nearly-unique columns are written plain (pyarrow alone would
    dictionary-encode them until the dictionary outgrows its page: more CPU and, under zstd, larger files), repeated
    values keep their dictionary; the rows and statistics are the same either way."""
    n = 30_000
    ids = list(range(n))
    batch = events(ids, qty=[i % 7 for i in ids], names=[f"name-{i * 7919 % n}" for i in ids])
    result = writer(make_plan(EVENTS)).write([batch.slice(i, 10_000) for i in range(0, n, 10_000)])
    (f,) = result.files
    md = pq.read_metadata(local_path(f.path))
    encodings = {md.row_group(0).column(c).path_in_schema: md.row_group(0).column(c).encodings for c in range(md.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["id"] and "RLE_DICTIONARY" not in encodings["name"]  # every value distinct
    assert "RLE_DICTIONARY" in encodings["qty"]  # 7 values
    back = pq.read_table(local_path(f.path))
    assert back.column("id").to_pylist() == ids and back.column("qty").to_pylist() == [i % 7 for i in ids]
    assert f.statistics["null_value_counts"] and f.record_count == n


def test_dictionary_choice_covers_nested_columns_and_falls_back_on_types_it_cannot_estimate() -> None:
    from lakesink.table.parquet_layout import dictionary_columns

    n = 5_000
    table = pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "s": pa.array([{"a": i % 3, "b": f"x{i}"} for i in range(n)]),
            "l": pa.array([[1, 2]] * n),
            "m": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
            "flag": pa.array([True] * n),
            "empty": pa.nulls(n, pa.string()),
            "u": pa.array([i.to_bytes(16, "big") for i in range(n)], pa.binary(16)),
        }
    )
    assert dictionary_columns(table) == ["s.a", "l.list.element", "m.key_value.key", "m.key_value.value", "empty"]
    # a dictionary larger than write.parquet.dict-size-bytes would fall back anyway: not chosen
    few = pa.table({"name": pa.array([f"{i % 500:0>100}" for i in range(n)])})
    assert dictionary_columns(few) == ["name"] and dictionary_columns(few, dictionary_page_limit=10_000) == []
