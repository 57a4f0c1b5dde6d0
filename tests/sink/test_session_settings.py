"""The user's Spark session must not change what lakesink writes (fault matrix row 24), and a batch
written by Spark's Parquet writer commits exactly the files of its own job.

Real Spark (local mode), real SQLite catalogs, real Parquet; values read back through pyiceberg and
DuckDB are compared, as multisets keyed by unique ids, with what Spark itself reads from the input.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.sink.spark.write import SPARKWRITE_AFTER_FILES
from tests.support.helpers import Stream, assert_snapshot_invariants, referenced_data_files, run_to_end, table_ids

pytestmark = pytest.mark.spark

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
# 1000-01-01T00:00:00Z in the proleptic Gregorian calendar (Iceberg's, Spark 3+'s, Python's)
YEAR_1000_US = (dt.datetime(1000, 1, 1, tzinfo=dt.timezone.utc) - EPOCH) // dt.timedelta(microseconds=1)

# Every session setting (SQL or Hadoop, set through spark.conf) that would change the bytes or the set of
# files Spark's Parquet writer produces, set to the value that does the most damage.
HOSTILE_SESSION = {
    "spark.sql.parquet.datetimeRebaseModeInWrite": "LEGACY",  # dates, micros timestamps rebased to Julian
    "spark.sql.parquet.int96RebaseModeInWrite": "LEGACY",
    "spark.sql.parquet.outputTimestampType": "INT96",
    "spark.sql.parquet.writeLegacyFormat": "true",  # decimals as fixed_len_byte_array, Spark 1.4 lists
    "spark.sql.parquet.fieldId.write.enabled": "false",
    "spark.sql.files.maxRecordsPerFile": "1",
    "spark.sql.session.timeZone": "Asia/Kolkata",
    "mapreduce.fileoutputcommitter.algorithm.version": "2",  # task output straight into the final directory
    "mapreduce.fileoutputcommitter.cleanup.skipped": "true",  # _temporary left behind
    "parquet.summary.metadata.level": "ALL",  # _metadata and _common_metadata beside the data files
    "parquet.enable.dictionary": "false",
    "parquet.writer.version": "PARQUET_2_0",
}


@contextmanager
def session_confs(spark: Any, confs: dict[str, str]) -> Iterator[None]:
    saved = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _ints(table: pa.Table) -> Counter[tuple[int, ...]]:
    """Rows as (id, days since epoch, micros since epoch, local micros, price as str), whatever the engine's Arrow types."""
    cols = []
    for name in ("id", "d", "ts", "ntz", "price"):
        col = table.column(name)
        if pa.types.is_date(col.type):
            col = col.cast(pa.date32()).cast(pa.int32())
        elif pa.types.is_timestamp(col.type):
            col = pc.cast(col, pa.timestamp("us", tz="UTC") if col.type.tz else pa.timestamp("us")).cast(pa.int64())
        elif pa.types.is_decimal(col.type):
            col = col.cast(pa.string())
        cols.append(col.to_pylist())
    return Counter(zip(*cols, strict=True))


def _input(spark: Any, folder: Path, rows: int) -> Counter[tuple[int, ...]]:
    """Write the input (dates and timestamps around the year 1000 and 1582, and today), return what Spark reads of it."""
    with session_confs(spark, {"spark.sql.session.timeZone": "UTC"}):
        spark.range(rows).selectExpr(
            "id + 7000 as id",
            "date_add(date'1000-01-01', cast(id * 97 as int)) as d",  # 1000-01-01 ... past 1582-10-15
            f"timestamp_micros({YEAR_1000_US} + id * 3600000000 * 24 * 97 + id) as ts",
            f"cast(timestamp_micros({YEAR_1000_US} + id * 3600000000 * 24 * 89) as timestamp_ntz) as ntz",
            "cast(id * 1.25 as decimal(9, 2)) as price",
        ).union(
            spark.range(1).selectExpr(
                "99999 as id",
                "date'2026-11-22' as d",
                "timestamp'2026-11-22 11:00:00+00:00' as ts",
                "timestamp_ntz'2026-11-22 11:00:00' as ntz",
                "cast(1.5 as decimal(9, 2)) as price",
            )  # fmt: skip
        ).repartition(2).write.parquet(str(folder))
        sent = spark.read.parquet(str(folder)).selectExpr(
            "id",
            "unix_date(d) as d",
            "unix_micros(ts) as ts",
            "timestampdiff(MICROSECOND, timestamp_ntz'1970-01-01 00:00:00', ntz) as ntz",
            "cast(price as string) as price",
        )
        return Counter(tuple(r) for r in sent.collect())


