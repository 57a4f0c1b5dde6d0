"""Driver side, option ``route-by`` with ``writer='spark'`` (appends): the batch is read once, by its write job.

Before the tables are known, there is nothing to write with but the template (the schema, field ids, partition spec
and Parquet settings of the tables lakesink creates from the stream:
lakesink.driver.tables.routed_tables.RoutedTables.template). So:

1. :func:`split` -- one Spark write job over the batch, the first and only read of its source: its rows as the template
   takes them (lakesink.sink.spark.write.project: field ids, casts, NOT NULL checks), partitioned by routing value into
   a folder per value, ``__lakesink_value=<the value's UTF-8 bytes in hex>``, of a batch directory of the query's
   split area ``<warehouse>/.lakesink-split/<query id>/`` (no character that Spark escapes in a folder name, no two
   values in one folder on a filesystem that ignores case). The job observes the batch as a whole (one
   ``CollectMetrics``, whatever the number of tables): its row count, once per committed task, and -- where the
   batch's tables are not committed as one unit (``atomic=off``, a catalog that commits table by table) -- its digest
   of kind ``b`` (:data:`BATCH_DIGEST_KIND`: the sum of Spark's ``xxhash64`` over every column of each row, the routing
   column included). As one unit, a replay finds the batch in all its tables or in none and compares no digest
   (lakesink.driver.committers.routed): the job counts the rows alone (kind ROWS_ONLY, recorded ``<rows>``; the hash
   and its two sums cost about 4% of the job, docs/performance.md), and the rare replay that finds the batch in some
   of its tables all the same (an earlier run's crash table by table, a table dropped since) reads it again for its
   digest before anything is compared (:func:`place`). A value whose folder name would be longer than a file name may
   be (more than :data:`MAX_VALUE_BYTES` bytes), null or empty gets a folder named by its SHA-256 instead, and the
   batch goes the way of two jobs (lakesink.sink.spark.routed: find, then write; an invalid route's RoutingError from
   there).
2. The tables are opened as on that path (created on first sight), the replay of the whole batch decided, then
   :func:`place` -- a table whose files look like the template's (same file schema with field ids, partition spec,
   Parquet settings and filesystem: every table lakesink creates from the stream) gets its values' folders moved
   into a batch directory of its own data location (a rename, as lakesink.sink.spark.routed moves a table's folder),
   their footers read and checked (the job's write id, field ids); any other table (created by someone else) is
   written by lakesink.sink.spark.routed.write_routed from the split's files. The rows in the footers of every value's
   files, wherever they are then, must add up to the rows the job counted: a file lost, copied or cut short since the
   job fails the batch, nothing committed. Each table's commit records ``<its rows>:b<the batch's digest>``
   (``lakesink.batch-rows-digest``; ``<its rows>`` alone as one unit): the batch's rows with their routing values
   determine every table's rows, so a replay that finds the batch in some of its tables compares the digest it
   observed with the recorded one (a row moved between tables changes its routing value, hence the digest) -- as
   strict as a digest per table, and stricter where a replay changes rows of tables that do not hold the batch yet (a
   ReplayMismatchError there too).

A split directory not moved or committed is deleted when the batch ends, committed or failed; a driver killed in
between leaves it, and the query's next run deletes every split directory of an earlier batch (:func:`sweep`; never
one of the batch it runs: a zombie driver of the previous run may still be reading it).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError
from lakesink.executor.messages import ROWS_ONLY, RowsDigest, TaskResult, WritePlan, WrittenFile
from lakesink.faults import fault_point
from lakesink.sink.spark import partition as spark_partition
from lakesink.sink.spark import routed as spark_routed
from lakesink.sink.spark import write as spark_write
from lakesink.table import names, storage
from lakesink.table.keys import SPLIT_VALUE_COLUMN as VALUE_KEY  # the split job's partition column
from lakesink.table.routes import routing_value

log = logging.getLogger("lakesink")

SPLIT_FOLDER = ".lakesink-split"
"""Under the catalog's warehouse: ``<warehouse>/.lakesink-split/<query id>/<batch directory>``."""
MAX_VALUE_BYTES = 118
"""The longest routing value (in UTF-8 bytes) whose folder is named by the value: 17 + 1 + 2 * 118 < 255 bytes."""
BATCH_DIGEST_KIND = "b"
"""lakesink.executor.messages.RowsDigest.kind of a table's digest on this path: the table's rows, and the digest of
the whole batch (every column of each row, the routing column included; lakesink.sink.spark.routed.row_hash's hash)."""
_FOOTER_THREADS = 8
#: driver, after the split job wrote the batch by routing value (its rows counted by the job), before any table is opened
SPARKSPLIT_AFTER_SPLIT = "sparksplit.after-split"
_PINNED_READ = {"spark.sql.files.ignoreCorruptFiles": "false", "spark.sql.files.ignoreMissingFiles": "false"}


