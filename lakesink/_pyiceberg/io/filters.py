"""Iceberg row filter expressions: parsed and bound by pyiceberg's parser, evaluated on Arrow rows."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyiceberg.expressions import BooleanExpression
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import _InclusiveMetricsEvaluator, bind, expression_evaluator, inclusive_projection
from pyiceberg.io.pyarrow import (
    expression_to_pyarrow,
)
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema

from lakesink._pyiceberg.io.schemas import new_table_schema
from lakesink.errors import PROGRAMMING_ERRORS
from lakesink.table.keys import (
    INDEX_COLUMN,
)


def parse_row_filter(expression: str) -> BooleanExpression:
    """An Iceberg row filter expression (``op = 'd'``), parsed by pyiceberg."""
    return parse(expression)


def filter_rows(table: pa.Table, expression: str) -> pa.Table:
    """The rows of ``table`` for which the Iceberg row filter ``expression`` is true (names matched as written)."""
    schema = new_table_schema(table.schema)
    bound = bind(schema, parse(expression), case_sensitive=False)
    return table.filter(expression_to_pyarrow(bound, schema))


def filter_arrow(rows: pa.Table, schema: Schema, row_filter: BooleanExpression) -> pa.Table:
    """The rows of ``rows`` (columns named as in ``schema``) for which ``row_filter`` is true."""
    bound = bind(schema, row_filter, case_sensitive=True)
    return rows.filter(expression_to_pyarrow(bound, schema))


def bind_row_filter(expression: str, schema: Schema) -> BooleanExpression:
    """``expression`` read by pyiceberg's expression parser and bound to ``schema`` (column names in any case);
    raises ValueError saying what it could not read or bind."""
    try:
        return bind(schema, parse(expression), case_sensitive=False)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None


def matching_rows(batch: pa.RecordBatch, schema: Schema, row_filter: BooleanExpression) -> pa.BooleanArray:
    """For each row of ``batch`` (columns named as in ``schema``): whether ``row_filter`` (bound by
    :func:`bind_row_filter`) is true for it -- false where it is false or null, as a SQL WHERE."""
    verdict = ds.dataset(pa.Table.from_batches([batch])).to_table(
        columns={INDEX_COLUMN: expression_to_pyarrow(row_filter, schema)}
    )
    return pc.fill_null(verdict.column(INDEX_COLUMN).combine_chunks(), False)


def data_file_may_match(schema: Schema, spec: PartitionSpec, data_file: DataFile, row_filter: BooleanExpression) -> bool:
    """Whether ``data_file`` (of partition spec ``spec``) may hold rows for which ``row_filter`` (unbound, over
    ``schema``'s columns) is true, by its partition values and column metrics, as pyiceberg's scan plans files
    (inclusive projection onto the partition, then the inclusive metrics evaluator): false only when it certainly
    holds none."""
    projected = inclusive_projection(schema, spec, case_sensitive=True)(row_filter)
    partition_schema = Schema(*spec.partition_type(schema).fields)
    if not expression_evaluator(partition_schema, projected, case_sensitive=True)(data_file.partition):
        return False
    return bool(_InclusiveMetricsEvaluator(schema, row_filter, case_sensitive=True, include_empty_files=True).eval(data_file))
