"""Executor side of ``format("lakesink")`` with option ``payload`` (and ``cdc-format``): a task's rows staged.

A routed sink whose tables take their columns from the batch's payloads cannot write a table's files before the
whole batch has been seen: a table's columns are the union of what every task's payloads hold, and a table the
batch creates gets its key from the changes' records (lakesink.driver.tables.routed_keys). So each task here:

- parses its rows (option cdc-format: Debezium's envelope, :func:`lakesink.cdc.envelope.changes`, the same columns
  as foreach_batch's Spark parser gives);
- evaluates option delete-when into :data:`lakesink.table.keys.DELETED` (an Iceberg row filter over the stream's
  columns, as format("lakesink")'s upsert writers evaluate it);
- infers each table's columns from its payloads with foreach_batch's own :class:`~lakesink.executor.payload.PayloadInference`
  (the keys its records carry, its last truncate);
- stages the narrow rows the driver needs (routing value, payload, deleted flag, order, Connect schema, op; with
  option dead-letter-table the whole row, from which the commit makes foreach_batch's dead letters) as ONE Parquet
  file under the query's staging area (``<checkpoint>/lakesink/staging/rows``), named like a data file of the batch
  (lakesink.table.names), and returns it with the inference in a :class:`StagedTaskResult`.

A payload column that is a VARIANT (Spark 4) is turned into its JSON text first (lakesink.executor.variant).
With option cdc-transactions=hold a task stages its records as they came, the transaction topic's records beside the
changes (:attr:`StagedPlan.transactions`): the commit decides which are released and stages those with :meth:`stage`.

The driver (lakesink.sink.staged) merges the inferences, opens/creates/widens the tables, and writes the tables'
files from the staged rows with the routed task writer, the code foreach_batch's tasks run. A staged file is never
committed; the abort deletes a failed attempt's, and each commit sweeps those of its batch and earlier ones.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyspark.sql.datasource import WriterCommitMessage

from lakesink.cdc import envelope
from lakesink.executor import payload, variant
from lakesink.executor.messages import TaskIds
from lakesink.executor.upsert_task import deleted_flags
from lakesink.faults import EXECUTOR_BEFORE_RETURN, EXECUTOR_BEFORE_WRITE, fault_point
from lakesink.options import CDC_SOURCE_TIME, CDC_VALUE
from lakesink.table import names, storage
from lakesink.table.keys import DELETED

STAGED_ROWS_FOLDER = "rows"
"""Under the query's staging area: the rows format("lakesink") stages with option payload."""


@dataclass(frozen=True)
class StagedPlan:
    """What a staging task needs (no table: the driver opens them at commit)."""

    root: str
    """``<checkpoint>/lakesink/staging/rows``."""
    io: FileIO = field(repr=False)
    route_column: str
    payload_column: str
    query_id: str | None = None
    cdc: tuple[str, str, str] | None = None
    """Option cdc-format: (the parsed columns' prefix, the payload column, the Connect schema column)."""
    key_column: str | None = None
    """Option cdc-format: Kafka's key (its fields: the key of a table lakesink creates)."""
    truncate_columns: tuple[str, str] | None = None
    """Option cdc-format: (op column, order column)."""
    schema_column: str | None = None
    delete_when: str | None = None
    order_by: str | None = None
    history_time: str | None = None
    """Option history: the column of each change's source time (with cdc-format, the parsed ``source_time``)."""
    upserts: bool = False
    dead_letters: bool = False
    """Option dead-letter-table: the inference is lenient (a field of several JSON types is a string column, each value
    then fits its column or is a dead letter: lakesink.executor.payload), and the whole row is staged (every stream
    column as it came; with cdc-format the Kafka record's value too), so that the commit's routed task writer makes the
    dead letters foreach_batch's tasks make of the same rows (their ``row``, reject-when over the stream's columns)."""
    variant: bool = False
    """The payload column is a VARIANT (Spark 4): each value becomes its JSON text first (Spark's ``to_json`` of it,
    timestamps in UTC: lakesink.executor.variant), as foreach_batch has Spark turn it into that text."""
    transactions: bool = False
    """Option cdc-transactions=hold: the task stages its records as they came (the stream's columns: Kafka's ``value``
    and ``offset``, the transaction topic's ``BEGIN``/``END`` records beside the changes), neither parsed nor inferred.
    Which of them a batch releases is known only once every task's records are joined with those the previous batch
    held back (lakesink.sink.cdc.staged_transactions); the commit stages the released ones as this writer does without
    the option (:meth:`StagedTaskWriter.stage`), so their inference covers exactly the rows committed."""

    def staged_columns(self, names: list[str]) -> list[str]:
        """The columns a staged file holds, in this order (``names``: the task's parsed batch's columns)."""
        if self.dead_letters:
            return list(names)
        out = [self.route_column, self.payload_column]
        if self.upserts:
            out.append(DELETED)
        for c in (self.order_by, self.history_time, self.schema_column, *(self.truncate_columns or ())):
            if c is not None and c not in out:
                out.append(c)
        return out


@dataclass(frozen=True)
class StagedTaskResult(WriterCommitMessage):
    """What a staging task returns: its staged file (None: no row) and, per routing value (raw bytes), the columns its
    payloads hold and what else the inference found (lakesink.executor.payload.Found)."""

    query_id: str
    batch_id: int
    partition_id: int
    run_id: str | None
    file: str | None = None
    rows: int = 0
    columns: Mapping[bytes | None, Mapping[str, pa.DataType | None]] = field(default_factory=dict)
    found: Mapping[bytes | None, payload.Found] = field(default_factory=dict)


