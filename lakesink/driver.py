"""Driver side: open (or create) the table, plan the executors' writes, commit or abort a batch.

It never touches rows. The commit is one atomic snapshot per batch, made by compare-and-swap of the
table's metadata pointer in the catalog. Every attempt re-reads the table and re-checks whether the
(query id, batch id) is already committed, *before* it swaps: a check made once and then retried
blindly is how Iceberg's Flink sink committed the same data twice (iceberg#14425).
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from lakesink import _pyiceberg as seam
from lakesink import catalogs, locations, partitioning
from lakesink.errors import (
    CatalogError,
    CatalogUnavailableError,
    CommitConflictError,
    CommitOutcomeUnknownError,
    ConcurrentTableChangeError,
    InvalidOptionError,
    LakesinkError,
)
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_CHECK, DRIVER_BEFORE_SWAP, DRIVER_IN_ABORT, fault_point
from lakesink.messages import TaskResult, WritePlan, WrittenFile
from lakesink.options import OutputMode, SinkOptions
from lakesink.properties import (
    SUMMARY_COMMIT_ATTEMPT,
    SUMMARY_PREVIOUS_BATCH_ID,
    CommittedBatch,
    batch_summary,
    last_batch_key,
    last_committed_on_branch,
)
from lakesink.redaction import redact_secrets_in
from lakesink.schema import SchemaChange, check_writable

log = logging.getLogger("lakesink")

MAIN_BRANCH = "main"
#: Summary key of the empty snapshot lakesink commits to ``main`` of an empty table to start a branch from.
BRANCH_BASE = "lakesink.branch-base"

# Iceberg's commit retry properties and their defaults (the same as Iceberg's Java library).
COMMIT_NUM_RETRIES = ("commit.retry.num-retries", 4)
COMMIT_MIN_WAIT_MS = ("commit.retry.min-wait-ms", 100)
COMMIT_MAX_WAIT_MS = ("commit.retry.max-wait-ms", 60_000)
COMMIT_TOTAL_TIMEOUT_MS = ("commit.retry.total-timeout-ms", 1_800_000)

_SETTLE_ATTEMPTS = 6
_MAX_SIBLINGS_CHECKED = 500
_CATALOG_READ_PATIENCE_S = 30.0


class Outcome(enum.Enum):
    COMMITTED = "committed"
    REPLAY_SKIPPED = "replay skipped"
    EMPTY = "empty batch, nothing to commit"


@dataclass(frozen=True)
class BatchOutcome:
    """What happened to one batch on the driver."""

    outcome: Outcome
    batch_id: int
    snapshot_id: int | None = None
    files: int = 0
    rows: int = 0
    bytes: int = 0
    commit_ms: float = 0.0
    retries: int = 0


@dataclass(frozen=True)
class CommitRetry:
    """Iceberg's ``commit.retry.*`` table properties."""

    num_retries: int
    min_wait_ms: int
    max_wait_ms: int
    total_timeout_ms: int

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> CommitRetry:
        def get(p: tuple[str, int]) -> int:
            return max(0, int(props.get(p[0], p[1])))

        return cls(get(COMMIT_NUM_RETRIES), get(COMMIT_MIN_WAIT_MS), get(COMMIT_MAX_WAIT_MS), get(COMMIT_TOTAL_TIMEOUT_MS))

    def retrying(self) -> Retrying:
        return Retrying(
            stop=stop_after_attempt(self.num_retries + 1) | stop_after_delay(self.total_timeout_ms / 1000),
            wait=wait_exponential_jitter(
                initial=self.min_wait_ms / 1000, max=self.max_wait_ms / 1000, jitter=self.min_wait_ms / 1000
            ),
            retry=retry_if_exception_type(_Conflict),
            reraise=False,
        )


class _Conflict(Exception):
    """One attempt's compare-and-swap lost against another commit (retry after re-checking)."""


