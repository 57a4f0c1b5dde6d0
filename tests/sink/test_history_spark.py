"""Option history through foreach_batch with real Spark (issue 55): every change of an upsert stream kept as a version
in the table's history table (SCD type 2), committed in the batch's unit with the table's own upsert.

The oracle is a plain-Python model of the change log: each key's distinct changes (a redelivered change -- same key and
order value -- counted once) in order-value order, each version valid from its change's time to the next one's, the
last one current unless it is a delete, the operation ``insert`` for a key's first version or its first after a delete.
The history must equal it in pyiceberg, DuckDB and iceberg-rust; the table must equal the upsert model; and at every
batch's snapshots, the table must equal the history's current versions (they never disagree, not even for one snapshot).
"""

from __future__ import annotations

import datetime
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink.audit import interop
from lakesink.cli.main import main
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.table.keys import (
    DRIVER_LOOKUP_BYTES,
    SUMMARY_HISTORY_ADDED,
    SUMMARY_HISTORY_OF,
    SUMMARY_HISTORY_REDELIVERED,
    SUMMARY_HISTORY_SEEDED,
    SUMMARY_UPSERT_MODE,
)
from tests.sink.test_upserts_spark import write_events
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, run_to_end
from tests.support.history import utc_iso, versions

pytestmark = pytest.mark.spark

Event = dict[str, Any]
DDL = "eid long, id long, value string, seq long, op string, ts timestamp"
T0 = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
MOR = {"write.merge.mode": "merge-on-read", DRIVER_LOOKUP_BYTES: "0"}


def at(seq: int) -> str:
    """The change's source time: one minute per sequence number (late changes have negative ones: before T0)."""
    return (T0 + datetime.timedelta(minutes=seq)).strftime("%Y-%m-%dT%H:%M:%SZ")


def stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    """Several changes of a key per batch, deletes and re-inserts; event ids and sequence numbers unique."""
    rng = random.Random(seed)
    out, eid = [], 0
    for _ in range(batches):
        events = []
        for _ in range(per_batch):
            eid += 1
            op = "d" if rng.random() < 0.25 else rng.choice(["c", "u"])
            events.append({"eid": eid, "id": rng.randrange(keys), "value": f"v{eid}", "seq": eid, "op": op, "ts": at(eid)})
        out.append(events)
    return out


def table_model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[int, str]]:
    """The upserted table (id -> (eid, value)): a key's newest change per batch; a change older than what the table
    holds for its key (its row's or its delete's seq) is not applied."""
    held: dict[int, tuple[int, tuple[int, str] | None]] = {}
    for events in batches:
        newest: dict[int, Event] = {}
        for e in events:
            if e["id"] not in newest or e["seq"] > newest[e["id"]]["seq"]:
                newest[e["id"]] = e
        for key, e in newest.items():
            if key in held and held[key][0] > e["seq"]:
                continue
            held[key] = (e["seq"], None if e["op"] == "d" else (e["eid"], e["value"]))
    return {k: row for k, (_, row) in held.items() if row is not None}


Version = tuple[int, int, str, str | None, str | None, bool, str]  # id, eid, value, valid_from, valid_to, is_current, operation


def history_model(batches: Sequence[Sequence[Event]]) -> list[Version]:
    """Every version of every key, from the whole change log (the module's description)."""
    changes: dict[int, dict[int, Event]] = {}
    for events in batches:
        for e in events:
            changes.setdefault(e["id"], {}).setdefault(e["seq"], e)  # a redelivery: the same change once
    out: list[Version] = []
    for key, by_seq in changes.items():
        chain = [by_seq[s] for s in sorted(by_seq)]
        for i, e in enumerate(chain):
            nxt = chain[i + 1] if i + 1 < len(chain) else None
            deleted = e["op"] == "d"
            previous_deleted = i == 0 or chain[i - 1]["op"] == "d"
            operation = "delete" if deleted else "insert" if previous_deleted else "update"
            out.append((key, e["eid"], e["value"], e["ts"], nxt["ts"] if nxt else None, nxt is None and not deleted, operation))
    return sorted(out)


def versions_of(rows: pa.Table) -> list[Version]:
    def iso(v: Any) -> str:
        return utc_iso(v).replace("+00:00", "Z")  # as at() writes them

    return sorted(versions(rows, ["id", "eid", "value"], time=iso, order=False))


def rows_of(rows: pa.Table) -> dict[int, tuple[int, str]]:
    ids = rows.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "a key is in the table more than once"
    return {r["id"]: (r["eid"], r["value"]) for r in rows.to_pylist()}


def current_of(rows: pa.Table) -> dict[int, tuple[int, str]]:
    return rows_of(rows.filter(rows.column("is_current")))


def sink(props: dict[str, str], **extra: Any) -> lakesink.ForeachBatchSink:
    options: dict[str, Any] = {
        "upsert_key": "id",
        "delete_when": "op = 'd'",
        "order_by": "seq",
        "history": "on",
        "history_time": "ts",
        **extra,
    }
    return lakesink.foreach_batch("db.events", catalog_properties=props, **options)


