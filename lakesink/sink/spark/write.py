"""Driver side, the fast write path of :func:`lakesink.foreach_batch`: Spark's own Parquet writer.

The batch DataFrame is projected onto the table's schema with Spark expressions (columns matched by
name, reordered, cast by Iceberg's allowed promotions, missing optional columns as null, NOT NULL
columns checked) and written by Spark's Parquet writer, in the JVM, with Iceberg field ids
(``parquet.field.id`` column metadata), microsecond timestamps and the table's codec, into a fresh
directory of its own::

    <data prefix>/<query id[:8]>-<batch:05d>-<token>/part-*.parquet

No row passes through a Python worker. Every session setting that would change what Spark writes
(calendar rebase modes, timestamp type, legacy format, commit protocol and committer, summary files,
...) is pinned for the write (:data:`SESSION_PINS`, :data:`HADOOP_PINS`; docs/write-paths.md#session-settings).
The driver then keeps, of the files in the directory, those whose footer carries the write id of its
own job (and checks that they hold the rows the job wrote), reads their footers (through the table's
FileIO) for Iceberg's column statistics, and hands them to the unchanged
:class:`~lakesink.driver.committers.table.TableCommitter` as :class:`~lakesink.executor.messages.TaskResult`\\ s.

If the Spark job (or anything before the commit) fails, the batch directory is deleted before the
error propagates. A driver killed in between leaves the directory behind; the orphan-file clean-up
recognises the layout (:mod:`lakesink.table.names` formats and parses the directory's name) and keeps it while
its batch may still commit.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import Column, DataFrame, DataFrameWriter, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError, SchemaMismatchError
from lakesink.executor.messages import TaskResult, WritePlan, WrittenFile, WrittenTotals
from lakesink.faults import fault_point
from lakesink.sink.spark import partition as spark_partition
from lakesink.table import names, storage
from lakesink.table.keys import DICT_SIZE_DEFAULT
from lakesink.table.keys import PAGE_ROW_LIMIT_DEFAULT as _PAGE_ROW_LIMIT_DEFAULT
from lakesink.table.keys import PAGE_SIZE_DEFAULT as _PAGE_SIZE_DEFAULT
from lakesink.table.keys import WRITE_ID as WRITE_ID_KEY
from lakesink.table.keys import ZSTD_LEVEL_DEFAULT as _ZSTD_LEVEL_DEFAULT

log = logging.getLogger("lakesink")

#: driver, after Spark's job wrote the batch's files and before they are read and committed
SPARKWRITE_AFTER_FILES = "sparkwrite.after-files"
#: driver, when the Spark path is about to start its write job (the equivalent of executor.before-write)
SPARKWRITE_BEFORE_WRITE = "sparkwrite.before-write"

# Iceberg's defaults for the parquet-mr settings a table does not set (always passed: never the session's value)

# Iceberg codec name -> Spark's Parquet ``compression`` option
_SPARK_CODECS = {
    "zstd": "zstd",
    "snappy": "snappy",
    "gzip": "gzip",
    "brotli": "brotli",
    "lz4": "lz4_raw",
    "uncompressed": "uncompressed",
    "none": "uncompressed",
}

# What the user's session may not decide (docs/write-paths.md#session-settings, fault matrix row 24).
# SQL confs, set on the batch's session for the write only and put back afterwards (foreachBatch's session is
# the query's clone): Spark reads them from the session, on the driver and (propagated with the job) on the
# executors, where the rebase modes are read; a write option cannot replace them.
SESSION_PINS = {
    # Iceberg stores timestamps as INT64 microseconds; INT96 is not an Iceberg type
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.fieldId.write.enabled": "true",
    # decimals as INT32/INT64/FIXED by precision (Iceberg's spec), not always FIXED_LEN_BYTE_ARRAY
    "spark.sql.parquet.writeLegacyFormat": "false",
    # LEGACY would store dates and timestamps before 1582-10-15 in the Julian calendar: every Iceberg
    # reader (proleptic Gregorian, no Spark footer marker) would read them shifted by days
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    # the commit protocol and output committer whose guarantees lakesink relies on: with FileOutputCommitter
    # algorithm 1, only the output of each partition's one committed task attempt reaches the directory
    "spark.sql.sources.commitProtocolClass": "org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol",
    "spark.sql.parquet.output.committer.class": "org.apache.parquet.hadoop.ParquetOutputCommitter",
}
# Partitioned writes only: pinned to Spark's default 0 (sort each task's rows by partition, then write one
# partition at a time); a session value > 0 would keep that many Parquet writers open per task
CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"
# Hadoop and parquet-mr settings, given as options of the write: they go into the write job's Hadoop
# configuration last, over the session's confs and spark.hadoop.* (and change nothing else)
HADOOP_PINS = {
    "mapreduce.fileoutputcommitter.algorithm.version": "1",  # 2 moves task output before the job commits
    "mapreduce.fileoutputcommitter.cleanup.skipped": "false",  # no _temporary left behind
    "mapreduce.fileoutputcommitter.cleanup-failures.ignored": "false",
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",  # no _SUCCESS file
    # no _metadata / _common_metadata summary files: the level alone (it overrides the older boolean
    # parquet.enable.summary-metadata, which a session may set; with both set parquet-mr warns at every write)
    "parquet.summary.metadata.level": "NONE",
    "parquet.writer.version": "PARQUET_1_0",  # v1 data pages, as Iceberg's and pyiceberg's writers
    "parquet.enable.dictionary": "true",
    "parquet.statistics.truncate.length": "2147483647",  # exact min/max in the footer, the source of Iceberg's bounds
}
# Settings lakesink refuses rather than pins (they cannot be unset through a write option)
_REFUSED_SETTINGS = ("parquet.crypto.factory.class",)
# The key, in the Spark metadata of a file's first column, of the write id of the job that wrote it
_SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"

_NOT_NULL_MARKER = "LAKESINK_NOT_NULL_VIOLATION"
_FOOTER_THREADS = 8


# --- which tables the Spark path can write --------------------------------------------------------


def _spark_type(t: IcebergType) -> T.DataType | None:
    """The Spark type Spark's Parquet writer writes as Iceberg type ``t``, or None when it cannot."""
    simple: dict[type, T.DataType] = {
        BooleanType: T.BooleanType(),
        IntegerType: T.IntegerType(),
        LongType: T.LongType(),
        FloatType: T.FloatType(),
        DoubleType: T.DoubleType(),
        DateType: T.DateType(),
        TimestampType: T.TimestampNTZType(),
        TimestamptzType: T.TimestampType(),
        StringType: T.StringType(),
        BinaryType: T.BinaryType(),
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, DecimalType):
        return T.DecimalType(t.precision, t.scale)
    if isinstance(t, StructType):
        fields = [spark_field(f) for f in t.fields]
        return None if any(f is None for f in fields) else T.StructType([f for f in fields if f is not None])
    # lists and maps (Spark writes no field ids for elements, keys, values), fixed, uuid, time, timestamp_ns, ...
    return None


