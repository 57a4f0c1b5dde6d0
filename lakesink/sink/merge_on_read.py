"""Merge-on-read upserts on foreach_batch: a batch's keys looked up in the table by Spark's executors, and the position
delete files written there (the driver never reads a data file's rows).

For one table whose write modes say merge-on-read (lakesink.table.settings.merge_on_read), :func:`lookup`, against the
branch head as it reads it:

1. finds the **candidate files** on the driver from manifests only, as the copy-on-write does: the live data files whose
   partition and key-column bounds can hold a key of the batch (lakesink.driver.actions.upsert.BatchKeys.may_hold), and
   the live position delete files that may apply to them (equality deletes: a loud refusal);
2. has **Spark** read the candidates' key columns (and, with option order-by, the table's order-by column) with each
   row's file and position (``_metadata.file_path``, ``_metadata.row_index``: Spark 3.5+), join them with the batch's
   keys (sent as a broadcast table), and drop the positions the table's position deletes delete already (an anti-join
   with the delete files Spark reads too: Spark's Parquet read applies no Iceberg delete). With order-by the stored row's
   order value is compared with the change's in the same join, as Spark SQL orders (the copy-on-write's rule): a change
   older than the row is stale -- not applied, and its row not written;
3. has the **executors** write the position delete files for the matched rows of the changes that win
   (lakesink.executor.position_deletes.LookupWriter, one file per partition per task), and return them with the
   matched keys.

The result (lakesink.driver.actions.upsert_mor.MergeLookup) goes with the batch's rows -- written afterwards by the
usual write paths, without the stale changes (:func:`without_stale`) -- to the commit, one row delta.
"""

from __future__ import annotations

import functools
import logging
import pickle
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import threads as seam_threads
from lakesink.driver.actions import upsert, upsert_order
from lakesink.driver.actions.batch import BatchCall, BatchOutcome
from lakesink.driver.actions.history import HistoryChanges
from lakesink.driver.actions.row_delta import delete_target
from lakesink.driver.actions.upsert_mor import (
    DRIVER_LOOKUP_PARTITION_ID,
    LOOKUP_ATTEMPTS,
    LookupRequest,
    MergeLookup,
    MergeLookups,
    request_for,
)
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.loop import validation
from lakesink.errors import (
    CommitOutcomeUnknownError,
    InvalidOptionError,
    LakesinkError,
    RowDeltaConflictError,
    UpsertKeyError,
)
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.position_deletes import (
    DeleteTarget,
    DeleteTaskResult,
    LookupTaskResult,
    LookupWriter,
    lookup_result,
    matched_rows,
)
from lakesink.executor.task_writer import TASK_RESULT_SCHEMA, utc_schema
from lakesink.options import SinkOptions
from lakesink.table import floats, settings, storage
from lakesink.table.keys import DELETED, HELD_COLUMN, LOOKUP_BRANCH, LOOKUP_PATH, LOOKUP_POS, LOOKUP_SPARK_PATH, LOOKUP_STALE
from lakesink.table.keys import ORDER_COLUMN as ORDER
from lakesink.table.numbering import row_numbers

log = logging.getLogger("lakesink")

_KEY = "__lakesink_path_key"
_SPARK_PATH = LOOKUP_SPARK_PATH
_CLASH = "__lakesink_null_order"
#: A candidate file's index among a table's candidates, in :func:`_matched_here`'s one join.
_FILE = "__lakesink_lookup_file"
_BRANCH = LOOKUP_BRANCH


def fallback_reason(table: Table, options: SinkOptions) -> str | None:
    """Why this merge-on-read table's batch is upserted copy-on-write instead (None: it is not): a key or order-by
    column renamed since some of its files were written (Spark reads the files' columns by name)."""
    schema = table.schema()
    wanted = list(schema.identifier_field_ids)
    if options.order_by is not None:
        try:
            wanted.append(schema.find_field(options.order_by, case_sensitive=False).field_id)
        except ValueError:
            pass
    for field_id in wanted:
        name = schema.find_field(field_id).name
        for old in table.metadata.schemas:
            try:
                if old.find_field(field_id).name != name:
                    return f"column {name} was renamed (schema {old.schema_id} named it {old.find_field(field_id).name})"
            except ValueError:
                continue
    return None


