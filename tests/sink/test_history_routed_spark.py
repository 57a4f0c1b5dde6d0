"""Option history with option route-by and with option cdc-format, on both entry points, in real local Spark (issue 55):
each table the stream upserts gets its own history table, committed in the batch's one unit with every table.

- route-by: two tables routed by a column, with late and redelivered changes; each history equals the plain-Python
  model of its table's change log (tests/sink/test_history_spark.py's model) in pyiceberg, DuckDB and iceberg-rust, and
  at every batch the table equals its history's current versions;
- cdc-format: Debezium's PostgreSQL records built field by field (tests/support/cdc_debezium.py), valid_from from
  ``source.ts_ms``, the order from the LSN, unchanged TOAST values (Debezium's unavailable-value placeholder) taken from
  the version before -- never the placeholder itself; a truncate re-sent with the changes around it (a connector
  restarted from an older LSN) adds no version.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.actions import history as history_module
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.table.keys import SUMMARY_COMMIT_ATTEMPT, SUMMARY_HISTORY_OF, SUMMARY_HISTORY_SEEDED, SUMMARY_UPSERT_MODE
from tests.driver.test_cdc_unavailable import TOASTED, TYPES, row, unchanged_toast
from tests.sink.test_history_spark import (
    DDL,
    MOR,
    Event,
    at,
    history_model,
    rows_of,
    stream,
    table_model,
    versions_of,
)
from tests.sink.test_upserts_spark import write_events
from tests.support import toast
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import (
    assert_snapshot_invariants,
    assert_table_is_current_versions,
    fail_once_at,
    lakesink_snapshots,
    run_to_end,
    start_sink,
)
from tests.support.history import utc_iso, versions
from tests.support.toast import change

pytestmark = pytest.mark.spark

# each entry point in make test once across the two cases, the other pairing under the long marker
ENTRIES = ["foreach", "format"]
ROUTED_ENTRIES = ["foreach", pytest.param("format", marks=pytest.mark.long)]
CDC_ENTRIES = [pytest.param("foreach", marks=pytest.mark.long), "format"]
ROUTED_DDL = DDL + ", tbl string"
TABLES = {0: "db.a", 1: "db.b"}
HISTORY_AND_TABLES = ("db.a", "db.b", "db.a__history", "db.b__history")


def routed(batches: Sequence[Sequence[Event]]) -> list[list[Event]]:
    """Each event routed by its key's parity to one of two tables."""
    return [[{**e, "tbl": TABLES[e["id"] % 2]} for e in events] for events in batches]


def of_table(batches: Sequence[Sequence[Event]], name: str) -> list[list[Event]]:
    return [[e for e in events if e["tbl"] == name] for events in batches]


def run_routed(spark: Any, entry: str, src: Path, ck: Path, props: Mapping[str, str], **extra: str) -> None:
    df = spark.readStream.schema(ROUTED_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    options = {
        "route_by": "tbl",
        "upsert_key": "id",
        "delete_when": "op = 'd'",
        "order_by": "seq",
        "history": "on",
        "history_time": "ts",
        **extra,
    }
    if entry == "format":
        df = df.repartition(2, "tbl", "id")
    table_properties = None
    if entry == "foreach-spark-mor":  # and the tables merge-on-read, their lookups in Spark's executors
        entry, table_properties = "foreach-spark", MOR
    if entry == "foreach-spark":  # Spark's own Parquet writer: the changes collected by one more Spark job
        entry, options["writer"] = "foreach", "spark"
    run_to_end(start_sink(df, entry, ck, props, table_properties=table_properties, **options))


def load(props: Mapping[str, str], name: str) -> Any:
    return catalogs.load(None, dict(props)).load_table(tuple(name.split(".")))


def assert_history_is_the_model(props: Mapping[str, str], name: str, batches: Sequence[Sequence[Event]]) -> None:
    """The table and its history equal their models in three readers, and agree at every batch."""
    table, history = load(props, name), load(props, name + "__history")
    expected = history_model(batches)
    assert versions_of(history.scan().to_arrow()) == expected, (name, "pyiceberg")
    assert versions_of(interop.duckdb_read(history.metadata_location)) == expected, (name, "duckdb")
    assert versions_of(interop.iceberg_rust_read(history.metadata_location)) == expected, (name, "iceberg-rust")
    assert rows_of(table.scan().to_arrow()) == table_model(batches), name
    mine = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(table)}
    theirs = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(history)}
    assert mine.keys() == theirs.keys(), name
    for batch_id, snapshot_id in mine.items():
        current = history.scan(snapshot_id=theirs[batch_id]).to_arrow()
        now = rows_of(table.scan(snapshot_id=snapshot_id).to_arrow())
        assert rows_of(current.filter(current.column("is_current"))) == now, (name, batch_id)
    assert {s["summary"][SUMMARY_HISTORY_OF] for s in lakesink_snapshots(history)} == {name}
    assert_snapshot_invariants(table)
    assert_snapshot_invariants(history)