def spark_field(f: NestedField) -> T.StructField | None:
    t = _spark_type(f.field_type)
    # always nullable for Spark: NOT NULL is checked by lakesink's own expression (DataFrame.to() would refuse it)
    return None if t is None else T.StructField(f.name, t, True, {"parquet.field.id": f.field_id})


def unsupported_reason(schema: Schema, spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC) -> str | None:
    """Why Spark's own writer cannot write this table, or None when it can."""
    for f in schema.fields:
        if spark_field(f) is None:
            return (
                f"column {f.name!r} has type {f.field_type}: Spark's Parquet writer cannot write it with Iceberg "
                "field ids (lists and maps: no ids on elements, keys and values; fixed, uuid, time, timestamp_ns)"
            )
    return spark_partition.unsupported_reason(spec, schema)


# --- the projection onto the table ------------------------------------------------------------------


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _project_field(
    table_field: NestedField, file_field: NestedField, source: Column | None, stream_type: T.DataType | None, path: str, ctx: str
) -> Column:
    target = _spark_type(file_field.field_type)
    assert target is not None
    if source is None or stream_type is None:
        value = F.lit(None).cast(target)  # check_writable let only optional columns be missing
    elif isinstance(file_field.field_type, StructType):
        assert isinstance(table_field.field_type, StructType) and isinstance(stream_type, T.StructType)
        present = {f.name: f.dataType for f in stream_type.fields}
        children = [
            _project_field(
                tc,
                fc,
                source.getField(tc.name) if tc.name in present else None,
                present.get(tc.name),
                f"{path}.{tc.name}",
                ctx,
            ).alias(fc.name)
            for tc, fc in zip(table_field.field_type.fields, file_field.field_type.fields, strict=True)
        ]
        value = F.when(source.isNull(), F.lit(None).cast(target)).otherwise(F.struct(*children))
    else:
        value = source if stream_type == target else source.cast(target)
    if table_field.required:
        message = f"{_NOT_NULL_MARKER}[{path}] column {path!r} is required (NOT NULL) in {ctx}"
        value = F.when(value.isNull(), F.raise_error(F.lit(message)).cast(target)).otherwise(value)
    return value