def applies(table: Table, table_name: str, options: SinkOptions, *, by_name: bool = True) -> bool:
    """Whether an upsert batch into ``table`` is applied merge-on-read (its write modes: lakesink.table.settings), else
    copy-on-write -- also, with a warning, when the lookup reads the table's files by name (``by_name``: Spark's) and
    cannot (a key or order-by column renamed: :func:`fallback_reason`). A merge-on-read table of format version 1:
    InvalidOptionError."""
    if not settings.merge_on_read(table_name, table.properties):
        return False
    if table.metadata.format_version < 2:
        raise InvalidOptionError(
            f"table {table_name} says merge-on-read (write.merge.mode), but is Iceberg format version 1, which holds "
            "no delete files; upgrade it (table property format-version=2) or set write.merge.mode=copy-on-write"
        )
    reason = fallback_reason(table, options) if by_name else None
    if reason is not None:
        log.warning("lakesink: table=%s merge-on-read, but the batch is upserted copy-on-write: %s", table_name, reason)
        return False
    return True


@dataclass(frozen=True)
class RoutedLookups:
    """Option route-by on foreach_batch (lakesink.driver.committers.routed.RoutedCommitter.merge_lookup): a routed batch's
    keys looked up in each of its merge-on-read tables by Spark's executors, after its rows were written (the batch's
    stale changes are then dropped from its own files by the commit: MergeLookup.written_without_stale)."""

    spark: SparkSession

    def __call__(
        self, requests: Sequence[LookupRequest], *, query_id: str, batch_id: int, run_id: str | None
    ) -> dict[str, MergeLookup]:
        return _look_up(self.spark, requests, query_id=query_id, batch_id=batch_id, run_id=run_id)


def _look_up(
    spark: SparkSession | None, requests: Sequence[LookupRequest], *, query_id: str, batch_id: int, run_id: str | None
) -> dict[str, MergeLookup]:
    """Every request's lookup: planned on the threads a unit's commits are prepared on (lakesink._pyiceberg.threads:
    on object storage enough to overlap the round trips, on the local filesystem the cores, the work being CPU under
    one GIL; a table whose candidate files are small, or every table without ``spark``, is looked up right there), the
    others run in as few Spark jobs as :func:`_run` makes (the tables' reads, joins and delete writers as branches of a
    union, whose stages run side by side) and then finished. On any error every delete file written for the batch is
    deleted before it is raised."""
    wanted = [r for r in requests if applies(r.table, r.table_name, r.options, by_name=spark is not None)]
    found: dict[str, MergeLookup] = {}
    pending: list[tuple[str, _Pending]] = []
    failure: BaseException | None = None

    def plan(r: LookupRequest) -> _Pending | tuple[MergeLookup, pa.Table | None]:
        return _prepare(
            spark,
            r.table,
            schema=r.schema,
            changes=r.changes,
            options=r.options,
            table_name=r.table_name,
            query_id=query_id,
            batch_id=batch_id,
            run_id=run_id,
        )

    threads = seam_threads.unit_threads([r.table for r in wanted])
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(wanted))), thread_name_prefix="lakesink-lookup") as pool:
        futures = [(r.table_name, pool.submit(plan, r)) for r in wanted]
        for name, future in futures:
            try:
                step = future.result()
            except BaseException as e:  # the others still finish: their delete files are deleted below
                failure = failure or e
                continue
            if isinstance(step, _Pending):
                pending.append((name, step))
            else:
                found[name] = step[0]
    try:
        if failure is not None:
            raise failure
        results = _run([p for _, p in pending])
        while pending:
            name, p = pending.pop(0)  # (a finish that fails deletes its own delete files)
            found[name] = p.finish(results.pop(0))[0]
    except BaseException:
        for _, p in pending:  # looked up, not yet taken: their delete files go too
            p.abort()
        for r in wanted:
            if r.table_name in found:
                storage.delete_failed_task_files(r.table.io, list(found[r.table_name].paths))
        raise
    return found


def look_up_here(
    requests: Sequence[LookupRequest], *, query_id: str, batch_id: int, run_id: str | None
) -> dict[str, MergeLookup]:
    """``format("lakesink")``'s merge-on-read lookups (one table, or route-by's tables: lakesink.driver.committers.
    routed.RoutedCommitter.merge_lookup). Spark commits its batches in a Python worker that has no Spark session, so
    that process looks the keys up itself: it reads the candidate files' key (and order-by) columns only, by field id
    (a renamed column is read as it is now), each row's position counted in the file, and writes the position delete
    files -- the same rows and files the executors find and write on foreach_batch (:func:`lookup`). The batch's rows
    were written by the tasks already: its stale changes are dropped from its own files by the commit."""
    found = _look_up(None, requests, query_id=query_id, batch_id=batch_id, run_id=run_id)
    return {name: replace(one, written_without_stale=False) for name, one in found.items()}


