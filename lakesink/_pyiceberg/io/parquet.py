"""Parquet files written: pyiceberg's Parquet writer options, column statistics and metrics modes (with Iceberg
Java's inferred-column limit), data file locations (pyiceberg's location providers), a file's footer read.
"""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    MetricModeTypes,
    _get_parquet_writer_kwargs,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.schema import Schema, index_by_id
from pyiceberg.table import Table
from pyiceberg.table.locations import load_location_provider
from pyiceberg.types import PrimitiveType

from lakesink._pyiceberg.io.schemas import arrow_schema, file_schema, kept_conversion, schema_key, schema_of_key
from lakesink.errors import PROGRAMMING_ERRORS, InvalidOptionError
from lakesink.table.keys import (
    METRICS_COLUMN_PREFIX,
    METRICS_DEFAULT,
    METRICS_MAX_INFERRED,
    METRICS_MAX_INFERRED_DEFAULT,
    METRICS_PREFIX,
)
from lakesink.table.keys import METRICS_MODE_DEFAULT as _METRICS_DEFAULT_MODE
from lakesink.table.keys import ROW_GROUP_BYTES as ROW_GROUP_SIZE_BYTES
from lakesink.table.parquet_layout import dictionary_columns


def parquet_writer_options(table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Parquet writer arguments from the table's ``write.parquet.*`` properties (codec, level, page sizes)."""
    props = {k: v for k, v in table_properties.items() if k != ROW_GROUP_SIZE_BYTES}
    return {"store_decimal_as_integer": True, **_get_parquet_writer_kwargs(props)}


def check_write_properties(table_name: str, schema: Schema, table_properties: Mapping[str, str]) -> None:
    """Run pyiceberg's own parsing of the ``write.parquet.*`` and ``write.metadata.metrics.*`` properties on the
    driver, so that a bad value fails the batch before any task runs, naming the table (not on an executor)."""
    try:
        parquet_writer_options(table_properties)
        _statistics_plan(schema, table_properties)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise InvalidOptionError(
            f"table {table_name} has a table property lakesink's writer cannot use: {type(e).__name__}: {e}; fix it with "
            f"ALTER TABLE {table_name} SET TBLPROPERTIES (...) (docs/options.md lists the properties lakesink reads)"
        ) from None


def records_bounds(schema: Schema, table_properties: Mapping[str, str], field_id: int) -> bool:
    """Whether the files lakesink writes record lower and upper bounds of field ``field_id`` (its metrics mode is
    ``truncate(n)`` or ``full``, not ``none`` or ``counts``)."""
    plan, _ = _statistics_plan(schema, table_properties)
    column = plan.get(field_id)
    return column is not None and column.mode.type.name in ("TRUNCATE", "FULL")


def bound_value(statistics: Mapping[str, Any], field_id: int, iceberg_type: PrimitiveType, *, upper: bool) -> Any:
    """A written file's lower (or upper) bound of one column, decoded from the file's statistics
    (:func:`file_statistics`); None when the file has none (every value null, or no metrics)."""
    raw = (statistics.get("upper_bounds" if upper else "lower_bounds") or {}).get(field_id)
    return from_bytes(iceberg_type, raw) if raw is not None else None


def file_statistics(metadata: pq.FileMetaData, schema: Schema, table_properties: Mapping[str, str]) -> dict[str, Any]:
    """Iceberg column statistics of a written Parquet file, as plain picklable values."""
    plan, columns = _statistics_plan(schema, table_properties)
    stats = data_file_statistics_from_parquet_metadata(
        parquet_metadata=metadata, stats_columns=plan, parquet_column_mapping=columns
    )
    return without_sizes_of_unmeasured_columns(dict(stats.to_serialized_dict()), plan)


def _statistics_plan(schema: Schema, table_properties: Mapping[str, str]) -> tuple[dict[int, Any], dict[str, int]]:
    """pyiceberg's statistics plan of ``schema`` under the table's metrics properties, and its Parquet column paths'
    field ids; kept per schema and metrics properties (:mod:`lakesink._pyiceberg.io.schemas`: the others change with
    every commit of a table with state, its state file's name). Read only by the callers."""
    metrics = sorted((k, v) for k, v in table_properties.items() if k.startswith(METRICS_PREFIX))
    return kept_conversion("statistics-plan", (schema_key(schema), json.dumps(metrics)), _plan_of)


def _plan_of(key: str, metrics: str) -> tuple[dict[int, Any], dict[str, int]]:
    schema = schema_of_key(key)
    plan = compute_statistics_plan(schema, metrics_properties(schema, dict(json.loads(metrics))))
    return plan, parquet_path_to_id_mapping(schema)


def new_data_location(
    table_location: str, table_properties: Mapping[str, str], file_name: str, partition_path: str | None = None
) -> str:
    """Where a new data file goes (honours ``write.data.path``, the object-store layout and partition paths)."""
    provider = load_location_provider(table_location=table_location, table_properties=dict(table_properties))
    key: Any = _PartitionPath(partition_path) if partition_path else None
    return provider.new_data_location(data_file_name=file_name, partition_key=key)


@dataclass(frozen=True)
class _PartitionPath:
    """What pyiceberg's location providers use of a PartitionKey: its path."""

    path: str

    def to_path(self) -> str:
        return self.path


def new_data_file_name(prefix: str) -> str:
    return f"{prefix}-{uuid_module.uuid4().hex}.parquet"


def write_parquet(
    table: Table,
    *,
    location: str,
    row_groups: Iterable[pa.Table],
    schema: Schema,
    dictionary_page_limit: int,
    key_value_metadata: Mapping[str, str] | None = None,
) -> tuple[int, pq.FileMetaData]:
    """Write ``row_groups`` (already in the table schema, with field ids; one row group each, see
    :func:`lakesink.table.parquet_layout.row_groups`) as one Parquet file; (size, footer). The dictionary encoding is
    chosen on the first row group (:func:`lakesink.table.parquet_layout.dictionary_columns`). ``key_value_metadata``
    goes into the file's footer (readers ignore keys they do not know)."""
    arrow = arrow_schema(file_schema(schema))
    if key_value_metadata:
        arrow = arrow.with_metadata({**(arrow.metadata or {}), **{k.encode(): v.encode() for k, v in key_value_metadata.items()}})
    options = parquet_writer_options(table.properties)
    output = table.io.new_output(location)
    writer: pq.ParquetWriter | None = None
    with output.create(overwrite=False) as stream:
        try:
            for group in row_groups:
                group = pa.Table.from_arrays(group.columns, schema=arrow)  # the schema with the field ids
                if writer is None:
                    dictionary = dictionary_columns(group, dictionary_page_limit)
                    writer = pq.ParquetWriter(stream, schema=arrow, **options, use_dictionary=dictionary)
                writer.write_table(group, row_group_size=group.num_rows)
            if writer is None:
                writer = pq.ParquetWriter(stream, schema=arrow, **options)
        finally:
            if writer is not None:
                writer.close()
        metadata = writer.writer.metadata
    return len(table.io.new_input(location)), metadata


def file_key_value_metadata(io: FileIO, path: str) -> dict[str, str]:
    """A Parquet data file's footer key-value metadata (one footer read)."""
    with io.new_input(path).open() as stream:
        metadata = pq.read_metadata(stream).metadata or {}
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in metadata.items()}


