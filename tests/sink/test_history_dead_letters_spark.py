"""Option history with option dead-letter-table (issue 55), on both entry points, one table, routed and change streams: a history
table records the changes its table APPLIES. A change that is a dead letter (a value that does not fit, reject-when, a
null key) is never a version and never closes its key's current version; the dead-letter table, the table and its
history commit in the batch's one unit, exactly once through a replay; a batch over max-rejected-fraction commits in
none of the three.

The oracle: the changes with the dead letters taken out (the rule of docs/dead-letters.md) fed to the plain-Python
models of tests/sink/test_history_spark.py (the table: each key's newest change; the history: each key's changes
chained by order value).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.table import dead_letters as dl
from lakesink.table.keys import DRIVER_LOOKUP_BYTES, SUMMARY_UPSERT_MODE
from tests.driver.test_cdc_unavailable import TYPES, row, unchanged_toast
from tests.sink.test_cdc_unavailable_spark import DEAD, TABLES, assert_tables_are, records
from tests.sink.test_history_spark import at, history_model, table_model, versions_of
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import assert_snapshot_invariants, assert_table_is_current_versions, lakesink_snapshots, start_sink
from tests.support.toast import change

pytestmark = pytest.mark.spark

DDL = "eid long, id long, value string, seq long, op string, ts timestamp, dest string"
Change = dict[str, Any]
REJECT_WHEN = "op = 'x' or value = 'reject'"


def _c(eid: int, key: int | None, value: str | None = "v", op: str = "u") -> Change:
    """A change with a unique id and sequence number (``eid``); ``value`` None: a required-null dead letter unless it
    is a delete (a delete is checked by its key only); ``op`` 'x' or ``value`` 'reject': a reject-when dead letter."""
    text = value if value in (None, "reject") else f"{value}{eid}"
    return {"eid": eid, "id": key, "value": text, "seq": eid, "op": op, "ts": at(eid), "dest": "events"}


BATCHES: list[list[Change]] = [
    # key 9's only change does not fit: no version (format("lakesink") with route-by writes a table it did not plan
    # with the template and finds this dead letter when it rewrites the rows into the table, on the driver)
    [*(_c(i, i, op="c") for i in range(1, 7)), _c(7, 9, value=None, op="c")],
    [
        _c(10, 7, op="c"),  # a new key that fits ...
        _c(11, 7, value=None),  # ... then a later change of it that does not: key 7's version is seq 10, current
        _c(12, 1, op="x"),  # key 1's only change is a letter: its version of batch 0 stays current, valid_to null
        _c(13, 2),  # key 2: applied, a letter, applied: the versions chain 1 -> 13 -> 15
        _c(14, 2, op="x"),
        _c(15, 2),
        _c(16, 3, value="reject", op="d"),  # a delete that is a letter: key 3 stays, its version current
        _c(17, 4, value=None, op="d"),  # a delete with a null value is no letter: key 4 is deleted
        _c(18, 8, value=None),  # a new key whose only change is a letter: no version at all
        _c(19, None),  # a null key
        _c(20, 5),  # key 5: applied, then a delete that is a letter
        _c(21, 5, value="reject", op="d"),
        _c(22, 6, op="d"),  # a delete that applies
    ],
    # every change a letter: over max-rejected-fraction, the batch fails and none of the three tables gets it
    [_c(30, 6, op="x"), _c(31, 2, value=None), _c(32, 1, value="reject")],
]
MAX_REJECTED = 0.7  # batch 0: 1 of 7 rejected; batch 1: 7 of 13; batch 2: all


def letter(c: Change) -> str | None:
    if c["op"] == "x" or c["value"] == "reject":
        return dl.REJECT_WHEN
    if c["id"] is None:
        return dl.NULL_UPSERT_KEY
    if c["value"] is None and c["op"] != "d":
        return dl.REQUIRED_NULL
    return None


def applied(batches: list[list[Change]]) -> list[list[Change]]:
    return [[c for c in b if letter(c) is None] for b in batches]


def create_table(props: dict[str, str], *, mor: bool = False) -> None:
    """The mirror, ``value`` NOT NULL (a change with a null value is a required-null dead letter); ``mor``:
    merge-on-read, its keys looked up by Spark's executors."""
    cat = catalogs.load(None, dict(props))
    cat.create_namespace_if_not_exists(("db",))
    schema = Schema(
        NestedField(1, "eid", LongType(), required=False),
        NestedField(2, "id", LongType(), required=True),
        NestedField(3, "value", StringType(), required=True),
        NestedField(4, "seq", LongType(), required=False),
        NestedField(5, "op", StringType(), required=False),
        NestedField(6, "ts", TimestamptzType(), required=False),
        identifier_field_ids=[2],
    )
    cat.create_table(
        ("db", "events"), schema, properties={"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"} if mor else {}
    )


