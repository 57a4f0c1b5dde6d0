"""The JVM options of the short-lived Spark jobs the tests start as child processes (a job SIGKILLed and restarted).

Each such job is a fresh JVM that runs a few small micro-batches and dies: most of its CPU goes into Java's
start-up and the JIT compiling Spark's code paths once. ``-XX:TieredStopAtLevel=1`` (the quick C1 compiler only, no
C2) and the serial garbage collector (no parallel GC threads on 2 cores) cut the CPU time of one run of the soak's
job by about a third (tests/soak/job.py, 8 files of 50 rows: 34.7 s of CPU -> 23.7 s, measured on the loaded 2-core
machine with the process tree's rusage). What the job does, and every fault point it passes, is the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def short_lived(builder: SparkSession.Builder) -> SparkSession.Builder:
    """``builder`` (a SparkSession.Builder, before getOrCreate) with the options of a short-lived driver JVM: PySpark
    starts the JVM with the builder's configuration, so the driver's Java options take effect (local mode: the
    executors are in the driver's JVM)."""
    return builder.config("spark.driver.extraJavaOptions", JAVA_OPTIONS)


def submit_args() -> str:
    """``PYSPARK_SUBMIT_ARGS`` that start the driver JVM with the same options, for a child process whose own code
    builds its session (a docs page's script, tests/test_docs.py): PySpark hands them to spark-submit."""
    return f'--driver-java-options "{JAVA_OPTIONS}" pyspark-shell'
