"""Driver side: partitioned tables on the Spark path (:mod:`lakesink.sink.spark.write`).

Spark's Parquet writer writes one partition per file when the DataFrame is written with ``partitionBy``
on computed columns. For each field of the table's partition spec lakesink adds one such column, a
*grouping key*: a Spark expression that takes the same value for two rows exactly when Iceberg's
transform does (so Spark's files hold one Iceberg partition each), and whose text form is a safe,
unambiguous directory name:

==================  ==========================================================================================
transform           grouping key (Spark SQL)
==================  ==========================================================================================
identity            the value (int, long, boolean, decimal); ``unix_date``/``unix_micros`` (date, timestamp);
                    the microseconds of a timestamp_ntz; ``x<hex>`` of a string's UTF-8 bytes or of a binary
                    (``h<sha-256>`` beyond 64 bytes); the text of a float/double (``-0.0`` and ``NaN`` apart)
years, months,      years/months/days/hours since 1970 in UTC, from ``unix_micros`` (timestamp), ``unix_date``
days, hours         (date), or the wall-clock fields of a timestamp_ntz (never the session time zone)
truncate(W)         ``v - pmod(v, W)`` in 64-bit (int, long), on the unscaled value (decimal up to precision
                    18), ``x<hex>`` of the first W characters (string) or bytes (binary)
bucket(N)           pyiceberg's transform in a vectorised Arrow UDF (:mod:`lakesink.executor.bucketing`)
void                (not written by lakesink: a void field fails as unsupported)
==================  ==========================================================================================

The grouping keys never become partition values. The partition values of each file come from the
file itself: its footer's min/max statistics of each source column (Spark writes exact ones: lakesink pins
``parquet.statistics.truncate.length``), run through the same pyiceberg transforms the Arrow path uses;
min and max must give the same value (and a column must be all null or have no null), else the batch
fails. Where the footer has no usable statistics (values over parquet-mr's 4 KiB statistics limit; floats,
whose -0.0/+0.0 bounds are normalised by the Parquet spec) the source column is read from the file and
every value transformed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    TruncateTransform,
    YearTransform,
)
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
    TimestampType,
    TimestamptzType,
)
from pyiceberg.utils.decimal import unscaled_to_decimal
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakesink._pyiceberg import io as seam
from lakesink.errors import LakesinkError
from lakesink.executor.bucketing import bucket_function
from lakesink.table import floats

_MICROS_PER_DAY = 86_400_000_000
_MICROS_PER_HOUR = 3_600_000_000
_HEX_LIMIT = 64  # bytes of a string/binary key written as hex; longer ones as their SHA-256
_TIME = (YearTransform, MonthTransform, DayTransform, HourTransform)
_STATS_UNRELIABLE = (FloatType, DoubleType)  # Parquet normalises -0.0/+0.0 in min/max; NaN is left out


def unsupported_reason(spec: PartitionSpec, schema: Schema) -> str | None:
    """Why the Spark path cannot write a table with this spec, or None when it can."""
    for pf in spec.fields:
        source = schema.find_field(pf.source_id)
        t = source.field_type
        supported = (
            isinstance(pf.transform, (IdentityTransform, BucketTransform))
            or (isinstance(pf.transform, _TIME) and isinstance(t, (DateType, TimestampType, TimestamptzType)))
            or (
                isinstance(pf.transform, TruncateTransform)
                and (
                    isinstance(t, (IntegerType, LongType, StringType, BinaryType))
                    or (isinstance(t, DecimalType) and t.precision <= 18)
                )
            )
        )
        if not supported:
            return f"partition field {pf.name!r} ({pf.transform} of {t}) has no Spark expression in lakesink"
    return None


def key_names(spec: PartitionSpec, schema: Schema) -> list[str]:
    """Names of the grouping-key columns, which name the batch's partition directories: the partition field's
    name (``ts_day``, as Iceberg's writers name the directories) when it is plain (letters, digits, ``_``; not
    hidden) and no table column has it (Spark matches names case-insensitively), else ``lakesink_p<i>``."""
    taken = {n.lower() for n in schema.column_names}
    out: list[str] = []
    for i, pf in enumerate(spec.fields):
        name = pf.name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_]*", pf.name) else f"lakesink_p{i}"
        while name.lower() in taken or name.lower() in {n.lower() for n in out}:
            name = f"lakesink_p{i}" if not name.startswith("lakesink_p") else name + "_"
        out.append(name)
    return out


def _sql_path(schema: Schema, field_id: int) -> str:
    """The source column as Spark SQL (backtick-quoted, struct fields by name)."""
    accessor = schema.accessor_for_field(field_id)
    names: list[str] = []
    fields = schema.fields
    position: Any = accessor
    while position is not None:
        f = fields[position.position]
        names.append(f.name)
        inner = position.inner
        if inner is not None:
            fields = f.field_type.fields
        position = inner
    return ".".join("`" + n.replace("`", "``") + "`" for n in names)


def _floor_div(m: str, d: int) -> str:
    """floor(m / d) in 64-bit integers without overflow (Spark's ``div`` truncates toward zero)."""
    return f"(CASE WHEN {m} >= 0 THEN {m} div {d}L ELSE -((-({m} + 1L)) div {d}L) - 1L END)"


def _bytes_key(b: str) -> str:
    return f"(CASE WHEN octet_length({b}) <= {_HEX_LIMIT} THEN concat('x', hex({b})) ELSE concat('h', sha2({b}, 256)) END)"


def _time_key(transform: Any, t: IcebergType, c: str) -> str:
    """Years (an int), months (``2024-03``), days (a date) or hours (``2024-03-05-10``) in UTC, as Iceberg's
    writers name the directories; from the stored instant (timestamp) or the wall-clock value (timestamp_ntz)."""
    if isinstance(t, TimestamptzType):
        m = f"unix_micros({c})"
        hours = _floor_div(m, _MICROS_PER_HOUR)
        date = f"date_from_unix_date(cast({_floor_div(m, _MICROS_PER_DAY)} AS INT))"
        hour = f"pmod({hours}, 24L)"
    elif isinstance(t, TimestampType):  # timestamp_ntz: its wall-clock fields, with no time zone involved
        date = f"cast({c} AS DATE)"
        hour = f"hour({c})"
    else:
        date, hour = c, "0"
    if isinstance(transform, DayTransform):
        return date
    if isinstance(transform, HourTransform):
        return f"concat(cast({date} AS STRING), '-', lpad(cast({hour} AS STRING), 2, '0'))"
    if isinstance(transform, MonthTransform):
        return f"concat(cast(year({date}) AS STRING), '-', lpad(cast(month({date}) AS STRING), 2, '0'))"
    return f"year({date})"


def _identity_key(t: IcebergType, c: str) -> str:
    if isinstance(t, (BooleanType, IntegerType, LongType, DecimalType)):
        return c
    if isinstance(t, DateType):
        return c
    if isinstance(t, TimestamptzType):
        return f"unix_micros({c})"
    if isinstance(t, TimestampType):  # timestamp_ntz: microseconds of the wall-clock value
        return (
            f"(cast(unix_date(cast({c} AS DATE)) AS BIGINT) * {_MICROS_PER_DAY}L + hour({c}) * {_MICROS_PER_HOUR}L"
            f" + minute({c}) * 60000000L + cast(extract(SECOND FROM {c}) * 1000000 AS BIGINT))"
        )
    if isinstance(t, (FloatType, DoubleType)):
        return f"cast({c} AS STRING)"  # Java's shortest text: -0.0, 0.0, NaN and every other value apart
    if isinstance(t, StringType):
        return _bytes_key(f"encode({c}, 'UTF-8')")
    if isinstance(t, BinaryType):
        return _bytes_key(c)
    raise LakesinkError(f"no Spark grouping key for identity of {t}")


def _truncate_key(width: int, t: IcebergType, c: str) -> str:
    if isinstance(t, (IntegerType, LongType)):
        v = f"cast({c} AS BIGINT)" if isinstance(t, IntegerType) else c
        # Iceberg wraps around near the type's minimum; the unwrapped multiple of W groups the same rows
        return f"(cast({v} AS DECIMAL(20,0)) - pmod({v}, {width}L))"
    if isinstance(t, DecimalType):
        unscaled = f"cast({c} * CAST('1{'0' * t.scale}' AS DECIMAL({t.scale + 1},0)) AS BIGINT)"
        return f"(cast({unscaled} AS DECIMAL(20,0)) - pmod({unscaled}, {width}L))"
    if isinstance(t, StringType):
        return _bytes_key(f"encode(substring({c}, 1, {width}), 'UTF-8')")
    if isinstance(t, BinaryType):
        return _bytes_key(f"substring({c}, 1, {width})")
    raise LakesinkError(f"no Spark grouping key for truncate of {t}")


def grouping_keys(spec: PartitionSpec, schema: Schema) -> list[Column]:
    """One Spark column per partition field (see the module's table), over the columns of the table."""
    out: list[Column] = []
    for pf in spec.fields:
        t = schema.find_field(pf.source_id).field_type
        c = _sql_path(schema, pf.source_id)
        if isinstance(pf.transform, BucketTransform):
            udf = F.arrow_udf(bucket_function(pf.transform.num_buckets, t), "int")  # type: ignore[attr-defined]
            out.append(udf(F.expr(c)))
        elif isinstance(pf.transform, IdentityTransform):
            out.append(F.expr(_identity_key(t, c)))
        elif isinstance(pf.transform, _TIME):
            out.append(F.expr(_time_key(pf.transform, t, c)))
        elif isinstance(pf.transform, TruncateTransform):
            out.append(F.expr(_truncate_key(pf.transform.width, t, c)))
        else:
            raise LakesinkError(f"no Spark grouping key for partition field {pf.name!r} ({pf.transform})")
    return out


def with_grouping_keys(df: DataFrame, spec: PartitionSpec, schema: Schema) -> tuple[DataFrame, list[str]]:
    """``df`` (rows projected onto the table's ``schema``) with one grouping-key column per field of ``spec`` appended
    (:func:`grouping_keys`, named by :func:`key_names`), and their names: Spark's writer writes one directory per key,
    one partition per file (docs/partitioning.md#on-the-spark-path); the keys are not written into the files. An
    unpartitioned spec: ``df`` as it is, no key."""
    if spec.is_unpartitioned():
        return df, []
    file_schema = seam.file_schema(schema)
    names = key_names(spec, file_schema)
    columns = grouping_keys(spec, file_schema)
    return df.select("*", *[c.alias(n) for c, n in zip(columns, names, strict=True)]), names


# --- partition values, from the files -------------------------------------------------------------


def _leaves(fields: Sequence[pa.Field]) -> Iterator[pa.Field]:
    """Leaf fields in Parquet column order."""
    for f in fields:
        t = f.type
        if pa.types.is_struct(t):
            yield from _leaves(list(t))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            yield from _leaves([t.value_field])
        elif pa.types.is_map(t):
            yield from _leaves([t.key_field, t.item_field])
        else:
            yield f


def _from_stat(t: IcebergType, raw: Any) -> Any:
    """A Parquet statistic (physical value, as Spark writes it) as a Python value for a one-element Arrow array."""
    if isinstance(t, DecimalType):
        unscaled = int.from_bytes(raw, "big", signed=True) if isinstance(raw, bytes) else int(raw)
        return unscaled_to_decimal(unscaled, t.scale)
    if isinstance(t, StringType):
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return raw


def _arrow_type(t: IcebergType) -> pa.DataType:
    """The Arrow type of a one-element array of statistics: what Spark hands the Arrow path (``string``,
    ``binary``: pyiceberg-core's truncate refuses ``large_binary``), else pyiceberg's own mapping."""
    if isinstance(t, StringType):
        return pa.string()
    if isinstance(t, BinaryType):
        return pa.binary()
    return seam.arrow_schema(Schema(NestedField(1, "v", t, required=False))).field(0).type


def partition_of_file(
    metadata: pq.FileMetaData, spec: PartitionSpec, schema: Schema, read_columns: Any, path: str
) -> tuple[Any, ...]:
    """The partition record of one data file, from the file (see the module docstring).

    ``read_columns(top_level_names) -> pa.Table`` reads columns of the file (for sources without usable statistics).
    """
    leaves = {
        int(f.metadata[b"PARQUET:field_id"]): i
        for i, f in enumerate(_leaves(list(metadata.schema.to_arrow_schema())))
        if f.metadata and b"PARQUET:field_id" in f.metadata
    }
    rows = metadata.num_rows
    sources: list[pa.Array | None] = []
    for pf in spec.fields:
        t = schema.find_field(pf.source_id).field_type
        sources.append(
            None if isinstance(t, _STATS_UNRELIABLE) else _source_from_stats(metadata, leaves.get(pf.source_id), t, rows)
        )
    if any(s is None for s in sources):
        top = sorted({_top_level(schema, pf.source_id) for pf in spec.fields})
        (batch,) = read_columns(top).combine_chunks().to_batches()  # a file with rows (empty ones are not committed)
        read = seam.partition_source_arrays(spec, batch)
        sources = [s if s is not None else r for s, r in zip(sources, read, strict=True)]
    values = seam.partition_values(spec, schema, [s for s in sources if s is not None])
    record: list[Any] = []
    for pf, v in zip(spec.fields, values, strict=True):
        distinct = set(floats.value_key(x) for x in v.to_pylist())  # NaN equal to NaN, -0.0 apart from 0.0
        if len(distinct) != 1:
            raise LakesinkError(
                f"Spark wrote {path} with rows of more than one partition of field {pf.name!r} ({pf.transform}): "
                f"{sorted(map(repr, distinct))[:4]}; nothing is committed (a bug in lakesink's grouping key for this "
                "transform: write with writer='arrow' and report it)"
            )
        record.append(v[0].as_py())
    return seam.partition_record_values(spec, schema, record)


def _top_level(schema: Schema, field_id: int) -> str:
    accessor = schema.accessor_for_field(field_id)
    return schema.fields[accessor.position].name


def _source_from_stats(metadata: pq.FileMetaData, column: int | None, t: IcebergType, rows: int) -> pa.Array | None:
    """The source's [min, max] (or [null] when it is all null) from the footer; None when the footer cannot tell."""
    if column is None:
        return None
    nulls = 0
    low = high = None
    for g in range(metadata.num_row_groups):
        stats = metadata.row_group(g).column(column).statistics
        if stats is None or not stats.has_null_count:
            return None
        nulls += stats.null_count
        if stats.null_count == metadata.row_group(g).num_rows:
            continue
        if not stats.has_min_max:
            return None
        lo, hi = _from_stat(t, stats.min_raw), _from_stat(t, stats.max_raw)
        low = lo if low is None or lo < low else low
        high = hi if high is None or hi > high else high
    arrow_type = _arrow_type(t)
    if nulls == rows:
        return pa.array([None], arrow_type)
    if nulls:
        return pa.array([None, low], arrow_type)  # both kinds in one file: reported as two partitions
    return pa.array([low, high], arrow_type)