def metrics_properties(schema: Schema, table_properties: Mapping[str, str]) -> dict[str, str]:
    """The metrics properties as Iceberg Java's ``MetricsConfig`` reads them, for pyiceberg's statistics plan.

    Without ``write.metadata.metrics.default``, Java records metrics only for the first
    ``write.metadata.metrics.max-inferred-column-defaults`` (100) top-level columns (and their nested fields)
    of a wider table, and none for the others, unless a ``write.metadata.metrics.column.<name>`` says otherwise.
    pyiceberg 0.12 has no such limit: a file of 1,000 columns carried bounds and counts for all of them to the
    driver and into the manifest (4,000 such files per batch: millions of map entries). Expressed here as the
    per-column and default properties pyiceberg does read; a table with at most that many columns keeps its
    properties as they are.
    """
    props = dict(table_properties)
    if METRICS_DEFAULT in props:
        return props
    raw = props.get(METRICS_MAX_INFERRED)
    try:
        limit = METRICS_MAX_INFERRED_DEFAULT if raw is None else int(raw)
    except ValueError:
        raise ValueError(f"{METRICS_MAX_INFERRED} must be a whole number of columns, not {raw!r}") from None
    if limit < 0:  # as Java: a negative value falls back to the default
        limit = METRICS_MAX_INFERRED_DEFAULT
    if len(schema.fields) <= limit:
        return props
    first = Schema(*schema.fields[:limit])
    for field_id in index_by_id(first):
        name = first.find_column_name(field_id)
        if name is not None:
            props.setdefault(METRICS_COLUMN_PREFIX + name, _METRICS_DEFAULT_MODE)
    props[METRICS_DEFAULT] = "none"
    return props


def without_sizes_of_unmeasured_columns(statistics: dict[str, Any], plan: Mapping[int, Any]) -> dict[str, Any]:
    """Drop the column sizes of columns whose metrics mode is ``none``: pyiceberg (as Iceberg Java up to 1.9)
    records a size for every column whatever its mode, so a 1,000-column file still carried 1,000 entries;
    newer Iceberg records no metric at all for a ``none`` column, its size included."""
    sizes = statistics.get("column_sizes")
    if sizes:
        statistics["column_sizes"] = {k: v for k, v in sizes.items() if plan[k].mode.type is not MetricModeTypes.NONE}
    return statistics
