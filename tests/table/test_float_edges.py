"""Float and double edge values (NaN, -0.0, 0.0, +inf, -inf, null) as upsert order-by and identity partition source,
without Spark: a task's resolution (format("lakesink")), the Arrow writer and compaction, on real SQLite catalogs and
real Parquet files (RELIABILITY row 32; the Spark entry points: tests/sink/test_float_edges_spark.py).

The oracles:
- order: Spark SQL's, which foreach_batch applies (NaN greatest and equal to NaN, -0.0 equal to 0.0, null below
  everything; measured with pyspark 4.3: ``max`` over a window, then ``<=>``);
- partitions: Iceberg's identity, which engines apply with Java's ``Double.compare``: every file's partition value
  has the bit pattern of every row's value in it (-0.0 apart from 0.0, every NaN one partition).
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import combinations_with_replacement
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.avro import file as avro_file
from pyiceberg.avro.decoder import StreamingBinaryDecoder
from pyiceberg.conversions import from_bytes
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType

from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import UpsertKeyError
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.executor.upsert_task import UpsertSpec, resolve_task
from lakesink.maintenance import compaction
from lakesink.options import SinkOptions, TableName
from lakesink.table import floats
from lakesink.table.keys import DELETED, ORDER_COLUMN
from lakesink.table.keys import DELETED as UPSERT_DELETED
from lakesink.table.partitioning import parse
from tests.support.helpers import sink_committer

Q = "11111111-aaaa-4000-8000-000000000032"
NAN = math.nan
INF = math.inf
#: every edge, and two ordinary values
EDGES: list[float | None] = [NAN, -0.0, 0.0, INF, -INF, None, 1.5, -2.25]
FLOAT_TYPES = {"float": pa.float32(), "double": pa.float64()}


def spark_rank(v: float | None) -> tuple[int, float] | None:
    """Spark SQL's order of a double (None: null, which max skips): NaN above everything, -0.0 equal to 0.0."""
    if v is None:
        return None
    return (2, 0.0) if math.isnan(v) else (1, v)  # (1, -0.0) == (1, 0.0)


def spark_winners(values: list[float | None]) -> list[int]:
    """Positions of the rows foreach_batch keeps for one key: those equal (<=>) to the greatest value."""
    ranks = [spark_rank(v) for v in values]
    present = [r for r in ranks if r is not None]
    top = max(present) if present else None
    return [i for i, r in enumerate(ranks) if r == top]


def bits(v: float | None, arrow_type: pa.DataType) -> bytes | None:
    """The value's bit pattern in its type, NaN canonical (Java's floatToIntBits / doubleToLongBits)."""
    if v is None:
        return None
    if math.isnan(v):
        v = NAN
    return struct.pack(">f" if arrow_type == pa.float32() else ">d", v)


# --- order-by -----------------------------------------------------------------------------------------------


def test_spark_order_keys_rank_every_edge_as_spark_does() -> None:
    for arrow_type in FLOAT_TYPES.values():
        keys = floats.spark_order(pa.array(EDGES, arrow_type)).to_pylist()
        for (a, ka), (b, kb) in combinations_with_replacement(zip(EDGES, keys, strict=True), 2):
            ra, rb = spark_rank(a), spark_rank(b)
            if ra is None or rb is None:
                assert (ka is None) == (ra is None) and (kb is None) == (rb is None)
                continue
            assert (ka < kb, ka == kb, ka > kb) == (ra < rb, ra == rb, ra > rb), (a, b, arrow_type)


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_a_task_resolves_every_float_order_by_edge_as_spark_does(type_name: str) -> None:
    """format("lakesink"): for every pair of edges (and every single edge) as one key's order-by values, the task
    keeps the row Spark keeps (foreach_batch), or fails on a tie as foreach_batch does. Before: a key whose
    greatest value was NaN lost its row and its delete (Arrow's max skips NaN, Arrow's = never matches it)."""
    arrow_type = FLOAT_TYPES[type_name]
    cases: list[list[float | None]] = [[v] for v in EDGES] + [list(p) for p in combinations_with_replacement(EDGES, 2)]
    cases += [list(reversed(c)) for c in cases if len(c) == 2]
    for case in cases:
        winners = spark_winners(case)
        rows = pa.table({"id": pa.array([7] * len(case), pa.int64()), "o": pa.array(case, arrow_type),
                         "row": pa.array(range(len(case)), pa.int64())})  # fmt: skip
        for op_column in (False, True):  # also as a delete: the winner's flag decides
            spec = UpsertSpec(("id",), "row = 0" if op_column else None, "o")
            if len(winners) > 1:
                with pytest.raises(UpsertKeyError, match=r"rows for key \(id=7\) with the same greatest 'order-by' value"):
                    resolve_task(rows.to_batches(), spec, batch_id=3, partition_id=0)
                continue
            written, changes = resolve_task(rows.to_batches(), spec, batch_id=3, partition_id=0)
            deleted = op_column and winners[0] == 0
            assert changes.select(["id", DELETED]).to_pylist() == [{"id": 7, DELETED: deleted}], case
            # the winner's order value goes with the key (the commit compares it with the table's, as Spark orders)
            won = pa.array([case[winners[0]]], arrow_type)
            assert floats.spark_order(changes.column(ORDER_COLUMN)).to_pylist() == floats.spark_order(won).to_pylist(), case
            got = pa.Table.from_batches(written, rows.schema).column("row").to_pylist() if written else []
            assert got == ([] if deleted else winners), (case, got, winners)


