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
from typing import Any

import pytest

from tests.support import timeouts
from tests.support.pg import PostgresServer

# the fixtures of the no-Spark tests (isolated pyiceberg configuration, write plans of fresh tables), the REST
# catalog server and the HTTP fault layer (tests/support/catalog_servers.py), and the durations file of each run
# (tests/support/durations.py, make durations)
pytest_plugins = ("tests.support.fixtures", "tests.support.catalog_servers", "tests.support.durations")

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
# Host-wide state of lakesink, one folder per test process (make test runs two pytest-xdist workers; other test runs
# may share the machine): the commit locks and in-doubt records (keyed by table, query id and batch: the tests'
# fixed query ids, e.g. "q-1" on db.events, would meet in /tmp/lakesink-commit-locks), and the embedded default
# catalog (./lakehouse in the working folder, the repository). A test that checks a default unsets the variable.
os.environ["LAKESINK_LOCK_DIR"] = tempfile.mkdtemp(prefix="lakesink-locks-")
os.environ["LAKESINK_HOME"] = os.path.join(tempfile.mkdtemp(prefix="lakesink-home-"), "lakehouse")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Fix the load factor of the wall-time guards for this test (tests/support/timeouts.py), before pytest-timeout
    arms its timer."""
    timeouts.pin()
    yield


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> object:
    """pytest-timeout's limit of a test (the ini's timeout = 600, or a test's own mark) is a hang guard: scaled with
    the machine's load like the guards inside the test (tests/support/timeouts.py), so it stays the larger one."""
    timeout = getattr(settings, "timeout", None)
    if not timeout:
        return None
    plugin: Any = item.config.pluginmanager.get_plugin("timeout")
    scaled = settings._replace(timeout=timeouts.guard(timeout))  # type: ignore[attr-defined]
    return plugin.pytest_timeout_set_timer(item=item, settings=scaled)


# test files whose tests share no module fixture and no state: make test hands out their tests one by one (each docs
# page runs in a Spark process of its own: 11 pages took 45 min of one worker's time in one file at load 35, 2026-11-24)
SPLIT_FILES = ("tests/test_docs.py",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """--dist loadfile hands whole files to the workers, by default the files with the most tests first; here the
    slowest files first (tests/file_seconds.json, measured: make durations), so that the last file handed out is a
    short one and the two workers end together; the tests of SPLIT_FILES one by one, after the slow files."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from tests.support.durations import slow_files_first

    class SlowFilesFirst(LoadFileScheduling):  # type: ignore[misc]
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return nodeid if nodeid.split("::", 1)[0] in SPLIT_FILES else str(super()._split_scope(nodeid))

        def _assign_work_unit(self, node: object) -> None:
            if not self._ordered:
                self._ordered = True
                order = slow_files_first(list(self.workqueue))
                units = dict(self.workqueue)
                self.workqueue.clear()
                for scope in order:
                    self.workqueue[scope] = units[scope]
            super()._assign_work_unit(node)

    return SlowFilesFirst(config, log)


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


_jvm_archive_build: Any = None


def pytest_collection_finish(session: pytest.Session) -> None:
    """A session with Spark tests writes the class data sharing archive of the tests' job JVMs in the background when
    this machine has none yet (tests/jobs/jvm.py): the jobs started after it is there start faster, those before run
    without it. The other pytest-xdist worker's build finds the first one's lock and ends at once."""
    global _jvm_archive_build
    if session.config.option.collectonly or not any(item.get_closest_marker(SPARK_MARKER) for item in session.items):
        return
    from tests.jobs import jvm

    _jvm_archive_build = jvm.start_background_build()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.jobs import jvm

    jvm.stop_background_build(_jvm_archive_build)


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
    """The test process's Spark session, with the JVM options and workers' Python of the tests' short-lived jobs
    (tests/jobs/jvm.py short_lived: the quick JIT only, the serial GC, the class data sharing archive when there is one;
    Spark's Python workers without the zip of pyspark's sources). What the tests run is the same; the session costs
    about a third less CPU (two Spark test files: 120-139 -> 85 CPU-s of the process tree, cgroup, 2026-11-25)."""
    from pyspark.sql import SparkSession

    import lakesink
    from tests.jobs import jvm

    session = (
        jvm.short_lived(SparkSession.builder.master("local[2,4]"))  # 2 cores, a failed task is retried (up to 4 attempts)
        .appName("lakesink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.streaming.stopActiveRunOnRestart", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="lakesink-spark-warehouse-"))  # not ./spark-warehouse
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
    c.table.open_table(arrow_rows([]).schema)
    return c


@pytest.fixture(params=["format", "foreach", "foreach-driver"])
def stream(request: pytest.FixtureRequest, spark: object, tmp_path: Path, catalog_properties: dict[str, str]) -> object:
    """One streaming pipeline on a fresh SQLite catalog, through each entry point in turn (``foreach-driver``:
    foreach_batch with every batch written on the driver, ``writer="driver"``)."""
    from tests.support.helpers import Stream

    return Stream(spark, tmp_path, catalog_properties, request.param)
