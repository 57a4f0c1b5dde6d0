"""Iceberg's Java implementation as a real second engine: Spark 3.5 with Iceberg's own Spark runtime.

pyspark 4 cannot load Iceberg's runtime jar (built for Spark 3.5), so the engine lives in a second
virtual environment, ``.venv-iceberg-java`` (``make .venv-iceberg-java/.installed``; this module
builds it on first use when it is missing):

- ``pyspark==3.5.8``;
- ``snowpark-connect-deps-iceberg==1.0.1`` from PyPI, which ships ``iceberg-spark-runtime-3.5_2.12-1.9.2.jar``
  and the extensions jar (1.0.3 lacks the shaded Jackson classes and fails on the first metadata read);
- the JDBC drivers from Debian: ``libpostgresql-jdbc-java`` (``/usr/share/java/postgresql.jar``) and
  ``libxerial-sqlite-jdbc-java`` (``/usr/share/java/sqlite-jdbc.jar``); ``.ci/run`` installs them.

:class:`JavaEngine` runs tests/jobs/java_engine_server.py in that environment as a child process and
sends it SQL over a pipe; one JVM serves many statements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "jobs" / "java_engine_server.py"
VENV = Path(os.environ.get("LAKESINK_JAVA_VENV", ROOT / ".venv-iceberg-java"))
REQUIREMENTS = ("pyspark==3.5.8", "snowpark-connect-deps-iceberg==1.0.1")
JDBC_JARS = {"postgresql": "/usr/share/java/postgresql.jar", "sqlite": "/usr/share/java/sqlite-jdbc.jar"}
JDBC_PACKAGES = {"postgresql": "libpostgresql-jdbc-java", "sqlite": "libxerial-sqlite-jdbc-java"}
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


#: The longest one answer of the engine may take (its start included) before the engine is killed and the statement
#: reported: a hung JVM fails its test with the statement's text instead of holding the suite until CI's limit. The
#: slowest statement measured (the benchmarks' MERGE INTO at toy size, loaded machine) takes well under a minute.
ANSWER_SECONDS = 300


class JavaEngineUnavailable(RuntimeError):
    pass


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """The second environment's interpreter, built (``python -m venv`` + pip) when missing."""
    marker = VENV / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python()), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
        marker.touch()
    return python()


def iceberg_jars() -> list[str]:
    """Iceberg's Spark 3.5 runtime (Scala 2.12, as pyspark 3.5.8) and extensions jars."""
    found = sorted(str(p) for p in VENV.glob("lib/python*/site-packages/**/*.jar") if "iceberg" in p.name and "2.12" in p.name)
    if not found:
        raise JavaEngineUnavailable(f"no iceberg-spark-runtime-3.5_2.12 jar inside {VENV}: reinstall {REQUIREMENTS[1]}")
    return found


def jdbc_jar(kind: str) -> str:
    jar = JDBC_JARS[kind]
    if not Path(jar).exists():
        raise JavaEngineUnavailable(f"{jar} is missing: apt-get install {JDBC_PACKAGES[kind]} (.ci/run does)")
    return jar


def jdbc_url(catalog_properties: Mapping[str, str]) -> tuple[str, str, dict[str, str]]:
    """(JDBC URL, driver kind, extra catalog properties) of a pyiceberg SQL catalog's SQLAlchemy URI."""
    uri = catalog_properties["uri"]
    if uri.startswith("sqlite:///"):
        return "jdbc:sqlite:" + uri[len("sqlite:///") - 1 :], "sqlite", {}
    if uri.startswith("postgresql"):
        # postgresql+psycopg2://user[:pw]@host:port/db
        rest = uri.split("://", 1)[1]
        creds, _, hostdb = rest.rpartition("@")
        user, _, password = creds.partition(":")
        extra = {"jdbc.user": user} if user else {}
        if password:
            extra["jdbc.password"] = password
        return f"jdbc:postgresql://{hostdb}", "postgresql", extra
    raise ValueError(f"no JDBC equivalent for catalog URI {uri!r}")


def session_conf(kind: str) -> dict[str, str]:
    """The Java session's own Spark configuration: Iceberg's jars and the JDBC driver of ``kind`` (:func:`jdbc_url`), a
    small local session in UTC, its answers written as Parquet pyarrow reads."""
    return {
        "spark.jars": ",".join([*iceberg_jars(), jdbc_jar(kind)]),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        # the answers written as Parquet for pyarrow: standard timestamps, not INT96
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # and dates before 1582 / timestamps before 1900 as they are (proleptic Gregorian, as Iceberg)
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
    }


