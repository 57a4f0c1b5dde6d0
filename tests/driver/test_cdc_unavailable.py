"""Option cdc-format: Debezium's unavailable-value placeholder (PostgreSQL's unchanged TOAST values under REPLICA
IDENTITY DEFAULT) keeps the value the table -- or the batch's earlier change of the key -- holds (issue 51, item 5).

No Spark: format("lakesink")'s CDC pipeline driven directly (the staging tasks, lakesink.executor.staged, and the
staged commit, lakesink.sink.staged, on a real SQLite catalog); foreach_batch runs the same routed task writer and
commit below its parsing (tests/sink/test_cdc_unavailable_spark.py runs both entry points in Spark). The records are
Debezium's PostgreSQL connector's, built field by field (tests/support/cdc_debezium.py), the placeholder in each
column type as the connector sends it (tests/support/toast.py); every table equals a model in plain Python.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.cdc import unavailable
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError, UpsertKeyError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.options import SinkOptions
from lakesink.table.keys import SUMMARY_UPSERT_STALE
from tests.support import cdc_debezium, toast
from tests.support.changes import staged_cdc_batch
from tests.support.helpers import run_through_a_fault
from tests.support.toast import change

DOCS = "public.docs"
TYPES = {
    "id": "int",
    "title": "string",
    "body": "string",
    "blob": "binary",
    "tags": "list<string>",
    "nums": "list<int>",
    "meta": "json",
    "blobs": "list<binary>",
    "uuids": "list<uuid>",
}
TOASTED = ("body", "blob", "tags", "nums", "meta", "blobs", "uuids")
KEY = ("id",)


def row(i: int, title: str, body: str | None = None, **toasted: Any) -> dict[str, Any]:
    """A full row of public.docs; ``body`` and ``toasted`` given as ``"toast"`` hold the placeholder."""
    values: dict[str, Any] = {
        "id": i,
        "title": title,
        "body": body if body is not None else f"body of {i} " + "x" * 3000,
        "blob": f"blob {i}".encode(),
        "tags": [f"t{i}", "big"],
        "nums": [i, i + 1],
        "meta": f'{{"n": {i}}}',
        "blobs": [f"b{i}".encode(), b"more"],
        "uuids": [str(uuid.UUID(int=i))],
    }
    values.update(toasted)
    return {c: toast.placeholder(TYPES[c]) if v == "toast" else v for c, v in values.items()}


def unchanged_toast(i: int, title: str, **changed: Any) -> dict[str, Any]:
    """An update of row ``i`` that changes ``title`` (and ``changed``) and leaves every TOASTed column unchanged."""
    return row(i, title, **{c: "toast" for c in TOASTED if c not in changed}, **changed)


def staged_batch(
    props: Mapping[str, str],
    ck: Path,
    query_id: str,
    batch_id: int,
    changes: Sequence[dict[str, Any]],
    *,
    schemas: bool = True,
    options: Mapping[str, str] | None = None,
    run_id: str = "r",
) -> None:
    """One micro-batch of format("lakesink") with option cdc-format over the changes' Kafka records."""
    records = toast.kafka_records(changes, KEY, schemas=schemas)
    staged_cdc_batch(props, ck, query_id, batch_id, records, options, run_id=run_id)


def model(batches: Sequence[Sequence[dict[str, Any]]], raw: bytes = toast.DEFAULT) -> dict[int, dict[str, Any]]:
    """public.docs after the changes in source order, a placeholder keeping the key's value before it."""
    rows: dict[int, dict[str, Any]] = {}
    for c in sorted((c for b in batches for c in b), key=lambda c: c["lsn"]):
        if c["op"] == "d":
            rows.pop(c["before"]["id"], None)
            continue
        after = dict(c["after"])
        for n in TOASTED:
            if after[n] == toast.placeholder(TYPES[n], raw):
                after[n] = rows[after["id"]][n]
        rows[after["id"]] = after
    return rows