# --- identity partitions ----------------------------------------------------------------------------------


def committer(props: dict[str, str], arrow_type: pa.DataType) -> TableCommitter:
    c = sink_committer(SinkOptions(table=TableName(("db",), "floats"), catalog_properties=props, partitioned_by=parse("v")))
    c.table.open_table(pa.schema([("id", pa.int64()), ("v", arrow_type)]))
    return c


def write(c: TableCommitter, batch_id: int, tasks: list[list[pa.RecordBatch]]) -> None:
    plan = c.write_plan(c.table.reload_table(), Q)
    results = [
        TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 100 + t)).write(
            batches
        )
        for t, batches in enumerate(tasks)
    ]
    outcome = c.commit_batch(BatchCall(Q, batch_id, f'[{{"o":{batch_id}}}]'), results)
    assert outcome.outcome is Outcome.COMMITTED


def edge_batches(arrow_type: pa.DataType, start: int) -> Iterator[pa.RecordBatch]:
    """Every edge twice, in record batches of three rows (so NaN and the zeros come in several batches)."""
    values = EDGES + EDGES
    ids = list(range(start, start + len(values)))
    for i in range(0, len(values), 3):
        yield pa.record_batch([pa.array(ids[i : i + 3], pa.int64()), pa.array(values[i : i + 3], arrow_type)], names=["id", "v"])


@contextmanager
def exact_avro_doubles() -> Iterator[None]:
    """Manifests read by the test with pyiceberg's pure-Python Avro decoder (0.12.0's Cython one reads doubles as
    float32, apache/iceberg-python#3808): the partition values checked are the bytes the manifests hold, whatever
    lakesink's own reads do."""
    fast = avro_file.new_decoder  # type: ignore[attr-defined]
    avro_file.new_decoder = StreamingBinaryDecoder  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        avro_file.new_decoder = fast  # type: ignore[attr-defined]


def iceberg_order(v: float) -> tuple[float, float]:
    """Iceberg's order of non-NaN floats (the spec's sort order, Java's Double.compare): -0.0 below 0.0."""
    return (v, math.copysign(1.0, v))


def assert_partitions_bit_exact(table: Table, arrow_type: pa.DataType, column: str = "v") -> Counter[bytes | None]:
    """For the identity partition field of ``column``: every live file's partition value has the bits of every
    row's value in it, and every manifest's partition summary holds its files' values (bounds in Iceberg's order,
    NaN and null flags). Returns the number of live files per partition value (by bits)."""
    with exact_avro_doubles():
        return _partitions_bit_exact(table, arrow_type, column)