def project(
    df: DataFrame, plan: WritePlan, batch_id: int, write_id: str = "", extra: Sequence[tuple[str, Column, T.DataType]] = ()
) -> DataFrame:
    """``df`` with the table's columns in the table's order and types, with Iceberg field ids, NOT NULL checked.

    ``write_id`` goes into the metadata of the first column, which Spark keeps in every file's footer
    (``org.apache.spark.sql.parquet.row.metadata``): how the driver recognises the files of its own write job.
    ``extra``: columns after the table's (name, value, type), e.g. a partition column of the write that is not
    written into the files (route-by: lakesink.sink.spark.routed).
    """
    file_schema = seam.file_schema(plan.schema)
    stream = {f.name: f.dataType for f in df.schema.fields}
    ctx = f"table {plan.table}, batch {batch_id}"

    def metadata(i: int, field_id: int) -> dict[str, Any]:
        return {"parquet.field.id": field_id, WRITE_ID_KEY: write_id} if write_id and i == 0 else {"parquet.field.id": field_id}

    columns = [
        _project_field(tf, ff, F.col(_quote(tf.name)) if tf.name in stream else None, stream.get(tf.name), tf.name, ctx).alias(
            ff.name, metadata=metadata(i, ff.field_id)
        )
        for i, (tf, ff) in enumerate(zip(plan.schema.fields, file_schema.fields, strict=True))
    ]
    columns += [value.alias(name) for name, value, _ in extra]
    fields = [f for f in (spark_field(ff) for ff in file_schema.fields) if f is not None]
    target = T.StructType(
        [T.StructField(f.name, f.dataType, f.nullable, metadata(i, f.metadata["parquet.field.id"])) for i, f in enumerate(fields)]
        + [T.StructField(name, data_type, True) for name, _, data_type in extra]
    )
    # DataFrame.to() carries the field ids over onto every nested field of the written schema. The explicit
    # metadata of the top-level aliases matters: a projection that changes nothing else is optimised away
    # together with metadata given only by to() (seen with Spark 4.3), and the files lose their field ids.
    return df.select(*columns).to(target)


def _null_count(df: DataFrame, path: str) -> int:
    """How many rows hold a null at ``path`` (a dotted column path) where its parents are present."""
    parts = path.split(".")
    cond: Column | None = None
    col = F.col(_quote(parts[0]))
    for part in parts[1:]:
        cond = col.isNotNull() if cond is None else cond & col.isNotNull()
        col = col.getField(part)
    missing = col.isNull() if cond is None else cond & col.isNull()
    return int(df.filter(missing).count())


# --- the write -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDirectory:
    """A new batch directory for one Spark write job (named by :func:`lakesink.table.names.batch_directory_name`), and
    the write id the job's files carry in their footers (:data:`WRITE_ID_KEY`)."""

    path: str
    name: str
    """The directory's name (``path``'s last segment)."""
    token: str
    write_id: str
    since_ms: int
    """When the directory was named (ms since the epoch): before any file of the batch is written."""


def job_directory(prefix: str, *, query_id: str, batch_id: int) -> JobDirectory:
    """A new batch directory under ``prefix`` for batch ``batch_id`` of query ``query_id`` (nothing is created)."""
    since_ms = names.now_ms()
    token = names.new_token()
    name = names.batch_directory_name(query_id=query_id, batch_id=batch_id, token=token)
    return JobDirectory(f"{prefix.rstrip('/')}/{name}", name, token, f"{query_id}/{batch_id}/{token}", since_ms)


