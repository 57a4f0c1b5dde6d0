"""The seam's executor-safe part: Arrow in, Parquet out, Iceberg's metadata files, and reading what tables hold.

Runs in Spark's Python workers as well as on the driver: it imports no catalog, no commit machinery, no SQLAlchemy
(the import contracts of ``make lint``). By what each module talks to: :mod:`~lakesink._pyiceberg.io.schemas` (the
table's schema as files are written with it, batches projected onto it, Arrow types as Iceberg types),
:mod:`~lakesink._pyiceberg.io.parquet` (Parquet files written: writer options, column statistics and metrics, data
file locations), :mod:`~lakesink._pyiceberg.io.partitions` (partition values), :mod:`~lakesink._pyiceberg.io.filters`
(Iceberg row filter expressions), :mod:`~lakesink._pyiceberg.io.deletes` (position delete files written and
read), :mod:`~lakesink._pyiceberg.io.reads` (data files, manifests and metadata files read as pyiceberg's own scan
reads them), :mod:`~lakesink._pyiceberg.io.metadata` (Iceberg's metadata files: table
metadata, manifests and manifest lists written and read by pyiceberg's encoder and decoder, Avro schemas prepared once
per process) and :mod:`~lakesink._pyiceberg.io.floats` (two pyiceberg 0.12.0 bugs
with float and double values in manifests, corrected when this package is imported: every process that writes or
commits imports it). Every name is importable from here (``from lakesink._pyiceberg import io as seam``). Tested against
pyiceberg 0.12.
"""

from __future__ import annotations

from lakesink._pyiceberg.io.deletes import FILE_PATH_ID, POS_ID
from lakesink._pyiceberg.io.filters import (
    bind_row_filter,
    data_file_may_match,
    filter_arrow,
    filter_rows,
    matching_rows,
    parse_row_filter,
)
from lakesink._pyiceberg.io.floats import fast_avro_reads_doubles_as_float32, partition_summaries_merge_signed_zeros
from lakesink._pyiceberg.io.metadata import manifest_entries, read_manifest_list, snapshot_manifests
from lakesink._pyiceberg.io.parquet import (
    bound_value,
    check_write_properties,
    file_key_value_metadata,
    file_statistics,
    metrics_properties,
    new_data_file_name,
    new_data_location,
    parquet_writer_options,
    records_bounds,
    without_sizes_of_unmeasured_columns,
    write_parquet,
)
from lakesink._pyiceberg.io.partitions import (
    column_bounds,
    identity_partition_value,
    partition_of,
    partition_path,
    partition_record_values,
    partition_source_arrays,
    partition_values,
)
from lakesink._pyiceberg.io.reads import (
    added_data_file_paths,
    branch_data_files,
    data_file_entries,
    data_manifests,
    deleted_positions,
    entries_written_by,
    has_delete_files,
    keep_written_columns,
    keep_written_positions,
    live_data_files,
    live_entries,
    other_tables_metadata,
    reachable_files,
    read_columns,
    read_data_file,
    read_table_metadata,
    scan_files,
    snapshot_has_delete_files,
)
from lakesink._pyiceberg.io.schemas import (
    UnsupportedIcebergType,
    arrow_schema,
    file_schema,
    iceberg_type,
    new_table_schema,
    project_batch,
    schema_key,
    stream_schema,
    with_small_types,
)

__all__ = [
    "FILE_PATH_ID",
    "POS_ID",
    "UnsupportedIcebergType",
    "added_data_file_paths",
    "arrow_schema",
    "bind_row_filter",
    "bound_value",
    "branch_data_files",
    "check_write_properties",
    "column_bounds",
    "data_file_entries",
    "data_file_may_match",
    "data_manifests",
    "deleted_positions",
    "entries_written_by",
    "fast_avro_reads_doubles_as_float32",
    "file_key_value_metadata",
    "file_schema",
    "file_statistics",
    "filter_arrow",
    "filter_rows",
    "has_delete_files",
    "iceberg_type",
    "identity_partition_value",
    "keep_written_columns",
    "keep_written_positions",
    "live_data_files",
    "live_entries",
    "manifest_entries",
    "matching_rows",
    "metrics_properties",
    "new_data_file_name",
    "new_data_location",
    "new_table_schema",
    "other_tables_metadata",
    "read_manifest_list",
    "parquet_writer_options",
    "parse_row_filter",
    "partition_of",
    "partition_path",
    "partition_record_values",
    "partition_source_arrays",
    "partition_summaries_merge_signed_zeros",
    "partition_values",
    "project_batch",
    "reachable_files",
    "read_columns",
    "read_data_file",
    "read_table_metadata",
    "records_bounds",
    "scan_files",
    "schema_key",
    "snapshot_manifests",
    "snapshot_has_delete_files",
    "stream_schema",
    "with_small_types",
    "without_sizes_of_unmeasured_columns",
    "write_parquet",
]