def run(spark: Any, src: Path, ck: Path, s: Any) -> None:
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
    q = df.writeStream.foreachBatch(s).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    run_to_end(q)


def run_format(
    spark: Any,
    src: Path,
    ck: Path,
    props: dict[str, str],
    table_properties: dict[str, str] | None = None,
    *,
    history: bool = True,
) -> None:
    """The same stream through writeStream.format("lakesink"), repartitioned by the key (each task resolves its keys);
    ``history=False``: without option history."""
    lakesink.register(spark)
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
    w = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
    for k, v in props.items():
        w = w.option(f"catalog.{k}", v)
    for k, v in (table_properties or {}).items():
        w = w.option(f"table-property.{k}", v)
    w = w.option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    if history:
        w = w.option("history", "on").option("history-time", "ts")
    run_to_end(w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start())


def load(props: dict[str, str], name: str) -> Any:
    return catalogs.load(None, props).load_table(("db", name))


def assert_in_every_reader(props: dict[str, str], batches: Sequence[Sequence[Event]]) -> None:
    table, history = load(props, "events"), load(props, "events__history")
    expected = history_model(batches)
    assert versions_of(history.scan().to_arrow()) == expected, "pyiceberg"
    assert versions_of(interop.duckdb_read(history.metadata_location)) == expected, "duckdb"
    assert versions_of(interop.iceberg_rust_read(history.metadata_location)) == expected, "iceberg-rust"
    assert rows_of(table.scan().to_arrow()) == table_model(batches)
    assert current_of(history.scan().to_arrow()) == table_model(batches)
    assert_snapshot_invariants(table)
    assert_snapshot_invariants(history)


def assert_never_disagree(props: dict[str, str]) -> None:
    """At every batch's snapshots, the table equals the history's current versions."""
    table, history = load(props, "events"), load(props, "events__history")
    mine = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(table)}
    theirs = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(history)}
    assert mine.keys() == theirs.keys()
    for batch_id, snapshot_id in mine.items():
        now = rows_of(table.scan(snapshot_id=snapshot_id).to_arrow())
        assert current_of(history.scan(snapshot_id=theirs[batch_id]).to_arrow()) == now, batch_id


@pytest.mark.parametrize(
    ("entry", "mode"),
    [
        ("foreach", "copy-on-write"),
        pytest.param("foreach", "merge-on-read", marks=pytest.mark.long),
        pytest.param("format", "copy-on-write", marks=pytest.mark.long),
        ("format", "merge-on-read"),
    ],
)
def test_history_of_a_change_stream_with_late_and_redelivered_changes_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str, mode: str
) -> None:
    """Inserts, updates, deletes, re-inserts, several changes of a key per batch; then a batch redelivering changes of
    earlier batches (counted once), a batch of late changes (older than everything: each takes its place as the key's
    first version, the versions after it re-linked -- the table does not apply them), and a batch of newer ones. The
    history equals the model in every reader; the table and the history's current versions agree at every batch."""
    changes = stream(seed=3, batches=4, per_batch=50, keys=20)
    redelivered = [dict(e) for e in changes[1][:15]]
    late = [{"eid": 5000 + k, "id": k, "value": f"late{k}", "seq": -k - 1, "op": "u", "ts": at(-k - 1)} for k in range(0, 20, 3)]
    last = changes[-1][-1]["seq"]
    newer = [
        {
            "eid": 6000 + k,
            "id": k,
            "value": f"new{k}",
            "seq": last + 1 + k,
            "op": "d" if k % 4 == 0 else "u",
            "ts": at(last + 1 + k),
        }
        for k in range(0, 24, 2)
    ]
    batches = [*changes, redelivered, late, newer]
    write_events(tmp_path / "in", batches)
    props = MOR if mode == "merge-on-read" else None
    if entry == "format":
        run_format(spark, tmp_path / "in", tmp_path / "ck", catalog_properties, props)
    else:
        run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties, table_properties=props))
    assert_in_every_reader(catalog_properties, batches)
    assert_never_disagree(catalog_properties)
    table, history = load(catalog_properties, "events"), load(catalog_properties, "events__history")
    assert {s["summary"][SUMMARY_UPSERT_MODE] for s in lakesink_snapshots(table)} == {mode}
    snaps = lakesink_snapshots(history)
    assert [s["batch_id"] for s in snaps] == list(range(len(batches)))
    assert {s["summary"][SUMMARY_HISTORY_OF] for s in snaps} == {"db.events"}
    assert int(snaps[len(changes)]["summary"][SUMMARY_HISTORY_REDELIVERED]) == len(redelivered)
    assert int(snaps[len(changes)]["summary"][SUMMARY_HISTORY_ADDED]) == 0
    assert int(snaps[len(changes) + 1]["summary"][SUMMARY_HISTORY_ADDED]) == len(late)


