"""Option cdc-format through both entry points in real local Spark (foreach_batch and format("lakesink")), issue 51:

- item 5: Debezium's unavailable-value placeholder (PostgreSQL's unchanged TOAST values) keeps the value the table,
  or the batch's earlier change of the key, holds -- two routed tables;
- item 4: a source whose primary key changed (the records' Kafka keys name other columns than the table's identifier
  fields) fails the batch loudly, naming both keys, on both entry points; nothing is committed.

The records are Debezium's PostgreSQL connector's, built field by field (tests/support/cdc_debezium.py,
tests/support/toast.py); every table equals a model in plain Python.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from tests.driver.test_cdc_unavailable import TOASTED, TYPES, as_stored, row, unchanged_toast
from tests.support import toast
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import assert_each_batch_once, run_to_end, start_sink
from tests.support.toast import change

pytestmark = pytest.mark.spark

ENTRIES = ["foreach", "format"]
TABLES = ("public.docs", "shop.notes")


def run(spark: Any, entry: str, props: Mapping[str, str], tmp_path: Path) -> None:
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    run_to_end(start_sink(df, entry, tmp_path / "ck", props, cdc_format="debezium", merge_schema=True))


def records(changes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes' records, with schemas.enable (tests/driver/test_cdc_unavailable.py covers the records without)."""
    return toast.kafka_records(changes, ("id",), schemas=True)


def model(rounds: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[int, dict[str, Any]]]:
    tables: dict[str, dict[int, dict[str, Any]]] = {}
    for c in sorted((c for r in rounds for c in r), key=lambda c: c["lsn"]):
        rows = tables.setdefault(c["table"], {})
        if c["op"] == "d":
            rows.pop(c["before"]["id"], None)
            continue
        after = dict(c["after"])
        for n in TOASTED:
            if after[n] == toast.placeholder(TYPES[n]):
                after[n] = rows[after["id"]][n]
        rows[after["id"]] = after
    return tables


def assert_tables_are(props: Mapping[str, str], rounds: Sequence[Sequence[dict[str, Any]]]) -> None:
    catalog = catalogs.load(None, dict(props))
    for name, want in model(rounds).items():
        table = catalog.load_table(tuple(name.split(".")))
        got = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
        assert set(got) == set(want), name
        for i, r in want.items():
            assert got[i] == as_stored({i: r}, schemas=True)[i], (name, i)
        assert_each_batch_once(table, name)


