"""Shared fixtures: one local Spark session per test run, real SQLite catalogs per test, fault points.

Also the ``spark`` marker's guard: every test that starts Spark must carry ``@pytest.mark.spark``
(the fast lane, ``make test-fast``, deselects them). A test that uses the ``spark`` fixture without
the marker fails at collection; an unmarked test that starts Spark anyway (``SparkSession.builder``
in this process, or ``spark-submit`` in a subprocess) fails when it does.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pg import PostgresServer

# the fixtures of the no-Spark tests (isolated pyiceberg configuration, write plans of fresh tables), and the REST
# catalog server and the HTTP fault layer (tests/support/catalog_servers.py)
pytest_plugins = ("tests.support.fixtures", "tests.support.catalog_servers")

SPARK_MARKER = "spark"
SPARK_FIXTURE = "spark"
POSTGRES_FIXTURE = "postgres"
# what an unmarked test's subprocesses get as spark-submit arguments: spark-submit refuses the option
# (its error names it), so a subprocess that starts Spark fails instead of running unmarked
NO_SPARK_SUBMIT_ARGS = "--lakesink-test-without-the-spark-marker pyspark-shell"

# Spark's Python workers must import lakesink: run them with this interpreter. Fault points are read
# from this folder by every process (driver, commit workers, executors), so it is set before Spark starts.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
_FAULTS_DIR = tempfile.mkdtemp(prefix="lakesink-faults-")
os.environ["LAKESINK_FAULTS_DIR"] = _FAULTS_DIR


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the fast lane checks the tests it skips too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = [
        item.nodeid
        for item in items
        if SPARK_FIXTURE in getattr(item, "fixturenames", ()) and item.get_closest_marker(SPARK_MARKER) is None
    ]
    for item in items:  # the PostgreSQL server is started on demand: mark what needs it (the fast lane skips it)
        if POSTGRES_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} test(s) use the {SPARK_FIXTURE!r} fixture (directly or through another fixture) "
            f"without @pytest.mark.{SPARK_MARKER}; mark them (or the module: pytestmark = pytest.mark.{SPARK_MARKER}):\n  "
            + "\n  ".join(unmarked)
        )


class SparkWithoutMarkerError(Exception):
    pass


@pytest.fixture(autouse=True)
def _spark_needs_the_marker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unmarked test cannot start Spark, here or in a subprocess."""
    if request.node.get_closest_marker(SPARK_MARKER) is not None:
        return
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", NO_SPARK_SUBMIT_ARGS)
    if "pyspark.sql.session" not in sys.modules:
        return  # nothing imported pyspark.sql yet: nothing to patch (the subprocess guard above still holds)
    from pyspark.sql.session import SparkSession

    def refuse(*args: object, **kwargs: object) -> object:
        raise SparkWithoutMarkerError(f"{request.node.nodeid} starts Spark without @pytest.mark.{SPARK_MARKER}")

    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse)
    monkeypatch.setattr(SparkSession.Builder, "create", refuse, raising=False)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    import lakesink

    session = (
        SparkSession.builder.master("local[2,4]")  # 2 cores, a failed task is retried (up to 4 attempts)
        .appName("lakesink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.streaming.stopActiveRunOnRestart", "true")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    lakesink.register(session)
    yield session
    session.stop()


class Faults:
    """Switch fault points on (see lakesink.faults) for the processes of this test run."""

    def __init__(self, folder: str):
        self.folder = Path(folder)

    def arm(self, point: str, action: str = "raise") -> None:
        (self.folder / point).write_text(action)

    def reached(self, point: str) -> bool:
        return (self.folder / f"{point}.reached").exists()

    def release(self, point: str) -> None:
        (self.folder / f"{point}.release").touch()

    def wait_reached(self, point: str) -> None:
        """Wait until a process reached the fault point ``point`` (armed with ``pause``)."""
        from tests.support.helpers import wait_until

        wait_until(lambda: self.reached(point), what=f"fault point {point} to be reached")

    def fired(self, point: str) -> bool:
        return any(p.name.startswith(f"{point}.fired.") for p in self.folder.iterdir())

    def clear(self) -> None:
        for p in self.folder.iterdir():
            p.unlink()


@pytest.fixture
def faults() -> Iterator[Faults]:
    f = Faults(_FAULTS_DIR)
    f.clear()
    yield f
    f.clear()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the test session (a fresh database per test)."""
    server = PostgresServer.start()
    yield server
    server.stop()


def sql_catalog_properties(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    if kind == "sqlite":
        uri = f"sqlite:///{tmp_path}/catalog.db"
    else:
        uri = request.getfixturevalue("postgres").create_database()
    return {"type": "sql", "uri": uri, "warehouse": f"file://{tmp_path}/warehouse"}


@pytest.fixture
def catalog_properties(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """A fresh SQLite catalog file and warehouse folder for one test."""
    return sql_catalog_properties("sqlite", tmp_path, request)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_catalog_properties(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The same test on a SQLite catalog file and on a PostgreSQL-backed SQL catalog (a fresh database)."""
    return sql_catalog_properties(request.param, tmp_path, request)


@pytest.fixture
def catalog(catalog_properties: dict[str, str]) -> object:
    from lakesink.driver import catalogs

    return catalogs.load(None, catalog_properties)


@pytest.fixture
def committer(catalog_properties: dict[str, str]) -> object:
    """A TableCommitter of table db.events (created, columns id and user) in the test's catalog."""
    from tests.support.helpers import arrow_rows, make_committer

    c = make_committer(catalog_properties)
    c.open_table(arrow_rows([]).schema)
    return c


@pytest.fixture(params=["format", "foreach", "foreach-driver"])
def stream(request: pytest.FixtureRequest, spark: object, tmp_path: Path, catalog_properties: dict[str, str]) -> object:
    """One streaming pipeline on a fresh SQLite catalog, through each entry point in turn (``foreach-driver``:
    foreach_batch with every batch written on the driver, ``writer="driver"``)."""
    from tests.support.helpers import Stream

    return Stream(spark, tmp_path, catalog_properties, request.param)
