"""Auditing a routed query across the catalog: ``lakesink verify TABLE`` and ``lakesink verify --query ID`` say
whether each batch is in every table it wrote (lakesink.audit.routes). Real SQLite catalog, real files; the
incomplete batch is made by a fault between two tables' commits (atomic=off), and completed by the replay."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner

from lakesink.audit import publish, verify
from lakesink.audit.routes import BATCH_INCOMPLETE, verify_query
from lakesink.cli import main
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.errors import InjectedFault
from lakesink.faults import DRIVER_BETWEEN_TABLE_COMMITS
from tests.driver.test_routing import OFFSETS, Q, routed, run
from tests.driver.test_routing_dead_letters import Q as LETTERS_Q
from tests.driver.test_routing_dead_letters import routed as routed_with_letters
from tests.driver.test_routing_dead_letters import run as run_with_letters
from tests.support.helpers import table_ids


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


def test_a_table_left_out_of_routed_batches_has_no_gap_but_a_lost_batch_is_still_one(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """db.a gets no row in batches 1-2 (batch 1 writes db.b only, batch 2 routes no row and is recorded in db.b): its
    next batch records batch 0 as its previous one, and verify finds batches 1 and 2 accounted for by db.b -- no gap.
    A batch the query committed nowhere (5), or one that a table its digest names misses (7: a crash between the
    tables' commits, atomic=off, and the query went on without replaying it), is still a gap."""
    rc = routed(catalog_properties, atomic="off")
    run(rc, 0, {"a": [1], "b": [2]})
    run(rc, 1, {"b": [3]})
    rc.commit_batch(BatchCall(Q, 2, OFFSETS), [])  # routes no row: db.b's marker moves
    run(rc, 3, {"a": [4], "b": [5]})
    catalog = catalogs.load(None, catalog_properties)
    for name in ("db.a", "db.b"):
        report = verify(catalog.load_table(tuple(name.split("."))))
        assert report.ok, (name, report.violations)
    (a,) = verify(catalog.load_table(("db", "a"))).queries
    assert (a.first_batch, a.last_batch, a.empty_batches, a.elsewhere_batches) == (0, 3, 0, 2)
    code, printed = cli(catalog_properties, "verify", "db.a")
    assert code == 0 and printed["ok"] is True
    run(rc, 4, {"b": [6]})
    run(rc, 6, {"a": [7], "b": [8]})  # batch 5 is lost: in no table, recorded nowhere
    a_report = verify(catalog.load_table(("db", "a")))
    assert [(v.kind, "batch id(s) 5 missing" in v.message) for v in a_report.violations] == [("batch-gap", True)]
    assert a_report.queries[0].elsewhere_batches == 3  # 1, 2 and 4
    assert [v.kind for v in verify(catalog.load_table(("db", "b"))).violations] == ["batch-gap"]
    assert cli(catalog_properties, "verify", "db.a")[0] == 1
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 7, {"a": [9], "b": [10]})  # lands in db.a only
    faults.clear()
    run(routed(catalog_properties, atomic="off"), 8, {"a": [11], "b": [12]})  # batch 7 never replayed
    b = verify(catalog.load_table(("db", "b")))
    assert [v.kind for v in b.violations] == ["batch-gap", "batch-gap"]
    assert "batch id(s) 7 missing" in b.violations[1].message  # db.a holds it, but its digest names db.b too
    a_kinds = sorted(v.kind for v in verify(catalog.load_table(("db", "a"))).violations)
    assert a_kinds == ["batch-gap", BATCH_INCOMPLETE]


def test_publish_of_an_audited_routed_branch_is_not_refused_for_batches_of_other_tables(
    catalog_properties: dict[str, str],
) -> None:
    rc = routed(catalog_properties, branch="audit")
    run(rc, 0, {"a": [1], "b": [2]})
    run(rc, 1, {"b": [3]})
    run(rc, 2, {"a": [4], "b": [5]})
    catalog = catalogs.load(None, catalog_properties)
    a = catalog.load_table(("db", "a"))
    assert verify(a, branch="audit").ok
    result = publish(a, branch="audit")
    assert not result.forced and table_ids(catalog.load_table(("db", "a"))) == Counter([1, 4])  # main: the audited rows


def test_the_dead_letter_table_of_a_routed_query_has_no_gap_after_an_empty_batch(catalog_properties: dict[str, str]) -> None:
    """An empty routed batch moves the markers of the previous batch's tables, not the dead-letter table's: its next
    snapshot records the batch before as its previous one, and verify finds the empty batch in the routed tables."""
    rc = routed_with_letters(catalog_properties)
    run_with_letters(rc, 0, {"a": [1], None: [100]})
    rc.commit_batch(BatchCall(LETTERS_Q, 1, OFFSETS), [])  # routes no row
    run_with_letters(rc, 2, {"a": [2], None: [101]})
    catalog = catalogs.load(None, catalog_properties)
    dead = verify(catalog.load_table(("db", "dead")))
    assert dead.ok, dead.violations
    assert [(q.last_batch, q.elsewhere_batches) for q in dead.queries] == [(2, 1)]
    assert verify(catalog.load_table(("db", "a"))).ok
    run_with_letters(rc, 3, {"a": [3]})  # no dead letter: the dead-letter table's marker moves
    run_with_letters(rc, 5, {"a": [4], None: [102]})  # batch 4: lost
    dead = verify(catalog.load_table(("db", "dead")))
    assert [(v.kind, "batch id(s) 4 missing" in v.message) for v in dead.violations] == [("batch-gap", True)]
