"""``spark.read.format("lakesink")``: a Spark Python data source *reader* of Iceberg tables, no Java runtime.

Where each part runs:

- the data source's ``schema()`` and ``reader()`` (:mod:`lakesink.sink.source`), and the reader's
  ``pushFilters`` and ``partitions``, run in a Python worker on the driver while Spark plans the query: they open
  the catalog, resolve the point in time (``snapshot-id``, ``as-of-timestamp``, ``as-of-batch``, ``branch``) and
  plan the scan with pyiceberg, so pushed filters skip data files by partition values and column statistics
  (min/max, null counts);
- ``read`` runs on executors: one partition is a group of pyiceberg file scan tasks, read with pyiceberg's
  own Arrow reader (field-id projection, schema evolution, the row filter) and handed to Spark as Arrow.

Executors unpickle :class:`LakesinkReader` from this module, so it imports executor-safe code only: the
driver side -- opening the catalog and resolving the point in time with the audit package -- is
:func:`lakesink.sink.read.open_read`, which hands the reader the table it resolved (what a worker
really loads: tests/executor/test_boundary.py).

Spark's Python data source API (pyspark 4.x) has filter pushdown (``pushFilters``) but no column pruning hook:
the reader is given the full schema and must return every column. Option ``columns`` reads fewer columns.

Filter pushdown is **off by default** (option ``pushdown``): in the Spark this was built against (pyspark 4.3),
``PythonScanBuilder.pushFilters`` stores the read plan made with the pushed filters on the relation's
``PythonDataSourceV2`` (``ds.setReadInfo``), and a later query of the same DataFrame or view that has no
filter to push reuses that plan: after ``SELECT count(*) FROM v WHERE id < 100``, ``SELECT count(*) FROM v``
returns 100 too. Newer Spark keeps the plan in the scan. With ``pushdown=true`` (and the SQL conf
``spark.sql.python.filterPushdown.enabled=true``), use each loaded DataFrame for one query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyiceberg import expressions
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.io import FileIO
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from lakesink import _pyspark
from lakesink._pyiceberg import io as seam
from lakesink.options import ReadOptions

#: One Spark task reads about this many bytes of data files (small files are grouped).
TARGET_SPLIT_BYTES = 128 * 1024 * 1024

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


@dataclass(frozen=True)
class ResolvedRead:
    """What a read of the table at a point needs: the table, the snapshot and the schema to read with."""

    table: Table
    snapshot_id: int | None
    schema: Schema


def spark_schema(schema: Schema) -> StructType:
    """The Spark schema of an Iceberg schema (through Arrow: timestamptz -> timestamp, timestamp -> timestamp_ntz)."""
    arrow = seam.arrow_schema(schema)
    return from_arrow_schema(pa.schema([f.with_metadata(None) for f in arrow]))


# --- filters --------------------------------------------------------------------------------------

_SCALARS = (bool, int, float, str, Decimal, date)
ex: Any = expressions  # pyiceberg's expressions are pydantic models whose constructors mypy cannot see


def _value(v: Any) -> Any:
    if isinstance(v, datetime):
        if v.tzinfo is None:  # Spark's naive timestamps are in the session time zone: not safe to compare
            raise ValueError("naive datetime")
        return v
    if isinstance(v, _SCALARS):
        return v
    raise ValueError(f"unsupported literal {v!r}")


def to_expression(f: Filter) -> BooleanExpression | None:
    """The pyiceberg expression of a Spark filter, or None when it cannot be expressed exactly."""
    if isinstance(f, Not):
        return _not(f)
    attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(attribute) != 1:
        return None
    name = attribute[0]
    value = getattr(f, "value", None)
    expr: BooleanExpression | None = None
    try:
        if isinstance(f, EqualTo):
            expr = ex.EqualTo(name, _value(value))
        elif isinstance(f, EqualNullSafe):
            expr = ex.IsNull(name) if value is None else ex.EqualTo(name, _value(value))
        elif isinstance(f, GreaterThan):
            expr = ex.GreaterThan(name, _value(value))
        elif isinstance(f, GreaterThanOrEqual):
            expr = ex.GreaterThanOrEqual(name, _value(value))
        elif isinstance(f, LessThan):
            expr = ex.LessThan(name, _value(value))
        elif isinstance(f, LessThanOrEqual):
            expr = ex.LessThanOrEqual(name, _value(value))
        elif isinstance(f, In) and value:
            expr = ex.In(name, {_value(v) for v in value if v is not None})
        elif isinstance(f, IsNull):
            expr = ex.IsNull(name)
        elif isinstance(f, IsNotNull):
            expr = ex.NotNull(name)
        elif isinstance(f, StringStartsWith):
            expr = ex.StartsWith(name, str(value))
    except ValueError:
        return None
    return expr


def _not(f: Not) -> BooleanExpression | None:
    inner = to_expression(f.child)
    return ex.Not(inner) if inner is not None else None


# --- the reader -----------------------------------------------------------------------------------


class FilesPartition(InputPartition):
    """A group of data files read by one Spark task."""

    def __init__(self, index: int, tasks: Sequence[FileScanTask]):
        super().__init__(index)
        self.tasks = list(tasks)


class LakesinkReader(DataSourceReader):
    """Batch reader of a lakesink (any Iceberg) table at a point in time."""

    def __init__(self, options: ReadOptions, schema: StructType, resolved: ResolvedRead):
        """Made on the driver (:meth:`lakesink.sink.source.LakesinkDataSource.reader`), from the table resolved
        at the point the options name (:func:`lakesink.sink.read.open_read`)."""
        self.options = options
        self.snapshot_id = resolved.snapshot_id
        self.schema = resolved.schema
        self.spark_schema = schema
        self.row_filter: BooleanExpression = AlwaysTrue()
        self.pushed: list[str] = []
        self._table: Table | None = resolved.table
        self.metadata: TableMetadata = resolved.table.metadata
        self.io: FileIO = resolved.table.io

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_table"] = None  # executors get metadata and file io, never the catalog
        return state

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep every filter pyiceberg can evaluate to skip files (and rows); all are also returned to Spark.

        Spark evaluates the returned filters again on the rows read: the pushdown only has to be safe (never
        skip a file with a matching row), which pyiceberg's partition and metrics evaluators are.
        """
        for f in filters:
            expr = to_expression(f)
            if expr is not None:
                self.row_filter = expr if isinstance(self.row_filter, AlwaysTrue) else ex.And(self.row_filter, expr)
                self.pushed.append(repr(f))
            yield f

    def plan(self) -> list[FileScanTask]:
        """The data files to read (after skipping by partition values and column statistics)."""
        if self.snapshot_id is None:
            return []
        table = self._table
        if table is None:
            raise AssertionError("planning runs where the reader was made")
        columns = tuple(self.schema.column_names)
        scan = table.scan(snapshot_id=self.snapshot_id, row_filter=self.row_filter, selected_fields=columns)
        return list(scan.plan_files())

    def partitions(self) -> Sequence[InputPartition]:
        tasks = self.plan()
        groups: list[list[FileScanTask]] = []
        size = 0
        for task in sorted(tasks, key=lambda t: t.file.file_path):
            if not groups or size + task.file.file_size_in_bytes > TARGET_SPLIT_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(task)
            size += task.file.file_size_in_bytes
        return [FilesPartition(i, g) for i, g in enumerate(groups)] or [FilesPartition(0, [])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilesPartition)
        if not partition.tasks:
            return
        target = _pyspark.arrow_schema(self.spark_schema)  # what Spark checks (string, not large_string)
        for batch in seam.scan_files(self.metadata, self.io, partition.tasks, schema=self.schema, row_filter=self.row_filter):
            columns = [batch.column(i).cast(target.field(i).type) for i in range(len(target))]
            yield pa.RecordBatch.from_arrays(columns, schema=target)


class LakesinkReaderWithoutPushdown(LakesinkReader):
    """The same reader without ``pushFilters`` (option ``pushdown`` false, for sessions that disable the conf)."""

    pushFilters = DataSourceReader.pushFilters