def split_root(warehouse: str, query_id: str) -> str:
    return f"{warehouse.rstrip('/')}/{SPLIT_FOLDER}/{query_id}"


def _value_key(column: str) -> Column:
    """A row's folder key: its routing value's UTF-8 bytes in hex (upper case, nothing else: the cheapest key measured,
    2026-11-26), or ``h`` and their SHA-256 (lower case; null: ``hnull``) for a value :func:`split` leaves to the two
    jobs' path. No ``H`` in hex digits: two keys never differ by case alone."""
    value = F.col(spark_routed.quote(column))  # a string (lakesink.driver.tables.routed_tables.stream_columns)
    size = F.octet_length(value)
    hashed = F.concat(F.lit("h"), F.coalesce(F.sha2(value.cast("binary"), 256), F.lit("null")))
    return F.when((size >= 1) & (size <= MAX_VALUE_BYTES), F.hex(value)).otherwise(hashed)


def _named(key: str) -> bool:
    """A folder key holding its value (hex digits), not a hashed one (``h...``)."""
    return not key.startswith("h")


def _value_of(key: str) -> object:
    """The routing value of a named folder key (a value that is not UTF-8 stays bytes: an invalid route)."""
    return routing_value(bytes.fromhex(key))


@dataclass(frozen=True)
class Split:
    """A batch written by routing value into one directory (:func:`split`); nothing committed, no table opened."""

    directory: str
    write_id: str
    batch_dir: str
    """The name of the batch directory (``directory``'s last segment; each table's own takes it too)."""
    keys: dict[object, str]
    """Each routing value's folder key (its UTF-8 bytes in hex: :func:`_value_key`)."""
    template: WritePlan
    batch: RowsDigest
    """The batch as the split job observed it: its rows (once per committed task) and its digest (kind ``b``)."""
    folders: tuple[str, ...] = ()
    """The folder keys of the split job: the value's, then the template's partition keys."""
    odd: bool = False
    """A value got a hashed folder (null, empty, longer than MAX_VALUE_BYTES): the batch needs the two-job path."""
    since_ms: int = 0
    job_ms: float = 0.0


def split(
    df: DataFrame,
    *,
    column: str,
    template: WritePlan,
    root: str,
    query_id: str,
    batch_id: int,
    max_records_per_file: int,
    digest: bool = True,
) -> Split:
    """Write the batch ``df`` by routing value into a new batch directory under ``root`` (with the ``template`` plan's
    columns, field ids, partition spec and settings), observing the batch's row count and, with ``digest``, its digest
    in the same job (without: its rows alone, kind ROWS_ONLY -- where the batch's tables are committed as one unit, no
    replay compares a digest, :func:`place`). On any failure the directory is deleted before the error propagates."""
    spark_routed.check_columns(df, column)
    if VALUE_KEY in df.columns:
        raise LakesinkError(f"the stream has a column {VALUE_KEY!r}, which route-by with writer='spark' uses itself; rename it")
    spark = df.sparkSession
    job = spark_write.job_directory(root, query_id=query_id, batch_id=batch_id)
    directory, batch_dir, write_id, since_ms = job.path, job.name, job.write_id, job.since_ms
    plan = dataclasses.replace(template, data_prefix=root, table=f"(created for a routing value of column {column!r})")
    spark_write.check_refused_settings(spark, plan)
    key = F.col(VALUE_KEY)
    # the batch's rows as the stream gives them (the digest a replay computes again), counted once per committed task
    observation = Observation(f"lakesink-split-{job.token}")
    observed = _observed(df, observation, digest)
    projected = spark_write.project(
        observed.withColumn(VALUE_KEY, _value_key(column)), plan, batch_id, write_id, extra=[(VALUE_KEY, key, T.StringType())]
    )
    projected, part_keys = spark_partition.with_grouping_keys(projected, plan.spec, plan.schema)
    keys = [VALUE_KEY, *part_keys]
    writer = spark_write.parquet_writer(projected, plan, keys, directory, max_records_per_file)
    try:
        fault_point(spark_write.SPARKWRITE_BEFORE_WRITE)
        started = time.monotonic()
        spark_write.save(
            spark, writer, directory, partitioned=True, on_error=lambda e: spark_write.raise_not_null(e, df, plan, batch_id)
        )
        written = time.monotonic()
        batch = _observed_batch(observation.get, digest)
        found = _folder_keys(plan.io, directory)
        odd = not all(_named(k) for k in found)
        if not odd:
            fault_point(SPARKSPLIT_AFTER_SPLIT)
    except BaseException:
        spark_write.delete_directory(plan.io, directory)
        raise
    values = {_value_of(k): k for k in found if _named(k)}
    return Split(
        directory=directory,
        write_id=write_id,
        batch_dir=batch_dir,
        keys=values,
        template=plan,
        batch=batch,
        folders=tuple(keys),
        odd=odd,
        since_ms=since_ms,
        job_ms=(written - started) * 1000,
    )