@dataclass(frozen=True)
class SparkWrite(WrittenTotals):
    """One batch written by Spark's Parquet writer: its directory and the results to commit."""

    directory: str
    results: tuple[TaskResult, ...]
    job_ms: float = 0.0
    """Wall time of Spark's write job (projection, NOT NULL checks, Parquet writing, Spark's file commit)."""
    footer_ms: float = 0.0
    """Wall time of listing the files and reading their footers on the driver."""

    def written_parts(self) -> Iterable[TaskResult]:
        return self.results


def write_batch(
    df: DataFrame,
    plan: WritePlan,
    *,
    batch_id: int,
    max_records_per_file: int = 0,
    run_id: str | None = None,
) -> SparkWrite:
    """Write ``df`` as Parquet data files of the table into a new directory; nothing is committed.

    On any failure the directory is deleted before the error propagates.
    """
    query_id = plan.query_id or ""
    job = job_directory(plan.data_prefix, query_id=query_id, batch_id=batch_id)
    directory, token, write_id, since_ms = job.path, job.token, job.write_id, job.since_ms
    spark = df.sparkSession
    check_refused_settings(spark, plan)
    observation = Observation(f"lakesink-{token}")
    projected = project(df, plan, batch_id, write_id)
    projected, keys = spark_partition.with_grouping_keys(projected, plan.spec, plan.schema)
    writer = parquet_writer(
        projected.observe(observation, F.count(F.lit(1)).alias("rows")), plan, keys, directory, max_records_per_file
    )
    try:
        fault_point(SPARKWRITE_BEFORE_WRITE)
        started = time.monotonic()
        save(spark, writer, directory, partitioned=bool(keys), on_error=lambda e: raise_not_null(e, df, plan, batch_id))
        written = time.monotonic()
        rows_written = int(observation.get["rows"])
        fault_point(SPARKWRITE_AFTER_FILES)
        listed = file_names(plan.io, directory)
        files = files_of_write(plan, directory, listed, write_id, rows_written, batch_id)
        footers_read = time.monotonic()
    except BaseException:
        delete_directory(plan.io, directory)
        raise
    empty = [f for f in files if f.record_count == 0]
    for f in empty:  # Spark writes a file even for an empty task; nothing to commit in it
        plan.io.delete(f.path)
    results = tuple(
        task_result(plan, (f,), query_id=query_id, batch_id=batch_id, partition_id=i, run_id=run_id, since_ms=since_ms)
        for i, f in enumerate(f for f in files if f.record_count)
    )
    if not results:
        storage.remove_empty_directory(directory)
    return SparkWrite(
        directory=directory,
        results=results,
        job_ms=(written - started) * 1000,
        footer_ms=(footers_read - written) * 1000,
    )


def task_result(
    plan: WritePlan,
    files: Sequence[WrittenFile],
    *,
    query_id: str,
    batch_id: int,
    partition_id: int,
    run_id: str | None,
    since_ms: int,
) -> TaskResult:
    """Files Spark's writer wrote for the table of ``plan``, as the result of one task for the table's committer."""
    return TaskResult(
        query_id=query_id,
        batch_id=batch_id,
        partition_id=partition_id,
        task_attempt_id=-1,
        schema_id=plan.schema_id,
        spec_id=plan.spec_id,
        files=tuple(files),
        table_uuid=plan.table_uuid or None,
        run_id=run_id,
        written_schema=plan.schema_digest,
        schema_changes=plan.schema_changes,
        written_since_ms=since_ms,
    )


def parquet_writer(
    frame: DataFrame, plan: WritePlan, keys: Sequence[str], directory: str, max_records_per_file: int
) -> DataFrameWriter:
    """Spark's Parquet writer of ``frame`` into ``directory`` (one folder per value of ``keys``), with the table's
    Parquet settings and every Hadoop setting lakesink pins (:data:`HADOOP_PINS`)."""
    settings = plan.settings
    codec = settings.codec  # validated by TableSettings.parse on the driver
    frame_writer = frame.write
    if keys:
        frame_writer = frame_writer.partitionBy(*keys)
    writer = (
        frame_writer.format("parquet")
        .mode("errorifexists")
        .option("compression", _SPARK_CODECS[codec])
        .option("parquet.block.size", str(settings.row_group_bytes))
        .option("maxRecordsPerFile", str(max(0, max_records_per_file)))
        .options(**HADOOP_PINS)
    )
    if storage.spark_location(directory).startswith("file:"):
        # Hadoop's checksummed local filesystem would leave a hidden .crc file beside every data file
        writer = writer.option("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem").option(
            "fs.file.impl.disable.cache", "true"
        )
    # Iceberg's write.parquet.* properties -> parquet-mr (Hadoop configuration) keys, passed as write options
    for value, key in (
        (settings.page_size or _PAGE_SIZE_DEFAULT, "parquet.page.size"),
        (settings.page_row_limit or _PAGE_ROW_LIMIT_DEFAULT, "parquet.page.row.count.limit"),
        (settings.dict_size or DICT_SIZE_DEFAULT, "parquet.dictionary.page.size"),
    ):
        writer = writer.option(key, str(value))
    if codec == "zstd":
        level = settings.compression_level if settings.compression_level is not None else _ZSTD_LEVEL_DEFAULT
        writer = writer.option("parquet.compression.codec.zstd.level", str(level))
    return writer