class TableMergeOnRead:
    """``format("lakesink")`` into one table (option upsert-key): the batch's commit (lakesink.sink.datasource.
    StreamCommits) through its table's committer, a merge-on-read table's keys looked up first (:func:`look_up_here`)
    and committed with the rows as one row delta; a lookup out of date at the commit (RowDeltaConflictError) deletes
    its delete files and looks again on the new head (LOOKUP_ATTEMPTS). Every other batch commits as before."""

    def __init__(self, committer: TableCommitter, lookups: MergeLookups | None = None):
        self.committer = committer
        self.lookups: MergeLookups = lookups if lookups is not None else look_up_here

    def commit_batch(
        self,
        call: BatchCall,
        results: Sequence[TaskResult],
        *,
        table_uuid: str | None = None,
        history: HistoryChanges | None = None,
    ) -> BatchOutcome:
        """``table_uuid``: the table the batch was planned for; ``history``: the batch's changes for its history table
        (TableCommitter.commit_batch's)."""
        c = self.committer
        if not c.options.upsert_key:
            return c.commit_batch(call, results, table_uuid=table_uuid, history=history)
        for attempt in range(1, LOOKUP_ATTEMPTS + 1):
            with c.batch_turn():  # this process's maintenance waits from the lookup to the commit
                found = self._lookup(c.table.reload_table(), call, results)
                if found is None:
                    return c.commit_batch(call, results, table_uuid=table_uuid, history=history)
                try:
                    return c.commit_batch(call, results, table_uuid=table_uuid, merge=found, history=history)
                except CommitOutcomeUnknownError:
                    raise  # the delete files may be referenced by a commit the catalog still applies: kept
                except RowDeltaConflictError as e:
                    c.abort_deletes(query_id=call.query_id, batch_id=call.batch_id, paths=found.paths)
                    if attempt == LOOKUP_ATTEMPTS:
                        raise
                    log.warning(
                        "lakesink: table=%s batch=%s: the merge-on-read lookup is out of date (%s); looking the keys up "
                        "again on the new head (attempt %s of %s)",
                        c.table.table_name,
                        call.batch_id,
                        e,
                        attempt + 1,
                        LOOKUP_ATTEMPTS,
                    )
                except BaseException:
                    c.abort_deletes(query_id=call.query_id, batch_id=call.batch_id, paths=found.paths)
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[TaskResult]) -> None:
        self.committer.abort_batch(query_id=query_id, batch_id=batch_id, results=results)

    def _lookup(self, table: Table, call: BatchCall, results: Sequence[TaskResult]) -> MergeLookup | None:
        c = self.committer
        parts = [r.changes for r in results if r.changes]
        if (
            not parts
            or any(r.replay_skipped for r in results)
            or not settings.merge_on_read(c.table.table_name, table.properties)
        ):
            return None
        done = c.table.last(table, call.query_id)
        if done is not None and done.batch_id >= call.batch_id:
            return None  # a replay: the commit finds it
        schema = c.write_plan(table, call.query_id).schema
        request = request_for(c.table.table_name, table, parts, schema=schema, options=c.options, batch_id=call.batch_id)
        if request is None:
            return None
        return self.lookups([request], query_id=call.query_id, batch_id=call.batch_id, run_id=call.run_id).get(c.table.table_name)


def lookup(
    spark: SparkSession | None,
    table: Table,
    *,
    schema: Schema,
    changes: pa.Table,
    options: SinkOptions,
    table_name: str,
    query_id: str,
    batch_id: int,
    run_id: str | None,
) -> tuple[MergeLookup, pa.Table | None]:
    """The batch's keys (``changes``: lakesink.sink.upsert_batch.ResolvedBatch.keys) looked up in ``table`` at its branch
    head (the module's description), in the schema the batch's files are written in (``schema``: the write plan's);
    returns the lookup and the stale upserts' keys (key columns as the batch spells them, None: none), whose rows must
    not be written (:func:`without_stale`). Without ``spark`` this process reads and writes (:func:`look_up_here`)."""
    step = _prepare(
        spark,
        table,
        schema=schema,
        changes=changes,
        options=options,
        table_name=table_name,
        query_id=query_id,
        batch_id=batch_id,
        run_id=run_id,
    )
    if not isinstance(step, _Pending):
        return step
    return step.finish(_run([step])[0])


