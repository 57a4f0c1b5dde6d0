"""Driver side, option ``route-by`` with ``writer='spark'`` (:func:`lakesink.foreach_batch`): Spark's own Parquet writer
writes every table of a routed batch, no row passes through a Python worker.

1. :func:`find_routes` -- one Spark job over the batch: its routing values, each with the count and the digest of its
   rows (the sum of Spark's ``xxhash64`` over the row's columns, the routing column aside: one hash aggregation keyed
   by the value), then the tables opened (upserts: :func:`routing_values`, the values only -- the resolve job digests
   the rows it resolves). Each table's count and digest are recorded in its commit
   (``lakesink.batch-rows-digest``, kind ``x``: lakesink.executor.messages) so that a replay that moves rows between
   the same tables stays loud, as on the Arrow path.
2. :func:`write_routed` -- one Spark write job per group of tables whose files look alike (the same file schema with
   field ids, partition spec, Parquet settings and filesystem: tables lakesink creates from one stream are one group;
   at most :data:`MAX_TABLES_PER_JOB` tables a job when it observes digests), partitioned by the table (a folder
   ``__lakesink_route=<n>`` per table) and, for a partitioned table, by its partition keys; it observes nothing (the
   counts and digests of step 1; upserts resolved by Spark bring theirs: lakesink.sink.upsert_batch.resolve_routed;
   given other rows whose digests are not known, the first job observes them, three aggregates per table). The job writes into a
   batch directory of the group's first table; each other table's folder is then renamed into a batch directory of its
   own data location (a rename within one filesystem), so that every committed file lives in its table's location (an
   orphan clean-up of one table never sees another's files). The driver keeps the files carrying the job's write id,
   checks that each table's files hold the rows counted for it, reads their footers (every table's at once) for
   Iceberg's statistics (as the single-table Spark path, lakesink.sink.spark.write) and hands them to the routed commit
   as one unit.

A stream column a table lacks must be null in the rows routed to it (checked by Spark, as the Arrow path checks it);
NOT NULL columns, casts and field ids as in lakesink.sink.spark.write. Tables that hold the batch already (a replay
completing the tables a crash left without it) get no row written, their digest is compared. Any failure before the
commit deletes every directory of the batch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError, SchemaMismatchError
from lakesink.executor.messages import RowsDigest, TaskResult, WritePlan, WrittenFile, WrittenTotals
from lakesink.executor.routed_writer import RoutedTaskResult, TableResult
from lakesink.faults import fault_point
from lakesink.sink.spark import fs as spark_fs
from lakesink.sink.spark import partition as spark_partition
from lakesink.sink.spark import write as spark_write
from lakesink.table import storage
from lakesink.table.keys import ROUTE_PARTITION_COLUMN, ROUTED_NO_COLUMN_MARKER, ROUTED_UNKNOWN_ROUTE_MARKER
from lakesink.table.routes import parse_route, routing_value

log = logging.getLogger("lakesink")

MAX_TABLES_PER_JOB = 64
"""A write job that observes its tables' digests has three aggregates per table: more tables, more jobs (each reads the
batch). A job that observes nothing (the digests known before) writes all the tables of its group."""
ROUTE_KEY = ROUTE_PARTITION_COLUMN
"""The partition column of a routed write job: the table's number in its group (not written into the files)."""
HASH_COLUMN = "__lakesink_row_hash"
"""A column of each row's hash while a job observes its rows (a stream column of that name is refused)."""
_MASK = (1 << 64) - 1
_NO_COLUMN_MARKER = ROUTED_NO_COLUMN_MARKER
_UNKNOWN_ROUTE_MARKER = ROUTED_UNKNOWN_ROUTE_MARKER
_FOOTER_THREADS = 8
DIGEST_KIND = "x"
"""lakesink.executor.messages.RowsDigest.kind of the digests Spark computes here."""


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _hashed(field: T.StructField) -> Column:
    column = F.col(quote(field.name))
    # Spark refuses maps in hash expressions: a map column is hashed as its JSON text
    return F.to_json(column) if isinstance(field.dataType, T.MapType) else column


def check_columns(df: DataFrame, column: str) -> None:
    if column == ROUTE_KEY or ROUTE_KEY in df.columns or HASH_COLUMN in df.columns:
        raise LakesinkError(
            f"the stream has a column {ROUTE_KEY!r} or {HASH_COLUMN!r}, which route-by with writer='spark' uses itself; rename it"
        )