def save(
    spark: SparkSession, writer: DataFrameWriter, directory: str, *, partitioned: bool, on_error: Callable[[Exception], None]
) -> None:
    """Run Spark's write job with the session settings lakesink pins (:data:`SESSION_PINS`), put back afterwards;
    ``on_error`` may turn a failure of the job into lakesink's own error (it returns to let the failure propagate)."""
    # a partitioned write sorts each task's rows by the grouping keys (Spark's default): measured faster than
    # spark.sql.maxConcurrentOutputFileWriters (a writer per partition) on shuffled input, 1M rows over 30 days
    with session_confs(spark, {**SESSION_PINS, CONCURRENT_WRITERS: "0"} if partitioned else SESSION_PINS):
        try:
            writer.save(storage.spark_location(directory))
        except Exception as e:
            on_error(e)
            raise


def raise_not_null(error: Exception, df: DataFrame, plan: WritePlan, batch_id: int) -> None:
    m = re.search(re.escape(_NOT_NULL_MARKER) + r"\[([^\]]+)\]", str(error))
    if m is None:
        return
    path = m.group(1)
    try:
        count = _null_count(df, path)
        counted = f"{count} null value(s)"
    except Exception:
        counted = "null value(s)"
    raise SchemaMismatchError(
        f"column {path!r} is required (NOT NULL) in table {plan.table}, but batch {batch_id} has {counted} in it"
    ) from None


class session_confs:
    """Set session confs for one write, then put back what was there (unset when nothing was)."""

    def __init__(self, spark: SparkSession, confs: dict[str, str]):
        self._spark = spark
        self._confs = confs
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for key, value in self._confs.items():
            self._saved[key] = self._spark.conf.get(key, None)
            self._spark.conf.set(key, value)

    def __exit__(self, *exc: object) -> None:
        for key, value in self._saved.items():
            if value is None:
                self._spark.conf.unset(key)
            else:
                self._spark.conf.set(key, value)


def file_names(io: FileIO, directory: str) -> list[str]:
    """Paths, relative to ``directory``, of the data files Spark committed into it, listed through the table's
    FileIO (the one the footers are then read with), as Spark's own file index would list them: a file or folder
    whose name starts with ``.`` (checksums), or with ``_`` and holds no ``=`` (``_temporary`` with uncommitted task
    output, ``_SUCCESS``), is not data. A partitioned write puts the files in one ``key=value`` folder per
    grouping key, whose names are made of characters that need no escaping (see lakesink.sink.spark.partition).

    Listing through Spark (``spark.read...inputFiles()``) gave the same names at about 18 ms more per batch (a
    DataFrame analysed for the listing); on an object store both are one LIST request."""
    return sorted(f.relative for f in storage.list_files(io, directory) if not any(_hidden(p) for p in f.relative.split("/")))


