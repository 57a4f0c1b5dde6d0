"""Driver side: can Spark's own Parquet writer reach a table's storage? (``writer="auto"`` asks this.)

Spark writes through Hadoop filesystems in the JVM. pyspark ships the local one (``file:``) but not
``hadoop-aws`` (``s3a:``), ``gcs-connector`` (``gs:``) or ``hadoop-azure`` (``abfs:``): a table on
object storage is written through the Arrow path unless the cluster has the filesystem's jar
(``spark.jars``/``--jars`` on the driver *and* the executors). The question is answered once per
scheme and session by asking the driver's JVM for the filesystem class
(``FileSystem.getFileSystemClass``), before any file is written.

A Spark Connect session has no JVM on the client side to ask: the answer there is "no" (the Arrow
path), which needs nothing on the server but lakesink in its Python environment.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

_lock = threading.Lock()
_answers: dict[tuple[int, str], str | None] = {}


def hadoop_scheme(location: str) -> str:
    """The Hadoop filesystem scheme Spark would use for ``location`` (``s3://`` is written as ``s3a://``)."""
    if "://" not in location:
        return "file"
    scheme = urlsplit(location).scheme.lower() or "file"
    return "s3a" if scheme == "s3" else scheme


def unwritable_reason(spark: Any, location: str) -> str | None:
    """Why Spark's own writer cannot write files under ``location`` from this session, or None when it can."""
    scheme = hadoop_scheme(location)
    jsc = getattr(spark, "_jsc", None)
    jvm = getattr(spark, "_jvm", None)
    if jsc is None or jvm is None:
        return "the session has no JVM in this process (Spark Connect): Spark's writer cannot be checked or driven from here"
    key = (id(jsc), scheme)
    with _lock:
        if key in _answers:
            return _answers[key]
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, jsc.hadoopConfiguration())
        reason = None
    except Exception as e:
        # py4j's message holds the JVM stack trace; the first line names the missing class or scheme
        first = str(e).strip().splitlines()
        detail = next((line.strip() for line in first if "Exception" in line or "No FileSystem" in line), type(e).__name__)
        reason = (
            f"Spark has no Hadoop filesystem for scheme {scheme!r} ({detail[:200]}); add its jar to the cluster "
            f"(for s3a: hadoop-aws and the AWS SDK bundle, on the driver and the executors) to use Spark's writer"
        )
    with _lock:
        _answers[key] = reason
    return reason