#: At most this many tables' lookups in one Spark job: each is a shuffle of its own, and a union of a hundred shuffles
#: ran many times slower than their jobs one by one (every shuffle stage materialised at once; the JVM's heap thrashed).
LOOKUPS_PER_JOB = 8


def _run(pending: Sequence[_Pending]) -> list[list[LookupTaskResult]]:
    """The lookups' Spark plans run as few jobs (unions of up to :data:`LOOKUPS_PER_JOB`, each branch tagged with its
    index); each one's task results."""
    results: list[list[LookupTaskResult]] = [[] for _ in pending]
    tagged = [p.writes.withColumn(_BRANCH, F.lit(i)) for i, p in enumerate(pending) if p.writes is not None]
    for start in range(0, len(tagged), LOOKUPS_PER_JOB):
        for row in functools.reduce(DataFrame.union, tagged[start : start + LOOKUPS_PER_JOB]).collect():
            results[row[1]].append(pickle.loads(row[0]))
    return results


@dataclass
class _Pending:
    """A table's lookup planned, to run in Spark (:attr:`writes`) and then be finished with its tasks' results."""

    table_name: str
    batch_id: int
    keys: upsert.BatchKeys
    check: upsert_order.OrderCheck | None
    candidates: Sequence[DataFile]
    base: int | None
    target: DeleteTarget
    writes: DataFrame | None
    """The lookup's Spark plan: the delete writers' task results (TASK_RESULT_SCHEMA); None: looked up here."""
    deletes: tuple[DeleteTaskResult, ...] = ()

    def abort(self) -> None:
        _abort(self.target, self.deletes)

    def finish(self, results: Sequence[LookupTaskResult]) -> tuple[MergeLookup, pa.Table | None]:
        keys, check, table_name, batch_id = self.keys, self.check, self.table_name, self.batch_id
        key_names = [f.name for f in keys.fields]
        self.deletes = deletes = tuple(d for r in results for d in r.deletes)
        try:
            found = matched_rows(results)
            updated, deleted = 0, 0
            if found is not None and found.num_rows:
                _check_found(found, keys, check, table_name, batch_id)
                found = upsert._cast_like(found, keys.table.select(key_names).schema)
                distinct = found.group_by([*key_names, DELETED, LOOKUP_STALE]).aggregate([])
                won = distinct.filter(pc.invert(distinct.column(LOOKUP_STALE)))
                deleted = int(pc.sum(won.column(DELETED)).as_py() or 0)
                updated = won.num_rows - deleted
                lost = distinct.filter(distinct.column(LOOKUP_STALE))
                if check is not None and lost.num_rows:
                    check.stale.append(lost.select([*key_names, DELETED]))
                    check.stale_in_files += int(pc.sum(pc.invert(lost.column(DELETED))).as_py() or 0)
        except BaseException:
            self.abort()
            raise
        counts = upsert.Rewrite(
            spec_id=0,
            inserted=keys.upserts - updated,
            updated=updated,
            deleted=deleted,
            files_considered=len(self.candidates),
        )
        log.info(
            "lakesink: table=%s batch=%s merge-on-read lookup: candidate_files=%s delete_files=%s updated=%s deleted=%s",
            table_name,
            batch_id,
            len(self.candidates),
            sum(len(d.files) for d in deletes),
            updated,
            deleted,
        )
        return MergeLookup(keys, check, deletes, self.base, counts), _stale_upserts(keys, check)


