"""What crosses between driver and executors: small, frozen, picklable dataclasses.

The driver sends a :class:`WritePlan` to the executors (inside the pickled Spark writer or the
``mapInArrow`` closure); each task sends back one :class:`TaskResult`. The digests a result carries are defined here
with it, and compared on the driver from here: :func:`schema_digest` (the schema the files were written with) and,
option ``route-by``, :class:`RowsDigest` (the rows a task routed to a table; the row hash that makes one runs in the
tasks: lakesink.executor.row_digest).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.io import FileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyspark.sql.datasource import WriterCommitMessage

from lakesink.executor.upsert_task import UpsertSpec
from lakesink.table import names
from lakesink.table.settings import TableSettings


def schema_digest(schema: Schema) -> str:
    """A short digest of a schema's fields and field ids (not of its schema id): two schemas with the same
    digest write and read Parquet files identically."""
    canonical = Schema(*schema.fields, identifier_field_ids=schema.identifier_field_ids, schema_id=0).model_dump_json()
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:24]


_MASK = (1 << 64) - 1
ROWS_ONLY = "n"
""":attr:`RowsDigest.kind` of a count without a hash (recorded as ``<rows>``)."""


@dataclass(frozen=True)
class RowsDigest:
    """The rows of one task (or of a whole batch) for one table: how many, and the sum of their hashes (mod 2**64),
    as lakesink.executor.row_digest (or Spark, ``kind`` ``"x"``) computes them. Order-independent: the driver adds the
    tasks' digests up (:func:`combine_rows_digests`) and records the sum in the table's commit of the batch; a replay
    that finds the batch in some of its tables compares (:func:`same_rows`) before it completes any other."""

    rows: int = 0
    total: int = 0
    kind: str = ""
    """Which row hash: ``""`` lakesink.executor.row_digest's (the Arrow path), ``"x"`` Spark's ``xxhash64`` of the
    row's columns, the routing column aside (route-by with writer='spark', the two jobs' path: lakesink.sink.spark.routed),
    ``"b"`` the same hash of every column, summed over the whole batch (its split job: lakesink.sink.spark.split; the
    table's own rows, the batch's sum), :data:`ROWS_ONLY` the rows alone (that split job where a batch's tables are
    committed as one unit: no replay compares a hash there)."""

    def add(self, other: RowsDigest) -> RowsDigest:
        return RowsDigest(self.rows + other.rows, (self.total + other.total) & _MASK, self.kind or other.kind)

    def text(self) -> str:
        """As recorded in a commit (``lakesink.batch-rows-digest``): ``<rows>:<kind><16 hex digits>``, or ``<rows>``
        (kind :data:`ROWS_ONLY`: compared with any digest by its rows, :func:`same_rows`)."""
        return str(self.rows) if self.kind == ROWS_ONLY else f"{self.rows}:{self.kind}{self.total:016x}"


def same_rows(recorded: str, replayed: str) -> bool:
    """Do two digests of a table's rows of one batch (:meth:`RowsDigest.text`) tell the same rows? Digests of two
    kinds (the batch committed by one writer, replayed by the other: the Arrow path and route-by with writer='spark'
    hash rows differently; or one of them is a count alone, ``<rows>``) can only compare their row counts."""
    if recorded == replayed:
        return True
    rows_a, hashed_a, hash_a = recorded.partition(":")
    rows_b, hashed_b, hash_b = replayed.partition(":")
    if not hashed_a or not hashed_b or hash_a[:-16] != hash_b[:-16]:
        return rows_a == rows_b
    return False


def combine_rows_digests(digests: list[RowsDigest | None]) -> str | None:
    """The batch's digest for one table from its tasks' (None when a task did not compute one)."""
    total = RowsDigest()
    for d in digests:
        if d is None:
            return None
        total = total.add(d)
    return total.text()


@dataclass(frozen=True)
class TaskIds:
    """Who writes: one attempt of one task of one batch of a query (and the query's run). Every task writer (one table,
    routed, staged) takes it; it names the task's files (lakesink.table.names) and stands in its results."""

    query_id: str
    batch_id: int
    partition_id: int
    task_attempt_id: int
    run_id: str | None = None

    def data_file_name(self, *, token: str, counter: int) -> str:
        """The name of the ``counter``-th data file of this task's writer ``token``."""
        return names.data_file_name(
            query_id=self.query_id,
            batch_id=self.batch_id,
            partition_id=self.partition_id,
            task_attempt_id=self.task_attempt_id,
            token=token,
            counter=counter,
        )


