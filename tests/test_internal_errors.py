"""A bug is never reported as the user's problem (issue 20, item 9).

Where lakesink turns a dependency's failures into one of its error classes with a broad ``except``, it lets
``TypeError``, ``AttributeError``, ``NameError`` and ``AssertionError`` through unchanged
(``lakesink.errors.PROGRAMMING_ERRORS``): the pyspark 4.1 ``TypeError`` was once reported as a schema
mismatch. Each test fails a dependency at one precise point with such an error (the fault injection), and
also checks that a genuine user error at the same place still gets lakesink's error class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from lakesink._pyiceberg import io as _pyiceberg
from lakesink._pyiceberg.io import parquet as seam_parquet
from lakesink.driver import catalogs
from lakesink.errors import PROGRAMMING_ERRORS, CatalogError, CheckpointError, InvalidOptionError, LakesinkError
from lakesink.executor.upsert_task import UpsertSpec
from lakesink.sink import checkpoint


class CatalogWithABug:
    """A catalog implementation (pyiceberg's ``py-catalog-impl``) whose constructor hits a bug."""

    def __init__(self, name: str, **properties: str):
        raise TypeError("__init__() got an unexpected keyword argument 'warehouse'")


def test_a_bug_in_a_catalog_implementation_is_not_reported_as_a_catalog_error(tmp_path: Path) -> None:
    impl = f"{__name__}.{CatalogWithABug.__name__}"
    with pytest.raises(TypeError, match="unexpected keyword argument") as e:
        catalogs.load("buggy", {"py-catalog-impl": impl, "warehouse": f"file://{tmp_path}"})
    assert not isinstance(e.value, LakesinkError)
    # a catalog that cannot be loaded for a reason of the user's: still a CatalogError naming it
    with pytest.raises(CatalogError, match="cannot load catalog 'missing'"):
        catalogs.load("missing", {"py-catalog-impl": "no.such.module.Catalog"})


def test_a_bug_while_checking_table_properties_is_not_an_invalid_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # a schema no other test converts: its statistics plan is not kept yet (lakesink.table.kept), so the check
    # below calls pyiceberg's (patched) plan instead of answering from what an earlier test in this process kept
    schema = Schema(NestedField(1, "id_of_test_a_bug_while_checking_table_properties", LongType(), required=False))
    with pytest.raises(InvalidOptionError, match="table property lakesink's writer cannot use"):
        _pyiceberg.check_write_properties("db.t", schema, {"write.metadata.metrics.default": "most"})

    def changed(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'Schema' object has no attribute 'as_arrow'")

    monkeypatch.setattr(seam_parquet, "compute_statistics_plan", changed)
    with pytest.raises(AttributeError, match="as_arrow") as e:
        _pyiceberg.check_write_properties("db.t", schema, {})
    assert not isinstance(e.value, LakesinkError)


def test_a_bug_while_parsing_delete_when_is_not_an_invalid_option(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidOptionError, match="delete-when"):
        UpsertSpec(key=("id",), delete_when="op = = 'd'").check()

    def changed(expression: str) -> Any:
        raise TypeError("parse() missing 1 required positional argument")

    monkeypatch.setattr(_pyiceberg, "parse_row_filter", changed)
    with pytest.raises(TypeError, match="missing 1 required"):
        UpsertSpec(key=("id",), delete_when="op = 'd'").check()


def test_a_bug_while_reading_the_checkpoint_is_not_a_checkpoint_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "metadata").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(CheckpointError, match="cannot read"):
        checkpoint.read_query_id(str(tmp_path))

    def changed(url: str, **kwargs: Any) -> Any:
        raise TypeError("url_to_fs() got an unexpected keyword argument")

    monkeypatch.setattr(fsspec.core, "url_to_fs", changed)
    with pytest.raises(TypeError, match="unexpected keyword"):
        checkpoint.read_query_id(str(tmp_path))


def test_the_programming_errors_are_the_bug_classes() -> None:
    assert set(PROGRAMMING_ERRORS) == {TypeError, AttributeError, NameError, AssertionError}


def test_a_bug_while_verifying_is_not_reported_as_an_unreadable_manifest(catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from lakesink.audit.invariants import UNREADABLE_MANIFEST, verify
    from lakesink.audit.manifests import Manifests
    from tests.support.helpers import arrow_rows

    catalog.create_namespace("db")
    table = catalog.create_table(("db", "v"), schema=arrow_rows([]).schema)
    table.append(arrow_rows(range(5)))
    table = catalog.load_table(("db", "v"))
    assert verify(table, show_progress=False).ok

    def changed(self: Any, snapshot: Any) -> Any:
        raise AttributeError("'ManifestFile' object has no attribute 'fetch_manifest_entry'")

    monkeypatch.setattr(Manifests, "changes", changed)
    with pytest.raises(AttributeError, match="fetch_manifest_entry"):
        verify(table, show_progress=False)
    monkeypatch.undo()
    # a manifest list that really cannot be read is still reported as the table's problem
    snapshot = table.current_snapshot()
    assert snapshot is not None
    Path(snapshot.manifest_list.removeprefix("file://")).unlink()
    report = verify(catalog.load_table(("db", "v")), show_progress=False)
    assert [v.kind for v in report.violations] == [UNREADABLE_MANIFEST, UNREADABLE_MANIFEST]