def write_batch(src: Path, i: int) -> None:
    path = src / f"part-{i}.json"
    path.write_text("".join(json.dumps(c) + "\n" for c in BATCHES[i]))
    os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order, one file per batch


def run(spark: Any, src: Path, ck: Path, props: dict[str, str], entry: str, routed: bool) -> None:
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
    if entry == "format":  # its tasks resolve a key's changes in one task: every row of a key there
        df = df.repartition(2, "id")
    target = {"route_by": "dest", "namespace": "db"} if routed else {"table": "db.events"}
    query = start_sink(
        df if routed else df.drop("dest"),
        entry,
        ck,
        props,
        **target,
        upsert_key="id",
        order_by="seq",
        delete_when="op = 'd'",
        history="on",
        history_time="ts",
        dead_letter_table="db.dead",
        reject_when=REJECT_WHEN,
        max_rejected_fraction=str(MAX_REJECTED) if entry == "format" else MAX_REJECTED,
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()


def load(props: dict[str, str], name: str) -> Any:
    return catalogs.load_table_fresh(None, props, ("db", name))


def letters_of(props: dict[str, str]) -> Counter[tuple[int, str, int]]:
    out: Counter[tuple[int, str, int]] = Counter()
    for r in load(props, "dead").scan().to_arrow().to_pylist():
        out[(json.loads(r[dl.ROW])["eid"], r[dl.ERROR], r[dl.BATCH_ID])] += 1
    return out


def heads(props: dict[str, str]) -> tuple[Any, ...]:
    return tuple(load(props, n).metadata.current_snapshot_id for n in ("events", "events__history", "dead"))


def assert_state(props: dict[str, str], batches: int) -> None:
    """The three tables equal the models of the first ``batches`` batches."""
    done = BATCHES[:batches]
    table, history = load(props, "events"), load(props, "events__history")
    rows = table.scan().to_arrow().to_pylist()
    assert {r["id"]: (r["eid"], r["value"]) for r in rows} == table_model(applied(done))
    assert len(rows) == len({r["id"] for r in rows})
    assert versions_of(history.scan().to_arrow()) == history_model(applied(done))
    want = Counter((c["eid"], letter(c), b) for b, batch in enumerate(done) for c in batch if letter(c) is not None)
    assert letters_of(props) == want
    assert_table_is_current_versions(table, history, ("id",))
    for t in (table, history, load(props, "dead")):
        assert_snapshot_invariants(t)
    assert [s["batch_id"] for s in lakesink_snapshots(history)] == list(range(batches))


@pytest.mark.parametrize(
    ("entry", "routed", "mor"),
    [
        ("foreach", False, False),
        pytest.param("format", False, False, marks=pytest.mark.long),  # make test's time: the routed format case
        pytest.param("foreach", True, False, marks=pytest.mark.long),  # and the foreach cases cover both paths there
        ("format", True, False),
        ("foreach", False, True),
    ],
)
def test_a_dead_letter_is_never_a_version_and_the_three_tables_commit_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, routed: bool, mor: bool
) -> None:
    props = catalog_properties
    create_table(props, mor=mor)
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    write_batch(src, 0)
    run(spark, src, ck, props, entry, routed)
    assert_state(props, 1)
    # batch 1 lands in the three tables, then the driver fails before Spark's commit log: the restart replays it
    write_batch(src, 1)
    faults.arm(DRIVER_AFTER_SWAP, "raise")
    with pytest.raises(Exception, match="fault injected"):
        run(spark, src, ck, props, entry, routed)
    assert faults.fired(DRIVER_AFTER_SWAP)
    landed = heads(props)
    run(spark, src, ck, props, entry, routed)
    assert heads(props) == landed  # the replay adds nothing to any of the three
    assert_state(props, 2)
    # the models say what the attacks above mean
    versions = history_model(applied(BATCHES[:2]))
    assert [v[1:2] + v[4:7] for v in versions if v[0] == 1] == [(1, None, True, "insert")]  # still open
    assert [(v[1], v[4], v[5]) for v in versions if v[0] == 2] == [(2, at(13), False), (13, at(15), False), (15, None, True)]
    assert [v[1] for v in versions if v[0] == 7] == [10] and not [v for v in versions if v[0] == 8]
    assert [(v[1], v[5]) for v in versions if v[0] == 3] == [(3, True)]
    # a batch over max-rejected-fraction: nothing committed in any of the three tables
    write_batch(src, 2)
    with pytest.raises(Exception, match="TooManyRejected|rejected"):
        run(spark, src, ck, props, entry, routed)
    assert heads(props) == landed
    assert_state(props, 2)
    if mor:  # batch 1's upsert was a row delta
        events = load(props, "events")
        last = events.metadata.snapshot_by_id(lakesink_snapshots(events)[-1]["snapshot_id"]).summary
        assert last.get(SUMMARY_UPSERT_MODE) == "merge-on-read" and int(last.get("added-position-deletes") or 0) > 0


