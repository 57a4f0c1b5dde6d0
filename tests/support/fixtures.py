"""Fixtures of the tests that need no Spark session (only real catalogs, files and Arrow data); tests/conftest.py
registers them for every test folder."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.executor.messages import WritePlan
from lakesink.options import SinkOptions, TableName
from tests.support.files import MakePlan
from tests.support.helpers import sink_committer


@pytest.fixture
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pyiceberg's configuration sees no .pyiceberg.yaml and no PYICEBERG_* variable of the machine.

    pyiceberg's ``Config()`` looks in $PYICEBERG_HOME, then ~, then the working folder: all three are
    pointed at empty folders of this test. Returns the test's working folder.
    """
    for name in list(os.environ):
        if name.upper().startswith("PYICEBERG_"):
            monkeypatch.delenv(name)
    for sub in ("pyiceberg-home", "home", "cwd"):
        (tmp_path / sub).mkdir()
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path / "pyiceberg-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path / "cwd"


@pytest.fixture
def make_plan(catalog: object, catalog_properties: dict[str, str]) -> MakePlan:
    """Create table db.<name> in the test's SQLite catalog from an Arrow schema; return its WritePlan."""
    from pyiceberg.catalog import Catalog

    assert isinstance(catalog, Catalog)
    catalog.create_namespace_if_not_exists(("db",))

    def make(schema: pa.Schema, *, name: str = "t", properties: dict[str, str] | None = None) -> WritePlan:
        table = catalog.create_table(("db", name), schema=schema, properties=properties or {})
        committer = sink_committer(SinkOptions(table=TableName(("db",), name), catalog_properties=catalog_properties))
        return committer.write_plan(table, "q-1")

    return make