def _prepare(
    spark: SparkSession | None,
    table: Table,
    *,
    schema: Schema,
    changes: pa.Table,
    options: SinkOptions,
    table_name: str,
    query_id: str,
    batch_id: int,
    run_id: str | None,
) -> _Pending | tuple[MergeLookup, pa.Table | None]:
    """:func:`lookup`'s driver part: the candidate files from the manifests, and the Spark plan that reads, joins and
    writes the delete files (:class:`_Pending`); a finished lookup when no file may hold a key of the batch, or when
    there is no ``spark`` (this process reads and writes: :func:`_matched_here`)."""
    branch = options.branch
    keys = upsert.BatchKeys(table_name, schema, changes)
    check: upsert_order.OrderCheck | None = None
    if options.order_by is not None:
        keys, check = upsert_order.start(table, schema, keys, order_by=options.order_by, branch=branch, batch_id=batch_id)
    head = table.metadata.snapshot_by_name(branch)
    entries = seam.live_entries(table, branch, kept=True)  # read, never changed
    if equality := [e.data_file.file_path for e in entries if e.data_file.content == DataFileContent.EQUALITY_DELETES]:
        raise LakesinkError(
            f"table {table_name} (branch {branch}) has {len(equality)} equality delete file(s) (e.g. {equality[0]}), "
            "written by another engine; lakesink neither reads nor applies equality deletes, and its upserts would keep "
            "rows they delete. Compact the table with an engine that applies them (Spark's rewrite_data_files with "
            "delete-file-threshold=1) and restart the query"
        )
    specs, table_schema = table.specs(), table.schema()
    data = [e.data_file for e in entries if e.data_file.content == DataFileContent.DATA]
    candidates = [f for f in data if keys.may_hold(f, specs, table_schema)] if len(keys) else []
    counts = upsert.Rewrite(spec_id=0, inserted=keys.upserts, files_considered=len(candidates))
    base = head.snapshot_id if head is not None else None
    if not candidates:
        return MergeLookup(keys, check, (), base, counts), _stale_upserts(keys, check)
    positions = [e.data_file for e in entries if e.data_file.content == DataFileContent.POSITION_DELETES]
    applying = _deletes_applying(candidates, positions, specs)
    key_names = [f.name for f in keys.fields]
    order_column = check.table_column if check is not None else None
    read = [*key_names, *([order_column] if order_column is not None and order_column not in key_names else [])]
    if spark is not None:
        read_ids = [schema.find_field(n).field_id for n in read]
        read_bytes = sum(_column_bytes(f, read_ids) for f in candidates) + sum(d.file_size_in_bytes for d in applying)
        if read_bytes <= settings.TableSettings.parse(table_name, table.properties).driver_lookup_bytes:
            spark = None  # a few small column chunks: read here, a Spark job would cost more than the read
    batch_keys = keys.table.select([*key_names, DELETED, *([ORDER] if ORDER in keys.table.column_names else [])])
    outcome = (*key_names, DELETED, _CLASH, *([HELD_COLUMN] if order_column is not None else []))
    target = delete_target(table, branch=branch, candidates=candidates)
    if spark is None:
        matched_here = _matched_here(table, candidates, applying, schema.select(*read), batch_keys, order_column)
        ids = TaskIds(query_id, batch_id, DRIVER_LOOKUP_PARTITION_ID, 0, run_id)
        here = _Pending(table_name, batch_id, keys, check, candidates, base, target, None)
        return here.finish([lookup_result(target, ids, outcome, matched_here.to_batches())])
    arrow = utc_schema(seam.arrow_schema(schema))
    rows = (
        spark.read.schema(from_arrow_schema(pa.schema([arrow.field(n) for n in read])))
        .option("recursiveFileLookup", "true")  # no partition discovery from the folders' names
        .parquet(*[storage.spark_location(f.file_path) for f in candidates])
        .select(
            *[_col(n) for n in read],
            F.col("_metadata.file_path").alias(_SPARK_PATH),
            F.col("_metadata.row_index").alias(LOOKUP_POS),
        )
    )
    if order_column is not None:
        rows = rows.withColumn(HELD_COLUMN, _col(order_column))
        if order_column not in key_names:
            rows = rows.drop(order_column)
    matched = rows.join(F.broadcast(spark.createDataFrame(batch_keys)), key_names, "inner")
    # each row's data file as the table's manifests name it (Spark names it by its URL-encoded URI)
    files = spark.createDataFrame(
        [(_path_key(f.file_path), f.file_path) for f in candidates], f"{_KEY} string, {LOOKUP_PATH} string"
    )
    matched = matched.withColumn(_KEY, _spark_path_key(F.col(_SPARK_PATH))).join(F.broadcast(files), _KEY, "left")
    if applying:
        gone = (
            spark.read.schema("file_path string, pos long")
            .option("recursiveFileLookup", "true")
            .parquet(*[storage.spark_location(d.file_path) for d in applying])
            .select(F.col("file_path").alias(LOOKUP_PATH), F.col("pos").alias(LOOKUP_POS))
        )
        matched = matched.join(gone, [LOOKUP_PATH, LOOKUP_POS], "left_anti")  # rows the table deleted already
    stale, clash = _stale(matched, order_column is not None and ORDER in batch_keys.column_names)
    matched = matched.withColumn(LOOKUP_STALE, stale).withColumn(_CLASH, clash)
    writer = LookupWriter(target, query_id, batch_id, outcome, run_id)
    writes = matched.repartition(F.col(LOOKUP_PATH)).mapInArrow(writer, TASK_RESULT_SCHEMA)
    return _Pending(table_name, batch_id, keys, check, candidates, base, target, writes)