def row_hash(df: DataFrame, column: str | None) -> Column:
    """Spark's ``xxhash64`` of a row's columns, the routing ``column`` aside (the row hash of digest kind ``x``; with
    ``column`` None, of every column: lakesink.sink.spark.split's digest of the whole batch, kind ``b``)."""
    fields = [f for f in df.schema.fields if f.name != column]
    return F.xxhash64(*[_hashed(f) for f in fields]) if fields else F.lit(0).cast("long")


def digest_of(count: Any, high: Any, low: Any) -> RowsDigest:
    """A digest from a row count and its rows' hashes summed as two sums of their 32-bit halves (no overflow)."""
    return RowsDigest(int(count), ((int(high or 0) << 32) + int(low or 0)) & _MASK, DIGEST_KIND)


def digest_aggregates(hashed: Column, where: Column | None = None, suffix: str = "") -> list[Column]:
    """The three aggregates :func:`digest_of` takes (``c``, ``h``, ``l``, each name followed by ``suffix``): the count of
    the rows (those where ``where`` holds), and the sum of their 64-bit row hashes ``hashed`` as two sums of the hashes'
    32-bit halves (no overflow)."""

    def rows(value: Column) -> Column:
        return value if where is None else F.when(where, value)

    return [
        F.count(rows(F.lit(1))).alias(f"c{suffix}"),
        F.sum(rows(F.shiftrightunsigned(hashed, 32))).alias(f"h{suffix}"),
        F.sum(rows(hashed.bitwiseAND(F.lit(0xFFFFFFFF)))).alias(f"l{suffix}"),
    ]


def routing_values(df: DataFrame, column: str) -> list[object]:
    """One Spark job over the batch: its distinct routing values, read as bytes (a value that is not UTF-8 stays itself,
    an invalid route: lakesink.table.routes.routing_value) -- what :func:`find_routes` finds without the counts and
    digests, for a batch whose rows are counted and digested elsewhere (upserts: the resolve job digests the resolved
    rows, lakesink.sink.upsert_batch.resolve_routed; the Arrow path: its tasks)."""
    raw = df.select(F.col(quote(column)).cast("binary")).distinct().collect()
    return [routing_value(None if r[0] is None else bytes(r[0])) for r in raw]


def find_routes(df: DataFrame, column: str) -> dict[object, RowsDigest]:
    """One Spark job over the batch: its routing values, read as bytes (a value that is not UTF-8 stays itself, an
    invalid route: lakesink.table.routes.routing_value), each with the count and digest of the rows carrying it (one
    hash aggregation keyed by the value, in Spark's generated code: the write job then observes nothing). The first
    job over foreach_batch's persisted batch (lakesink.sink.foreach_spark.read_once): it fills the cache."""
    check_columns(df, column)
    hashed = row_hash(df, column)
    grouped = df.groupBy(F.col(quote(column)).cast("binary").alias("value")).agg(*digest_aggregates(hashed))
    raw = grouped.collect()
    return {routing_value(None if r[0] is None else bytes(r[0])): digest_of(r[1], r[2], r[3]) for r in raw}


@dataclass(frozen=True)
class RoutedSparkWrite(WrittenTotals):
    """A routed batch written by Spark's Parquet writer: the result to commit and the directories it wrote."""

    result: RoutedTaskResult
    directories: tuple[str, ...]
    jobs: int = 0
    job_ms: float = 0.0
    footer_ms: float = 0.0

    def written_parts(self) -> Iterable[TaskResult]:
        return (t.result for t in self.result.tables)


def group_key(plan: WritePlan) -> tuple[Any, ...]:
    """Tables with the same key can be written by one job: the same files but for their folder."""
    parts = urlsplit(plan.data_prefix)
    spec = tuple((f.source_id, f.field_id, str(f.transform), f.name) for f in plan.spec.fields)
    return (str(seam.file_schema(plan.schema)), spec, repr(plan.settings), spark_fs.hadoop_scheme(plan.data_prefix), parts.netloc)


@dataclass(frozen=True)
class RoutedBatch:
    """A routed batch as the Spark writers take it: its routing (column, namespace, allowed namespaces) and ids."""

    column: str
    namespace: tuple[str, ...]
    allowed: tuple[tuple[str, ...], ...]
    query_id: str
    batch_id: int
    run_id: str | None

    def tables_by_value(self, values: Sequence[object]) -> dict[object, str]:
        """Each routing value's table (its name: ``t`` and ``db.t`` with namespace ``db`` name one table)."""
        return {v: str(parse_route(v, self.namespace, self.allowed)) for v in values}


