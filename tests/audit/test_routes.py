"""Auditing a routed query across the catalog: ``lakesink verify TABLE`` and ``lakesink verify --query ID`` say
whether each batch is in every table it wrote (lakesink.audit.routes). Real SQLite catalog, real files; the
incomplete batch is made by a fault between two tables' commits (atomic=off), and completed by the replay."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from lakesink.audit import verify
from lakesink.audit.routes import BATCH_INCOMPLETE, verify_query
from lakesink.cli import main
from lakesink.driver import catalogs
from lakesink.errors import InjectedFault
from lakesink.faults import DRIVER_BETWEEN_TABLE_COMMITS
from tests.driver.test_routing import Q, routed, run


def cli(props: dict[str, str], *args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(main, [*args, "--json", *[f"--catalog-property={k}={v}" for k, v in props.items()]])
    return result.exit_code, json.loads(result.output)


def test_a_batch_missing_from_a_table_is_reported_until_the_replay_completes_it(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    rc = routed(catalog_properties, atomic="off")
    run(rc, 0, {"a": [1], "b": [2], "other.c": [3]})
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 1, {"a": [4], "b": [5], "other.c": [6]})  # batch 1 lands in db.a only
    faults.clear()
    catalog = catalogs.load(None, catalog_properties)

    report = verify_query(catalog, Q)
    assert report.tables == ["db.a", "db.b", "other.c"] and report.batches == 2 and not report.ok
    (incomplete,) = report.incomplete
    assert (incomplete.batch_id, incomplete.expected, incomplete.found) == (1, 3, ("db.a",))
    # a table that misses batch 1 has no trace of it (verify --query finds it from the tables that have it)
    one = verify(catalog.load_table(("other", "c")))
    assert [v.kind for v in one.violations] == [] and one.routed_batches == 1  # batch 0 only: complete
    a = verify(catalog.load_table(("db", "a")))
    assert [v.kind for v in a.violations] == [BATCH_INCOMPLETE] and "batch 1" in a.violations[0].message
    code, printed = cli(catalog_properties, "verify", "--query", Q)
    assert code == 1 and printed["ok"] is False and printed["incomplete"][0]["found"] == ["db.a"]
    code, printed = cli(catalog_properties, "verify", "db.a")
    assert code == 1 and printed["violations"][0]["kind"] == BATCH_INCOMPLETE

    run(routed(catalog_properties, atomic="off"), 1, {"a": [4], "b": [5], "other.c": [6]})  # the replay completes it
    assert verify_query(catalog, Q).ok
    code, printed = cli(catalog_properties, "verify", "--query", Q)
    assert code == 0 and printed == {
        "query_id": Q,
        "tables": ["db.a", "db.b", "other.c"],
        "batches": 2,
        "incomplete": [],
        "ok": True,
    }
    assert cli(catalog_properties, "verify", "db.a")[0] == 0


def test_verify_query_of_an_unknown_query_fails(catalog_properties: dict[str, str]) -> None:
    run(routed(catalog_properties), 0, {"a": [1]})
    code, printed = cli(catalog_properties, "verify", "--query", "no-such-query")
    assert code == 1 and printed["tables"] == [] and printed["ok"] is False
    result = CliRunner().invoke(main, ["verify"])
    assert result.exit_code == 2 and "give TABLE, or --query ID" in result.output