class StagedTaskWriter:
    """One task of a format("lakesink") batch with option payload: its rows parsed, inferred and staged."""

    def __init__(self, plan: StagedPlan, ids: TaskIds):
        self._plan = plan
        self._ids = ids

    def _prepared(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        plan = self._plan
        if plan.variant:
            index = batch.schema.get_field_index(plan.payload_column)
            batch = batch.set_column(index, plan.payload_column, variant.json_texts(batch.column(index)))
        if plan.cdc is not None:
            prefix, payload_column, schema_column = plan.cdc
            if plan.dead_letters and "value" in batch.schema.names:  # a dead letter's row holds the record's value
                batch = batch.append_column(CDC_VALUE, batch.column("value"))
            batch = envelope.changes(batch, prefix=prefix, payload_column=payload_column, schema_column=schema_column)
        if plan.upserts:
            flags = deleted_flags(pa.Table.from_batches([batch]), plan.delete_when)
            if isinstance(flags, pa.ChunkedArray):
                flags = flags.combine_chunks()
            batch = batch.append_column(DELETED, flags)
        return batch

    def write(self, batches: Iterator[pa.RecordBatch]) -> StagedTaskResult:
        fault_point(EXECUTOR_BEFORE_WRITE)
        if self._plan.transactions:  # the records as they came: the commit decides which are released
            result = self._stage_rows([b for b in batches if b.num_rows])
        else:
            result = self.stage(batches)
        if result.file is not None:
            try:
                fault_point(EXECUTOR_BEFORE_RETURN)
            except BaseException:
                storage.delete_file(self._plan.io, result.file)
                raise
        return result

    def stage(self, batches: Iterator[pa.RecordBatch]) -> StagedTaskResult:
        """The rows parsed, inferred and staged (also run by the commit over the records a batch releases, option
        cdc-transactions=hold: lakesink.sink.cdc.staged_transactions)."""
        plan = self._plan
        prepared = [b for b in (self._prepared(b) for b in batches if b.num_rows) if b.num_rows]
        if not prepared:
            return self._stage_rows([])
        columns, found = self._inferred(prepared)
        rows = pa.Table.from_batches(prepared)
        return self._stage_rows(rows.select(plan.staged_columns(rows.schema.names)).to_batches(), columns, found)

    def infer(self, batches: Iterator[pa.RecordBatch]) -> StagedTaskResult:
        """The rows parsed and inferred as :meth:`stage` does, nothing staged: a result without a file (option
        cdc-transactions=hold: the changes a batch holds back, whose tables a batch that releases none makes)."""
        ids = self._ids
        prepared = [b for b in (self._prepared(b) for b in batches if b.num_rows) if b.num_rows]
        columns, found = self._inferred(prepared) if prepared else ({}, {})
        return StagedTaskResult(ids.query_id, ids.batch_id, ids.partition_id, ids.run_id, None, 0, columns, found)

    def _inferred(
        self, prepared: list[pa.RecordBatch]
    ) -> tuple[dict[bytes | None, dict[str, pa.DataType | None]], dict[bytes | None, payload.Found]]:
        """Per routing value (raw bytes): the columns its payloads hold, and what else the inference found."""
        plan = self._plan
        inference = payload.PayloadInference(
            plan.route_column,
            plan.payload_column,
            plan.key_column,
            plan.truncate_columns,
            plan.schema_column,
            lenient=plan.dead_letters,
            time_column=CDC_SOURCE_TIME if plan.history_time is not None and plan.cdc is not None else None,
            change_time=CDC_SOURCE_TIME if plan.cdc is not None else None,
        )
        columns: dict[bytes | None, dict[str, pa.DataType | None]] = {}
        found: dict[bytes | None, payload.Found] = {}
        for out in inference(iter(prepared)):
            for raw, cols, more in zip(*(out.column(i).to_pylist() for i in range(3)), strict=True):
                columns[raw] = pickle.loads(cols)
                found[raw] = pickle.loads(more)
        return columns, found

    def _stage_rows(
        self,
        batches: list[pa.RecordBatch],
        columns: Mapping[bytes | None, Mapping[str, pa.DataType | None]] | None = None,
        found: Mapping[bytes | None, payload.Found] | None = None,
    ) -> StagedTaskResult:
        """``batches`` written as the task's one staged file (none: no row)."""
        plan, ids = self._plan, self._ids
        if not batches:
            return StagedTaskResult(ids.query_id, ids.batch_id, ids.partition_id, ids.run_id)
        rows = pa.Table.from_batches(batches)
        name = ids.data_file_name(token=names.new_token(), counter=0)
        path = f"{plan.root.rstrip('/')}/{name}"
        try:
            with plan.io.new_output(path).create(overwrite=True) as stream:
                pq.write_table(rows, stream, compression="zstd")
        except BaseException:
            storage.delete_file(plan.io, path)
            raise
        return StagedTaskResult(
            ids.query_id, ids.batch_id, ids.partition_id, ids.run_id, path, rows.num_rows, columns or {}, found or {}
        )


def read_staged(io: FileIO, path: str) -> Iterator[pa.RecordBatch]:
    """A staged file's rows (on the driver)."""
    with io.new_input(path).open() as stream:
        yield from pq.ParquetFile(stream).iter_batches()
