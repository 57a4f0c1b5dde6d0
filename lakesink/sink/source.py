"""The class Spark registers for ``format("lakesink")``: :class:`LakesinkDataSource`, a thin factory.

Spark pickles this class (by reference: its module and name) into the Python workers it starts on the driver
machine for the data source: the one that makes the instance from the options, the one that calls
``streamWriter()`` at each start of the query, the one that commits and aborts its batches, the one that plans a
batch read. Each such worker imports this module before it knows which of these steps it runs. So this module
imports no driver code: each method imports the module that does its step when it runs -- the stream writer and
its committer (:mod:`lakesink.sink.datasource`: the driver's committers, the catalogs, SQLAlchemy) or the batch
read (:mod:`lakesink.sink.read`: lakesink.audit's point-in-time resolution). A worker that only makes the instance
pays for neither; one that writes does not load the audit code. tests/sink/test_worker_imports.py holds it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from lakesink.errors import LakesinkError
from lakesink.table.keys import ENV_LOG_LEVEL, LOG_LEVEL_DEFAULT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakesink.executor.stream_writer import LakesinkStreamWriter


def _log_to_stderr_in_workers() -> None:
    """Spark's Python workers have no logging set up; give lakesink's lines a handler there."""
    logger = logging.getLogger("lakesink")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    level = os.environ.get(ENV_LOG_LEVEL, LOG_LEVEL_DEFAULT).upper()
    if not isinstance(logging.getLevelName(level), int):
        logger.warning("lakesink: %s=%r is not a logging level; using %s", ENV_LOG_LEVEL, level, LOG_LEVEL_DEFAULT)
        level = LOG_LEVEL_DEFAULT
    logger.setLevel(level)


WORKER_MODULES = ("lakesink", "pyiceberg", "pyarrow", "pyspark")
"""What a Python worker of the data source imports first (its own module's imports)."""
_CHECKED: set[str] = set()


def check_worker_python(spark: SparkSession) -> None:
    """At :func:`lakesink.register`: the interpreter Spark's Python workers run on this machine can find lakesink and
    its dependencies (found, not imported: tens of milliseconds, once per interpreter); a LakesinkError naming it and
    the fix otherwise. Workers elsewhere (a cluster, Spark Connect) are not checked."""
    from lakesink import _pyspark  # driver side only (this module is imported by every worker of the data source)

    python = _pyspark.local_worker_python(spark)
    if python is None or python == sys.executable or python in _CHECKED:
        return
    found = shutil.which(python)
    fix = (
        f"set os.environ['PYSPARK_PYTHON'] = sys.executable (here {sys.executable}) before the SparkSession starts, or "
        "run the job with its virtual environment activated (docs/quickstart.md, the PYSPARK_PYTHON trap)"
    )
    if found is None:
        raise LakesinkError(f"Spark starts its Python workers with {python!r} (PYSPARK_PYTHON), which is not found: {fix}")
    script = "import importlib.util as u, sys; sys.exit(', '.join(m for m in sys.argv[1:] if u.find_spec(m) is None) or None)"
    try:  # the worker's folder: the driver's (a local master), where `import lakesink` also finds a checkout
        probe = subprocess.run([found, "-c", script, *WORKER_MODULES], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return  # not a verdict: the query's first batch will tell
    if probe.returncode == 0:
        _CHECKED.add(python)
        return
    missing = probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit status {probe.returncode}"
    raise LakesinkError(
        f"Spark starts its Python workers with {python!r} ({found}), which cannot import {missing}: format('lakesink') "
        f"would fail at its first batch with ModuleNotFoundError; {fix}"
    )


class LakesinkDataSource(DataSource):
    """The ``lakesink`` streaming sink, and a batch reader of its tables. Register it with :func:`lakesink.register`."""

    @classmethod
    def name(cls) -> str:
        return "lakesink"

    def schema(self) -> StructType:
        """The table's schema at the point in time the read options name (``spark.read.format("lakesink")``)."""
        from lakesink.options import ReadOptions
        from lakesink.sink.read import table_schema

        return table_schema(ReadOptions.from_spark_options(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader of the table (see :mod:`lakesink.executor.reader`)."""
        from lakesink.executor.reader import LakesinkReader, LakesinkReaderWithoutPushdown
        from lakesink.options import ReadOptions
        from lakesink.sink.read import open_read

        options = ReadOptions.from_spark_options(dict(self.options))
        reader = LakesinkReader if options.pushdown else LakesinkReaderWithoutPushdown
        return reader(options, schema, open_read(options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> LakesinkStreamWriter:
        """The writer of one run of the query, or of a commit worker's commits and aborts (:mod:`lakesink.sink.datasource`).

        This is the first place lakesink sees the options of ``format("lakesink")``: ``start()`` runs no Python code of
        a data source; Spark makes the writer in the query's own thread when it plans the first batch, and an error here
        ends the query before any row is read or written, reported by ``awaitTermination()`` / ``query.exception()``
        inside Spark's ``PYTHON_DATA_SOURCE_ERROR``. So a lakesink error is raised afresh from this frame (Spark prints
        the traceback whole: one frame, then the message) and logged as one line of its own."""
        from lakesink.errors import LakesinkError
        from lakesink.options import SinkOptions
        from lakesink.sink.datasource import stream_writer

        _log_to_stderr_in_workers()
        try:
            return stream_writer(SinkOptions.from_spark_options(dict(self.options), overwrite=overwrite), schema)
        except LakesinkError as e:
            refused = e
        logging.getLogger("lakesink").error("lakesink: format('lakesink') cannot start: %s: %s", type(refused).__name__, refused)
        raise refused.with_traceback(None)