def _partitions_bit_exact(table: Table, arrow_type: pa.DataType, column: str) -> Counter[bytes | None]:
    per_partition: Counter[bytes | None] = Counter()
    snapshot = table.current_snapshot()
    assert snapshot is not None
    schema, spec = table.schema(), table.spec()
    (pos,) = [i for i, pf in enumerate(spec.fields) if schema.find_column_name(pf.source_id) == column]
    field_type = spec.partition_type(schema).fields[pos].field_type
    assert isinstance(field_type, PrimitiveType)
    for manifest in snapshot.manifests(table.io):
        values = [e.data_file.partition[pos] for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False)]
        if not values:
            continue
        summary = (manifest.partitions or [])[pos]
        assert summary.contains_null == any(v is None for v in values), manifest.manifest_path
        assert summary.contains_nan == any(v is not None and math.isnan(v) for v in values), manifest.manifest_path
        ordered = sorted((v for v in values if v is not None and not math.isnan(v)), key=iceberg_order)
        lower: Any = from_bytes(field_type, summary.lower_bound) if summary.lower_bound is not None else None
        upper: Any = from_bytes(field_type, summary.upper_bound) if summary.upper_bound is not None else None
        assert (bits(lower, arrow_type), bits(upper, arrow_type)) == (
            (bits(ordered[0], arrow_type), bits(ordered[-1], arrow_type)) if ordered else (None, None)
        ), (manifest.manifest_path, values, lower, upper)
    for task in table.scan().plan_files():
        f = task.file
        value = f.partition[pos]
        rows = pq.ParquetFile(f.file_path.removeprefix("file://")).read().column(column).to_pylist()
        assert rows and len(rows) == f.record_count
        assert {bits(r, arrow_type) for r in rows} == {bits(value, arrow_type)}, (f.file_path, value, rows)
        per_partition[bits(value, arrow_type)] += 1
    return per_partition


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_the_arrow_writer_keeps_every_float_partition_apart_bit_for_bit(
    catalog_properties: dict[str, str], type_name: str
) -> None:
    """One task gets every edge (twice, NaN and the zeros in several record batches): one file per partition,
    by bit pattern. Before: -0.0 and 0.0 went into one file (Python's dict keys merge them) under the partition
    value that came first, and every NaN record batch opened a file of its own."""
    arrow_type = FLOAT_TYPES[type_name]
    c = committer(catalog_properties, arrow_type)
    write(c, 0, [list(edge_batches(arrow_type, 0))])
    table = c.table.reload_table()
    per_partition = assert_partitions_bit_exact(table, arrow_type)
    assert per_partition == Counter({bits(v, arrow_type): 1 for v in EDGES})
    got = Counter(r["id"] for r in table.scan().to_arrow().to_pylist())
    assert got == Counter(range(2 * len(EDGES)))


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_compaction_keeps_every_float_partition_apart_bit_for_bit(catalog_properties: dict[str, str], type_name: str) -> None:
    """Small files of each edge's partition (one task per value, so the files are right whatever the writer
    does), compacted: one file per partition, by bit pattern, every id once. Before: compaction grouped files
    by Python's ==, packing -0.0's and 0.0's files into one file under one of the two values, and never
    compacting NaN's files (each NaN its own group)."""
    arrow_type = FLOAT_TYPES[type_name]
    c = committer(catalog_properties, arrow_type)
    sent: list[int] = []
    for batch_id in range(2):
        tasks = []
        for v in EDGES:
            sent.append(len(sent))
            tasks.append([pa.record_batch([pa.array([sent[-1]], pa.int64()), pa.array([v], arrow_type)], names=["id", "v"])])
        write(c, batch_id, tasks)
    assert assert_partitions_bit_exact(c.table.reload_table(), arrow_type) == Counter({bits(v, arrow_type): 2 for v in EDGES})
    report = compaction.compact(c.table.reload_table(), min_input_files=2)
    assert report.status == "committed", report
    assert len(report.groups) == len(EDGES)
    table = c.table.reload_table()
    assert assert_partitions_bit_exact(table, arrow_type) == Counter({bits(v, arrow_type): 1 for v in EDGES})
    assert Counter(r["id"] for r in table.scan().to_arrow().to_pylist()) == Counter(sent)


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_a_manifest_of_both_zeros_is_bounded_by_both(catalog_properties: dict[str, str], type_name: str) -> None:
    """Two tasks, one writing 0.0 and one -0.0: the batch's manifest bounds its partitions [-0.0, 0.0], as Iceberg
    orders them. Before: pyiceberg's summary took Python's min/max (-0.0 == 0.0) and recorded [0.0, 0.0], below
    which an engine comparing with Double.compare skips the manifest for v = -0.0."""
    arrow_type = FLOAT_TYPES[type_name]
    c = committer(catalog_properties, arrow_type)
    tasks = [
        [pa.record_batch([pa.array([i], pa.int64()), pa.array([v], arrow_type)], names=["id", "v"])]
        for i, v in enumerate([0.0, -0.0])
    ]
    write(c, 0, tasks)
    assert assert_partitions_bit_exact(c.table.reload_table(), arrow_type) == Counter(
        {bits(0.0, arrow_type): 1, bits(-0.0, arrow_type): 1}
    )


