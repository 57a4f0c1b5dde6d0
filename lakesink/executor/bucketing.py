"""Executor side: Iceberg's bucket transform as a vectorised Arrow UDF, for the Spark path's partitioned writes.

Spark has no Iceberg bucket function: its ``hash`` is Murmur3 x86_32 but with seed 42 (Iceberg's is 0) and its
own byte layout per type (a 4-byte int where Iceberg hashes 8 bytes, the JVM's BigDecimal bytes), so it does
not give Iceberg's bucket for any type. Rather than re-implementing the hash in Spark SQL expressions, the
bucket column is computed by pyiceberg's own transform (pyiceberg-core: iceberg-rust's implementation, the one
the Arrow path uses), in a Python worker that receives only the bucket's source column.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import IcebergType, NestedField

from lakesink._pyiceberg import io as seam


class BucketOf:
    """``pa.Array -> pa.Array`` (int32): Iceberg's ``bucket[num_buckets]`` of each value (null for null).

    Pickled to Python workers with its two fields only.
    """

    def __init__(self, num_buckets: int, source_type: IcebergType):
        self.num_buckets = num_buckets
        self.source_type = source_type

    def __call__(self, values: pa.Array) -> pa.Array:
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_timestamp(values.type) and values.type.tz is not None:
            # Spark hands timestamps over in the session time zone; the stored instant is the same in UTC
            values = values.cast(pa.timestamp("us", "UTC"))
        schema = Schema(NestedField(1, "v", self.source_type, required=False))
        spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(self.num_buckets), name="b"))
        (buckets,) = seam.partition_values(spec, schema, [values])
        return buckets.cast(pa.int32())


def bucket_function(num_buckets: int, source_type: IcebergType) -> Callable[[pa.Array], pa.Array]:
    """:class:`BucketOf` as a plain function with Arrow type hints (what ``pyspark.sql.functions.arrow_udf`` takes)."""
    bucket_of = BucketOf(num_buckets, source_type)

    def bucket(values: pa.Array) -> pa.Array:
        return bucket_of(values)

    return bucket