def test_a_replayed_batch_adds_no_version_and_a_restart_goes_on(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """The query's last batch replayed (its commit log entry removed, as after a crash between the table's commit and
    Spark's): found in both tables, nothing added; then a restart with more batches goes on where it was."""
    changes = stream(seed=5, batches=3, per_batch=40, keys=15)
    write_events(tmp_path / "in", changes)
    ck = tmp_path / "ck"
    run(spark, tmp_path / "in", ck, sink(catalog_properties))
    history = load(catalog_properties, "events__history")
    before = history.metadata.current_snapshot_id
    (ck / "commits" / "2").unlink()
    (ck / "commits" / ".2.crc").unlink(missing_ok=True)
    run(spark, tmp_path / "in", ck, sink(catalog_properties))
    assert load(catalog_properties, "events__history").metadata.current_snapshot_id == before
    more = stream(seed=6, batches=2, per_batch=40, keys=15)
    for events in more:
        for e in events:
            e["eid"] += 10_000
            e["seq"] += 10_000
            e["value"] = f"v{e['eid']}"
            e["ts"] = at(e["seq"])
    write_events(tmp_path / "in", more, start=3)
    run(spark, tmp_path / "in", ck, sink(catalog_properties))
    assert_in_every_reader(catalog_properties, [*changes, *more])
    assert_never_disagree(catalog_properties)


def test_history_options_are_checked_before_anything_is_written(catalog_properties: dict[str, str]) -> None:
    with pytest.raises(InvalidOptionError, match="upsert-key"):
        lakesink.foreach_batch("db.events", catalog_properties=catalog_properties, history="on", history_time="ts")
    with pytest.raises(InvalidOptionError, match="history-time"):
        lakesink.foreach_batch("db.events", catalog_properties=catalog_properties, upsert_key="id", history="on")
    with pytest.raises(InvalidOptionError, match="history"):
        lakesink.foreach_batch(
            "db.events", catalog_properties=catalog_properties, upsert_key="id", history="{namespace}", history_time="ts"
        )
    # a dead-letter table of its own is taken (tests/sink/test_history_dead_letters_spark.py), not the history table
    with pytest.raises(InvalidOptionError, match="dead-letter-table"):
        lakesink.foreach_batch(
            "db.events",
            catalog_properties=catalog_properties,
            upsert_key="id",
            history="on",
            history_time="ts",
            dead_letter_table="db.events__history",
        )


def as_of_model(batches: Sequence[Sequence[Event]], when: str) -> dict[int, tuple[int, str]]:
    """The table as it was at source time ``when``: each key's version valid then, deletes left out."""
    return {
        v[0]: (v[1], v[2])
        for v in history_model(batches)
        if v[3] is not None and v[3] <= when and (v[4] is None or v[4] > when) and v[6] != "delete"
    }


def test_history_of_prints_a_keys_versions_and_the_table_as_of_a_source_time(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """``lakesink history-of``: every version of one key, oldest first; ``--as-of``: the table at a source time, from
    the history table alone (the time of a change in the middle of the stream); a key column the table lacks and a key
    and a time together are usage errors."""
    changes = stream(seed=9, batches=3, per_batch=40, keys=10)
    write_events(tmp_path / "in", changes)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties))
    catalog_args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    printed = CliRunner().invoke(main, ["--json", "history-of", "db.events", "--key", "id=4", *catalog_args])
    assert printed.exit_code == 0, printed.output
    got = [(r["id"], r["eid"], r["value"], r["operation"], r["is_current"]) for r in json.loads(printed.output)]
    assert got == [(v[0], v[1], v[2], v[6], v[5]) for v in sorted(history_model(changes), key=lambda v: v[1]) if v[0] == 4]
    assert got, "key 4 has versions"
    middle = changes[1][10]["ts"]
    printed = CliRunner().invoke(main, ["--json", "history-of", "db.events", "--as-of", middle, *catalog_args])
    assert printed.exit_code == 0, printed.output
    assert {r["id"]: (r["eid"], r["value"]) for r in json.loads(printed.output)} == as_of_model(changes, middle)
    bad = CliRunner().invoke(main, ["history-of", "db.events", "--key", "nope=1", *catalog_args])
    assert bad.exit_code != 0 and "no column 'nope'" in bad.output, bad.output
    both = CliRunner().invoke(main, ["history-of", "db.events", "--key", "id=1", "--as-of", middle, *catalog_args])
    assert both.exit_code != 0 and "not both" in both.output, both.output