def _observed(df: DataFrame, observation: Observation, digest: bool) -> DataFrame:
    """``df`` observed as :func:`split` does: its rows counted, and with ``digest`` their hashes summed (the hash a
    column of its own, computed once a row in Spark's generated code, then dropped)."""
    if not digest:
        return df.observe(observation, F.count(F.lit(1)).alias("c"))
    hash_column = spark_routed.HASH_COLUMN
    hashed = df.withColumn(hash_column, spark_routed.row_hash(df, None))
    return hashed.observe(observation, *spark_routed.digest_aggregates(F.col(hash_column))).drop(hash_column)


def _observed_batch(seen: Mapping[str, Any], digest: bool) -> RowsDigest:
    if not digest:
        return RowsDigest(int(seen["c"]), 0, ROWS_ONLY)
    return dataclasses.replace(spark_routed.digest_of(seen["c"], seen["h"], seen["l"]), kind=BATCH_DIGEST_KIND)


def _batch_digest(df: DataFrame) -> RowsDigest:
    """The batch's count and digest of kind ``b`` by a job of their own (the source read again)."""
    (seen,) = df.agg(*spark_routed.digest_aggregates(spark_routed.row_hash(df, None))).collect()
    return _observed_batch(seen.asDict(), True)


def _folder_keys(io: Any, directory: str) -> set[str]:
    """The folder keys (``<hex>`` or ``h<sha>``) of the values' folders holding a data file of the split."""
    prefix = f"{VALUE_KEY}="
    return {
        f.relative.split("/", 1)[0][len(prefix) :]
        for f in storage.list_files(io, directory)
        if f.relative.startswith(prefix) and "/" in f.relative
    }


def _read_schema(plan: WritePlan, keys: list[str]) -> T.StructType:
    """The split's files as Spark reads them back: the template's columns, then the partition folders (as text)."""
    file_schema = seam.file_schema(plan.schema)
    fields = [f for f in (spark_write.spark_field(ff) for ff in file_schema.fields) if f is not None]
    return T.StructType(
        [T.StructField(f.name, f.dataType, True) for f in fields] + [T.StructField(k, T.StringType()) for k in keys]
    )


def _read_back(
    spark: Any, df: DataFrame, column: str, plan: WritePlan, directory: str, keys: list[str], folders: list[str]
) -> DataFrame:
    """The split's rows read back from its files, each stream column as the stream's type (the template's type is the
    stream's, or a wider integer for a narrower one: cast back exactly), the routing column from the folder key."""
    # the values' folders only (a file Spark may leave at the job's root for an empty task holds no row)
    paths = [storage.spark_location(f"{directory}/{VALUE_KEY}={k}") for k in folders]
    reader = spark.read.schema(_read_schema(plan, keys)).option("basePath", storage.spark_location(directory))
    read: DataFrame = reader.parquet(*paths)
    have = set(read.columns)
    columns: list[Column] = []
    for f in df.schema.fields:
        if f.name == column:
            columns.append(F.unhex(F.col(VALUE_KEY)).cast("string").alias(column))
        elif f.name in have:
            columns.append(F.col(spark_routed.quote(f.name)).cast(f.dataType).alias(f.name))
        else:
            columns.append(F.lit(None).cast(f.dataType).alias(f.name))
    return read.select(*columns, F.col(VALUE_KEY))  # (the template's partition keys: recomputed by each table)