def _hidden(name: str) -> bool:
    """Spark's rule (``HadoopFSUtils.shouldFilterOutPathName``) for names a file index skips."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def check_refused_settings(spark: SparkSession, plan: WritePlan) -> None:
    for key in _REFUSED_SETTINGS:
        for name in (key, f"spark.hadoop.{key}"):
            if spark.conf.get(name, None):
                raise LakesinkError(
                    f"the Spark session sets {name}: Parquet modular encryption would write files of table "
                    f"{plan.table} that Iceberg readers cannot read without the keys; unset it for this query, "
                    "or use writer='arrow'"
                )


def _write_id(metadata: pq.FileMetaData) -> str | None:
    """The lakesink write id Spark kept in a file's footer (in the first column's metadata), if any."""
    row_metadata = (metadata.metadata or {}).get(_SPARK_ROW_METADATA)
    if row_metadata is None:
        return None
    try:
        fields = json.loads(row_metadata)["fields"]
        value = fields[0]["metadata"].get(WRITE_ID_KEY) if fields else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def files_of_write(
    plan: WritePlan, directory: str, names: Sequence[str], write_id: str, rows_written: int | None, batch_id: int
) -> list[WrittenFile]:
    """The files in ``directory`` that Spark's write job ``write_id`` committed, with their statistics.

    A directory listing is not a record of the job: whatever else is in the directory (a file copied
    there by another process, output of a task attempt leaked by a committer) would be committed with
    it. A file belongs to the job when its footer carries the job's write id; any other file is left
    out (and left alone: it is not lakesink's to delete; the orphan clean-up collects it). The files'
    rows must then add up to the rows Spark's job wrote (counted by an observation, once per committed
    task): more means a file of the job is there twice, fewer that one is missing. Either fails the
    batch before anything is committed. ``rows_written`` None: the caller adds the rows of several directories up and
    checks their sum (route-by's split job counts the whole batch: lakesink.sink.spark.split).
    """
    file_schema = seam.file_schema(plan.schema)

    def read(name: str) -> WrittenFile | None:
        path = f"{directory}/{name}"
        try:
            input_file = plan.io.new_input(path)
            size = len(input_file)
            with input_file.open() as stream:
                metadata = pq.read_metadata(stream)
        except Exception as e:
            log.warning("lakesink: %s is not a Parquet file of batch %s's write job (%s); not committed", path, batch_id, e)
            return None
        if _write_id(metadata) != write_id:
            log.warning("lakesink: %s was not written by batch %s's write job; not committed", path, batch_id)
            return None
        _check_field_ids(metadata, path)
        stats = seam.file_statistics(metadata, file_schema, plan.properties)
        partition: tuple[Any, ...] = ()
        if not plan.spec.is_unpartitioned() and metadata.num_rows:

            def read_columns(columns: list[str]) -> pa.Table:
                with plan.io.new_input(path).open() as stream:
                    return pq.read_table(stream, columns=columns)

            partition = spark_partition.partition_of_file(metadata, plan.spec, file_schema, read_columns, path)
        return WrittenFile(path=path, size_in_bytes=size, record_count=metadata.num_rows, statistics=stats, partition=partition)

    if len(names) <= 1:
        found = [read(n) for n in names]
    else:
        with ThreadPoolExecutor(max_workers=min(_FOOTER_THREADS, len(names))) as pool:
            found = list(pool.map(read, names))
    files = [f for f in found if f is not None]
    in_files = sum(f.record_count for f in files)
    if rows_written is not None and in_files != rows_written:
        raise LakesinkError(
            f"Spark's write job for batch {batch_id} of table {plan.table} wrote {rows_written} rows, but the files "
            f"carrying its write id in {directory} hold {in_files} rows ({len(files)} file(s)): a file was copied, "
            "leaked by a task attempt or removed. Nothing is committed; the batch directory is deleted and the "
            "batch is written again when the query restarts. Check that no other process writes into the table's "
            "data directory"
        )
    return files


def _check_field_ids(metadata: pq.FileMetaData, path: str) -> None:
    """Every field of the file must carry an Iceberg field id (else readers would map columns by name, or fail)."""
    missing: list[str] = []

    def walk(fields: Iterator[pa.Field], prefix: str) -> None:
        for f in fields:
            name = f"{prefix}{f.name}"
            if not f.metadata or b"PARQUET:field_id" not in f.metadata:
                missing.append(name)
            if pa.types.is_struct(f.type):
                walk(iter(f.type), f"{name}.")

    walk(iter(metadata.schema.to_arrow_schema()), "")
    if missing:
        raise LakesinkError(f"Spark wrote {path} without Iceberg field ids on column(s) {', '.join(missing)}")


def delete_directory(io: FileIO, directory: str) -> None:
    """Delete a batch directory and everything in it (including Spark's ``_temporary``); never raises."""
    try:
        storage.delete_directory(io, directory)
    except Exception as e:
        log.warning("lakesink: could not delete %s (%s); an orphan clean-up collects it", directory, e)