def test_a_column_the_stream_adds_reaches_the_history_in_the_same_commit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Option merge-schema: the query restarted with a stream that has one more column; the batch that brings it
    evolves the table and the history table each in its batch snapshot (the history's versions of that batch hold its
    values, the earlier ones null)."""
    first = stream(seed=11, batches=2, per_batch=20, keys=8)
    write_events(tmp_path / "in", first)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties, merge_schema=True))
    later = [
        {"eid": 900 + k, "id": k, "value": f"t{k}", "seq": 900 + k, "op": "u", "ts": at(900 + k), "tier": f"gold{k}"}
        for k in range(5)
    ]
    write_events(tmp_path / "in", [later], start=2)
    df = spark.readStream.schema(DDL + ", tier string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    q = (
        df.writeStream.foreachBatch(sink(catalog_properties, merge_schema=True))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    run_to_end(q)
    history = load(catalog_properties, "events__history")
    assert "tier" in history.schema().column_names
    snaps = lakesink_snapshots(history)
    assert [s["batch_id"] for s in snaps] == [0, 1, 2]
    schema_ids = [history.metadata.snapshot_by_id(s["snapshot_id"]).schema_id for s in snaps]
    assert schema_ids[0] == schema_ids[1] != schema_ids[2] == history.metadata.current_schema_id
    rows = history.scan().to_arrow().to_pylist()
    assert {r["id"]: r["tier"] for r in rows if r["eid"] >= 900} == {k: f"gold{k}" for k in range(5)}
    assert all(r["tier"] is None for r in rows if r["eid"] < 900)
    batches = [[{k: v for k, v in e.items() if k != "tier"} for e in b] for b in [*first, later]]
    assert versions_of(history.scan().to_arrow()) == history_model(batches)
    assert_never_disagree(catalog_properties)


def test_history_on_a_branch_leaves_main_of_both_tables_alone(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Option branch (write-audit-publish): the history's versions are committed to the same branch of the history
    table, in the same unit; main of both tables holds nothing of the query until it is published."""
    changes = stream(seed=13, batches=2, per_batch=30, keys=10)
    write_events(tmp_path / "in", changes)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties, branch="audit"))
    table, history = load(catalog_properties, "events"), load(catalog_properties, "events__history")
    for t in (table, history):
        assert "audit" in t.metadata.refs
        main = t.metadata.snapshot_by_name("main")
        assert main is None or not main.summary or "lakesink.batch-id" not in (main.summary.additional_properties or {})
    audited = history.scan(snapshot_id=history.metadata.snapshot_by_name("audit").snapshot_id).to_arrow()
    assert versions_of(audited) == history_model(changes)
    mirror = table.scan(snapshot_id=table.metadata.snapshot_by_name("audit").snapshot_id).to_arrow()
    assert rows_of(mirror) == table_model(changes) == current_of(audited)


def test_a_string_key_links_its_versions_across_batches(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    """A string key (the history's stored keys read back as string, the batch's in the table's large_string): versions
    closed across batches, a late change placed, the history equal to the model."""
    changes = stream(seed=17, batches=3, per_batch=30, keys=8)
    late = [{"eid": 7000 + k, "id": k, "value": f"late{k}", "seq": -k - 1, "op": "u", "ts": at(-k - 1)} for k in range(0, 8, 3)]
    batches = [[{**e, "id": f"key-{e['id']}"} for e in b] for b in [*changes, late]]
    write_events(tmp_path / "in", batches)
    ddl = DDL.replace(", id long,", ", id string,")
    df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    q = df.writeStream.foreachBatch(sink(catalog_properties)).option("checkpointLocation", str(tmp_path / "ck"))
    run_to_end(q.trigger(availableNow=True).start())
    history = load(catalog_properties, "events__history")
    assert versions_of(history.scan().to_arrow()) == history_model(batches)
    assert_never_disagree(catalog_properties)


def test_a_change_without_a_time_fails_the_batch_naming_the_column_and_commits_nothing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """A change whose history-time column is null: the batch fails before anything is written (the error names the
    option and the column), both tables stay at the last batch, and the stream fails the same way until the input is
    fixed."""
    first = stream(seed=19, batches=1, per_batch=20, keys=6)
    broken = [{"eid": 900, "id": 1, "value": "x", "seq": 900, "op": "u", "ts": None}]
    write_events(tmp_path / "in", [*first, broken])
    with pytest.raises(
        StreamingQueryException, match=r"null; the history of db\.events orders and dates every change by option 'history-time'"
    ):
        run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties))
    table, history = load(catalog_properties, "events"), load(catalog_properties, "events__history")
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0] == [s["batch_id"] for s in lakesink_snapshots(history)]
    assert versions_of(history.scan().to_arrow()) == history_model(first)
    assert rows_of(table.scan().to_arrow()) == table_model(first)