def _column_bytes(data_file: DataFile, field_ids: Sequence[int]) -> int:
    """The bytes a lookup reads of a data file: its column chunks of ``field_ids`` as its manifest entry records them
    (``column_sizes``), else the whole file's size."""
    sizes = data_file.column_sizes or {}
    if all(i in sizes for i in field_ids):
        return sum(int(sizes[i]) for i in field_ids)
    return int(data_file.file_size_in_bytes)


def _matched_here(
    table: Table,
    candidates: Sequence[DataFile],
    applying: Sequence[DataFile],
    read: Schema,
    batch_keys: pa.Table,
    order_column: str | None,
) -> pa.Table:
    """The Spark plan's matched rows (:func:`_prepare`), found in this process: each candidate's ``read`` columns (key
    and order-by, by field id: pyiceberg's projection) with each row's position (its index in the file: no row filter,
    no delete applied), the positions the table's position deletes delete already dropped, joined with the batch's
    keys; staleness and null-order clashes as :func:`_stale` tells them."""
    key_names = [n for n in batch_keys.column_names if n not in (DELETED, ORDER)]
    paths = {f.file_path for f in candidates}
    gone: dict[str, pa.Array] = {}
    for d in applying:
        for path, positions in seam.deleted_positions(table.io, d).items():
            if path in paths:
                gone[path] = pa.concat_arrays([gone[path], positions]) if path in gone else positions
    key_schema = batch_keys.select(key_names).schema
    # every candidate's rows, each tagged with its file's index, joined with the batch's keys at once: one join a
    # table, not one a file (a join's fixed cost is most of a small file's)
    parts: list[pa.Table] = []
    for i, f in enumerate(candidates):
        rows = seam.read_columns(table, f, read)
        stored = upsert._cast_like(rows.select(key_names), key_schema)
        if order_column is not None:
            stored = stored.append_column(HELD_COLUMN, rows.column(order_column))
        stored = stored.append_column(LOOKUP_POS, row_numbers(rows.num_rows))
        parts.append(stored.append_column(_FILE, pa.repeat(pa.scalar(i, pa.int32()), rows.num_rows)))
    stored_rows = pa.concat_tables(parts, promote_options="permissive")
    hit = stored_rows.join(batch_keys, key_names, join_type="inner", use_threads=False)
    deleted = [(i, gone[f.file_path]) for i, f in enumerate(candidates) if f.file_path in gone]
    if deleted and hit.num_rows:  # the rows deleted already, among the few the keys hit (not the files' every row)
        already = pa.table({
            _FILE: pa.concat_arrays([pa.repeat(pa.scalar(i, pa.int32()), len(p)) for i, p in deleted]),
            LOOKUP_POS: pa.concat_arrays([p.cast(pa.int64()) for _, p in deleted]),
        })  # fmt: skip
        hit = hit.join(already, [_FILE, LOOKUP_POS], join_type="left anti", use_threads=False)
    locations = pa.array([f.file_path for f in candidates], pa.string())
    matched = hit.drop_columns([_FILE]).append_column(LOOKUP_PATH, pc.take(locations, hit.column(_FILE)))
    stale, clash = _stale_here(matched, order_column is not None and ORDER in batch_keys.column_names)
    return matched.append_column(LOOKUP_STALE, stale).append_column(_CLASH, clash)


def _stale_here(matched: pa.Table, ordered: bool) -> tuple[pa.Array, pa.Array]:
    """:func:`_stale` in Arrow: a change older than the row (Spark SQL's order: NaN greatest; a null on either side is
    no order), and a null change against a non-null row."""
    if not ordered:
        none = pa.array([False] * matched.num_rows, pa.bool_())
        return none, none
    change = matched.column(ORDER)
    held = matched.column(HELD_COLUMN)
    if pa.types.is_null(change.type) or pa.types.is_null(held.type):
        none = pa.array([False] * matched.num_rows, pa.bool_())
        return none, pc.and_(held.is_valid(), change.is_null()).combine_chunks()
    held = pc.cast(held, change.type)
    stale = pc.fill_null(pc.greater(floats.spark_order(held), floats.spark_order(change)), False)
    clash = pc.and_(held.is_valid(), change.is_null())
    return stale.combine_chunks(), clash.combine_chunks()