class TableCommitter:
    """The driver side of one lakesink sink (one table, one set of options)."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self.catalog = catalogs.load(options.catalog_name, options.catalog_properties)
        self.table_name = str(options.table)

    # --- start of a query: the table and the plan ---------------------------------------------

    def open_table(self, stream_schema: pa.Schema) -> Table:
        """At the start of a query: load the table (creating it and its namespace if missing and allowed),
        check the stream fits it and that its location overlaps no other table's."""
        table = self._load_or_create(stream_schema)
        self._check(table, stream_schema)
        locations.check_no_overlap(self.table_name, table.location(), self._sibling_locations())
        return self._ensure_branch(table)

    def _ensure_branch(self, table: Table) -> Table:
        """With option ``branch``: create the branch from ``main``'s head when it does not exist yet."""
        branch = self.options.branch
        if branch == MAIN_BRANCH or branch in table.metadata.refs:
            return table
        try:
            head = table.metadata.snapshot_by_name(MAIN_BRANCH)
            if head is None:
                # Iceberg writes a branch only from a snapshot: give an empty table an empty snapshot to branch from
                with table.transaction() as tx:
                    with tx.update_snapshot(snapshot_properties={BRANCH_BASE: branch}).fast_append():
                        pass
                table = self.catalog.load_table(self.options.table.identifier)
                head = table.metadata.snapshot_by_name(MAIN_BRANCH)
                assert head is not None
            table.manage_snapshots().create_branch(head.snapshot_id, branch).commit()
            log.info("lakesink: created branch %s of %s at snapshot %s", branch, self.table_name, head.snapshot_id)
        except CommitFailedException:
            pass  # created by another query meanwhile
        return self.catalog.load_table(self.options.table.identifier)

    def reload_table(self) -> Table:
        """For a later batch of a query already opened: the current table (no other table is read; the
        stream is checked against it by :meth:`write_plan`)."""
        try:
            table = self.catalog.load_table(self.options.table.identifier)
        except NoSuchTableError:
            raise CatalogError(f"table {self.table_name} was dropped while the query ran") from None
        except Exception as e:
            raise CatalogError(f"cannot load table {self.table_name}: {self._redact(e)}") from None
        return table

    def _check(self, table: Table, stream_schema: pa.Schema) -> tuple[SchemaChange, ...]:
        """Check the stream against the table (listing every problem); return the ``merge-schema`` changes."""
        changes = check_writable(self.table_name, table.schema(), stream_schema, merge_schema=self.options.merge_schema)
        terms = self.options.partitioned_by
        if terms and not partitioning.same_terms(table.spec(), terms, table.schema()):
            raise InvalidOptionError(
                f"option '{partitioning.PARTITIONED_BY}' is {', '.join(map(str, terms))!r} but table {self.table_name} "
                f"is partitioned by {partitioning.describe(table.spec(), table.schema())!r}; the option only applies "
                "when lakesink creates the table: drop the option (lakesink writes with the table's current spec) or "
                "evolve the table's spec (ALTER TABLE ... ADD/DROP PARTITION FIELD, or pyiceberg's update_spec())"
            )
        locations.data_prefix(self.table_name, table.location(), table.properties)
        return changes

    def _sibling_locations(self) -> list[tuple[str, str]]:
        """Locations of the other tables of the namespace (read once, at the start of a query)."""
        out = []
        ident = self.options.table.identifier
        try:
            siblings = [t for t in self.catalog.list_tables(self.options.table.namespace) if tuple(t) != ident]
        except Exception as e:
            log.warning("lakesink: cannot list the tables of %s (%s); location overlap not checked", ident[:-1], e)
            return []
        if len(siblings) > _MAX_SIBLINGS_CHECKED:
            log.warning(
                "lakesink: namespace of %s has %s tables; location overlap checked against the first %s",
                self.table_name,
                len(siblings),
                _MAX_SIBLINGS_CHECKED,
            )
        for other in siblings[:_MAX_SIBLINGS_CHECKED]:
            try:
                out.append((".".join(other), self.catalog.load_table(other).location()))
            except Exception:
                continue  # dropped meanwhile, or not an Iceberg table
        return out

    def _load_or_create(self, stream_schema: pa.Schema) -> Table:
        ident = self.options.table.identifier
        try:
            return self.catalog.load_table(ident)
        except NoSuchTableError:
            if not self.options.create_table:
                raise CatalogError(
                    f"table {self.table_name} does not exist in catalog {self.catalog.name!r} (option create-table is false)"
                ) from None
        except Exception as e:
            raise CatalogError(f"cannot load table {self.table_name}: {self._redact(e)}") from None
        schema = seam.new_table_schema(stream_schema)
        spec = partitioning.to_spec(self.options.partitioned_by, schema, self.table_name)
        try:
            self.catalog.create_namespace_if_not_exists(self.options.table.namespace)
            table = self.catalog.create_table(ident, schema=schema, partition_spec=spec)
            log.info("lakesink: created table %s in catalog %r", self.table_name, self.catalog.name)
            return table
        except TableAlreadyExistsError:  # another query created it first
            return self.catalog.load_table(ident)
        except Exception as e:
            raise CatalogError(f"cannot create table {self.table_name}: {self._redact(e)}") from None

    def write_plan(self, table: Table, query_id: str | None, stream_schema: pa.Schema | None = None) -> WritePlan:
        """What executors need to write a batch into ``table``; with ``merge-schema`` and a stream that
        needs it, the files are written with the evolved schema (committed with the batch)."""
        last = self._last(table, query_id) if query_id else None
        changes = self._check(table, stream_schema) if stream_schema is not None else ()
        if changes:
            log.info(
                "lakesink: table=%s merge-schema: the next commit will %s",
                self.table_name,
                "; ".join(str(c) for c in changes),
            )
        return WritePlan(
            table=self.table_name,
            location=table.location(),
            data_prefix=locations.data_prefix(self.table_name, table.location(), table.properties),
            properties=dict(table.properties),
            schema=seam.evolved_schema(table, changes) if changes else table.schema(),
            schema_id=table.metadata.current_schema_id,
            spec_id=table.metadata.default_spec_id,
            io=table.io,
            query_id=query_id,
            last_committed_batch=last.batch_id if last else None,
            spec=table.spec(),
            schema_changes=changes,
        )

    def last_committed(self, query_id: str) -> CommittedBatch | None:
        table = self.catalog.load_table(self.options.table.identifier)
        return self._last(table, query_id)

    def _last(self, table: Table, query_id: str) -> CommittedBatch | None:
        """The query's last batch on the branch written (replay check)."""
        return last_committed_on_branch(table.metadata, query_id, self.options.branch)

    # --- commit ---------------------------------------------------------------------------------

    def commit_batch(
        self, *, query_id: str, batch_id: int, results: Sequence[TaskResult], source_offsets: str | None
    ) -> BatchOutcome:
        """Commit the batch's files as one snapshot, exactly once for this (query id, batch id)."""
        started = time.monotonic()
        files = [f for r in results for f in r.files]
        rows = sum(f.record_count for f in files)
        size = sum(f.size_in_bytes for f in files)
        overwrite = self.options.output_mode is OutputMode.COMPLETE

        if results and all(r.replay_skipped for r in results):
            return self._logged(BatchOutcome(Outcome.REPLAY_SKIPPED, batch_id), query_id)
        if not files and not overwrite:
            return self._logged(self._commit_empty(query_id, batch_id), query_id)

        commit_id = uuid.uuid4().hex
        summary = batch_summary(query_id, batch_id, commit_id, source_offsets, started_ms=int(time.time() * 1000))
        paths = [f.path for f in files]
        attempts = 0
        table = self._load_for_commit(batch_id)
        retry = CommitRetry.from_properties(table.properties)
        data_files = None
        try:
            for attempt in retry.retrying():
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        table = self._load_for_commit(batch_id)
                    fault_point(DRIVER_BEFORE_CHECK)
                    done = self._last(table, query_id)
                    if done is not None and done.batch_id >= batch_id:
                        if done.batch_id == batch_id and done.commit_id == commit_id:
                            # an earlier attempt of this very call landed (its response was lost)
                            return self._logged(
                                self._committed(done.snapshot_id, batch_id, files, rows, size, started, attempts),
                                query_id,
                            )
                        self._delete(table, paths, reason="batch already committed (replay)")
                        return self._logged(BatchOutcome(Outcome.REPLAY_SKIPPED, batch_id, retries=attempts - 1), query_id)
                    schema_changes = self._schema_changes_at_commit(table, results, paths)
                    if data_files is None:
                        data_files = [
                            seam.data_file(
                                path=f.path,
                                size_in_bytes=f.size_in_bytes,
                                statistics=f.statistics,
                                spec_id=r.spec_id,
                                partition=f.partition,
                            )
                            for r in results
                            for f in r.files
                        ]
                    prepared = None
                    try:
                        prepared = seam.prepare_snapshot(
                            table,
                            data_files=data_files,
                            overwrite=overwrite,
                            summary={
                                **summary,
                                SUMMARY_COMMIT_ATTEMPT: str(attempts),
                                **({SUMMARY_PREVIOUS_BATCH_ID: str(done.batch_id)} if done is not None else {}),
                            },
                            # the replay marker, in the same atomic commit as the snapshot it names
                            properties=lambda snapshot_id: {
                                last_batch_key(query_id): CommittedBatch(
                                    batch_id, snapshot_id, commit_id, branch=self.options.branch
                                ).to_property()
                            },
                            branch=self.options.branch,
                            schema_changes=schema_changes,
                        )
                        fault_point(DRIVER_BEFORE_SWAP)
                    except BaseException:
                        if prepared is not None:  # failed before the swap: certainly not committed
                            prepared.discard()
                        raise
                    try:
                        prepared.commit()
                    except CommitFailedException as e:
                        prepared.discard()
                        log.info("lakesink: commit of batch %s conflicted (%s); re-checking and retrying", batch_id, e)
                        raise _Conflict(str(e)) from e
                    except Exception as e:
                        settled = self._settle(query_id, batch_id, commit_id)
                        if settled == "landed":
                            pass
                        elif settled == "not-landed":
                            prepared.discard()
                            raise _Conflict(f"commit failed and did not land: {self._redact(e)}") from e
                        elif settled == "other":
                            prepared.discard()
                            self._delete(table, paths, reason="batch committed by another writer")
                            return self._logged(BatchOutcome(Outcome.REPLAY_SKIPPED, batch_id, retries=attempts - 1), query_id)
                        else:
                            raise CommitOutcomeUnknownError(
                                f"commit of batch {batch_id} of query {query_id} to {self.table_name}: the catalog "
                                f"failed ({self._redact(e)}) and the table could not be read to settle the outcome; "
                                "no file was deleted, a restart settles it"
                            ) from None
                    fault_point(DRIVER_AFTER_SWAP)
                    return self._logged(
                        self._committed(prepared.snapshot_id, batch_id, files, rows, size, started, attempts), query_id
                    )
        except RetryError as e:
            self._delete(table, paths, reason="commit retries exhausted")
            raise CommitConflictError(
                f"commit of batch {batch_id} of query {query_id} to {self.table_name} conflicted with other "
                f"writers {attempts} time(s) (commit.retry.num-retries={retry.num_retries}); nothing was "
                "committed and its files were deleted; restarting the query replays the batch"
            ) from e.last_attempt.exception()
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_empty(self, query_id: str, batch_id: int) -> BatchOutcome:
        """Record an empty batch: a properties-only commit moves the query's marker to it.

        The next snapshot of the query then carries ``lakesink.previous-batch-id``, so that a missing batch id
        can be told from an empty batch (``lakesink verify``). The commit asserts the branch head it read.
        """
        commit_id = uuid.uuid4().hex
        attempts = 0
        table = self._load_for_commit(batch_id)
        retry = CommitRetry.from_properties(table.properties)
        try:
            for attempt in retry.retrying():
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        table = self._load_for_commit(batch_id)
                    done = self._last(table, query_id)
                    if done is not None and done.batch_id >= batch_id:
                        return BatchOutcome(Outcome.REPLAY_SKIPPED, batch_id, retries=attempts - 1)
                    head = table.metadata.snapshot_by_name(self.options.branch)
                    marker = CommittedBatch(
                        batch_id, head.snapshot_id if head else -1, commit_id, branch=self.options.branch, empty=True
                    )
                    try:
                        seam.commit_properties_at_head(
                            table, {last_batch_key(query_id): marker.to_property()}, branch=self.options.branch
                        )
                    except CommitFailedException as e:
                        raise _Conflict(str(e)) from e
                    except Exception as e:
                        settled = self._settle(query_id, batch_id, commit_id)
                        if settled == "not-landed":
                            raise _Conflict(f"commit failed and did not land: {self._redact(e)}") from e
                        if settled is None:
                            raise CommitOutcomeUnknownError(
                                f"recording empty batch {batch_id} of query {query_id} in {self.table_name}: the catalog "
                                f"failed ({self._redact(e)}) and the table could not be read; a restart settles it"
                            ) from None
                    return BatchOutcome(Outcome.EMPTY, batch_id, retries=attempts - 1)
        except RetryError as e:
            raise CommitConflictError(
                f"recording empty batch {batch_id} of query {query_id} in {self.table_name} conflicted with other "
                f"writers {attempts} time(s); restarting the query replays the batch"
            ) from e.last_attempt.exception()
        raise AssertionError("unreachable")  # pragma: no cover

    def _load_for_commit(self, batch_id: int) -> Table:
        """Read the table for a commit attempt, riding out a briefly locked or unreachable catalog."""
        retrying = Retrying(
            stop=stop_after_delay(_CATALOG_READ_PATIENCE_S),
            wait=wait_exponential_jitter(initial=0.2, max=5.0),
            retry=retry_if_not_exception_type((NoSuchTableError, LakesinkError)),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self.catalog.load_table(self.options.table.identifier)
        except NoSuchTableError:
            raise CatalogError(f"table {self.table_name} was dropped while batch {batch_id} was written") from None
        except LakesinkError:
            raise
        except Exception as e:
            raise CatalogUnavailableError(
                f"cannot read table {self.table_name} from catalog {self.catalog.name!r} to commit batch {batch_id} "
                f"(tried for {_CATALOG_READ_PATIENCE_S:.0f} s: {self._redact(e)}); nothing was committed; "
                "restart the query when the catalog is available"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _schema_changes_at_commit(
        self, table: Table, results: Sequence[TaskResult], paths: list[str]
    ) -> tuple[SchemaChange, ...]:
        """The schema changes this commit must make for the files to be registered under the schema and
        spec they were written for; raise ConcurrentTableChangeError (deleting the files) when the table
        moved to another schema or spec meanwhile."""
        current = table.schema()
        schema_id = table.metadata.current_schema_id
        spec_id = table.metadata.default_spec_id
        written = [r for r in results if r.files]
        if not written:
            return ()
        stale_spec = {r.spec_id for r in written} - {spec_id}
        problem = None
        if stale_spec:
            problem = f"files were written for partition spec {sorted(stale_spec)[0]}, the table now has spec {spec_id}"
        changes: tuple[SchemaChange, ...] = ()
        for r in written:
            if problem:
                break
            if r.schema is not None and r.schema == current:
                continue  # written with the table's current schema (perhaps evolved by an earlier batch)
            if r.schema is None and r.schema_id == schema_id:
                continue
            if r.schema_changes and r.schema_id == schema_id:
                # merge-schema: the table is still at the schema the plan evolved; evolve it in this commit
                if r.schema is not None and seam.evolved_schema(table, r.schema_changes) != r.schema:
                    problem = "the planned schema evolution no longer gives the schema the files were written with"
                changes = tuple(r.schema_changes)
                continue
            problem = (
                f"files were written for schema {r.schema_id}"
                + (" (+ merge-schema changes)" if r.schema_changes else "")
                + f", the table now has schema {schema_id}"
            )
        if problem:
            self._delete(table, paths, reason="table schema or partition spec changed during the batch")
            raise ConcurrentTableChangeError(
                f"table {self.table_name} changed while the batch was written: {problem}; nothing was committed "
                "and the files were deleted; restart the query to write with the table's new schema/spec"
            )
        return changes

    def _settle(self, query_id: str, batch_id: int, commit_id: str) -> str | None:
        """After an error with unknown outcome: did our commit land? Read the table to find out."""
        for i in range(_SETTLE_ATTEMPTS):
            try:  # connections of its own: never the one that may still hold our failed swap
                table = catalogs.load_table_fresh(
                    self.options.catalog_name, self.options.catalog_properties, self.options.table.identifier
                )
            except Exception:
                time.sleep(min(0.2 * 2**i, 5.0))
                continue
            done = self._last(table, query_id)
            if done is not None and done.batch_id == batch_id and done.commit_id == commit_id:
                return "landed"
            if done is not None and done.batch_id >= batch_id:
                return "other"
            return "not-landed"
        return None

    def _committed(
        self,
        snapshot_id: int,
        batch_id: int,
        files: Sequence[WrittenFile],
        rows: int,
        size: int,
        started: float,
        attempts: int,
    ) -> BatchOutcome:
        return BatchOutcome(
            Outcome.COMMITTED,
            batch_id,
            snapshot_id=snapshot_id,
            files=len(files),
            rows=rows,
            bytes=size,
            commit_ms=(time.monotonic() - started) * 1000,
            retries=attempts - 1,
        )

    def _logged(self, outcome: BatchOutcome, query_id: str) -> BatchOutcome:
        if outcome.outcome is Outcome.COMMITTED:
            log.info(
                "lakesink: table=%s query=%s batch=%s committed snapshot=%s files=%s rows=%s bytes=%s commit_ms=%.1f retries=%s",
                self.table_name,
                query_id,
                outcome.batch_id,
                outcome.snapshot_id,
                outcome.files,
                outcome.rows,
                outcome.bytes,
                outcome.commit_ms,
                outcome.retries,
            )
        else:
            log.info(
                "lakesink: table=%s query=%s batch=%s %s",
                self.table_name,
                query_id,
                outcome.batch_id,
                outcome.outcome.value,
            )
        return outcome

    # --- abort ----------------------------------------------------------------------------------

    def abort_batch(self, *, query_id: str | None, batch_id: int, results: Sequence[TaskResult]) -> None:
        """Delete the files of a batch that certainly did not commit.

        When the batch is found committed, only files the committing snapshot does not reference are
        deleted; when that cannot be established (the table cannot be read, the snapshot expired),
        nothing is deleted (an orphan-file clean-up collects leftovers).
        """
        fault_point(DRIVER_IN_ABORT)
        paths = [f.path for r in results for f in r.files]
        if not paths:
            log.info("lakesink: table=%s batch=%s aborted; no files to delete", self.table_name, batch_id)
            return
        try:
            table = self.catalog.load_table(self.options.table.identifier)
        except Exception as e:
            log.warning(
                "lakesink: abort of batch %s cannot read the table (%s); keeping %s file(s)",
                batch_id,
                self._redact(e),
                len(paths),
            )
            return
        done = self._last(table, query_id) if query_id else None
        if done is not None and done.batch_id >= batch_id:
            # the batch is in the table: keep whatever its snapshot references
            assert query_id is not None
            snapshot_id = done.snapshot_id if done.batch_id == batch_id else seam.find_batch_snapshot(table, query_id, batch_id)
            referenced = seam.added_data_file_paths(table, snapshot_id) if snapshot_id is not None else None
            if referenced is None:
                log.warning(
                    "lakesink: batch %s is committed but its snapshot cannot be read; keeping %s file(s)",
                    batch_id,
                    len(paths),
                )
                return
            paths = [p for p in paths if p not in referenced]
        self._delete(table, paths, reason=f"batch {batch_id} aborted")

    def _delete(self, table: Table, paths: Sequence[str], *, reason: str) -> None:
        for path in paths:
            try:
                seam.delete_file(table.io, path)
            except FileNotFoundError:
                pass
            except Exception as e:
                log.warning("lakesink: could not delete %s (%s); an orphan clean-up collects it", path, self._redact(e))
        if paths:
            log.info("lakesink: table=%s deleted %s unreferenced file(s): %s", self.table_name, len(paths), reason)

    def _redact(self, e: BaseException) -> str:
        _, props = catalogs.resolve_catalog_properties(self.options.catalog_name, self.options.catalog_properties)
        return redact_secrets_in(f"{type(e).__name__}: {e}", props)