def test_merge_on_read_on_the_driver_writes_no_stale_change(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """foreach_batch, merge-on-read, small batches (written on the driver from the changes the resolution collected):
    a batch whose late change of a key loses to the newer row the table holds writes the key's fresh rows only -- the
    late change is a version in the history, never a row of the table (the rows a merge-on-read lookup leaves are
    written, not every winner of the batch)."""
    first = [{"eid": k, "id": k, "value": f"v{k}", "seq": 10 + k, "op": "c", "ts": at(10 + k)} for k in range(6)]
    second = [
        {"eid": 100, "id": 1, "value": "late", "seq": 2, "op": "u", "ts": at(2)},
        {"eid": 101, "id": 2, "value": "fresh", "seq": 30, "op": "u", "ts": at(30)},
        {"eid": 102, "id": 9, "value": "new", "seq": 31, "op": "c", "ts": at(31)},
    ]
    third = [{"eid": 103, "id": 3, "value": "later", "seq": 32, "op": "u", "ts": at(32)}]
    batches = [first, second, third]
    write_events(tmp_path / "in", batches)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties, table_properties=MOR))
    table, history = load(catalog_properties, "events"), load(catalog_properties, "events__history")
    assert {s["summary"][SUMMARY_UPSERT_MODE] for s in lakesink_snapshots(table)} == {"merge-on-read"}
    assert rows_of(table.scan().to_arrow()) == table_model(batches)
    assert versions_of(history.scan().to_arrow()) == history_model(batches)
    assert_never_disagree(catalog_properties)


def test_a_history_left_behind_its_dropped_table_or_read_by_another_key_is_refused(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """The table is dropped (its history left) and a new query creates it again; then a query upserts the table by
    another key: each fails its first batch loudly naming the history table, and commits nothing in either table --
    the new table's rows would otherwise close versions of the old table's rows (or of another key's). Dropping the
    history, as the error says, lets the stream go on: its history holds only the new table's versions."""
    first = stream(seed=31, batches=2, per_batch=20, keys=6)
    write_events(tmp_path / "in", first)
    run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties))
    catalog = catalogs.load(None, catalog_properties)
    old = load(catalog_properties, "events__history")
    catalog.drop_table(("db", "events"))
    with pytest.raises(Exception, match=r"history table db\.events__history holds the versions of table db\.events with uuid"):
        run(spark, tmp_path / "in", tmp_path / "ck2", sink(catalog_properties))
    kept = load(catalog_properties, "events__history")
    assert kept.metadata.current_snapshot_id == old.metadata.current_snapshot_id
    assert not lakesink_snapshots(load(catalog_properties, "events"))
    catalog.drop_table(("db", "events__history"))
    run(spark, tmp_path / "in", tmp_path / "ck3", sink(catalog_properties))
    assert load(catalog_properties, "events__history").properties["lakesink.history.complete"] == "true"
    assert_in_every_reader(catalog_properties, first)
    assert_never_disagree(catalog_properties)
    # the same table re-keyed (as the table's own refusal of upsert_key='eid' says: its identifier fields set to eid):
    # the history keyed by id refuses it
    with load(catalog_properties, "events").update_schema(allow_incompatible_changes=True) as update:
        update.update_column("eid", required=True)
        update.set_identifier_fields("eid")
    history = load(catalog_properties, "events__history")
    table = load(catalog_properties, "events")
    with pytest.raises(Exception, match=r"order file .* holds the order values of keys \(id\), but the batch upserts"):
        run(spark, tmp_path / "in", tmp_path / "ck4", sink(catalog_properties, upsert_key="eid"))
    with load(catalog_properties, "events").transaction() as t:  # as that error says: the old key's order values go
        t.remove_properties("lakesink.upsert.order-file")
    table = load(catalog_properties, "events")
    with pytest.raises(Exception, match=r"keyed by \(id\), but this query upserts it by \(eid\)"):
        run(spark, tmp_path / "in", tmp_path / "ck5", sink(catalog_properties, upsert_key="eid"))
    assert load(catalog_properties, "events__history").metadata.current_snapshot_id == history.metadata.current_snapshot_id
    assert load(catalog_properties, "events").metadata.current_snapshot_id == table.metadata.current_snapshot_id