def fits(plan: WritePlan, template: WritePlan) -> bool:
    """Can the split's files of a table be its data files as they are? Its file schema (with field ids), partition
    spec, Parquet settings and filesystem are the template's, and its commit adds no column."""
    return not plan.schema_changes and spark_routed.group_key(plan) == spark_routed.group_key(template)


def place(
    df: DataFrame,
    s: Split,
    batch: spark_routed.RoutedBatch,
    *,
    plans: Mapping[str, WritePlan],
    max_records_per_file: int,
) -> spark_routed.RoutedSparkWrite:
    """Make the split's files every table's data files (see the module's docstring); nothing is committed. A table
    holding the batch already gets none (its digest is compared). The rows in the footers of every value's files must
    add up to the rows the split job counted (else LakesinkError: a file lost, copied or cut short). On any failure
    every batch directory made in the tables' locations is deleted before the error propagates (the split's own is the
    caller's)."""
    spark, column, query_id, batch_id, run_id = df.sparkSession, batch.column, batch.query_id, batch.batch_id, batch.run_id
    value_table = batch.tables_by_value(list(s.keys))
    held = {n for n, p in plans.items() if p.last_committed_batch is not None and batch_id <= p.last_committed_batch}
    whole = s.batch
    if whole.kind == ROWS_ONLY and held and len(held) < len(plans):
        whole = _digest_again(df, s, batch_id, held)
    moved = sorted(n for n in plans if n not in held and fits(plans[n], s.template))
    other = sorted(n for n in plans if n not in held and n not in moved)
    directories: list[str] = []
    written: dict[str, TaskResult] = {}
    started = time.monotonic()
    io = s.template.io
    try:
        # the rows of the values not moved (tables holding the batch, tables written from the split), in the split
        stay = [v for v, t in value_table.items() if t not in moved]
        with ThreadPoolExecutor(max_workers=max(1, min(_FOOTER_THREADS, len(stay)))) as pool:
            value_rows = dict(zip(stay, pool.map(lambda v: _rows_in_folder(s, v, batch_id), stay), strict=True))
        located: dict[str, str] = {}
        for name in moved:
            located[name] = f"{plans[name].data_prefix.rstrip('/')}/{s.batch_dir}"
            directories.append(located[name])
            mine = [v for v, t in value_table.items() if t == name]
            for value in mine:  # one value: its folder is the batch directory; more (spellings of one table): in it
                folder = f"{VALUE_KEY}={s.keys[value]}"
                target = located[name] if len(mine) == 1 else f"{located[name]}/{folder}"
                spark_routed.move_folder(spark, f"{s.directory}/{folder}", target)
        fault_point(spark_write.SPARKWRITE_AFTER_FILES)

        def table_files(name: str) -> list[WrittenFile]:
            listed = spark_write.file_names(plans[name].io, located[name])
            found = spark_write.files_of_write(plans[name], located[name], listed, s.write_id, None, batch_id)
            return [f for f in found if f.record_count]

        with ThreadPoolExecutor(max_workers=max(1, min(_FOOTER_THREADS, len(moved)))) as pool:  # footers at once
            files = dict(zip(moved, pool.map(table_files, moved), strict=True))
        rows = {name: sum(f.record_count for f in files[name]) for name in moved}
        for value, n in value_rows.items():
            rows[value_table[value]] = rows.get(value_table[value], 0) + n
        _check_rows(s, rows, batch_id)
        for i, name in enumerate(moved):
            written[name] = spark_write.task_result(
                plans[name], files[name], query_id=query_id, batch_id=batch_id, partition_id=i, run_id=run_id, since_ms=s.since_ms
            )
        rewritten: spark_routed.RoutedSparkWrite | None = None
        if other:  # tables not as lakesink creates them: written from the split's files by Spark
            values = [v for v, t in value_table.items() if t in other]
            keys = [s.keys[v] for v in values]
            with spark_write.session_confs(spark, _PINNED_READ):  # a file Spark cannot read fails the batch
                read = _read_back(spark, df, column, s.template, s.directory, list(s.folders), keys)
                rewritten = spark_routed.write_routed(
                    read.filter(F.col(VALUE_KEY).isin(keys)).drop(VALUE_KEY),
                    batch,
                    plans={n: plans[n] for n in other},
                    values=values,
                    max_records_per_file=max_records_per_file,
                    # each value's rows as its footers give them: the rewrite's files must hold as many (the
                    # tables' digests are this function's, below)
                    found={v: RowsDigest(rows=value_rows[v]) for v in values},
                )
            directories += rewritten.directories
            for t in rewritten.result.tables:
                written[t.table] = dataclasses.replace(t.result, partition_id=len(moved) + other.index(t.table))
    except BaseException:
        for d in reversed(directories):
            spark_write.delete_directory(io, d)
        raise
    digests = {name: RowsDigest(rows.get(name, 0), whole.total, whole.kind) for name in plans}
    return spark_routed.RoutedSparkWrite(
        result=spark_routed.routed_result(
            plans, written, digests, query_id=query_id, batch_id=batch_id, run_id=run_id, first_skipped=len(plans)
        ),
        directories=tuple(directories),
        jobs=1 + (rewritten.jobs if rewritten is not None else 0),
        job_ms=s.job_ms + (rewritten.job_ms if rewritten is not None else 0.0),
        footer_ms=(time.monotonic() - started) * 1000,
    )