def write_routed(
    df: DataFrame,
    batch: RoutedBatch,
    *,
    plans: Mapping[str, WritePlan],
    values: Sequence[object],
    max_records_per_file: int = 0,
    found: Mapping[object, RowsDigest] | None = None,
    table_digests: Mapping[str, RowsDigest] | None = None,
) -> RoutedSparkWrite:
    """Write the rows of every table of ``plans`` that does not hold the ``batch`` yet; nothing is committed. ``values``:
    the batch's routing values (each names a table of ``plans``). ``found``: each value's digest as
    :func:`find_routes` found it in ``df`` (the very rows written): each table's count and digest are then theirs, and
    the write jobs observe nothing; ``table_digests``: the same by table, for rows ``df`` holds (the resolved upserts whose
    hashes lakesink.sink.upsert_batch.resolve_routed collected with their keys); without either the first job also
    observes each table's count and digest (those holding the batch already included: they get their digest only).
    Without observing, one job writes every table of a group of alike tables (:data:`MAX_TABLES_PER_JOB` bounds an
    observing job). On any failure every directory of the batch is deleted before the error propagates."""
    column, query_id, batch_id, run_id = batch.column, batch.query_id, batch.batch_id, batch.run_id
    check_columns(df, column)
    value_table = batch.tables_by_value(values)
    known: dict[str, RowsDigest] | None = None
    if table_digests is not None:
        known = {name: table_digests.get(name, RowsDigest(kind=DIGEST_KIND)) for name in plans}
    elif found is not None:
        known = {name: RowsDigest(kind=DIGEST_KIND) for name in plans}
        for value, found_digest in found.items():
            known[value_table[value]] = known[value_table[value]].add(found_digest)
    held = {n for n, p in plans.items() if p.last_committed_batch is not None and batch_id <= p.last_committed_batch}
    pending = sorted(set(plans) - held)
    by_key: dict[tuple[Any, ...], list[str]] = {}
    for name in pending:
        by_key.setdefault(group_key(plans[name]), []).append(name)
    per_job = MAX_TABLES_PER_JOB if known is None else max(1, len(pending))  # observing: three aggregates per table
    groups = [g[i : i + per_job] for g in by_key.values() for i in range(0, len(g), per_job)]
    written: dict[str, TaskResult] = {}
    digests: dict[str, RowsDigest] = dict(known or {})
    directories: list[str] = []
    job_ms = footer_ms = 0.0
    io = plans[pending[0]].io if pending else None
    try:
        for n, group in enumerate(groups):
            # without ``found``, the first job digests the rows of the tables holding the batch
            observed = sorted(held) if n == 0 and known is None else []
            job = _write_group(
                df, column, group, observed, plans, value_table, query_id, batch_id, max_records_per_file, directories, known
            )
            digests.update(job.digests)
            job_ms += job.job_ms
            footer_ms += job.footer_ms
            for name in group:
                written[name] = spark_write.task_result(
                    plans[name],
                    job.files[name],
                    query_id=query_id,
                    batch_id=batch_id,
                    partition_id=pending.index(name),
                    run_id=run_id,
                    since_ms=job.since_ms,
                )
    except BaseException:
        for d in reversed(directories):
            assert io is not None
            spark_write.delete_directory(io, d)
        raise
    return RoutedSparkWrite(
        result=routed_result(
            plans, written, digests, query_id=query_id, batch_id=batch_id, run_id=run_id, first_skipped=len(pending)
        ),
        directories=tuple(directories),
        jobs=len(groups),
        job_ms=job_ms,
        footer_ms=footer_ms,
    )


@dataclass(frozen=True)
class _Job:
    files: dict[str, list[WrittenFile]]
    digests: dict[str, RowsDigest]
    since_ms: int
    job_ms: float
    footer_ms: float