@pytest.mark.parametrize("entry", [pytest.param("foreach", marks=pytest.mark.long), "format"])
def test_a_change_streams_dead_letters_are_no_versions_of_its_tables_histories(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Option cdc-format (Debezium's PostgreSQL records, built field by field: tests/support/cdc_debezium.py): an update
    holding the unavailable-value placeholder with no value to keep (its key's table holds no row; right after the
    batch deleted the key) is a dead letter found by the commit or the writer, the batch written again without it:
    it is no version of its table's history either, and a replay of the batch adds nothing."""
    props = catalog_properties
    docs, notes = TABLES
    zero = [change(t, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",)) for t in TABLES for i in range(1, 3)]
    good = [change(docs, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",))]
    good += [change(notes, "c", 21, row(9, "new", body="nine"), TYPES, ("id",))]
    good += [change(notes, "u", 22, unchanged_toast(9, "new, updated"), TYPES, ("id",))]
    bad = [change(docs, "u", 23, unchanged_toast(7, "never inserted"), TYPES, ("id",))]
    bad += [change(notes, "u", 24, unchanged_toast(8, "never inserted"), TYPES, ("id",))]
    good += [change(notes, "d", 26, {"id": 2}, TYPES, ("id",))]  # applied; the update right after it is a dead letter
    bad += [change(notes, "u", 27, unchanged_toast(2, "after its delete"), TYPES, ("id",))]
    write_json_round(tmp_path / "in", 0, records(zero))
    write_json_round(tmp_path / "in", 1, records([good[0], bad[0], good[1], bad[1], good[2], good[3], bad[2]]))

    def go() -> None:
        df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        query = start_sink(
            df, entry, tmp_path / "ck", props, cdc_format="debezium", merge_schema=True, dead_letter_table=DEAD, history="on"
        )
        query.awaitTermination()
        query.stop()

    catalog = catalogs.load(None, dict(props))

    def state() -> tuple[Any, ...]:
        out: list[Any] = []
        for name in TABLES:
            table = catalog.load_table(tuple(name.split(".")))
            history = catalog.load_table(tuple((name + "__history").split(".")))
            assert_table_is_current_versions(table, history, ("id",))
            out.append(sorted((r["id"], r["operation"], r["is_current"]) for r in history.scan().to_arrow().to_pylist()))
        letters = catalog.load_table(tuple(DEAD.split("."))).scan().to_arrow().to_pylist()
        out.append(sorted((r["error"], r["table"], r["batch_id"], json.loads(r["row"])["value"]) for r in letters))
        return tuple(out)

    want = (
        [(1, "insert", False), (1, "update", True), (2, "insert", True)],  # no version of key 7
        [(1, "insert", True), (2, "delete", False), (2, "insert", False), (9, "insert", False), (9, "update", True)],
        sorted(("unavailable-value", c["table"], 1, r["value"]) for c in bad for r in records([c])),
    )
    go()
    assert_tables_are(props, [zero, good])
    assert state() == want
    (tmp_path / "ck" / "commits" / "1").unlink()  # a restart before Spark's commit log: batch 1 replayed
    (tmp_path / "ck" / "commits" / ".1.crc").unlink(missing_ok=True)
    go()
    assert_tables_are(props, [zero, good])
    assert state() == want