def read(props: Mapping[str, str], name: str = DOCS) -> dict[int, dict[str, Any]]:
    table = catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))
    return {r["id"]: r for r in table.scan().to_arrow().to_pylist()}


def as_stored(rows: Mapping[int, Mapping[str, Any]], *, schemas: bool) -> dict[int, dict[str, Any]]:
    """The model's rows as the table holds them: with schemas.enable a bytea is binary; without, JSON's base64 text
    (a table lakesink creates from JSON alone); a bytea[] is a list of base64 texts either way (lakesink types a
    Connect array from its JSON values)."""
    out = {}
    for i, r in rows.items():
        got = dict(r)
        if not schemas:
            got["blob"] = cdc_debezium.value(got["blob"], "binary")
        got["blobs"] = cdc_debezium.value(got["blobs"], "list<binary>")
        out[i] = got
    return out


@pytest.mark.parametrize("schemas", [True, False], ids=["schemas-enable", "no-schemas"])
def test_an_unchanged_toast_value_keeps_the_tables_value(
    catalog_properties: dict[str, str], tmp_path: Path, schemas: bool
) -> None:
    """Before the fix the placeholder replaced the stored text (and bytes, list, JSON) of every updated row."""
    q = str(uuid.uuid4())
    one = [change(DOCS, "c", 10 + i, row(i, f"v1 of {i}"), TYPES, KEY) for i in range(1, 4)]
    two = [
        change(DOCS, "u", 20, unchanged_toast(1, "v2 of 1"), TYPES, KEY),
        change(DOCS, "u", 21, unchanged_toast(2, "v2 of 2", body="a new body"), TYPES, KEY),
    ]
    three = [change(DOCS, "u", 30, unchanged_toast(1, "v3 of 1", tags=["new"]), TYPES, KEY)]
    batches = [one, two, three]
    for batch_id, changes in enumerate(batches):
        staged_batch(catalog_properties, tmp_path / "ck", q, batch_id, changes, schemas=schemas)
        assert read(catalog_properties) == as_stored(model(batches[: batch_id + 1]), schemas=schemas)
    got = read(catalog_properties)
    assert got[1]["body"].startswith("body of 1") and got[1]["title"] == "v3 of 1" and got[1]["tags"] == ["new"]
    assert got[2]["body"] == "a new body"
    assert not [r for r in got.values() for v in r.values() if "__debezium" in str(v)]