@pytest.mark.parametrize("entry", ["foreach", pytest.param("format", marks=pytest.mark.long)])
def test_a_history_started_late_leaves_out_changes_older_than_the_tables_rows(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """One table keeping its order-by column (seq): rows written without option history, then history turned on and
    a batch re-sending changes from before it (older than the table's rows: the table does not apply them) with newer
    ones: the re-sent ones are no versions (before: each became its key's current version while the table kept its
    newer row); a deleted key's re-sent insert (older than its tombstone) neither."""
    zero = [{"eid": i, "id": i, "value": f"v{i}", "seq": 10 + i, "op": "c", "ts": at(10 + i)} for i in range(1, 5)]
    zero.append({"eid": 9, "id": 4, "value": "", "seq": 19, "op": "d", "ts": at(19)})
    write_events(tmp_path / "in", [zero])
    if entry == "format":
        run_format(spark, tmp_path / "in", tmp_path / "ck", catalog_properties, history=False)
    else:
        run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties, history="off", history_time=None))
    one = [
        {"eid": 20, "id": 1, "value": "re-sent", "seq": 5, "op": "u", "ts": at(5)},  # older than id 1's row (11)
        {"eid": 21, "id": 2, "value": "newer", "seq": 30, "op": "u", "ts": at(30)},
        {"eid": 22, "id": 2, "value": "re-sent", "seq": 6, "op": "u", "ts": at(6)},  # older than id 2's row (12)
        {"eid": 23, "id": 4, "value": "re-sent", "seq": 14, "op": "c", "ts": at(14)},  # older than id 4's delete (19)
        {"eid": 24, "id": 5, "value": "new", "seq": 31, "op": "c", "ts": at(31)},
    ]
    write_events(tmp_path / "in", [one], start=1)
    if entry == "format":
        run_format(spark, tmp_path / "in", tmp_path / "ck", catalog_properties)
    else:
        run(spark, tmp_path / "in", tmp_path / "ck", sink(catalog_properties))
    history = load(catalog_properties, "events__history")
    # its first commit took a version of each of the table's live rows (dated and ordered by the row's own ts and
    # seq), then linked the batch's changes after them. Not complete: id 4's delete left it no version, and its order
    # value is the table's (the order file), read for each later change of a key the history has no version of
    assert history.properties["lakesink.history.complete"] == "false"
    assert versions_of(history.scan().to_arrow()) == [
        (1, 1, "v1", at(11), None, True, "insert"),
        (2, 2, "v2", at(12), at(30), False, "insert"),
        (2, 21, "newer", at(30), None, True, "update"),
        (3, 3, "v3", at(13), None, True, "insert"),
        (5, 24, "new", at(31), None, True, "insert"),
    ]
    assert [int(s["summary"][SUMMARY_HISTORY_SEEDED]) for s in lakesink_snapshots(history)] == [3]
    current = history.scan().to_arrow()
    assert rows_of(current.filter(current.column("is_current"))) == rows_of(load(catalog_properties, "events").scan().to_arrow())
    assert rows_of(load(catalog_properties, "events").scan().to_arrow()) == {
        1: (1, "v1"),
        2: (21, "newer"),
        3: (3, "v3"),
        5: (24, "new"),
    }


@pytest.mark.parametrize(
    ("entry", "faulted"),
    [
        ("foreach", False),
        pytest.param("format", False, marks=pytest.mark.long),
        pytest.param("foreach", True, marks=pytest.mark.long),
        pytest.param("format", True, marks=pytest.mark.long),
    ],
)
def test_a_history_started_late_on_a_merge_on_read_table_takes_its_live_rows_as_first_versions(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, faulted: bool
) -> None:
    """A merge-on-read table written without option history for two batches (the second updates and deletes rows:
    position deletes), then history turned on: the history's first commit holds a version of each live row as the
    table has it -- not a row a position delete removed, not a row's value before its update -- dated by the row's own
    ts, ordered by its seq, then the batch's changes linked after them; its current versions are the table, in
    pyiceberg, DuckDB and iceberg-rust. A next batch goes on from there: a change re-sent from before the history
    started, of a key deleted then (no version; its order value is the table's), is no version (the history is not
    complete: it reads the table's order values for such keys' changes; before, it was a current version the table
    did not have).
    ``faulted``: the seeding batch's first attempt fails inside the unit's catalog transaction (its next attempt seeds
    again from the same rows), then the query fails after the unit landed, before Spark's commit log: the restart
    replays the batch, which seeds nothing more."""
    zero = [{"eid": i, "id": i, "value": f"v{i}", "seq": 10 + i, "op": "c", "ts": at(10 + i)} for i in range(1, 7)]
    one = [
        {"eid": 20, "id": 2, "value": "two", "seq": 20, "op": "u", "ts": at(20)},
        {"eid": 21, "id": 3, "value": "", "seq": 21, "op": "d", "ts": at(21)},
        {"eid": 22, "id": 6, "value": "", "seq": 22, "op": "d", "ts": at(22)},
    ]
    two = [
        {"eid": 30, "id": 1, "value": "one", "seq": 30, "op": "u", "ts": at(30)},
        {"eid": 31, "id": 7, "value": "v7", "seq": 31, "op": "c", "ts": at(31)},
        {"eid": 32, "id": 6, "value": "six again", "seq": 32, "op": "c", "ts": at(32)},
        {"eid": 33, "id": 2, "value": "re-sent", "seq": 19, "op": "u", "ts": at(19)},  # older than id 2's row (20)
    ]
    three = [
        {"eid": 40, "id": 4, "value": "", "seq": 40, "op": "d", "ts": at(40)},
        # re-sent from before the history started: older than id 3's delete (21), which left it no version
        {"eid": 41, "id": 3, "value": "re-sent", "seq": 13, "op": "c", "ts": at(13)},
    ]
    src, ck = tmp_path / "in", tmp_path / "ck"

    def go(history: bool) -> None:
        if entry == "format":
            run_format(spark, src, ck, catalog_properties, MOR, history=history)
        else:
            extra = {} if history else {"history": "off", "history_time": None}
            run(spark, src, ck, sink(catalog_properties, table_properties=MOR, **extra))

    write_events(src, [zero, one])
    go(history=False)
    table = load(catalog_properties, "events")
    assert {s["summary"][SUMMARY_UPSERT_MODE] for s in lakesink_snapshots(table)} == {"merge-on-read"}
    assert int(table.current_snapshot().summary["total-position-deletes"]) >= 2  # the seeds must apply them
    write_events(src, [two], start=2)
    if faulted:
        faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
        faults.arm(DRIVER_AFTER_SWAP, "raise")
        with pytest.raises(StreamingQueryException):
            go(history=True)
        assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS) and faults.fired(DRIVER_AFTER_SWAP)
        faults.clear()
    go(history=True)
    history = load(catalog_properties, "events__history")
    assert history.properties["lakesink.history.complete"] == "false"  # ids 3 and 6 were deleted: see batch three
    expected = [
        (1, 1, "v1", at(11), at(30), False, "insert"),
        (1, 30, "one", at(30), None, True, "update"),
        (2, 20, "two", at(20), None, True, "insert"),
        (4, 4, "v4", at(14), None, True, "insert"),
        (5, 5, "v5", at(15), None, True, "insert"),
        (6, 32, "six again", at(32), None, True, "insert"),
        (7, 31, "v7", at(31), None, True, "insert"),
    ]
    for reader in (lambda h: h.scan().to_arrow(), interop.duckdb_read, interop.iceberg_rust_read):
        rows = reader(history) if reader.__name__ == "<lambda>" else reader(history.metadata_location)
        assert versions_of(rows) == expected
    assert [int(s["summary"][SUMMARY_HISTORY_SEEDED]) for s in lakesink_snapshots(history)] == [4]
    table = load(catalog_properties, "events")
    current = history.scan().to_arrow()
    assert current_of(current) == rows_of(table.scan().to_arrow())
    write_events(src, [three], start=3)
    go(history=True)
    history, table = load(catalog_properties, "events__history"), load(catalog_properties, "events")
    want = [v for v in expected if v[0] != 4] + [
        (4, 4, "v4", at(14), at(40), False, "insert"),
        (4, 40, "", at(40), None, False, "delete"),
    ]
    assert versions_of(history.scan().to_arrow()) == sorted(want)
    assert current_of(history.scan().to_arrow()) == rows_of(table.scan().to_arrow())
    assert [SUMMARY_HISTORY_SEEDED in s["summary"] for s in lakesink_snapshots(history)] == [True, False]