def without_stale(rows: DataFrame, stale: pa.Table | None) -> DataFrame:
    """The batch's rows to write without those of its stale upserts (``stale``: their keys as the batch spells them)."""
    if stale is None or not stale.num_rows:
        return rows
    lost = rows.sparkSession.createDataFrame(stale)
    return rows.join(F.broadcast(lost), list(stale.column_names), "left_anti")


def _stale_upserts(keys: upsert.BatchKeys, check: upsert_order.OrderCheck | None) -> pa.Table | None:
    """The stale upserts' keys (the order file's and the live rows'), under the batch's spelling of the key columns."""
    if check is None or not check.stale:
        return None
    stale = pa.concat_tables(check.stale)
    rows = stale.filter(pc.invert(stale.column(DELETED))).select([f.name for f in keys.fields])
    return rows.rename_columns(list(keys.names)) if rows.num_rows else None


def _stale(matched: DataFrame, ordered: bool) -> tuple[Column, Column]:
    """Per matched row: whether the batch's change is older than the row (the row's order value greater: Spark SQL's
    order, NaN greatest, null lowest), and whether the change's order value is null against a row's non-null one."""
    if not ordered:
        return F.lit(False), F.lit(False)
    change_type = matched.schema[ORDER].dataType
    held = F.col(HELD_COLUMN).cast(change_type)
    change = F.col(ORDER)
    stale = F.when(held.isNull() | change.isNull(), F.lit(False)).otherwise(held > change)
    return stale, held.isNotNull() & change.isNull()


def _check_found(
    found: pa.Table, keys: upsert.BatchKeys, check: upsert_order.OrderCheck | None, table_name: str, batch_id: int
) -> None:
    """A null order value against a row's non-null one: a loud error, as the copy-on-write's order check raises."""
    clash = found.column(_CLASH)
    if check is not None and pc.any(clash).as_py():
        row = found.filter(clash).slice(0, 1).to_pylist()[0]
        key = ", ".join(f"{k}={row[k]!r}" for k in check.key_names)
        raise UpsertKeyError(
            f"batch {batch_id}: option 'order-by' column {check.column!r} is null for key ({key}) of table "
            f"{table_name}, which holds order value {row.get(HELD_COLUMN)!r} for it: a change without an order value "
            "cannot be ordered after it. Nothing was committed; give every change an order value"
        )


def _deletes_applying(
    candidates: Sequence[DataFile], deletes: Sequence[DataFile], specs: dict[int, PartitionSpec]
) -> list[DataFile]:
    """The position delete files that may apply to a candidate (same spec and partition, its path in their bounds)."""
    by_partition: dict[tuple[object, ...], list[DataFile]] = {}
    for f in candidates:
        by_partition.setdefault((f.spec_id, floats.partition_key(seam.partition_of(f))), []).append(f)
    out = []
    for d in deletes:
        same = by_partition.get((d.spec_id, floats.partition_key(seam.partition_of(d))), [])
        if any(validation.may_apply(d, f, specs) for f in same):
            out.append(d)
    return out


def _path_key(path: str) -> str:
    """A data file's path as :func:`_spark_path_key` spells Spark's name of it (``file:`` and a bare path one, s3a s3)."""
    return re.sub(r"^s3a://", "s3://", re.sub(r"^file:/+", "/", path))


def _spark_path_key(column: Column) -> Column:
    # Spark's _metadata.file_path is the file's URI, percent-encoded; a '+' stays itself (url_decode would make it a space)
    decoded = F.url_decode(F.regexp_replace(column, r"\+", "%2B"))
    return F.regexp_replace(F.regexp_replace(decoded, r"^file:/+", "/"), r"^s3a://", "s3://")


def _col(name: str) -> Column:
    return F.col("`" + name.replace("`", "``") + "`")


def _abort(target: DeleteTarget, deletes: Sequence[DeleteTaskResult]) -> None:
    paths = [f.path for d in deletes for f in d.files]
    if paths:
        storage.delete_failed_task_files(target.io, paths)