def _write_group(
    df: DataFrame,
    column: str,
    group: Sequence[str],
    observed: Sequence[str],
    plans: Mapping[str, WritePlan],
    value_table: Mapping[object, str],
    query_id: str,
    batch_id: int,
    max_records_per_file: int,
    directories: list[str],
    known: Mapping[str, RowsDigest] | None,
) -> _Job:
    """One Spark write job for the tables of ``group`` (alike files), digesting their rows and those of ``observed``
    (not written) unless their digests are ``known``; every directory it makes is appended to ``directories`` as soon
    as it exists (the caller deletes them on failure)."""
    first = plans[group[0]]
    spark = df.sparkSession
    job = spark_write.job_directory(first.data_prefix, query_id=query_id, batch_id=batch_id)
    job_dir, batch_dir, token, write_id, since_ms = job.path, job.name, job.token, job.write_id, job.since_ms
    number = {name: i for i, name in enumerate([*group, *observed])}  # written: 0 .. len(group) - 1
    # each routing value -> its table's number, -1: a table of another job
    pairs: list[Column] = []
    for value, name in value_table.items():
        if isinstance(value, str):
            pairs += [F.lit(value), F.lit(number.get(name, -1))]
    routing = F.col(quote(column))
    index = F.element_at(F.create_map(*pairs), routing.cast("string")) if pairs else F.lit(None).cast("int")
    unknown = F.concat(
        F.lit(f"{_UNKNOWN_ROUTE_MARKER}[batch {batch_id}] routing value '"),
        F.coalesce(routing.cast("string"), F.lit("null")),
        F.lit("' was not in the batch when lakesink planned it"),
    )
    route = F.when(index.isNull(), F.raise_error(unknown).cast("int"))
    # a stream column the group's tables lack must be null in the rows routed to them (as the Arrow path checks)
    have = set(first.schema.column_names)
    written_here = (index >= 0) & (index < len(group))
    for extra in (f for f in df.columns if f != column and f not in have):
        message = F.concat(
            F.lit(f"{_NO_COLUMN_MARKER}[{extra}] batch {batch_id} routes a row with a value in column {extra!r} to table "),
            routing.cast("string"),
            F.lit(f", which has no column {extra!r}"),
        )
        route = route.when(written_here & F.col(quote(extra)).isNotNull(), F.raise_error(message).cast("int"))
    key = F.col(ROUTE_KEY)
    rows = df.withColumn(ROUTE_KEY, route.otherwise(index))
    digest: Observation | None = None
    if known is None:
        hashed = F.col(HASH_COLUMN)
        digest = Observation(f"lakesink-digest-{token}")
        aggregates: list[Column] = []
        for i in range(len(number)):  # per table: its rows' count and digest
            aggregates += digest_aggregates(hashed, where=key == i, suffix=str(i))
        rows = rows.withColumn(HASH_COLUMN, row_hash(df, column)).observe(digest, *aggregates)
    rows = rows.filter((key >= 0) & (key < len(group)))
    spark_write.check_refused_settings(spark, first)
    named = first if len(group) == 1 else dataclasses.replace(first, table=f"(one of) {', '.join(group)}")
    projected = spark_write.project(rows, named, batch_id, write_id, extra=[(ROUTE_KEY, key, T.IntegerType())])
    projected, part_keys = spark_partition.with_grouping_keys(projected, first.spec, first.schema)
    keys = [ROUTE_KEY, *part_keys]
    writer = spark_write.parquet_writer(projected, first, keys, job_dir, max_records_per_file)
    fault_point(spark_write.SPARKWRITE_BEFORE_WRITE)
    started = time.monotonic()
    directories.append(job_dir)
    spark_write.save(spark, writer, job_dir, partitioned=True, on_error=lambda e: _raise_own(e, df, named, batch_id))
    written = time.monotonic()
    if digest is not None:
        seen = digest.get
        digests = {name: digest_of(seen[f"c{i}"], seen[f"h{i}"], seen[f"l{i}"]) for name, i in number.items()}
    else:
        assert known is not None
        digests = {name: known[name] for name in group}
    fault_point(spark_write.SPARKWRITE_AFTER_FILES)
    by_table: dict[int, list[str]] = {}
    for relative in spark_write.file_names(first.io, job_dir):
        head, _, rest = relative.partition("/")
        m = re.fullmatch(re.escape(ROUTE_KEY) + r"=(\d+)", head)
        if m is None or not rest:
            if not rest:  # a file of an empty task at the job's root (Spark writes one): nothing in it to commit
                storage.delete_file(first.io, f"{job_dir}/{relative}")
            continue
        by_table.setdefault(int(m.group(1)), []).append(rest)
    located: dict[str, str] = {}
    for name in group:
        i, plan = number[name], plans[name]
        source = f"{job_dir}/{ROUTE_KEY}={i}"
        if plan.data_prefix.rstrip("/") == first.data_prefix.rstrip("/"):
            located[name] = source  # already in the table's own data location
        else:
            located[name] = f"{plan.data_prefix.rstrip('/')}/{batch_dir}"
            directories.append(located[name])
            move_folder(spark, source, located[name])

    def table_files(name: str) -> list[WrittenFile]:
        # the table's files must hold the rows the batch routes to it (found, or observed once per committed task)
        names = sorted(by_table.get(number[name], []))
        found = spark_write.files_of_write(plans[name], located[name], names, write_id, digests[name].rows, batch_id)
        return [f for f in found if f.record_count]

    with ThreadPoolExecutor(max_workers=max(1, min(_FOOTER_THREADS, len(group)))) as pool:  # the tables' footers at once
        files = dict(zip(group, pool.map(table_files, group), strict=True))
    storage.remove_empty_directory(job_dir)
    return _Job(files, digests, since_ms, (written - started) * 1000, (time.monotonic() - written) * 1000)