def test_double_partition_values_survive_manifest_rewrites_merges_and_compaction(catalog_properties: dict[str, str]) -> None:
    """identity(double) partitions of values float32 cannot hold (0.1, 1e300, 5e-324, ...): lakesink's manifest
    rewrite, manifests merged by later commits (commit.manifest.min-count-to-merge=2), then compaction. Every
    manifest must keep the exact bits. Before: pyiceberg 0.12.0 read doubles from manifests as float32, so every
    manifest it wrote again held 0.10000000149011612, inf, 0.0, ...; the compaction then failed ("Missing
    required files to delete": the removed files' rounded partitions matched no manifest's bounds)."""
    from lakesink.maintenance import manifest_rewrite

    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "floats"),
            catalog_properties=catalog_properties,
            partitioned_by=parse("v"),
            table_properties={"commit.manifest-merge.enabled": "false"},
        )
    )
    c.table.open_table(pa.schema([("id", pa.int64()), ("v", pa.float64())]))
    values = [0.1, 1e300, 5e-324, -0.1, 2.0 / 3.0]
    sent: list[int] = []

    def batch(batch_id: int) -> None:
        ids = list(range(batch_id * 10, batch_id * 10 + len(values)))
        sent.extend(ids)
        write(c, batch_id, [[pa.record_batch([pa.array(ids, pa.int64()), pa.array(values, pa.float64())], names=["id", "v"])]])

    def manifests() -> int:
        table = c.table.reload_table()
        return len(table.current_snapshot().manifests(table.io))  # type: ignore[union-attr]

    for batch_id in range(3):
        batch(batch_id)
    assert manifests() == 3
    assert manifest_rewrite.rewrite_manifests(c.table.reload_table()).status == "committed"
    assert manifests() == 1
    expected = Counter({bits(v, pa.float64()): 3 for v in values})
    assert assert_partitions_bit_exact(c.table.reload_table(), pa.float64()) == expected
    with c.table.reload_table().transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "2"})
    for batch_id in range(3, 5):
        batch(batch_id)
    assert manifests() == 1  # merged
    expected = Counter({bits(v, pa.float64()): 5 for v in values})
    assert assert_partitions_bit_exact(c.table.reload_table(), pa.float64()) == expected
    report = compaction.compact(c.table.reload_table(), min_input_files=2)
    assert report.status == "committed" and len(report.groups) == len(values), report
    table = c.table.reload_table()
    assert assert_partitions_bit_exact(table, pa.float64()) == Counter({bits(v, pa.float64()): 1 for v in values})
    assert Counter(r["id"] for r in table.scan().to_arrow().to_pylist()) == Counter(sent)


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_upserts_move_keys_between_every_float_partition(catalog_properties: dict[str, str], type_name: str) -> None:
    """An upsert table partitioned by a float column: batch 0 puts a key in every edge's partition, batch 1 moves
    each key to the next edge's partition and deletes one, batch 2 moves them again. The table equals the model,
    each partition bit-exact. Before: the copy-on-write of a file in the NaN partition failed at every attempt
    ("Cannot create expression literal from NaN", pyiceberg's predicate for the removed files' partitions), and
    -0.0's and 0.0's rows shared a file."""
    arrow_type = FLOAT_TYPES[type_name]
    c = sink_committer(
        SinkOptions(
            table=TableName(("db",), "floats"),
            catalog_properties=catalog_properties,
            partitioned_by=parse("v"),
            upsert_key=("id",),
        )
    )
    c.table.open_table(pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", arrow_type)]))
    state: dict[int, float | None] = {}
    for batch_id in range(3):
        shift = batch_id
        rows = {k: EDGES[(k + shift) % len(EDGES)] for k in range(len(EDGES))}
        deleted = {batch_id} if batch_id else set()
        upserted = {k: v for k, v in rows.items() if k not in deleted}
        data = pa.record_batch(
            [pa.array(list(upserted), pa.int64()), pa.array(list(upserted.values()), arrow_type)], names=["id", "v"]
        )
        keys = pa.table({"id": pa.array(list(rows), pa.int64()), UPSERT_DELETED: pa.array([k in deleted for k in rows])})
        plan = c.write_plan(c.table.reload_table(), Q)
        result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id)).write([data])
        outcome = c.commit_batch(BatchCall(Q, batch_id, f'[{{"o":{batch_id}}}]'), [result], changes=keys)
        assert outcome.outcome is Outcome.COMMITTED
        for k in deleted:
            state.pop(k, None)
        state.update(upserted)
        table = c.table.reload_table()
        got = {r["id"]: r["v"] for r in table.scan().to_arrow().to_pylist()}
        assert {k: bits(v, arrow_type) for k, v in got.items()} == {k: bits(v, arrow_type) for k, v in state.items()}
        per_partition = assert_partitions_bit_exact(table, arrow_type)
        assert per_partition == Counter({bits(v, arrow_type): 1 for v in state.values()}), batch_id


