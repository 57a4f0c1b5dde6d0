"""The ``spark`` marker guard of tests/conftest.py: a test that starts Spark without the marker fails."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests import conftest
from tests.support.timeouts import guard


@dataclass
class _Item:
    nodeid: str
    fixturenames: tuple[str, ...]
    marks: dict[str, Any] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> Any:
        return self.marks.get(name)

    def add_marker(self, mark: Any) -> None:
        self.marks[mark.name] = mark


def test_collection_refuses_a_test_using_the_spark_fixture_without_the_marker() -> None:
    unmarked = _Item("tests/x.py::test_unmarked", ("stream", "spark", "tmp_path"))
    marked = _Item("tests/x.py::test_marked", ("spark",), {"spark": pytest.mark.spark})
    with pytest.raises(pytest.UsageError, match="without @pytest.mark.spark") as info:
        conftest.pytest_collection_modifyitems(None, [unmarked, marked])  # type: ignore[arg-type,list-item]
    assert "tests/x.py::test_unmarked" in str(info.value) and "test_marked" not in str(info.value)


def test_collection_marks_tests_of_the_postgres_server() -> None:
    item = _Item("tests/x.py::test_pg", ("postgres",))
    conftest.pytest_collection_modifyitems(None, [item])  # type: ignore[arg-type,list-item]
    assert item.get_closest_marker("postgres") is not None


def test_an_unmarked_test_cannot_start_spark_in_this_process() -> None:
    with pytest.raises(conftest.SparkWithoutMarkerError, match="without @pytest.mark.spark"):
        SparkSession.builder.master("local[1]").getOrCreate()


@pytest.mark.slow  # a JVM starts, only to refuse the option
def test_an_unmarked_test_cannot_start_spark_in_a_subprocess() -> None:
    code = "from pyspark.sql import SparkSession; SparkSession.builder.master('local[1]').getOrCreate()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=guard(300))
    assert proc.returncode != 0
    assert "lakesink-test-without-the-spark-marker" in proc.stderr