@pytest.mark.parametrize(
    "entry", [*ROUTED_ENTRIES, "foreach-spark", pytest.param("foreach-spark-mor", marks=pytest.mark.long)]
)  # foreach-spark: writer='spark'; -mor: its tables merge-on-read
def test_each_routed_table_gets_its_history_in_the_batchs_unit(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Two routed tables; inserts, updates, deletes, several changes of a key per batch, a redelivered batch and a
    batch of late changes: each table's history equals its model, and the table its history's current versions at
    every batch (the routed unit holds both tables and both histories)."""
    changes = stream(seed=11, batches=3, per_batch=40, keys=16)
    redelivered = [dict(e) for e in changes[1][:12]]
    late = [{"eid": 5000 + k, "id": k, "value": f"late{k}", "seq": -k - 1, "op": "u", "ts": at(-k - 1)} for k in range(0, 16, 3)]
    batches = routed([*changes, redelivered, late])
    write_events(tmp_path / "in", batches)
    run_routed(spark, entry, tmp_path / "in", tmp_path / "ck", catalog_properties)
    for name in TABLES.values():
        assert_history_is_the_model(catalog_properties, name, of_table(batches, name))
    # a restart with more batches goes on where it was (the histories' replay points are the tables')
    last = max(e["seq"] for events in batches for e in events)
    newer = [
        {
            "eid": 7000 + k,
            "id": k,
            "value": f"new{k}",
            "seq": last + 1 + k,
            "op": "d" if k % 5 == 0 else "u",
            "ts": at(last + 1 + k),
        }
        for k in range(16)
    ]
    more = routed([newer])
    write_events(tmp_path / "in", more, start=len(batches))
    run_routed(spark, entry, tmp_path / "in", tmp_path / "ck", catalog_properties)
    for name in TABLES.values():
        assert_history_is_the_model(catalog_properties, name, of_table([*batches, *more], name))
    modes = {
        s["summary"][SUMMARY_UPSERT_MODE] for name in TABLES.values() for s in lakesink_snapshots(load(catalog_properties, name))
    }
    assert modes == {"merge-on-read" if entry.endswith("-mor") else "copy-on-write"}, modes


def test_spark_writers_routed_histories_take_a_batch_replayed_after_its_swap_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """writer='spark' (the changes collected by one more Spark job): a failure after the unit's swap, before Spark's
    commit log, replays the batch: found committed in each table and each history, no version twice, the histories
    still the model."""
    changes = stream(seed=23, batches=3, per_batch=30, keys=12)
    batches = routed(changes)
    write_events(tmp_path / "in", batches[:1])
    run_routed(spark, "foreach-spark", tmp_path / "in", tmp_path / "ck", catalog_properties)
    write_events(tmp_path / "in", batches[1:2], start=1)
    fail_once_at(
        faults,
        DRIVER_AFTER_SWAP,
        lambda: run_routed(spark, "foreach-spark", tmp_path / "in", tmp_path / "ck", catalog_properties),
    )
    write_events(tmp_path / "in", batches[2:], start=2)
    run_routed(spark, "foreach-spark", tmp_path / "in", tmp_path / "ck", catalog_properties)
    for name in TABLES.values():
        assert_history_is_the_model(catalog_properties, name, of_table(batches, name))
        ids = [s["batch_id"] for s in lakesink_snapshots(load(catalog_properties, name + "__history"))]
        assert ids == [0, 1, 2], (name, ids)


def test_spark_writers_routed_histories_hold_the_values_the_tables_got_from_a_nondeterministic_column(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """writer='spark': a column computed by a nondeterministic function (a Python UDF drawing a uuid: each read of the
    source computes it anew): the history's changes are collected from the batch the tables' rows were resolved from
    (the routed batch read once), so each table equals its history's current versions at every batch."""
    changes = stream(seed=29, batches=2, per_batch=30, keys=12)
    write_events(tmp_path / "in", routed(changes))
    df = spark.readStream.schema(ROUTED_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    drawn = F.udf(lambda v: f"{v} {uuid.uuid4()}", "string").asNondeterministic()
    df = df.withColumn("value", drawn(F.col("value")))
    options = {"route_by": "tbl", "upsert_key": "id", "delete_when": "op = 'd'", "order_by": "seq", "history": "on"}
    run_to_end(start_sink(df, "foreach", tmp_path / "ck", catalog_properties, history_time="ts", writer="spark", **options))
    for name in TABLES.values():
        table, history = load(catalog_properties, name), load(catalog_properties, name + "__history")
        assert_table_is_current_versions(table, history, ("id",))
        assert table.scan().to_arrow().num_rows


@pytest.mark.parametrize("entry", [*ROUTED_ENTRIES, pytest.param("foreach-spark", marks=pytest.mark.long)])
def test_routed_histories_committed_one_table_after_the_other_are_completed_by_the_replay(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    """Option atomic='off' (each table and each history its own commit, as on a catalog that cannot commit several
    tables as one unit): a failure between two of the batch's commits leaves some of the tables and histories with the
    batch; the restart replays it and completes the others, each once: every history equals its model, and each table
    its history's current versions at every batch."""
    changes = stream(seed=31, batches=3, per_batch=30, keys=12)
    batches = routed(changes)

    def go() -> None:
        run_routed(spark, entry, tmp_path / "in", tmp_path / "ck", catalog_properties, atomic="off")

    write_events(tmp_path / "in", batches[:1])
    go()
    write_events(tmp_path / "in", batches[1:2], start=1)
    fail_once_at(faults, DRIVER_BETWEEN_TABLE_COMMITS, go)
    holding = {n: [s["batch_id"] for s in lakesink_snapshots(load(catalog_properties, n))] for n in HISTORY_AND_TABLES}
    assert sorted(map(len, holding.values())) == [1, 1, 1, 2], holding  # the first commit landed, the others not
    write_events(tmp_path / "in", batches[2:], start=2)
    go()
    for name in TABLES.values():
        assert_history_is_the_model(catalog_properties, name, of_table(batches, name))
    for name in HISTORY_AND_TABLES:
        ids = [s["batch_id"] for s in lakesink_snapshots(load(catalog_properties, name))]
        assert ids == [0, 1, 2], (name, ids)


def seeded_model(before: Sequence[Event], after: Sequence[Event]) -> list[Any]:
    """The versions of a history started when its table held the rows ``before`` left: each live row's change is its
    key's first version (an insert), then the changes of ``after`` newer than the table's value for their key (a
    deleted key's too); the older ones (re-sent from before the history started) are none."""
    last: dict[int, Event] = {}
    for e in before:
        if e["id"] not in last or e["seq"] > last[e["id"]]["seq"]:
            last[e["id"]] = e
    seeds = [{**e, "op": "c"} for e in last.values() if e["op"] != "d"]
    kept = [e for e in after if e["id"] not in last or e["seq"] > last[e["id"]]["seq"]]
    return history_model([seeds, kept])


@pytest.mark.parametrize(
    "entry", ["foreach", pytest.param("format", marks=pytest.mark.long), pytest.param("foreach-spark", marks=pytest.mark.long)]
)
def test_routed_histories_started_after_their_tables_held_rows_take_them_as_first_versions(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Two routed tables written without option history for two batches (inserts, updates, deletes), then history
    turned on with a batch of newer changes, re-sent older ones and a re-insert of a deleted key: each history's first
    commit holds a version of each of its table's live rows (as the table has them, dated by the row's ts, ordered by
    its seq), the batch's newer changes linked after them, no version of a re-sent older change; each history's
    current versions are its table, in pyiceberg, DuckDB and iceberg-rust."""
    before = stream(seed=41, batches=2, per_batch=30, keys=12)
    last = max(e["seq"] for events in before for e in events)
    newer = [
        {"eid": 8000 + k, "id": k, "value": f"new{k}", "seq": last + 1 + k, "op": "d" if k == 4 else "u", "ts": at(last + 1 + k)}
        for k in range(0, 12, 2)
    ]
    # re-sent from before the history started, older than anything the tables hold
    resent = [dict(e, eid=e["eid"] + 90_000, seq=-1 - i) for i, e in enumerate(before[0][:6])]
    fresh = [
        {"eid": 8100 + k, "id": 12 + k, "value": f"fresh{k}", "seq": last + 20 + k, "op": "c", "ts": at(last + 20 + k)}
        for k in range(2)
    ]
    batches = routed([*before, [*newer, *resent, *fresh]])
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, batches[:2])
    run_routed(spark, entry, src, ck, catalog_properties, history="off", history_time=None)  # type: ignore[arg-type]
    write_events(src, batches[2:], start=2)
    run_routed(spark, entry, src, ck, catalog_properties)
    for name in TABLES.values():
        table, history = load(catalog_properties, name), load(catalog_properties, name + "__history")
        mine = of_table(batches, name)
        expected = seeded_model([e for events in mine[:2] for e in events], mine[2])
        assert versions_of(history.scan().to_arrow()) == expected, (name, "pyiceberg")
        assert versions_of(interop.duckdb_read(history.metadata_location)) == expected, (name, "duckdb")
        assert versions_of(interop.iceberg_rust_read(history.metadata_location)) == expected, (name, "iceberg-rust")
        # the tables' deletes left order values (tombstones) the history has no versions of: read for later changes
        assert history.properties["lakesink.history.complete"] == "false", name
        rows = table.scan().to_arrow()
        assert rows_of(rows) == table_model(mine), name
        seeded = [int(s["summary"][SUMMARY_HISTORY_SEEDED]) for s in lakesink_snapshots(history)]
        assert seeded == [len(table_model(mine[:2]))], (name, seeded)
        current = history.scan().to_arrow()
        assert rows_of(current.filter(current.column("is_current"))) == rows_of(rows), name


def test_history_options_with_route_by_are_checked_before_anything_is_written(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """A routed table named as the pattern names history tables is refused (it would be both a mirror and another
    table's history), nothing committed."""
    events = [[{"eid": 1, "id": 1, "value": "v", "seq": 1, "op": "c", "ts": at(1), "tbl": "db.a__history"}]]
    write_events(tmp_path / "in", events)
    with pytest.raises(Exception, match="both a routed table and another table's history"):
        run_routed(spark, "foreach", tmp_path / "in", tmp_path / "ck", catalog_properties)
    catalog = catalogs.load(None, dict(catalog_properties))
    assert not catalog.table_exists(("db", "a__history")) or not lakesink_snapshots(load(catalog_properties, "db.a__history"))


# --- cdc-format ------------------------------------------------------------------------------------------------------

T0 = datetime.datetime(2026, 11, 27, 10, 0, tzinfo=datetime.timezone.utc)
DOCS, NOTES = "public.docs", "shop.notes"


def timed(c: dict[str, Any]) -> dict[str, Any]:
    """The change committed in its source at T0 + its LSN in seconds (Debezium's ``source.ts_ms``)."""
    return {**c, "commit_ts": (T0 + datetime.timedelta(seconds=c["lsn"])).isoformat()}


def cdc_history_model(rounds: Sequence[Sequence[dict[str, Any]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Per table, every version from the whole change log: (id, title, body, valid_from, valid_to, is_current,
    operation, change_order), a TOAST placeholder taking the value of the key's version before it, a delete's version
    holding the key alone (REPLICA IDENTITY DEFAULT: Debezium's before image is the key)."""
    by_table: dict[str, dict[int, list[dict[str, Any]]]] = {}
    seen: set[tuple[str, int]] = set()
    for c in sorted((c for r in rounds for c in r), key=lambda c: c["lsn"]):
        if (c["table"], c["lsn"]) in seen:
            continue  # a redelivery: once
        seen.add((c["table"], c["lsn"]))
        if c["op"] == "t":  # every current version ends: a delete of each live key at the truncate
            for chain in by_table.setdefault(c["table"], {}).values():
                if chain[-1]["op"] != "d":
                    chain.append(
                        {"values": {"id": chain[-1]["values"]["id"]}, "op": "d", "lsn": c["lsn"], "time": timed(c)["commit_ts"]}
                    )
            continue
        image = c["after"] if c["op"] != "d" else c["before"]
        chain = by_table.setdefault(c["table"], {}).setdefault(image["id"], [])
        values = dict(image)
        if c["op"] != "d":
            for n in TOASTED:
                if values.get(n) == toast.placeholder(TYPES[n]):
                    values[n] = chain[-1]["values"][n]
        chain.append({"values": values, "op": c["op"], "lsn": c["lsn"], "time": timed(c)["commit_ts"]})
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, keys in by_table.items():
        versions = []
        for i, chain in keys.items():
            for place, v in enumerate(chain):
                nxt = chain[place + 1] if place + 1 < len(chain) else None
                deleted = v["op"] == "d"
                after_delete = place == 0 or chain[place - 1]["op"] == "d"
                operation = "delete" if deleted else "insert" if after_delete else "update"
                body = None if deleted else v["values"]["body"]
                title = None if deleted else v["values"]["title"]
                versions.append(
                    (
                        i,
                        title,
                        body,
                        utc_iso(v["time"]),
                        utc_iso(nxt["time"]) if nxt else None,
                        nxt is None and not deleted,
                        operation,
                        v["lsn"],
                    )
                )
        out[table] = sorted(versions, key=_by_key_and_order)
    return out


def _by_key_and_order(version: tuple[Any, ...]) -> tuple[Any, Any]:
    return version[0], version[7]


def cdc_versions(rows: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(versions(rows, ["id", "title", "body"]), key=_by_key_and_order)


def cdc_rounds() -> list[list[dict[str, Any]]]:
    """Four batches of two tables' changes (see the test below), each change with its source time."""
    zero = [timed(change(t, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",))) for t in (DOCS, NOTES) for i in range(1, 4)]
    one = [timed(change(DOCS, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",)))]
    one += [timed(change(NOTES, "c", 21, row(9, "new", body="nine"), TYPES, ("id",)))]
    one += [timed(change(NOTES, "u", 22, unchanged_toast(9, "new, updated"), TYPES, ("id",)))]
    one += [timed(change(NOTES, "u", 23, unchanged_toast(2, "v2", body="changed"), TYPES, ("id",)))]
    one += [timed(change(DOCS, "d", 24, {"id": 2}, TYPES, ("id",)))]
    two = [timed(change(DOCS, "u", 30, unchanged_toast(1, "v3", nums=[7]), TYPES, ("id",)))]
    two += [timed(change(DOCS, "c", 31, row(2, "back", body="again"), TYPES, ("id",)))]
    two += [one[0]]  # redelivered
    two += [timed(change(NOTES, "u", 32, unchanged_toast(9, "v3"), TYPES, ("id",)))]
    three = [timed(change(NOTES, "c", 39, row(5, "only before the truncate", body="five"), TYPES, ("id",)))]
    three += [timed(change(NOTES, "u", 40, unchanged_toast(1, "before the truncate"), TYPES, ("id",)))]
    three += [timed(change(NOTES, "t", 41, None, TYPES, ("id",)))]
    three += [timed(change(NOTES, "c", 42, row(2, "after the truncate", body="fresh"), TYPES, ("id",)))]
    three += [timed(change(DOCS, "u", 43, unchanged_toast(2, "v4"), TYPES, ("id",)))]
    return [zero, one, two, three]


def run_cdc(spark: Any, entry: str, props: Mapping[str, str], tmp_path: Path) -> None:
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    run_to_end(start_sink(df, entry, tmp_path / "ck", props, cdc_format="debezium", merge_schema=True, history="on"))


@pytest.mark.parametrize("entry", CDC_ENTRIES)
def test_a_change_streams_tables_get_histories_dated_by_the_source_with_toast_values_kept(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Two tables of a PostgreSQL change stream (schemas.enable): inserts, updates holding Debezium's unavailable-value
    placeholder for unchanged TOAST columns (of a key stored in an earlier batch, and of the batch's own insert),
    deletes, a re-insert, a redelivered change, a truncate (every current version ends then, a delete each; the batch's
    changes before it versions too, never applied to the table; the key inserted after it starts anew). Each history
    equals the model: valid_from = source.ts_ms, change_order = the LSN, a placeholder never stored (the version before
    it gives the value); the mirror equals the current rows."""
    rounds = cdc_rounds()
    for index, changes in enumerate(rounds):
        write_json_round(tmp_path / "in", index, toast.kafka_records(changes, ("id",), schemas=True))
        run_cdc(spark, entry, catalog_properties, tmp_path)
    expected = cdc_history_model(rounds)
    for name in (DOCS, NOTES):
        history = load(catalog_properties, name + "__history")
        got = history.scan().to_arrow()
        assert cdc_versions(got) == expected[name], name
        assert cdc_versions(interop.duckdb_read(history.metadata_location)) == expected[name], (name, "duckdb")
        for n in TOASTED:
            values = [v for v in got.column(n).to_pylist() if v is not None]
            assert toast.placeholder(TYPES[n]) not in values, (name, n)
        assert_table_is_current_versions(load(catalog_properties, name), history, ("id",))
        assert_snapshot_invariants(history)


@pytest.mark.parametrize("entry", ROUTED_ENTRIES)
def test_a_truncate_resent_with_the_changes_around_it_adds_no_version(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """A connector restarted from an older LSN re-sends an update, the truncate after it and an insert after that (all
    applied a batch before), with a new insert: the update before the truncate (never applied to the table again) and
    the insert after it are versions once, the truncate ends no version twice; a key deleted by the truncate and changed
    after the re-sent batch starts anew. The history equals the model of the change log without its redeliveries, the
    table its current versions."""
    zero = [timed(change(NOTES, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",))) for i in range(1, 4)]
    one = [timed(change(NOTES, "u", 20, unchanged_toast(1, "before the truncate"), TYPES, ("id",)))]
    one += [timed(change(NOTES, "t", 21, None, TYPES, ("id",)))]
    one += [timed(change(NOTES, "c", 22, row(3, "after the truncate", body="fresh"), TYPES, ("id",)))]
    two = [dict(c) for c in one]  # re-sent from LSN 15
    two += [timed(change(NOTES, "c", 30, row(2, "back", body="again"), TYPES, ("id",)))]
    three = [timed(change(NOTES, "u", 40, unchanged_toast(3, "later"), TYPES, ("id",)))]
    rounds = [zero, one, two, three]
    for index, changes in enumerate(rounds):
        write_json_round(tmp_path / "in", index, toast.kafka_records(changes, ("id",), schemas=True))
        run_cdc(spark, entry, catalog_properties, tmp_path)
    history = load(catalog_properties, NOTES + "__history")
    assert cdc_versions(history.scan().to_arrow()) == cdc_history_model(rounds)[NOTES]
    assert_table_is_current_versions(load(catalog_properties, NOTES), history, ("id",))
    assert sorted(load(catalog_properties, NOTES).scan().to_arrow().column("id").to_pylist()) == [2, 3]


@pytest.mark.parametrize("entry", CDC_ENTRIES)
def test_a_history_started_after_the_rows_takes_toast_values_from_the_table(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """The table's rows were written before option history was turned on; then updates hold Debezium's
    unavailable-value placeholder for every TOAST column (of a key changed once, of a key changed twice in the batch,
    one that changes body): each version takes the table's row of the key as it was before the batch -- never the
    placeholder, never a stuck stream (before: UnavailableValueError at every restart). A change re-sent from before
    the history started (older than the table's row), with a placeholder or without, is no version: the table keeps
    its row (before: the one without became the key's current version while the table kept its newer row).
    The history's first commit is seeded (issue 55): each of the table's live rows (a list column among them: the
    seeding's join once failed on it) becomes a version ordered by the source position the table's order file holds
    for its key, dated by the batch's first change's source time (here the re-sent insert's), closed by the batch's
    change of its key; the history then holds a version of every key the table holds. A change re-sent at a seed's
    position (with its own source time, not the seed's) is that change again: no version, in the seeding batch and
    after it (a deleted key's re-sent insert neither)."""
    zero = [timed(change(DOCS, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",))) for i in (1, 2, 3, 5)]
    write_json_round(tmp_path / "in", 0, toast.kafka_records(zero, ("id",), schemas=True))
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    run_to_end(start_sink(df, entry, tmp_path / "ck", catalog_properties, cdc_format="debezium", merge_schema=True))
    one = [timed(change(DOCS, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",)))]
    one += [timed(change(DOCS, "u", 21, unchanged_toast(2, "v2"), TYPES, ("id",)))]
    one += [timed(change(DOCS, "u", 22, unchanged_toast(2, "v3", body="changed"), TYPES, ("id",)))]
    one += [timed(change(DOCS, "d", 23, {"id": 3}, TYPES, ("id",)))]
    one += [timed(change(DOCS, "c", 24, row(4, "four"), TYPES, ("id",)))]
    one += [timed(change(DOCS, "u", 5, unchanged_toast(5, "re-sent"), TYPES, ("id",)))]  # older than key 5's insert
    one += [timed(change(DOCS, "u", 7, row(2, "re-sent whole"), TYPES, ("id",)))]  # older than key 2's row: no version
    one += [timed(change(DOCS, "c", 25, row(6, "six"), TYPES, ("id",)))]  # a new key
    one += [zero[3]]  # key 5's insert re-sent (at least once): at its seed's position, its own source time
    write_json_round(tmp_path / "in", 1, toast.kafka_records(one, ("id",), schemas=True))
    run_cdc(spark, entry, catalog_properties, tmp_path)
    two = [zero[3], zero[2], one[0]]  # re-sent again after the seeding: no version (before: an UpsertKeyError forever)
    write_json_round(tmp_path / "in", 2, toast.kafka_records(two, ("id",), schemas=True))
    run_cdc(spark, entry, catalog_properties, tmp_path)

    def at_lsn(lsn: int) -> str:
        return utc_iso(T0 + datetime.timedelta(seconds=lsn))

    stored = {i: row(i, f"v1 {i}") for i in (1, 2, 3, 5)}
    expected = [
        (1, "v1 1", stored[1]["body"], at_lsn(15), at_lsn(20), False, "insert", 11),  # seeded
        (1, "v2", stored[1]["body"], at_lsn(20), None, True, "update", 20),
        (2, "v1 2", stored[2]["body"], at_lsn(15), at_lsn(21), False, "insert", 12),  # seeded
        (2, "v2", stored[2]["body"], at_lsn(21), at_lsn(22), False, "update", 21),
        (2, "v3", "changed", at_lsn(22), None, True, "update", 22),
        (3, "v1 3", stored[3]["body"], at_lsn(15), at_lsn(23), False, "insert", 13),  # seeded
        (3, None, None, at_lsn(23), None, False, "delete", 23),
        (4, "four", row(4, "four")["body"], at_lsn(24), None, True, "insert", 24),
        (5, "v1 5", stored[5]["body"], at_lsn(15), None, True, "insert", 15),  # seeded; its re-sent changes no version
        (6, "six", row(6, "six")["body"], at_lsn(25), None, True, "insert", 25),
    ]
    history, table = load(catalog_properties, DOCS + "__history"), load(catalog_properties, DOCS)
    got = history.scan().to_arrow()
    assert cdc_versions(got) == expected
    batches = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(table)}
    before = {r["id"]: r for r in table.scan(snapshot_id=batches[min(batches)]).to_arrow().to_pylist()}
    for version in got.to_pylist():
        if version["id"] in (1, 2):
            for n in TOASTED:
                if n != "body" or version["change_order"] != 22:
                    assert version[n] == before[version["id"]][n], (version["id"], n)
    now = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    current = {r["id"]: r for r in got.to_pylist() if r["is_current"]}
    assert sorted(now) == [1, 2, 4, 5, 6] and sorted(current) == [1, 2, 4, 5, 6]
    # seeded, but its table's order file holds deleted keys' positions: a change re-sent from before such a delete
    # must still be compared with the table (no version of that key)
    assert history.properties["lakesink.history.complete"] == "false"
    seeded = [s.summary.get("lakesink.history.versions-seeded") for s in history.snapshots() if s.summary is not None]
    assert [n for n in seeded if n is not None] == ["4"]  # once: the re-sent changes seeded nothing again
    for i, r in current.items():
        assert {c: r[c] for c in now[i]} == now[i], i
    assert now[5]["title"] == "v1 5"  # the re-sent change is older than the row: not applied, not a version
    assert_snapshot_invariants(history)


@pytest.mark.long
def test_another_writers_update_between_the_units_read_and_the_tables_read_for_toast_values_is_taken_on_retry(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history started after its table held rows reads the table once more for a TOAST placeholder's values
    (lakesink.driver.actions.history.table_before), not on the unit's own read of it. Another engine updates that very
    row between the two reads: the values read are one commit newer than the unit's read of the table -- but the
    unit's swap of the table then conflicts (the table moved since the attempt read it) and the next attempt reads both
    again: the version's TOAST value is the other writer's, as the table's row is; never a version the table's commit
    did not see."""
    zero = [timed(change(DOCS, "c", 10 + i, row(i, f"v1 {i}"), TYPES, ("id",))) for i in (1, 2)]
    write_json_round(tmp_path / "in", 0, toast.kafka_records(zero, ("id",), schemas=True))
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    run_to_end(start_sink(df, "foreach", tmp_path / "ck", catalog_properties, cdc_format="debezium", merge_schema=True))
    one = [timed(change(DOCS, "u", 20, unchanged_toast(1, "v2"), TYPES, ("id",)))]
    write_json_round(tmp_path / "in", 1, toast.kafka_records(one, ("id",), schemas=True))

    real = history_module.table_before
    outside: list[int] = []

    def another_writer_first(mirror: Any, changes: pa.Table, rows_for: Sequence[bool]) -> Any:
        if not outside:  # once: after the attempt read the tables, before the history reads its table again
            table = load(catalog_properties, DOCS)
            rows = table.scan(row_filter="id = 1").to_arrow()
            body = rows.schema.field("body")
            rows = rows.set_column(rows.schema.get_field_index("body"), body, pa.array(["outside"], body.type))
            table.overwrite(rows, overwrite_filter="id = 1")
            outside.append(1)
        return real(mirror, changes, rows_for)

    monkeypatch.setattr(history_module, "table_before", another_writer_first)
    run_cdc(spark, "foreach", catalog_properties, tmp_path)
    assert outside == [1]
    history, table = load(catalog_properties, DOCS + "__history"), load(catalog_properties, DOCS)
    versions = sorted(history.scan().to_arrow().to_pylist(), key=lambda v: (v["id"], v["change_order"]))
    assert [(v["id"], v["title"], v["body"], v["is_current"]) for v in versions] == [
        (1, "v1 1", "outside", False),  # seeded from the table as the retry read it: the other writer's row
        (1, "v2", "outside", True),
        (2, "v1 2", row(2, "v1 2")["body"], True),  # seeded
    ]
    now = {r["id"]: r for r in table.scan().to_arrow().to_pylist()}
    assert now[1]["body"] == "outside" and now[1]["title"] == "v2"
    for n in now[1]:
        assert versions[1][n] == now[1][n], n
    assert history.properties["lakesink.history.complete"] == "false"
    landed = history.snapshot_by_id(lakesink_snapshots(history)[-1]["snapshot_id"])
    assert int(landed.summary[SUMMARY_COMMIT_ATTEMPT]) >= 2  # the first attempt's swap conflicted: retried
    assert_snapshot_invariants(history)