def _start(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str) -> Any:
    df = spark.readStream.schema(spark.read.parquet(str(src)).schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    if entry == "format":
        w = df.writeStream.format("lakesink").option("table", "db.dates")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
    else:
        w = df.writeStream.foreachBatch(lakesink.foreach_batch("db.dates", catalog_properties=props, writer=entry))
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


@pytest.mark.parametrize("entry", ["spark", "arrow", "format"])
def test_session_settings_do_not_change_what_is_written(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Row 24: LEGACY rebase, INT96, committer v2, summary files, ... in the user's session change nothing."""
    sent = _input(spark, tmp_path / "src", rows=12)
    before = {k: spark.conf.get(k, None) for k in HOSTILE_SESSION}
    with session_confs(spark, HOSTILE_SESSION):
        q = _start(spark, tmp_path / "src", tmp_path / "ck", catalog_properties, entry)
        run_to_end(q)
    assert {k: spark.conf.get(k, None) for k in HOSTILE_SESSION} == before  # nothing leaked into the user's session

    table = catalogs.load(None, catalog_properties).load_table(("db", "dates"))
    for reader, got in (
        ("pyiceberg", _ints(table.scan().to_arrow())),
        ("DuckDB", _ints(interop.duckdb_read(table.metadata_location))),
    ):
        assert got == sent, f"{reader} read {sorted(got - sent)[:3]} instead of {sorted(sent - got)[:3]}"
    assert_snapshot_invariants(table)

    # the data folder holds the referenced data files and nothing else (no summary files, no _temporary)
    root = Path(table.location().removeprefix("file://")) / "data"
    on_disk = {f"file://{p}" for p in root.rglob("*") if p.is_file()}
    assert on_disk == referenced_data_files(table)
    for path in on_disk:
        md = pq.read_metadata(path.removeprefix("file://"))
        assert b"org.apache.spark.legacyDateTime" not in (md.metadata or {}), path
        assert b"org.apache.spark.legacyINT96" not in (md.metadata or {}), path
        schema = md.schema.to_arrow_schema()
        assert schema.field("ts").type == pa.timestamp("us", tz="UTC"), path  # INT64 micros, not INT96
        assert schema.field("price").type == pa.decimal128(9, 2)
        assert md.schema.column(4).physical_type == "INT32", path  # decimal(9, 2) as int32, not the legacy format


def _stray_file(table: Any, path: Path, ids: list[int]) -> None:
    """A Parquet file the table would accept (its field ids, its schema) holding rows nobody sent."""
    schema = schema_to_pyarrow(table.schema())
    columns = {f.name: pa.nulls(len(ids), f.type) for f in schema}
    columns["id"] = pa.array(ids, pa.int64())
    pq.write_table(pa.table(columns, schema=schema), path)


@pytest.mark.parametrize("stray", ["foreign", "copy", "hidden"])
def test_only_the_files_of_the_batch_job_are_committed(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, stray: str
) -> None:
    """A Parquet file that appears in the batch directory next to Spark's output (another process, a leaked
    task attempt) is not committed: a foreign file is left out, a copy of the job's own file fails the batch.
    Copies where Spark's file index does not look (an uncommitted attempt's output under ``_temporary``, a
    hidden ``.``-file) are not data of the batch: the batch commits its own files once."""
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=1, rows_per_file=40)
    faults.arm(SPARKWRITE_AFTER_FILES, "pause")
    q = s.start(writer="spark")
    try:
        deadline = dt.datetime.now() + dt.timedelta(minutes=10)
        while not faults.reached(SPARKWRITE_AFTER_FILES):
            assert q.isActive and dt.datetime.now() < deadline, "the batch never reached sparkwrite.after-files"
            q.awaitTermination(0.2)
        table = s.table
        (batch_dir,) = [p for p in (Path(table.location().removeprefix("file://")) / "data").iterdir() if p.is_dir()]
        name = f"part-00007-{uuid.uuid4()}-c000.zstd.parquet"  # named like Spark's own files
        attempt = batch_dir / "_temporary" / "0" / "_temporary" / "attempt_202611220000_0001_m_000007_1"
        hidden = [attempt / name, batch_dir / f".{name}"]
        if stray == "foreign":
            _stray_file(table, batch_dir / name, [900_000, 900_001])
        elif stray == "hidden":
            own = next(p for p in batch_dir.glob("part-*.parquet") if pq.read_metadata(p).num_rows)
            for h in hidden:
                h.parent.mkdir(parents=True, exist_ok=True)
                h.write_bytes(own.read_bytes())
        else:
            own = next(p for p in batch_dir.glob("part-*.parquet") if pq.read_metadata(p).num_rows)
            (batch_dir / name).write_bytes(own.read_bytes())
        faults.release(SPARKWRITE_AFTER_FILES)
        if stray in ("foreign", "hidden"):
            q.awaitTermination()
        else:
            with pytest.raises(StreamingQueryException, match="rows"):
                q.awaitTermination()
    finally:
        faults.release(SPARKWRITE_AFTER_FILES)
        q.stop()

    table = s.table
    stray_path = f"file://{batch_dir / name}"
    assert stray_path not in referenced_data_files(table)
    if stray == "hidden":
        assert not any(f"file://{h}" in referenced_data_files(table) for h in hidden)
        assert table_ids(table) == Counter(s.sent)
    elif stray == "foreign":
        assert table_ids(table) == Counter(s.sent)
        assert (batch_dir / name).exists()  # not lakesink's to delete; the orphan clean-up collects it
    else:
        assert table.current_snapshot() is None  # nothing of the batch, and no duplicate
        s.run(writer="spark")  # the restart writes the batch again and commits it once
        s.assert_exactly_once()


def test_parquet_encryption_in_the_session_is_refused_before_writing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Modular encryption cannot be unset by a write option; files Iceberg readers cannot read are never written."""
    s = Stream(spark, tmp_path, catalog_properties, "foreach")
    s.add_input(files=1, rows_per_file=5)
    with session_confs(
        spark, {"parquet.crypto.factory.class": "org.apache.parquet.crypto.keytools.PropertiesDrivenCryptoFactory"}
    ):
        message = s.run_failing(writer="spark")
    assert "the Spark session sets parquet.crypto.factory.class" in message and "writer='arrow'" in message
    table = s.table
    assert table.current_snapshot() is None
    root = Path(table.location().removeprefix("file://")) / "data"
    assert not root.exists() or not any(root.iterdir())


def test_summary_files_are_pinned_off_by_one_setting() -> None:
    """parquet-mr's ParquetOutputFormat logs "Both parquet.summary.metadata.level and parquet.enable.summary-metadata
    are set!" (WARN) at every write that sets both: the level alone is pinned (it wins over the older boolean a
    session may set; HOSTILE_SESSION's level ALL is overridden by it above)."""
    from lakesink.sink.spark.write import HADOOP_PINS

    assert HADOOP_PINS.get("parquet.summary.metadata.level") == "NONE"
    assert "parquet.enable.summary-metadata" not in HADOOP_PINS