def test_a_history_started_late_without_order_by_is_seeded_complete_and_goes_on(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Without option order-by (one change per key and batch; each change's order value is its batch id): the table's
    live rows become the history's first versions ordered by the batch id before the seeding batch's, and the history
    is complete (no deleted key has an order value a re-sent change could be older than). A deleted key inserted again
    starts anew; later batches link as a history started with its table does."""
    zero = [{"eid": i, "id": i, "value": f"v{i}", "seq": i, "op": "c", "ts": at(10 + i)} for i in range(1, 5)]
    one = [{"eid": 20, "id": 2, "value": "", "seq": 0, "op": "d", "ts": at(20)}]
    two = [
        {"eid": 30, "id": 1, "value": "one", "seq": 0, "op": "u", "ts": at(30)},
        {"eid": 31, "id": 2, "value": "two again", "seq": 0, "op": "c", "ts": at(31)},
    ]
    three = [{"eid": 40, "id": 3, "value": "", "seq": 0, "op": "d", "ts": at(40)}]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, [zero, one])
    run(spark, src, ck, sink(catalog_properties, order_by=None, history="off", history_time=None))
    write_events(src, [two, three], start=2)
    run(spark, src, ck, sink(catalog_properties, order_by=None))
    history, table = load(catalog_properties, "events__history"), load(catalog_properties, "events")
    assert history.properties["lakesink.history.complete"] == "true"
    assert versions_of(history.scan().to_arrow()) == [
        (1, 1, "v1", at(11), at(30), False, "insert"),
        (1, 30, "one", at(30), None, True, "update"),
        (2, 31, "two again", at(31), None, True, "insert"),
        (3, 3, "v3", at(13), at(40), False, "insert"),
        (3, 40, "", at(40), None, False, "delete"),
        (4, 4, "v4", at(14), None, True, "insert"),
    ]
    orders = sorted((r["id"], r["eid"], r["change_order"]) for r in history.scan().to_arrow().to_pylist())
    assert orders == [(1, 1, 1), (1, 30, 2), (2, 31, 2), (3, 3, 1), (3, 40, 3), (4, 4, 1)]
    assert [int(s["summary"].get(SUMMARY_HISTORY_SEEDED, 0)) for s in lakesink_snapshots(history)] == [3, 0]
    assert current_of(history.scan().to_arrow()) == rows_of(table.scan().to_arrow())


def test_a_history_started_late_on_a_table_with_a_null_order_value_is_not_seeded(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """A table row whose order-by column is null (a new key's change may carry none) has no order a seed could take:
    the history is not seeded (complete false, no versions-seeded), each key's first version comes when it next
    changes, and a change re-sent from before the history started (older than its row) is still no version."""
    zero = [{"eid": i, "id": i, "value": f"v{i}", "seq": 10 + i, "op": "c", "ts": at(10 + i)} for i in range(1, 4)]
    zero[2]["seq"] = None
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, [zero])
    run(spark, src, ck, sink(catalog_properties, history="off", history_time=None))
    one = [
        {"eid": 20, "id": 1, "value": "newer", "seq": 30, "op": "u", "ts": at(30)},
        {"eid": 21, "id": 2, "value": "re-sent", "seq": 5, "op": "u", "ts": at(5)},  # older than id 2's row (12)
    ]
    write_events(src, [one], start=1)
    run(spark, src, ck, sink(catalog_properties))
    history, table = load(catalog_properties, "events__history"), load(catalog_properties, "events")
    assert history.properties["lakesink.history.complete"] == "false"
    assert [s["summary"].get(SUMMARY_HISTORY_SEEDED) for s in lakesink_snapshots(history)] == [None]
    assert [(v[0], v[1], v[2], v[4], v[5]) for v in versions_of(history.scan().to_arrow())] == [(1, 20, "newer", None, True)]
    assert rows_of(table.scan().to_arrow()) == {1: (20, "newer"), 2: (2, "v2"), 3: (3, "v3")}


def test_a_history_started_late_on_a_table_with_a_list_column_is_seeded(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """The seeding joins the table's rows with the batch's keys on the key columns alone: a table holding a list
    column (Arrow's join carries no list) is seeded, its lists in the seeds (before: ArrowInvalid "Data type
    large_list ... is not supported in join non-key field" at every retry -- the stream stuck)."""

    def with_tags(s: Any) -> Any:
        return lambda df, batch_id: s(df.withColumn("tags", F.array("value", "op")), batch_id)

    zero = [{"eid": i, "id": i, "value": f"v{i}", "seq": i, "op": "c", "ts": at(10 + i)} for i in range(1, 4)]
    one = [{"eid": 20, "id": 2, "value": "two", "seq": 20, "op": "u", "ts": at(20)}]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, [zero])
    run(spark, src, ck, with_tags(sink(catalog_properties, history="off", history_time=None)))
    write_events(src, [one], start=1)
    run(spark, src, ck, with_tags(sink(catalog_properties)))
    history, table = load(catalog_properties, "events__history"), load(catalog_properties, "events")
    assert versions_of(history.scan().to_arrow()) == [
        (1, 1, "v1", at(11), None, True, "insert"),
        (2, 2, "v2", at(12), at(20), False, "insert"),
        (2, 20, "two", at(20), None, True, "update"),
        (3, 3, "v3", at(13), None, True, "insert"),
    ]
    tags = sorted((r["id"], r["change_order"], r["tags"]) for r in history.scan().to_arrow().to_pylist())
    assert tags == [(1, 1, ["v1", "c"]), (2, 2, ["v2", "c"]), (2, 20, ["two", "u"]), (3, 3, ["v3", "c"])]
    assert current_of(history.scan().to_arrow()) == rows_of(table.scan().to_arrow())


@pytest.mark.parametrize("txn_server_options", [{"transactions": False}], ids=["no-transactions"], indirect=True)
@pytest.mark.parametrize("entry", ["foreach", pytest.param("format", marks=pytest.mark.long)])
def test_a_history_on_a_catalog_committing_one_table_after_the_other_is_completed_by_the_replay(
    spark: Any, tmp_path: Path, txn_catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """A REST catalog without multi-table transactions (the tests' REST server, its transactions/commit route
    answering 404): the table and its history are two commits. A failure between them leaves the batch in the first
    only; the restart replays the batch and commits it into the other, once: the history equals the model in every
    reader, both hold every batch once and agree at each."""
    props = txn_catalog_properties
    changes = stream(seed=37, batches=3, per_batch=30, keys=12)

    def go() -> None:
        if entry == "format":
            run_format(spark, tmp_path / "in", tmp_path / "ck", props)
        else:
            run(spark, tmp_path / "in", tmp_path / "ck", sink(props))

    write_events(tmp_path / "in", changes[:1])
    go()
    write_events(tmp_path / "in", changes[1:2], start=1)
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(StreamingQueryException):
        go()
    assert faults.fired(DRIVER_BETWEEN_TABLE_COMMITS)
    faults.clear()
    held = sorted(len(lakesink_snapshots(load(props, n))) for n in ("events", "events__history"))
    assert held == [1, 2], held  # the first commit landed, the second not
    write_events(tmp_path / "in", changes[2:], start=2)
    go()
    assert_in_every_reader(props, changes)
    assert_never_disagree(props)
    for n in ("events", "events__history"):
        assert [s["batch_id"] for s in lakesink_snapshots(load(props, n))] == [0, 1, 2], n
