"""Shared fixtures: one local Spark session per test run, real SQLite catalogs per test, fault points."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import PostgresServer

# Spark's Python workers must import lakesink: run them with this interpreter. Fault points are read
# from this folder by every process (driver, commit workers, executors), so it is set before Spark starts.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
_FAULTS_DIR = tempfile.mkdtemp(prefix="lakesink-faults-")
os.environ["LAKESINK_FAULTS_DIR"] = _FAULTS_DIR


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


@pytest.fixture(params=["sqlite", "postgres"])
def any_catalog_properties(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    """The same test on a SQLite catalog file and on a PostgreSQL-backed SQL catalog (a fresh database)."""
    return sql_catalog_properties(request.param, tmp_path, request)


@pytest.fixture
def catalog(catalog_properties: dict[str, str]) -> object:
    from lakesink import catalogs

    return catalogs.load(None, catalog_properties)


@pytest.fixture(params=["format", "foreach"])
def stream(request: pytest.FixtureRequest, spark: object, tmp_path: Path, catalog_properties: dict[str, str]) -> object:
    """One streaming pipeline on a fresh SQLite catalog, through each entry point in turn."""
    from tests.helpers import Stream

    return Stream(spark, tmp_path, catalog_properties, request.param)