@pytest.mark.parametrize("entry", ENTRIES)
def test_unchanged_toast_values_keep_the_stored_ones_on_both_entry_points(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Before the fix the placeholder replaced every unchanged TOASTed value (text, bytes, arrays, JSON)."""
    docs, notes = TABLES
    zero = [change(t, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",)) for t in TABLES for i in range(1, 4)]
    one = [change(docs, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",))]  # keeps the table's values
    one += [change(notes, "c", 21, row(9, "new", body="nine"), TYPES, ("id",))]
    one += [change(notes, "u", 22, unchanged_toast(9, "new, updated"), TYPES, ("id",))]  # the batch's own insert
    one += [change(notes, "u", 23, unchanged_toast(2, "v2", body="changed"), TYPES, ("id",))]
    two = [change(docs, "u", 30, unchanged_toast(1, "v3", nums=[7]), TYPES, ("id",))]
    two += [change(docs, "d", 31, {"id": 3}, TYPES, ("id",)), change(notes, "u", 32, unchanged_toast(9, "v3"), TYPES, ("id",))]
    rounds = [zero, one, two]
    for index, changes in enumerate(rounds):
        write_json_round(tmp_path / "in", index, records(changes))
        run(spark, entry, catalog_properties, tmp_path)
        assert_tables_are(catalog_properties, rounds[: index + 1])
    got = catalogs.load(None, dict(catalog_properties)).load_table(("shop", "notes")).scan().to_arrow().to_pylist()
    assert {r["id"]: r["body"] for r in got if r["id"] in (2, 9)} == {2: "changed", 9: "nine"}


DEAD = "audit.dead_letters"


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_placeholder_with_no_value_to_keep_is_a_dead_letter_on_both_entry_points(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """With option dead-letter-table: an update holding the placeholder for a key its table does not hold (alone, or
    twice in the batch), or right after the batch deleted its key, is a dead letter ``unavailable-value`` holding the
    Kafka record; the batch's other changes, of
    both tables, commit with it in one unit; a replay of the batch (its commit log entry removed) writes neither
    again. Before the fix the batch failed with an UpsertKeyError on every restart."""
    docs, notes = TABLES
    zero = [change(t, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",)) for t in TABLES for i in range(1, 3)]
    good = [change(docs, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",))]
    good += [change(notes, "c", 21, row(9, "new", body="nine"), TYPES, ("id",))]
    good += [change(notes, "u", 22, unchanged_toast(9, "new, updated"), TYPES, ("id",))]
    bad = [change(docs, "u", 23, unchanged_toast(7, "never inserted"), TYPES, ("id",))]
    bad += [change(notes, "u", 24 + i, unchanged_toast(8, f"never inserted {i}"), TYPES, ("id",)) for i in range(2)]
    good += [change(notes, "d", 26, {"id": 2}, TYPES, ("id",))]  # applied; the update right after it is a dead letter
    bad += [change(notes, "u", 27, unchanged_toast(2, "after its delete"), TYPES, ("id",))]
    write_json_round(tmp_path / "in", 0, records(zero))
    write_json_round(tmp_path / "in", 1, records([good[0], bad[0], good[1], bad[1], good[2], bad[2], bad[3], good[3]]))

    def go() -> None:
        df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        query = start_sink(
            df, entry, tmp_path / "ck", catalog_properties, cdc_format="debezium", merge_schema=True, dead_letter_table=DEAD
        )
        run_to_end(query)

    def letters() -> list[tuple[str, str, str, int, str]]:
        table = catalogs.load(None, dict(catalog_properties)).load_table(tuple(DEAD.split(".")))
        rows = table.scan().to_arrow().to_pylist()
        return sorted((r["error"], r["column"], r["table"], r["batch_id"], json.loads(r["row"])["value"]) for r in rows)

    expected = sorted(("unavailable-value", "body", c["table"], 1, r["value"]) for c in bad for r in records([c]))
    go()
    assert_tables_are(catalog_properties, [zero, good])
    assert letters() == expected
    (tmp_path / "ck" / "commits" / "1").unlink()  # a restart before Spark's commit log: batch 1 replayed
    (tmp_path / "ck" / "commits" / ".1.crc").unlink(missing_ok=True)
    go()
    assert_tables_are(catalog_properties, [zero, good])
    assert letters() == expected


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_placeholder_change_a_later_delete_absorbs_is_no_dead_letter_on_both_entry_points(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """With option dead-letter-table: of a key whose change after the batch's delete of it is a dead letter, the
    placeholder change before that delete (fillable from the table, or not) is no dead letter -- the delete absorbs it.
    Before the fix every placeholder change of the key was one (20 and 24 here)."""
    docs, _ = TABLES
    zero = [change(docs, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",)) for i in range(1, 3)]
    good = [
        change(docs, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",)),
        change(docs, "d", 21, {"id": 1}, TYPES, ("id",)),
        change(docs, "u", 24, unchanged_toast(7, "never inserted"), TYPES, ("id",)),
        change(docs, "d", 25, {"id": 7}, TYPES, ("id",)),
    ]
    bad = [
        change(docs, "u", 22, unchanged_toast(1, "after its delete"), TYPES, ("id",)),
        change(docs, "u", 26, unchanged_toast(7, "after its delete"), TYPES, ("id",)),
    ]
    write_json_round(tmp_path / "in", 0, records(zero))
    write_json_round(tmp_path / "in", 1, records(sorted([*good, *bad], key=lambda c: c["lsn"])))
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    query = start_sink(
        df, entry, tmp_path / "ck", catalog_properties, cdc_format="debezium", merge_schema=True, dead_letter_table=DEAD
    )
    run_to_end(query)
    assert_tables_are(catalog_properties, [zero, [c for c in good if c["lsn"] != 24]])  # 24: deleted, nothing to keep
    table = catalogs.load(None, dict(catalog_properties)).load_table(tuple(DEAD.split(".")))
    letters = table.scan().to_arrow().to_pylist()
    assert sorted(json.loads(json.loads(r["row"])["value"])["payload"]["source"]["lsn"] for r in letters) == [22, 26]


def line(order_id: int, n: int, qty: int) -> dict[str, Any]:
    return {"order_id": order_id, "line": n, "qty": qty}


LINE_TYPES = {"order_id": "long", "line": "int", "qty": "int"}


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_source_primary_key_change_fails_loudly_naming_both_keys(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """shop.lines created keyed by the records' Kafka key (order_id); the source key becomes (order_id, line) and the
    records' keys say so. Before the fix three source rows collapsed into one, upserted by order_id."""

    def changes(key: tuple[str, ...], rows: Sequence[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [change("shop.lines", "c", lsn, r, LINE_TYPES, key) for lsn, r in rows]

    def records_of(cs: Sequence[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
        return [r for c in cs for r in toast.kafka_records([c], key, schemas=True)]

    old, new = ("order_id",), ("order_id", "line")
    write_json_round(tmp_path / "in", 0, records_of(changes(old, [(10, line(1, 1, 5)), (11, line(2, 1, 6))]), old))
    run(spark, entry, catalog_properties, tmp_path)
    table = catalogs.load(None, dict(catalog_properties)).load_table(("shop", "lines"))
    assert table.schema().identifier_field_names() == {"order_id"}
    head = table.current_snapshot()
    after = changes(new, [(20, line(1, 2, 7)), (21, line(1, 3, 8))])
    write_json_round(tmp_path / "in", 1, records_of(after, new))
    with pytest.raises(Exception, match=r"table shop\.lines is keyed by \(order_id\).*carry key \(order_id, line\)"):
        run(spark, entry, catalog_properties, tmp_path)
    table = catalogs.load(None, dict(catalog_properties)).load_table(("shop", "lines"))
    assert table.current_snapshot() == head  # nothing committed
    assert sorted(r["qty"] for r in table.scan().to_arrow().to_pylist()) == [5, 6]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_batch_spanning_a_key_change_is_refused_then_goes_on_after_the_documented_way_out(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """A batch whose records switch from the old key to the new one (the source's ALTER within the batch): refused on
    every restart while the table keyed by the old key is there, naming the way out; once the table is dropped the same
    batch goes on, the table keyed by the new key from the change on, and the stream after it. Before the fix the
    batch was refused again after the drop (a table lakesink creates takes one key): the stream stuck for good."""
    old, new = ("order_id",), ("order_id", "line")

    def records_of(key: tuple[str, ...], rows: Sequence[tuple[int, str, dict[str, Any]]]) -> list[dict[str, Any]]:
        return toast.kafka_records([change("shop.lines", op, lsn, r, LINE_TYPES, key) for lsn, op, r in rows], key, schemas=True)

    def lines() -> list[tuple[int, int, int]]:
        table = catalogs.load(None, dict(catalog_properties)).load_table(("shop", "lines"))
        assert_each_batch_once(table, "shop.lines")
        return sorted((r["order_id"], r["line"], r["qty"]) for r in table.scan().to_arrow().to_pylist())

    write_json_round(tmp_path / "in", 0, records_of(old, [(10, "c", line(1, 1, 5)), (11, "c", line(2, 1, 6))]))
    run(spark, entry, catalog_properties, tmp_path)
    before = [(12, "u", line(2, 1, 60)), (13, "d", {"order_id": 1})]
    after = [(20, "c", line(1, 2, 7)), (21, "c", line(1, 3, 8)), (22, "u", line(2, 1, 61))]
    write_json_round(tmp_path / "in", 1, records_of(old, before) + records_of(new, after))
    for _ in range(2):
        with pytest.raises(Exception, match=r"switch key.*from source position \d+.*drop \(or rename\) table shop\.lines"):
            run(spark, entry, catalog_properties, tmp_path)
        assert lines() == [(1, 1, 5), (2, 1, 6)]  # nothing committed
    catalogs.load(None, dict(catalog_properties)).drop_table(("shop", "lines"))
    run(spark, entry, catalog_properties, tmp_path)
    model = {(r["order_id"], r["line"]): r for _, _, r in after}
    assert lines() == sorted((k[0], k[1], r["qty"]) for k, r in model.items())
    later = [(30, "u", line(1, 2, 70)), (31, "d", {"order_id": 1, "line": 3}), (32, "c", line(3, 1, 9))]
    write_json_round(tmp_path / "in", 2, records_of(new, later))
    run(spark, entry, catalog_properties, tmp_path)
    model[(1, 2)], model[(3, 1)] = line(1, 2, 70), line(3, 1, 9)
    del model[(1, 3)]
    assert lines() == sorted((k[0], k[1], r["qty"]) for k, r in model.items()) == [(1, 2, 70), (2, 1, 61), (3, 1, 9)]
    table = catalogs.load(None, dict(catalog_properties)).load_table(("shop", "lines"))
    assert table.schema().identifier_field_names() == {"order_id", "line"}