def test_in_one_batch_a_placeholder_keeps_the_batchs_earlier_value(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """An insert and its updates in one batch: the updates' placeholders keep the insert's values (the batch's own);
    a later batch's keep the table's. Before the fix the last update's placeholder was written."""
    q = str(uuid.uuid4())
    one = [change(DOCS, "c", 10, row(1, "a", body="first"), TYPES, KEY)]
    one += [change(DOCS, "u", 12, unchanged_toast(1, "c"), TYPES, KEY)]
    one += [change(DOCS, "u", 11, unchanged_toast(1, "b"), TYPES, KEY)]  # an earlier position, later in the topic
    one += [change(DOCS, "c", 13, row(2, "a", body="two"), TYPES, KEY)]
    one += [change(DOCS, "u", 14, unchanged_toast(2, "b", body="two, new"), TYPES, KEY)]
    one += [change(DOCS, "u", 15, unchanged_toast(2, "c"), TYPES, KEY)]  # keeps the batch's newer body
    two = [change(DOCS, "u", 20, unchanged_toast(1, "d"), TYPES, KEY), change(DOCS, "u", 21, unchanged_toast(2, "d"), TYPES, KEY)]
    staged_batch(catalog_properties, tmp_path / "ck", q, 0, one)
    assert read(catalog_properties) == as_stored(model([one]), schemas=True)
    assert {i: r["body"] for i, r in read(catalog_properties).items()} == {1: "first", 2: "two, new"}
    staged_batch(catalog_properties, tmp_path / "ck", q, 1, two)
    assert read(catalog_properties) == as_stored(model([one, two]), schemas=True)
    assert {i: (r["title"], r["body"]) for i, r in read(catalog_properties).items()} == {1: ("d", "first"), 2: ("d", "two, new")}


def test_a_placeholder_with_no_value_to_keep_is_a_loud_error(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """A placeholder for a key the table does not hold, or right after the batch deleted the key: no value to keep
    -- an error naming the table, the column and the key; nothing committed. Before the fix: the placeholder written."""
    q = str(uuid.uuid4())
    staged_batch(catalog_properties, tmp_path / "ck", q, 0, [change(DOCS, "c", 10, row(1, "a"), TYPES, KEY)])
    before = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs")).current_snapshot()
    unheld = [change(DOCS, "u", 20, unchanged_toast(7, "never inserted"), TYPES, KEY)]
    with pytest.raises(UpsertKeyError, match=r"table public\.docs, column 'body', key \(id=7\).*holds no row of that key"):
        staged_batch(catalog_properties, tmp_path / "ck", q, 1, unheld)
    deleted = [change(DOCS, "d", 20, {"id": 1}, TYPES, KEY), change(DOCS, "u", 21, unchanged_toast(1, "back"), TYPES, KEY)]
    with pytest.raises(UpsertKeyError, match=r"table public\.docs, column 'body', key \(id=1\).*deleted the key just before"):
        staged_batch(catalog_properties, tmp_path / "ck", q, 1, deleted)
    table = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs"))
    assert table.current_snapshot() == before  # nothing committed
    # a table the batch creates holds no row yet
    created = [change("public.fresh", "u", 5, unchanged_toast(1, "x"), TYPES, KEY)]
    with pytest.raises(UpsertKeyError, match=r"table public\.fresh, column 'body'"):
        staged_batch(catalog_properties, tmp_path / "ck2", str(uuid.uuid4()), 0, created)
    # after a truncate in the batch the table holds nothing to keep either
    truncated = [change(DOCS, "t", 30, None, TYPES, KEY), change(DOCS, "u", 31, unchanged_toast(1, "after"), TYPES, KEY)]
    with pytest.raises(UpsertKeyError, match=r"table public\.docs, column 'body', key \(id=1\)"):
        staged_batch(catalog_properties, tmp_path / "ck", q, 1, truncated)
    assert catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs")).current_snapshot() == before


DEAD = "public.dead_letters"


def dead_letters(props: Mapping[str, str]) -> list[dict[str, Any]]:
    table = catalogs.load_table_fresh(None, dict(props), tuple(DEAD.split(".")))
    rows: list[dict[str, Any]] = table.scan().to_arrow().to_pylist()
    return rows


def letter_of(c: dict[str, Any]) -> tuple[str, str, str, int]:
    """The dead letter a change of batch 1 with no value to keep is: (error, column, table, batch)."""
    return ("unavailable-value", "body", DOCS, 1)


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_with_a_dead_letter_table_a_placeholder_with_no_value_is_a_dead_letter(
    catalog_properties: dict[str, str], tmp_path: Path, mode: str
) -> None:
    """Option dead-letter-table: a change holding the placeholder with no value to keep -- a key the table does not
    hold (alone, or twice in the batch), a key the batch deleted just before -- is a dead letter ``unavailable-value``
    (the Kafka record as it came) and the batch's other changes commit, in one unit; a replay writes neither again.
    A merge-on-read table (write.merge.mode) too: a batch keeping stored values is upserted copy-on-write. Before the
    fix: an UpsertKeyError on every retry, nothing committed."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    options = {"dead-letter-table": DEAD}
    one = [change(DOCS, "c", 10 + i, row(i, f"v1 of {i}"), TYPES, KEY) for i in range(1, 4)]
    staged_batch(catalog_properties, ck, q, 0, one, options=options)
    docs = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs"))
    with docs.transaction() as tx:
        tx.set_properties({"write.merge.mode": mode})
    unheld = change(DOCS, "u", 20, unchanged_toast(7, "never inserted"), TYPES, KEY)
    twice = [change(DOCS, "u", 21 + i, unchanged_toast(9, f"never inserted {i}"), TYPES, KEY) for i in range(2)]
    after_delete = change(DOCS, "u", 25, unchanged_toast(2, "after its delete"), TYPES, KEY)
    good = [
        change(DOCS, "u", 30, unchanged_toast(1, "v2 of 1"), TYPES, KEY),  # filled from the table
        change(DOCS, "c", 31, row(8, "new"), TYPES, KEY),
        change(DOCS, "u", 32, unchanged_toast(8, "v2 of 8"), TYPES, KEY),  # filled from the batch's insert
        change(DOCS, "d", 24, {"id": 2}, TYPES, KEY),
        change(DOCS, "u", 33, unchanged_toast(3, "v2 of 3", body="new body of 3"), TYPES, KEY),
    ]
    bad = [unheld, *twice, after_delete]
    two = [*good[:2], unheld, good[2], twice[0], good[3], after_delete, twice[1], good[4]]
    staged_batch(catalog_properties, ck, q, 1, two, options=options)
    expected = as_stored(model([one, good]), schemas=True)
    assert read(catalog_properties) == expected
    got = dead_letters(catalog_properties)
    assert sorted((r["error"], r["column"], r["table"], r["batch_id"], json.loads(r["row"])["value"]) for r in got) == sorted(
        (*letter_of(c), k["value"]) for c in bad for k in toast.kafka_records([c], KEY, schemas=True)
    )
    assert all("no value to keep" in r["message"] and "public.docs" in r["message"] for r in got)
    assert sorted(json.loads(json.loads(r["row"])["value"])["payload"]["source"]["lsn"] for r in got) == sorted(
        c["lsn"] for c in bad
    )
    # a replay of the committed batch (a restart before Spark's commit log) writes nothing twice
    staged_batch(catalog_properties, ck, q, 1, two, options=options, run_id="restarted")
    assert read(catalog_properties) == expected
    assert len(dead_letters(catalog_properties)) == len(bad)
    # the stream goes on: a later update of a key whose change was a dead letter, with every value, is applied
    three = [change(DOCS, "c", 40, row(7, "sent whole"), TYPES, KEY)]
    staged_batch(catalog_properties, ck, q, 2, three, options=options, run_id="restarted")
    assert read(catalog_properties) == as_stored(model([one, good, three]), schemas=True)
    assert len(dead_letters(catalog_properties)) == len(bad)


def test_after_a_truncate_a_placeholder_is_a_dead_letter(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """A truncate in the batch leaves no row to keep a value from: the update after it holding the placeholder is a
    dead letter, the truncate and a whole insert after it commit. Before the fix: an UpsertKeyError."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    options = {"dead-letter-table": DEAD}
    one = [change(DOCS, "c", 10 + i, row(i, f"v1 of {i}"), TYPES, KEY) for i in range(1, 3)]
    staged_batch(catalog_properties, ck, q, 0, one, options=options)
    bad = [change(DOCS, "u", 31, unchanged_toast(1, "after the truncate"), TYPES, KEY)]
    two = [change(DOCS, "t", 30, None, TYPES, KEY), *bad, change(DOCS, "c", 32, row(3, "new"), TYPES, KEY)]
    staged_batch(catalog_properties, ck, q, 1, two, options=options)
    assert read(catalog_properties) == as_stored({3: row(3, "new")}, schemas=True)
    got = dead_letters(catalog_properties)
    assert [(r["error"], r["column"], json.loads(r["row"])["value"]) for r in got] == [
        ("unavailable-value", "body", toast.kafka_records(bad, KEY, schemas=True)[0]["value"])
    ]


@pytest.mark.parametrize("point", [DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP])
def test_unavailable_value_dead_letters_once_through_a_crash_and_restart(
    catalog_properties: dict[str, str], tmp_path: Path, faults: Any, point: str
) -> None:
    """The batch written again with its dead letters fails at its commit (before the catalog swap: nothing landed;
    after it: the unit landed, Spark never heard): the restarted query's replay commits it, or finds it committed --
    the target and the dead letters hold each change once."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    options = {"dead-letter-table": DEAD}
    one = [change(DOCS, "c", 10 + i, row(i, f"v1 of {i}"), TYPES, KEY) for i in range(1, 3)]
    staged_batch(catalog_properties, ck, q, 0, one, options=options)
    good = [change(DOCS, "u", 20, unchanged_toast(1, "v2 of 1"), TYPES, KEY)]
    bad = [change(DOCS, "u", 21, unchanged_toast(5, "never inserted"), TYPES, KEY)]
    run_through_a_fault(faults, point, lambda: staged_batch(catalog_properties, ck, q, 1, [*good, *bad], options=options))
    assert faults.fired(point)
    faults.clear()
    staged_batch(catalog_properties, ck, q, 1, [*good, *bad], options=options, run_id="restarted")
    assert read(catalog_properties) == as_stored(model([one, good]), schemas=True)
    got = dead_letters(catalog_properties)
    assert [(r["error"], r["table"], json.loads(r["row"])["value"]) for r in got] == [
        ("unavailable-value", DOCS, toast.kafka_records(bad, KEY, schemas=True)[0]["value"])
    ]


def test_a_placeholder_a_later_whole_change_replaces_needs_no_value(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """Without a dead-letter table: changes holding the placeholder with nothing to keep (a key the table does not
    hold, one the batch deleted just before) that a later change of the key in the batch replaces whole are not
    applied and need no value; the batch commits the later changes. Before: the update right after the delete failed
    the batch in its task, though the next change replaced it."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    one = [change(DOCS, "c", 10, row(1, "a"), TYPES, KEY)]
    two = [
        change(DOCS, "d", 20, {"id": 1}, TYPES, KEY),
        change(DOCS, "u", 21, unchanged_toast(1, "after its delete"), TYPES, KEY),
        change(DOCS, "u", 22, row(1, "whole again", body="b1"), TYPES, KEY),
        change(DOCS, "u", 23, unchanged_toast(5, "never inserted"), TYPES, KEY),
        change(DOCS, "u", 24, row(5, "whole", body="b5"), TYPES, KEY),
    ]
    staged_batch(catalog_properties, ck, q, 0, one)
    staged_batch(catalog_properties, ck, q, 1, two)
    whole = [c for c in two if c["lsn"] in (20, 22, 24)]
    assert read(catalog_properties) == as_stored(model([one, whole]), schemas=True)


def test_a_stale_placeholder_is_not_applied_and_needs_no_value(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """Order-by across batches: a redelivered older update with placeholders (of a row since updated, or since
    deleted) is stale like any older change -- not applied, no error. Before the fix the update into the live row was
    not applied either (stale), the test holds that the fill does not change it."""
    q = str(uuid.uuid4())
    one = [change(DOCS, "c", 10, row(1, "a", body="one"), TYPES, KEY), change(DOCS, "c", 11, row(2, "a"), TYPES, KEY)]
    two = [change(DOCS, "u", 30, row(1, "new", body="newer"), TYPES, KEY), change(DOCS, "d", 40, {"id": 2}, TYPES, KEY)]
    three = [change(DOCS, "u", 20, unchanged_toast(1, "older"), TYPES, KEY)]
    three += [change(DOCS, "u", 35, unchanged_toast(2, "before its delete"), TYPES, KEY)]
    four = [change(DOCS, "u", 50, unchanged_toast(1, "newest"), TYPES, KEY)]
    for batch_id, changes in enumerate([one, two, three]):
        staged_batch(catalog_properties, tmp_path / "ck", q, batch_id, changes)
    assert read(catalog_properties) == as_stored(model([one, two]), schemas=True)  # both stale: nothing changed
    head = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs")).current_snapshot()
    assert head is not None and head.summary is not None and head.summary[SUMMARY_UPSERT_STALE] == "2"
    staged_batch(catalog_properties, tmp_path / "ck", q, 3, four)
    assert read(catalog_properties) == as_stored(model([one, two, three, four]), schemas=True)
    assert {i: (r["title"], r["body"]) for i, r in read(catalog_properties).items()} == {1: ("newest", "newer")}


def test_option_cdc_unavailable_value_names_the_connectors_placeholder(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """A connector configured with another placeholder (hex octets too): that one keeps the value; Debezium's default
    text is then an ordinary value."""
    q = str(uuid.uuid4())
    raw = bytes.fromhex("fe01") + b"toast"  # not UTF-8 text: the string columns hold Java's decoding of it
    custom = {"cdc-unavailable-value": "hex:FE01" + b"toast".hex()}
    one = [change(DOCS, "c", 10, row(1, "a"), TYPES, KEY), change(DOCS, "c", 11, row(2, "a"), TYPES, KEY)]
    two = [change(DOCS, "u", 20, row(1, "b", **{c: toast.placeholder(TYPES[c], raw) for c in TOASTED}), TYPES, KEY)]
    two += [change(DOCS, "u", 21, row(2, "b", body=toast.DEFAULT.decode()), TYPES, KEY)]  # a real value now
    for batch_id, changes in enumerate([one, two]):
        staged_batch(catalog_properties, tmp_path / "ck", q, batch_id, changes, options=custom)
    assert read(catalog_properties) == as_stored(model([one, two], raw), schemas=True)
    assert read(catalog_properties)[2]["body"] == "__debezium_unavailable_value"
    with pytest.raises(InvalidOptionError, match="cdc-unavailable-value.*hexadecimal octets"):
        SinkOptions.from_mapping({"cdc-format": "debezium", "cdc-unavailable-value": "hex:xyz"})
    with pytest.raises(InvalidOptionError, match="cdc-unavailable-value.*needs option 'cdc-format'"):
        SinkOptions.from_mapping({"route-by": "r", "cdc-unavailable-value": "<toast>"})
    options = SinkOptions.from_mapping({"cdc-format": "debezium"})
    assert options.cdc_unavailable_value.raw == toast.DEFAULT


def test_marks_recognise_debeziums_form_of_the_placeholder_per_column_type() -> None:
    """Each form debezium-connector-postgres' UnchangedToastedPlaceholder gives (tests/support/toast.py, written from
    its source), a hex placeholder's signed integers and Java's name UUID among them; a near miss is a value."""
    raw = bytes.fromhex("ff00") + b"x"
    text = raw.decode("utf-8", errors="replace")
    hstore_json = json.dumps({text: text}, separators=(",", ":"), ensure_ascii=False)  # Jackson's: \u0000 escaped
    columns = {
        "text": (pa.string(), toast.placeholder("string", raw), raw.decode("utf-8", errors="replace") + " "),
        "bytea": (pa.binary(), toast.placeholder("binary", raw), raw + b"\0"),
        "bytea_no_schema": (pa.string(), base64.b64encode(raw).decode(), "AAAA"),
        "texts": (pa.list_(pa.string()), toast.placeholder("list<string>", raw), [raw.decode("utf-8", errors="replace"), "b"]),
        "ints": (pa.list_(pa.int32()), toast.placeholder("list<int>", raw), [-1, 0, 121]),
        "longs": (pa.list_(pa.int64()), toast.placeholder("list<long>", raw), []),
        "blobs": (pa.list_(pa.binary()), toast.placeholder("list<binary>", raw), [b"x"]),
        "uuids": (pa.list_(pa.string()), toast.placeholder("list<uuid>", raw), [str(uuid.UUID(int=1))]),
        "hstore_json": (pa.string(), hstore_json, "{}"),
        "hstore_map": (pa.map_(pa.string(), pa.string()), [(raw.decode("utf-8", errors="replace"),) * 2], [("a", "b")]),
    }
    assert toast.placeholder("list<int>", raw) == [-1, 0, 120]
    batch = pa.record_batch(
        [pa.array([hit, miss, None], t) for t, hit, miss in columns.values()] + [pa.array([False, False, False])],
        names=[*columns, "deleted"],
    )
    marked = unavailable.marks(batch, list(columns), unavailable.Placeholder(raw), "deleted")
    got = marked.column(unavailable.UNAVAILABLE_COLUMN).to_pylist()
    assert json.loads(got[0]) == list(columns) and got[1:] == [None, None]
    deleted = batch.set_column(len(columns), "deleted", pa.array([True, False, False]))
    assert unavailable.marks(deleted, list(columns), unavailable.Placeholder(raw), "deleted").column(
        unavailable.UNAVAILABLE_COLUMN
    ).to_pylist() == [None, None, None]  # a delete's values are not written


@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
def test_a_placeholder_change_the_batch_deletes_after_is_no_dead_letter(
    catalog_properties: dict[str, str], tmp_path: Path, mode: str
) -> None:
    """Issue 51 leftover (over-rejection): only the changes with no value to keep are dead letters. A placeholder
    change followed by a delete of its key in the batch is absorbed by the delete (as it is when no other change of the
    key is a dead letter): it is no dead letter even when a later change of the key, after the delete, is one -- else
    the dead-letter table holds a change that was fine (re-applied by whoever repairs dead letters, after the delete, it
    would bring the deleted row back). Before the fix the changes at 20 and 25 were dead letters too."""
    q, ck = str(uuid.uuid4()), tmp_path / "ck"
    options = {"dead-letter-table": DEAD}
    one = [change(DOCS, "c", 10 + i, row(i, f"v1 of {i}"), TYPES, KEY) for i in range(1, 4)]
    staged_batch(catalog_properties, ck, q, 0, one, options=options)
    docs = catalogs.load_table_fresh(None, dict(catalog_properties), ("public", "docs"))
    with docs.transaction() as tx:
        tx.set_properties({"write.merge.mode": mode})
    good = [
        change(DOCS, "u", 20, unchanged_toast(2, "v2 of 2"), TYPES, KEY),  # fillable from the table; then deleted
        change(DOCS, "d", 21, {"id": 2}, TYPES, KEY),
        change(DOCS, "u", 23, unchanged_toast(3, "v2 of 3"), TYPES, KEY),  # deleted after: no letter of key 3 at all
        change(DOCS, "d", 24, {"id": 3}, TYPES, KEY),
        change(DOCS, "u", 25, unchanged_toast(7, "never inserted"), TYPES, KEY),  # no value, but deleted after
        change(DOCS, "d", 26, {"id": 7}, TYPES, KEY),
    ]
    bad = [
        change(DOCS, "u", 22, unchanged_toast(2, "after its delete"), TYPES, KEY),
        change(DOCS, "u", 27, unchanged_toast(7, "after its delete"), TYPES, KEY),
    ]
    two = sorted([*good, *bad], key=lambda c: c["lsn"])
    staged_batch(catalog_properties, ck, q, 1, two, options=options)
    expected = as_stored(model([one, [c for c in good if c["lsn"] != 25]]), schemas=True)  # 25: nothing to keep, deleted
    assert read(catalog_properties) == expected and sorted(expected) == [1]
    got = dead_letters(catalog_properties)
    assert sorted(json.loads(json.loads(r["row"])["value"])["payload"]["source"]["lsn"] for r in got) == [22, 27]
    assert all(r["error"] == "unavailable-value" and "deleted the key" in r["message"] for r in got), got
    staged_batch(catalog_properties, ck, q, 1, two, options=options, run_id="restarted")  # a replay: nothing twice
    assert read(catalog_properties) == expected and len(dead_letters(catalog_properties)) == 2