@dataclass(frozen=True)
class WritePlan:
    """Everything an executor needs to write data files for one table: no catalog, no rows."""

    table: str
    location: str
    data_prefix: str
    """Every data file must be created under this prefix (checked by lakesink.table.locations)."""
    properties: Mapping[str, str]
    """The table's properties as they are (pyiceberg's writer helpers read the ``write.parquet.*`` and metrics ones)."""
    settings: TableSettings
    """The table properties lakesink acts on, parsed and validated on the driver."""
    table_uuid: str
    """The table's uuid when the plan was made: a commit into a table with another uuid (dropped and
    recreated meanwhile) is refused."""
    schema: Schema
    """The schema files are written with: the table's, or with ``merge-schema`` the table's evolved to fit
    the stream (committed together with the batch)."""
    schema_id: int
    """The id of the table's schema the plan was made from."""
    spec_id: int
    io: FileIO = field(repr=False)  # pickles by its configuration; may hold storage credentials
    query_id: str | None = None
    last_committed_batch: int | None = None
    """The query's last batch found committed when the plan was made: tasks of a batch at or
    below it are replays and write nothing."""
    spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC
    """The table's default partition spec (``spec_id``): every file holds rows of one partition of it."""
    schema_changes: tuple[Any, ...] = ()
    """lakesink.driver.tables.schema.SchemaChange's turning the table's schema ``schema_id`` into ``schema``
    (``merge-schema``); applied in the batch's commit."""
    sink_id: str | None = None
    upsert: UpsertSpec | None = None
    """format("lakesink") with option upsert-key: each task resolves its rows to one row per key
    (lakesink.executor.upsert_task); None for appends and for foreach_batch (which resolves in Spark)."""
    row_checks: RowChecks | None = None
    """Option dead-letter-table: rows that do not fit become dead letters (lakesink.executor.dead_letters)."""

    @property
    def schema_digest(self) -> str:
        """:func:`schema_digest` of the schema the files are written with (travels back in every TaskResult)."""
        return schema_digest(self.schema)


@dataclass(frozen=True)
class RowChecks:
    """What each task checks its rows against, and where rejected rows go (option ``dead-letter-table``)."""

    dead_letters: WritePlan
    """The write plan of the dead-letter table."""
    reject_when: str | None = None
    """Option ``reject-when``; format("lakesink"): read by Iceberg's expression parser and evaluated on Arrow."""
    reject_column: bool = False
    """foreach_batch: Spark computed ``reject_when`` into the column lakesink.table.dead_letters.REJECT_COLUMN; the
    expression is not evaluated here."""
    upsert_key: tuple[str, ...] = ()
    """A null in one of these columns is a dead letter (``null-upsert-key``)."""


class _Written(Protocol):
    @property
    def record_count(self) -> int: ...

    @property
    def size_in_bytes(self) -> int: ...


class WrittenTotals(ABC):
    """The rows and bytes written, summed over the parts :meth:`written_parts` names (data files, or the task results
    that hold them): one definition for a task's result and for a batch Spark wrote."""

    @abstractmethod
    def written_parts(self) -> Iterable[_Written]:
        """The parts whose rows and bytes add up to this one's."""

    @property
    def record_count(self) -> int:
        return sum(p.record_count for p in self.written_parts())

    @property
    def size_in_bytes(self) -> int:
        return sum(p.size_in_bytes for p in self.written_parts())


@dataclass(frozen=True)
class WrittenFile:
    """One immutable Parquet data file written by a task (pre-commit: not in the table yet)."""

    path: str
    size_in_bytes: int
    record_count: int
    statistics: Mapping[str, Any] = field(repr=False)
    partition: tuple[Any, ...] = ()
    """The file's partition values, one per field of the plan's partition spec, in Iceberg's internal
    representation (days/hours/months/years and buckets as ints, timestamps as micros, dates as days)."""


@dataclass(frozen=True)
class TaskResult(WrittenTotals, WriterCommitMessage):
    """What a task returns to the driver."""

    query_id: str
    batch_id: int
    partition_id: int
    task_attempt_id: int
    schema_id: int
    spec_id: int
    files: tuple[WrittenFile, ...] = ()
    replay_skipped: bool = False
    table_uuid: str | None = None
    """The uuid of the table the files were written for (the plan's)."""
    run_id: str | None = None
    """Spark's run id of the query run the task belongs to (when the task could read it)."""
    written_schema: str | None = None
    """:func:`schema_digest` of the schema the files were written with (field ids), checked against the table at
    commit: a digest, not the schema, so that thousands of task results stay small on the driver."""
    schema_changes: tuple[Any, ...] = ()
    """The plan's schema changes (``merge-schema``): from table schema ``schema_id`` to ``schema``."""
    changes: bytes | None = None
    """With ``WritePlan.upsert``: the keys the task changed, with their deleted flag (Arrow IPC)."""
    history: bytes | None = None
    """Option history (format("lakesink")): every change the task received, for the history table (Arrow IPC,
    lakesink.executor.upsert_task.history_rows)."""
    dead_letters: TaskResult | None = None
    """Option dead-letter-table: the task's rejected rows, written as files of the dead-letter table."""
    rows_in: int = 0
    """Option dead-letter-table: the rows the task received (good and rejected)."""
    rejected: int = 0
    """Option dead-letter-table: how many of them it rejected."""
    reasons: tuple[str, ...] = ()
    """Option dead-letter-table: the first few rejections, for an error message."""
    written_since_ms: int | None = None
    """When the task began writing its files (ms since the epoch, the executor's clock): a commit never uses files
    older than lakesink.table.names.COMMIT_DEADLINE_MS (the orphan clean-up keeps files in flight only so long)."""

    @classmethod
    def of_task(cls, ids: TaskIds, *, schema_id: int, spec_id: int, **more: Any) -> TaskResult:
        """The result of task ``ids`` for a table's schema and spec (``more``: the other fields)."""
        return cls(
            ids.query_id, ids.batch_id, ids.partition_id, ids.task_attempt_id, schema_id, spec_id, run_id=ids.run_id, **more
        )

    def written_parts(self) -> Iterable[WrittenFile]:
        return self.files
