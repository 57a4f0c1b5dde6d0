"""One dead-letter rule for upserts into one table, on both entry points (issue 31): a change that is a dead letter is
taken out BEFORE its key is resolved -- it is not applied, and its key resolves from the batch's other changes, or keeps
its row -- the rule of a routed table and of ``format("lakesink")``'s tasks.

Fails on 61f3c07 for ``foreach``: there Spark resolved the batch first and the sorter checked the winning row for a
required null, so key 1 below (a valid change, then a later one with a null in a NOT NULL column) lost both its row
and its valid change (the key was deleted from the table), and its dead letter was the resolved row only.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.driver import catalogs
from lakesink.table import dead_letters as dl
from lakesink.table.keys import DRIVER_LOOKUP_BYTES, SUMMARY_UPSERT_MODE
from tests.support.helpers import assert_snapshot_invariants, create_required_value_table, lakesink_snapshots, run_to_end

pytestmark = pytest.mark.spark

DDL = "id LONG, value STRING, seq LONG, op STRING"
Change = dict[str, Any]


def _c(key: int | None, seq: int, value: str | None = "v", op: str = "u") -> Change:
    return {"id": key, "value": None if value is None else f"{value}{seq}", "seq": seq, "op": op}


# every change has a unique seq; a change whose value is None is a required-null dead letter (value NOT NULL), one
# with op 'x' a reject-when dead letter, a null key a null-upsert-key dead letter; op 'd' deletes
BATCHES: list[list[Change]] = [
    [_c(1, 1), _c(2, 2), _c(3, 3), _c(5, 4)],
    [
        _c(1, 10),  # a valid change of key 1 ...
        _c(1, 11, value=None),  # ... then a later invalid one: key 1 takes seq 10
        _c(2, 12, value=None),  # only an invalid change: key 2 keeps its row (seq 2)
        _c(3, 13, op="x"),  # rejected, then a delete of key 3 after it: the delete applies
        _c(3, 14, value=None, op="d"),  # a delete is checked by its key only (its null value is no dead letter)
        _c(4, 15),  # an insert, then an invalid change: key 4 takes seq 15
        _c(4, 16, value=None),
        _c(6, 17, value=None),  # an invalid insert only: no row for key 6
        _c(None, 18),  # a null key
        _c(5, 19, op="x"),  # rejected: key 5 keeps seq 4
    ],
]


def is_letter(c: Change) -> tuple[str, str | None] | None:
    if c["op"] == "x":
        return (dl.REJECT_WHEN, None)
    if c["id"] is None:
        return (dl.NULL_UPSERT_KEY, "id")
    if c["value"] is None and c["op"] != "d":
        return (dl.REQUIRED_NULL, "value")
    return None


def model(batches: list[list[Change]]) -> tuple[dict[int, tuple[str, int]], Counter[Any]]:
    """The table by key (value, seq) and the dead letters (seq, error, column, batch) under the rule: dead letters out
    first, then each key's greatest seq wins (a delete removes the key)."""
    rows: dict[int, tuple[str, int]] = {}
    letters: Counter[Any] = Counter()
    for b, batch in enumerate(batches):
        winners: dict[int, Change] = {}
        for c in batch:
            letter = is_letter(c)
            if letter is not None:
                letters[(c["seq"], *letter, b)] += 1
            elif c["id"] not in winners or c["seq"] > winners[c["id"]]["seq"]:
                winners[c["id"]] = c
        for key, c in winners.items():
            if c["op"] == "d":
                rows.pop(key, None)
            else:
                rows[key] = (c["value"], c["seq"])
    return rows, letters


def table_state(props: dict[str, str]) -> dict[int, tuple[str, int]]:
    table = catalogs.load_table_fresh(None, props, ("db", "events"))
    assert_snapshot_invariants(table)
    rows = table.scan().to_arrow().to_pylist()
    assert len({r["id"] for r in rows}) == len(rows), "a key twice"
    return {r["id"]: (r["value"], r["seq"]) for r in rows}


def dead_letters(props: dict[str, str]) -> Counter[Any]:
    table = catalogs.load_table_fresh(None, props, ("db", "dead"))
    out: Counter[Any] = Counter()
    for r in table.scan().to_arrow().to_pylist() if table.current_snapshot() else []:
        row = json.loads(r[dl.ROW])
        out[(row["seq"], r[dl.ERROR], r[dl.COLUMN], r[dl.BATCH_ID])] += 1
    return out


@pytest.mark.parametrize(
    ("entry", "mode"),
    [("foreach", "cow"), ("foreach", "mor"), ("foreach", "mor-executors"), ("format", "cow"), ("format", "mor")],
)
def test_a_dead_lettered_change_is_not_applied_and_its_key_resolves_from_the_others(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, mode: str
) -> None:
    """``mor``: the table is merge-on-read: the second batch's upserts and deletes are a row delta, in the same unit
    as its dead letters (``mor-executors``: foreach_batch's lookup by Spark's executors, not on the driver)."""
    props = catalog_properties
    create_required_value_table(props, ("db", "events"))
    if mode.startswith("mor"):
        table = catalogs.load_table_fresh(None, props, ("db", "events"))
        mor = {"write.merge.mode": "merge-on-read", **({DRIVER_LOOKUP_BYTES: "0"} if mode == "mor-executors" else {})}
        table.transaction().set_properties(mor).commit_transaction()
    src = tmp_path / "in"
    src.mkdir()
    for i, batch in enumerate(BATCHES):
        path = src / f"part-{i}.json"
        path.write_text("".join(json.dumps(c) + "\n" for c in batch))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
    options = {"upsert-key": "id", "order-by": "seq", "delete-when": "op = 'd'", "dead-letter-table": "db.dead"}
    if entry == "format":  # its tasks resolve their rows by key: every row of a key in one task
        lakesink.register(spark)
        writer = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
        for k, v in {**options, "reject-when": "op = 'x'", **{f"catalog.{k}": v for k, v in props.items()}}.items():
            writer = writer.option(k, v)
    else:
        sink = lakesink.foreach_batch(
            "db.events",
            catalog_properties=props,
            upsert_key="id",
            order_by="seq",
            delete_when="op = 'd'",
            dead_letter_table="db.dead",
            reject_when="op = 'x'",
        )
        writer = df.writeStream.foreachBatch(sink)
    run_to_end(writer.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    want_rows, want_letters = model(BATCHES)
    assert want_rows == {1: ("v10", 10), 2: ("v2", 2), 4: ("v15", 15), 5: ("v4", 4)}  # the model is the rule
    assert table_state(props) == want_rows
    assert dead_letters(props) == want_letters
    events: Any = catalogs.load_table_fresh(None, props, ("db", "events"))
    last = events.metadata.snapshot_by_id(lakesink_snapshots(events)[-1]["snapshot_id"]).summary
    if mode.startswith("mor"):
        assert last.get(SUMMARY_UPSERT_MODE) == "merge-on-read" and int(last.get("added-position-deletes") or 0) > 0
        assert not int(last.get("deleted-data-files") or 0)