@pytest.mark.parametrize("type_name", list(FLOAT_TYPES))
def test_a_float_upsert_key_is_refused_naming_the_option_and_creates_no_table(
    catalog_properties: dict[str, str], type_name: str
) -> None:
    """Iceberg's identifier fields cannot be float or double. Before: pyiceberg's pydantic ValidationError
    ('Identifier field 2 invalid: must not be float or double field'), naming neither the option nor a way out."""
    from pyiceberg.exceptions import NoSuchTableError

    from lakesink.driver import catalogs
    from lakesink.errors import InvalidOptionError

    c = sink_committer(
        SinkOptions(table=TableName(("db",), "floats"), catalog_properties=catalog_properties, upsert_key=("id", "V"))
    )
    with pytest.raises(InvalidOptionError, match=rf"option 'upsert-key': column 'v' has type {type_name}, which cannot be a key"):
        c.table.open_table(pa.schema([("id", pa.int64()), ("v", FLOAT_TYPES[type_name])]))
    with pytest.raises(NoSuchTableError):
        catalogs.load(None, catalog_properties).load_table(("db", "floats"))


def test_diff_cancels_rewritten_float_edges_and_shows_a_change_of_zero_sign(catalog_properties: dict[str, str]) -> None:
    """lakesink diff across a compaction shows no row changed, NaN rows included; across an upsert that turns a
    key's -0.0 into 0.0 it shows that change. Before: its multiset of rows compared floats with Python's ==, so
    every NaN row of a rewritten file was reported removed and added, and -0.0 -> 0.0 was no change at all."""
    from lakesink.audit.points import Point
    from lakesink.audit.row_diff import diff

    c = committer(catalog_properties, pa.float64())
    for batch_id in range(2):
        write(c, batch_id, [list(edge_batches(pa.float64(), 100 * batch_id))])
    before = c.table.reload_table().metadata.current_snapshot_id
    assert compaction.compact(c.table.reload_table(), min_input_files=2).status == "committed"
    table = c.table.reload_table()
    d = diff(table, Point(snapshot_id=before), Point(snapshot_id=table.metadata.current_snapshot_id))
    assert d.removed_files and d.added_files  # files were rewritten...
    assert d.added.num_rows == 0 and d.removed.num_rows == 0, (d.added.to_pylist(), d.removed.to_pylist())  # ...no row changed

    u = sink_committer(SinkOptions(table=TableName(("db",), "zeros"), catalog_properties=catalog_properties, upsert_key=("id",)))
    u.table.open_table(pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.float64()), ("w", pa.float64())]))
    for batch_id, v in enumerate([-0.0, 0.0]):
        data = pa.record_batch(
            [pa.array([1, 2], pa.int64()), pa.array([v, 1.0]), pa.array([math.nan, math.nan])], names=["id", "v", "w"]
        )
        plan = u.write_plan(u.table.reload_table(), Q)
        result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id)).write([data])
        keys = pa.table({"id": pa.array([1, 2], pa.int64()), UPSERT_DELETED: [False, False]})
        u.commit_batch(BatchCall(Q, batch_id, f'[{{"o":{batch_id}}}]'), [result], changes=keys)
    table = u.table.reload_table()
    d = diff(table, Point(batch_id=0, query_id=Q), Point(batch_id=1, query_id=Q))
    assert [(r["id"], str(r["v"])) for r in d.added.to_pylist()] == [(1, "0.0")]
    assert [(r["id"], str(r["v"])) for r in d.removed.to_pylist()] == [(1, "-0.0")]