def _digest_again(df: DataFrame, s: Split, batch_id: int, held: set[str]) -> RowsDigest:
    """The batch's digest for a replay that finds it in some of its tables only, where the split job counted its rows
    alone (its tables are committed as one unit now, but a crash of an earlier run that committed table by table, or
    a table dropped since, left the batch in some of them): compared by lakesink.driver.committers.routed before the
    other tables are completed, as on a catalog that commits table by table."""
    log.info("lakesink: route-by batch=%s is in %s of its tables only: reading it again for its digest", batch_id, len(held))
    whole = _batch_digest(df)
    if whole.rows != s.batch.rows:
        raise LakesinkError(
            f"route-by with writer='spark': batch {batch_id} gave the split job {s.batch.rows} rows and a second read "
            f"of it {whole.rows} rows: its source does not give the same rows twice, so this replay cannot be compared "
            f"with the tables that hold the batch ({', '.join(sorted(held))}). Nothing is committed; make the source "
            "replayable (docs/routing.md, 'replays')"
        )
    return whole


def _rows_in_folder(s: Split, value: object, batch_id: int) -> int:
    """The rows in the footers of a value's files of the split job (in its folder of the split)."""
    folder = f"{s.directory}/{VALUE_KEY}={s.keys[value]}"
    listed = spark_write.file_names(s.template.io, folder)
    return sum(f.record_count for f in spark_write.files_of_write(s.template, folder, listed, s.write_id, None, batch_id))


def _check_rows(s: Split, rows: Mapping[str, int], batch_id: int) -> None:
    """The rows in the footers of the batch's files (``rows``: per table) must be the rows the split job counted."""
    in_files = sum(rows.values())
    if in_files != s.batch.rows:
        raise LakesinkError(
            f"route-by with writer='spark': the split job of batch {batch_id} wrote {s.batch.rows} rows, but the files "
            f"carrying its write id hold {in_files} rows (per table: "
            f"{', '.join(f'{n} {r}' for n, r in sorted(rows.items()))}): a file was copied, leaked by a task attempt, "
            f"cut short or removed since the job (in {s.directory} or a table's data location). Nothing is committed; "
            "the batch is written again when the query restarts -- check that nothing else writes or deletes under "
            f"the warehouse's {SPLIT_FOLDER} folder or the tables' data directories"
        )


def sweep(io: Any, root: str, batch_id: int) -> None:
    """Delete the query's split directories of batches before ``batch_id`` (a killed driver's; never the running
    batch's: a zombie driver of the previous run may still read it). Never raises."""
    try:
        stale = set()
        for f in storage.list_files(io, root):
            first = f.relative.split("/", 1)[0]
            parsed = names.BatchDirectoryName.parse(first)
            if parsed is not None and parsed.batch_id < batch_id:
                stale.add(first)
        for d in sorted(stale):
            spark_write.delete_directory(io, f"{root.rstrip('/')}/{d}")
    except Exception as e:
        log.warning("lakesink: could not sweep the split area %s (%s); the next run retries", root, e)


__all__ = [
    "BATCH_DIGEST_KIND",
    "MAX_VALUE_BYTES",
    "SPARKSPLIT_AFTER_SPLIT",
    "SPLIT_FOLDER",
    "VALUE_KEY",
    "Split",
    "fits",
    "place",
    "split",
    "split_root",
    "sweep",
]
