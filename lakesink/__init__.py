"""lakesink: exactly-once streaming from PySpark into Apache Iceberg tables.

Executors write immutable Parquet data files (pre-commit); the driver commits each micro-batch as
one atomic Iceberg snapshot, keyed by the streaming query id and batch id, so that a replayed batch
is recognised and never committed twice.

    import lakesink
    lakesink.register(spark)
    df.writeStream.format("lakesink").option("table", "db.events") \\
        .option("checkpointLocation", "/ck/events").start()

or, in code that already uses foreachBatch:

    df.writeStream.foreachBatch(lakesink.foreach_batch("db.events")) \\
        .option("checkpointLocation", "/ck/events").start()
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from lakesink.errors import (
    AuditError,
    CatalogError,
    CatalogUnavailableError,
    CheckpointError,
    CheckpointInUseError,
    CommitConflictError,
    CommitOutcomeUnknownError,
    ConcurrentTableChangeError,
    DuplicateSinkError,
    InFlightTooLongError,
    InvalidOptionError,
    LakesinkError,
    PublishRefusedError,
    ReplayMismatchError,
    RoutingError,
    SchemaMismatchError,
    TableIdentityChangedError,
    TableLocationError,
    TooManyRejectedError,
    UnavailableValueError,
    UpsertKeyError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.audit import (
        Diff,
        Point,
        PublishResult,
        SnapshotRecord,
        VerifyReport,
        Violation,
        dataframe_at,
        diff,
        history,
        locate,
        publish,
        read_at,
        resolve,
        verify,
    )
    from lakesink.audit.completeness import TableWatermark, WaitResult, table_watermark, wait_for_watermark
    from lakesink.driver.actions.batch import BatchOutcome, Outcome
    from lakesink.driver.catalogs import lakesink_home
    from lakesink.driver.report.metrics import CommitMetrics
    from lakesink.maintenance.compaction import compact
    from lakesink.maintenance.expiry import expire_snapshots
    from lakesink.maintenance.manifest_rewrite import rewrite_manifests
    from lakesink.maintenance.orphans import remove_orphan_files
    from lakesink.maintenance.position_deletes import rewrite_position_deletes
    from lakesink.maintenance.routine import forget_query, maintain
    from lakesink.options import OutputMode, ReadOptions, SinkOptions
    from lakesink.sink.foreach import ForeachBatchSink, foreach_batch
    from lakesink.sink.progress import BatchProgress, CommitProgressListener
    from lakesink.sink.source import LakesinkDataSource

__version__ = "0.1.0"

__all__ = [
    "compact",
    "expire_snapshots",
    "forget_query",
    "maintain",
    "rewrite_manifests",
    "rewrite_position_deletes",
    "AuditError",
    "BatchOutcome",
    "BatchProgress",
    "CommitMetrics",
    "CommitProgressListener",
    "CatalogError",
    "CatalogUnavailableError",
    "CheckpointError",
    "CheckpointInUseError",
    "CommitConflictError",
    "CommitOutcomeUnknownError",
    "ConcurrentTableChangeError",
    "InFlightTooLongError",
    "DuplicateSinkError",
    "Diff",
    "ForeachBatchSink",
    "InvalidOptionError",
    "LakesinkDataSource",
    "LakesinkError",
    "Outcome",
    "OutputMode",
    "Point",
    "PublishRefusedError",
    "PublishResult",
    "ReplayMismatchError",
    "ReadOptions",
    "RoutingError",
    "SchemaMismatchError",
    "SinkOptions",
    "SnapshotRecord",
    "TableIdentityChangedError",
    "TableLocationError",
    "TooManyRejectedError",
    "UnavailableValueError",
    "UpsertKeyError",
    "VerifyReport",
    "Violation",
    "dataframe_at",
    "diff",
    "foreach_batch",
    "history",
    "lakesink_home",
    "locate",
    "publish",
    "read_at",
    "register",
    "remove_orphan_files",
    "resolve",
    "verify",
    "TableWatermark",
    "WaitResult",
    "table_watermark",
    "wait_for_watermark",
]

# The public names, imported on first use (PEP 562). Spark's Python workers import this package
# whenever they unpickle a lakesink object (the data source writer, foreachBatch's mapInArrow
# function); importing the driver side here would load the catalogs, SQLAlchemy and tenacity into
# every executor (tests/executor/test_boundary.py holds that).
_LAZY = {
    **dict.fromkeys(
        (
            "Diff",
            "Point",
            "PublishResult",
            "SnapshotRecord",
            "VerifyReport",
            "Violation",
            "dataframe_at",
            "diff",
            "history",
            "locate",
            "publish",
            "read_at",
            "resolve",
            "verify",
        ),
        "lakesink.audit",
    ),
    **dict.fromkeys(("TableWatermark", "WaitResult", "table_watermark", "wait_for_watermark"), "lakesink.audit.completeness"),
    "lakesink_home": "lakesink.driver.catalogs",
    "LakesinkDataSource": "lakesink.sink.source",
    "BatchOutcome": "lakesink.driver.committers.table",
    "Outcome": "lakesink.driver.committers.table",
    "CommitMetrics": "lakesink.driver.report.metrics",
    "BatchProgress": "lakesink.sink.progress",
    "CommitProgressListener": "lakesink.sink.progress",
    "ForeachBatchSink": "lakesink.sink.foreach",
    "foreach_batch": "lakesink.sink.foreach",
    "remove_orphan_files": "lakesink.maintenance.orphans",
    "compact": "lakesink.maintenance.compaction",
    "expire_snapshots": "lakesink.maintenance.expiry",
    "forget_query": "lakesink.maintenance.routine",
    "maintain": "lakesink.maintenance.routine",
    "rewrite_manifests": "lakesink.maintenance.manifest_rewrite",
    "rewrite_position_deletes": "lakesink.maintenance.position_deletes",
    "OutputMode": "lakesink.options",
    "ReadOptions": "lakesink.options",
    "SinkOptions": "lakesink.options",
}

# Modules the user guides have always named as attributes of the package (``lakesink.catalogs.load(...)``,
# ``lakesink.interop.duckdb_query(...)``), kept reachable under those names since they moved into packages.
_MODULES = {"catalogs": "lakesink.driver.catalogs", "interop": "lakesink.audit.interop"}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _LAZY.get(name)
    if module is None:
        if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")  # a subpackage or module: lakesink.audit.history(...)
        raise AttributeError(f"module 'lakesink' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def register(spark: SparkSession) -> None:
    """Register the ``lakesink`` data source with a Spark session.

    It writes (``writeStream.format("lakesink")``) and reads (``spark.read.format("lakesink")``, see
    :mod:`lakesink.sink.source`). Spark runs the data source in Python workers started with ``PYSPARK_PYTHON``
    (default ``python3`` from ``PATH``), not necessarily this interpreter: when they run on this machine, their
    interpreter is checked here, and one that cannot import lakesink and its dependencies is a
    :class:`LakesinkError` saying the fix (instead of a ``ModuleNotFoundError`` at the query's first batch).
    """
    from lakesink.sink.source import LakesinkDataSource, check_worker_python

    check_worker_python(spark)
    spark.dataSource.register(LakesinkDataSource)
