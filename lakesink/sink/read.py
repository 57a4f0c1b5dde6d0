"""``spark.read.format("lakesink")``: the batch read's driver side -- the table loaded, the options' point in time
resolved (lakesink.audit), the columns selected. :class:`~lakesink.sink.source.LakesinkDataSource`'s ``schema()`` and
``reader()`` call it in a Python worker on the driver machine; the reader object it feeds
(:class:`~lakesink.executor.reader.LakesinkReader`) reads on executors.
"""

from __future__ import annotations

from pyiceberg.table.snapshots import Snapshot
from pyspark.sql.types import StructType

from lakesink.audit import Point, parse_timestamp_ms, resolve
from lakesink.driver import catalogs
from lakesink.errors import PROGRAMMING_ERRORS, AuditError, CatalogError, InvalidOptionError
from lakesink.executor.reader import ResolvedRead, spark_schema
from lakesink.options import ReadOptions
from lakesink.table.keys import MAIN_BRANCH


def open_read(options: ReadOptions) -> ResolvedRead:
    """Load the table and resolve the options' point in time (driver side)."""
    catalog = catalogs.load(options.catalog_name, options.catalog_properties)
    try:
        table = catalog.load_table(options.table.identifier)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise CatalogError(f"cannot read table {options.table}: {type(e).__name__}: {e}") from None
    point = None
    if options.snapshot_id is not None:
        point = Point(snapshot_id=options.snapshot_id)
    elif options.as_of_timestamp is not None:
        try:
            point = Point(timestamp_ms=parse_timestamp_ms(options.as_of_timestamp))
        except ValueError as e:
            raise InvalidOptionError(f"option 'as-of-timestamp' must be epoch milliseconds or an ISO 8601 time: {e}") from None
    elif options.as_of_batch is not None:
        point = Point.parse(f"batch={options.as_of_batch}")
    snapshot: Snapshot | None
    if point is not None:
        snapshot = resolve(table, point, branch=options.branch)
    else:
        snapshot = table.metadata.snapshot_by_name(options.branch)
        if snapshot is None and options.branch != MAIN_BRANCH:
            raise AuditError(f"branch {options.branch!r} of {options.table} does not exist")
    schema = table.schema()
    if snapshot is not None and snapshot.schema_id is not None and point is not None:
        schema = table.metadata.schema_by_id(snapshot.schema_id) or schema
    if options.columns:
        missing = [c for c in options.columns if c not in schema.column_names]
        if missing:
            raise InvalidOptionError(
                f"option 'columns': no column(s) {missing} in {options.table}; columns: {schema.column_names}"
            )
        schema = schema.select(*options.columns)
    return ResolvedRead(table, snapshot.snapshot_id if snapshot else None, schema)


def table_schema(options: ReadOptions) -> StructType:
    return spark_schema(open_read(options).schema)