def spark_conf(name: str, catalog_properties: Mapping[str, str]) -> dict[str, str]:
    """Spark configuration for Iceberg's ``SparkCatalog`` ``name`` on the same catalog as ``catalog_properties``."""
    url, kind, extra = jdbc_url(catalog_properties)
    prefix = f"spark.sql.catalog.{name}"
    conf = {
        **session_conf(kind),
        "spark.sql.extensions": EXTENSIONS,
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": url,
        f"{prefix}.warehouse": catalog_properties["warehouse"],
        # pyiceberg writes the V0 layout of the JDBC catalog tables (no iceberg_type column)
        f"{prefix}.jdbc.schema-version": "V0",
    }
    conf.update({f"{prefix}.{k}": v for k, v in extra.items()})
    return conf


class JavaEngine:
    """A running Spark 3.5 + Iceberg Java session (child process) that answers SQL."""

    def __init__(self, conf: Mapping[str, str]):
        interpreter = ensure_venv()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK_HOME", "PYTHONPATH"))}
        env["PYSPARK_PYTHON"] = str(interpreter)
        self.proc = subprocess.Popen(
            ["nice", "-n", "10", str(interpreter), str(SERVER), json.dumps(dict(conf))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd="/tmp",
        )
        ready = self._answer("(the engine's start)")
        if not ready.get("ready"):
            raise JavaEngineUnavailable(f"the Java engine did not start: {ready}")

    def _answer(self, waiting_for: str) -> dict[str, Any]:
        """The engine's next answer line; past :data:`ANSWER_SECONDS` the engine is killed and the wait fails naming
        ``waiting_for``."""
        assert self.proc.stdout is not None
        expired = threading.Event()
        stacks: list[str] = []

        def kill() -> None:
            expired.set()
            stacks.append(self._stacks())
            self.proc.kill()

        watchdog = threading.Timer(ANSWER_SECONDS, kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            watchdog.cancel()
        if expired.is_set():
            raise JavaEngineUnavailable(
                f"the Java engine gave no answer in {ANSWER_SECONDS} s to {waiting_for}: killed; where its threads "
                f"were (jstack, the threads in Iceberg, JDBC or Spark's scheduler):\n{''.join(stacks)}"
            )
        if not line:
            raise JavaEngineUnavailable(f"the Java engine exited (code {self.proc.wait()}) before answering {waiting_for}")
        return json.loads(line)  # type: ignore[no-any-return]

    def _send(self, sql: str, parquet: str | None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"sql": sql, "parquet": parquet}) + "\n")
        self.proc.stdin.flush()
        return self._answer(repr(sql))

    def _stacks(self) -> str:
        """The JVM's threads that are in Iceberg, a JDBC driver or Spark's scheduler (jstack; a hung engine's
        diagnosis), at most 200 lines."""
        try:
            import psutil

            jvms = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True) if "java" in p.name()]
            dumps = [subprocess.run(["jstack", str(pid)], capture_output=True, text=True, timeout=60).stdout for pid in jvms]
        except Exception as e:  # a diagnosis never hides the failure it explains
            return f"(no thread dump: {e!r})"
        wanted = ("org.apache.iceberg", "org.postgresql", "org.sqlite", "DAGScheduler", "awaitResult")
        threads = [t for dump in dumps for t in dump.split("\n\n") if any(w in t for w in wanted)]
        return "\n".join("\n\n".join(threads).splitlines()[:200]) or "(no thread in Iceberg, JDBC or the scheduler)"

    def sql(self, sql: str) -> list[list[Any]]:
        """Rows of ``sql`` (values made JSON-safe); an engine error raises AssertionError with its message."""
        answer = self._send(sql, None)
        assert answer["ok"], f"Java engine failed on {sql!r}: {answer.get('error')}"
        return answer["rows"]  # type: ignore[no-any-return]

    def error(self, sql: str) -> str:
        answer = self._send(sql, None)
        assert not answer["ok"], f"expected the Java engine to refuse {sql!r}"
        return str(answer["error"])

    def read_arrow(self, sql: str, folder: Path) -> Any:
        """The result of ``sql`` as Spark wrote it to Parquet in ``folder``, read back with pyarrow."""
        import pyarrow.parquet as pq

        answer = self._send(sql, str(folder))
        assert answer["ok"], f"Java engine failed on {sql!r}: {answer.get('error')}"
        return pq.read_table(str(folder))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