def move_folder(spark: Any, source: str, target: str) -> None:
    """Move a table's folder of the job into a batch directory of its own data location (same filesystem). A table the
    job wrote no row to has no folder (with upserts: a table whose changes in the batch are all deletes): nothing to
    move (its files must then hold no row, which :func:`spark_write.files_of_write` checks)."""
    local_source, local_target = storage.local_path(source), storage.local_path(target)
    if local_source is not None and local_target is not None:
        if not os.path.exists(local_source):
            return
        os.makedirs(os.path.dirname(local_target), exist_ok=True)
        os.rename(local_source, local_target)
        return
    jvm, jsc = getattr(spark, "_jvm", None), getattr(spark, "_jsc", None)
    if jvm is None or jsc is None:
        raise LakesinkError("route-by with writer='spark' needs the session's JVM (not Spark Connect); use writer='arrow'")
    path = jvm.org.apache.hadoop.fs.Path
    src, dst = path(storage.spark_location(source)), path(storage.spark_location(target))
    fs = src.getFileSystem(jsc.hadoopConfiguration())
    if not fs.exists(src):
        return
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise LakesinkError(
            f"could not move {source} to {target} (route-by with writer='spark' writes every table of a job into one "
            "directory, then moves each table's folder into its own data location): check the permissions on the "
            "tables' locations, or use writer='arrow'"
        )


#: The errors the write job raises itself (by ``raise_error``): its marker, what follows the marker's ``[...]`` up to
#: the end of the message, and lakesink's error built from that text and the batch id.
_OWN_ERRORS: tuple[tuple[str, str, Callable[[str, int], LakesinkError]], ...] = (
    (
        _NO_COLUMN_MARKER,
        r"[^\n]*?which has no column '[^']*'",
        lambda found, batch_id: SchemaMismatchError(
            f"{found}; nothing was committed. Add the column to the table, or set option merge-schema=true "
            "(lakesink adds it in the batch's commit)"
        ),
    ),
    (
        _UNKNOWN_ROUTE_MARKER,
        r"[^\n]*?planned it",
        lambda found, batch_id: LakesinkError(
            f"batch {batch_id}: {found}: the batch's rows changed between two reads (a non-deterministic source or "
            "query). Nothing was committed; make the routing column deterministic"
        ),
    ),
)


def _raise_own(error: Exception, df: DataFrame, plan: WritePlan, batch_id: int) -> None:
    """A failed write job whose failure lakesink raised itself (by ``raise_error``): lakesink's error."""
    text = str(error)
    for marker, message, build in _OWN_ERRORS:
        m = re.search(re.escape(marker) + r"\[[^\]]+\] (" + message + ")", text)
        if m is not None:
            raise build(m.group(1), batch_id) from None
    spark_write.raise_not_null(error, df, plan, batch_id)


def routed_result(
    plans: Mapping[str, WritePlan],
    written: Mapping[str, TaskResult],
    digests: Mapping[str, Any],
    *,
    query_id: str,
    batch_id: int,
    run_id: str | None,
    first_skipped: int,
) -> RoutedTaskResult:
    """The batch's result: each table's written files, or (a table that holds the batch already: nothing written, its
    digest compared) a replay-skipped result numbered from ``first_skipped``."""
    tables: list[TableResult] = []
    for name, plan in sorted(plans.items()):
        result = written.get(name) or TaskResult(
            query_id=query_id,
            batch_id=batch_id,
            partition_id=first_skipped + len(tables),
            task_attempt_id=-1,
            schema_id=plan.schema_id,
            spec_id=plan.spec_id,
            replay_skipped=True,
            table_uuid=plan.table_uuid or None,
            run_id=run_id,
            written_schema=plan.schema_digest,
        )
        tables.append(TableResult(name, result, rows_digest=digests.get(name)))
    return RoutedTaskResult(query_id, batch_id, 0, run_id, tuple(tables))
