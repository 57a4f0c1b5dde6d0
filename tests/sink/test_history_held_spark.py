"""Option history with the change-stream pipeline's held transactions and source key changes (issues 55 and 51), in
real local Spark on both entry points (``lakesink.foreach_batch(...)`` and ``writeStream.format("lakesink")``):

- ``cdc-transactions=hold``: a transaction held back (not all its records in the batch) becomes history versions only
  in the batch that releases it, in the source's order, exactly once -- not when it is held, not again when the holding
  or the releasing batch is replayed from the checkpoint, not again when Debezium re-sends its tail after the release;
- a source primary key change (issue 51 item 4): with history on, the batch fails as loudly (naming both keys), neither
  the table nor its history gets a snapshot from it, and after the documented way out the stream goes on.

Records: Debezium's PostgreSQL connector's, built field by field (tests/support/cdc_debezium.py: the Kafka key with its
Connect schema, the envelope, the ``source`` block with ``ts_ms``/``txId``/``lsn``, the ``transaction`` block of
``provide.transaction.metadata=true`` with ``id``/``total_order``/``data_collection_order``, and the transaction
topic's BEGIN/END with ``event_count`` and ``data_collections``), with Kafka's ``offset`` per topic. Every table and
every history table is compared with a plain-Python model, at every batch.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS
from lakesink.table.keys import SUMMARY_COMMIT_ATTEMPT
from tests.sink.test_cdc_transactions_spark import held_files_on_disk
from tests.support import cdc_debezium, toast
from tests.support.changes import KAFKA_DDL, write_json_round
from tests.support.helpers import (
    assert_each_batch_once,
    assert_snapshot_invariants,
    assert_table_is_current_versions,
    lakesink_snapshots,
    run_to_end,
    start_sink,
)
from tests.support.history import utc_iso, versions

pytestmark = pytest.mark.spark

# each case on one entry point in make test, on the other under the long marker (make test-long)
FOREACH_FIRST = ["foreach", pytest.param("format", marks=pytest.mark.long)]
FORMAT_FIRST = [pytest.param("foreach", marks=pytest.mark.long), "format"]
DOCS, NOTES = "public.docs", "shop.notes"
TABLES = (DOCS, NOTES)
TYPES = {"id": "int", "title": "string"}
T0 = datetime.datetime(2026, 11, 27, 10, 0, tzinfo=datetime.timezone.utc)
Change = dict[str, Any]
Version = tuple[Any, ...]


def tx_change(table: str, op: str, lsn: int, image: dict[str, Any], commit_lsn: int) -> Change:
    """A change at WAL position ``lsn`` of the transaction committed at ``commit_lsn`` (txId ``900 + commit_lsn``, source
    time T0 + ``commit_lsn`` seconds: Debezium's ``source.ts_ms`` is the commit's time); a delete: ``image`` is its
    before image, the key alone (REPLICA IDENTITY DEFAULT)."""
    c = toast.change(table, op, lsn, image, TYPES, ("id",))
    c["txid"], c["commit_lsn"] = 900 + commit_lsn, commit_lsn
    c["commit_ts"] = (T0 + datetime.timedelta(seconds=commit_lsn)).isoformat()
    return c


def transaction(changes: Sequence[Change]) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """A transaction's BEGIN, its changes' records (a delete with its tombstone), its END -- unstamped: the caller
    delivers them in any cut."""
    tx = cdc_debezium.transaction_id(changes[0])
    assert tx is not None
    tables = [c["table"] for c in changes]
    begin, end = cdc_debezium.transaction_records(tx, cdc_debezium.commit_ms(changes[0]), tables, schemas=True)
    blocks = cdc_debezium.transaction_blocks(list(changes))
    records = [
        r
        for c, b in zip(changes, blocks, strict=True)
        for r in cdc_debezium.records(c, "shop", ("id",), schemas=True, transaction=b)
    ]
    return begin, records, end


def mirror_model(released: Sequence[Change]) -> dict[str, dict[int, str]]:
    """Each table (id -> title) after the released changes in source order."""
    out: dict[str, dict[int, str]] = {t: {} for t in TABLES}
    for c in sorted(released, key=lambda c: c["lsn"]):
        if c["op"] == "d":
            out[c["table"]].pop(c["before"]["id"], None)
        else:
            out[c["table"]][c["after"]["id"]] = c["after"]["title"]
    return out


def history_model(released: Sequence[Change]) -> dict[str, list[Version]]:
    """Each history: every released change once as a version (id, title, valid_from = source.ts_ms, valid_to = the key's
    next version's valid_from, is_current, operation, change_order = the LSN), a delete holding the key alone."""
    chains: dict[str, dict[int, list[Change]]] = {t: {} for t in TABLES}
    for c in sorted(released, key=lambda c: c["lsn"]):
        image = c["after"] if c["op"] != "d" else c["before"]
        chains[c["table"]].setdefault(image["id"], []).append(c)
    out: dict[str, list[Version]] = {}
    for table, keys in chains.items():
        versions = []
        for i, chain in keys.items():
            for place, c in enumerate(chain):
                nxt = chain[place + 1] if place + 1 < len(chain) else None
                deleted = c["op"] == "d"
                fresh = place == 0 or chain[place - 1]["op"] == "d"
                versions.append(
                    (
                        i,
                        None if deleted else c["after"]["title"],
                        utc_iso(c["commit_ts"]),
                        utc_iso(nxt["commit_ts"]) if nxt else None,
                        nxt is None and not deleted,
                        "delete" if deleted else "insert" if fresh else "update",
                        c["lsn"],
                    )
                )
        out[table] = sorted(versions, key=lambda v: (v[0], v[6]))
    return out


def load(props: Mapping[str, str], name: str) -> Any:
    return catalogs.load(None, dict(props)).load_table(tuple(name.split(".")))


def exists(props: Mapping[str, str], name: str) -> bool:
    return bool(catalogs.load(None, dict(props)).table_exists(tuple(name.split("."))))


def versions_at(history: Any, snapshot_id: int | None = None) -> list[Version]:
    rows = history.scan(snapshot_id=snapshot_id).to_arrow()  # None: the current snapshot
    return sorted(versions(rows, ["id", "title"]), key=lambda v: (v[0], v[6]))


def run(spark: Any, entry: str, props: Mapping[str, str], tmp_path: Path, **options: Any) -> None:
    ddl = KAFKA_DDL + (", offset LONG" if options.get("cdc_transactions") else "")
    df = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    run_to_end(start_sink(df, entry, tmp_path / "ck", props, cdc_format="debezium", merge_schema=True, history="on", **options))


def replay(ck: Path, batch_id: int) -> None:
    """A restart before Spark's commit log of batch ``batch_id``: the restart runs it again with the same records."""
    (ck / "commits" / str(batch_id)).unlink()
    (ck / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


# --- cdc-transactions=hold -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "swap_fault"),
    [
        ("foreach", False),
        pytest.param("format", False, marks=pytest.mark.long),
        pytest.param("foreach", True, marks=pytest.mark.long),
        pytest.param("format", True, marks=pytest.mark.long),
    ],
)
def test_held_changes_become_versions_once_in_the_batch_that_releases_them(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, swap_fault: bool
) -> None:
    """Transaction 20 (docs and notes) is cut by the micro-batches: held back by batch 0, released by batch 1 (its END
    and its last change arrive then), beside transaction 30, whole in batch 1. Batches 0 and 1 are each replayed from
    the checkpoint (a restart before Spark's commit log), and after the release Debezium re-sends transaction 20's tail
    with its END (a connector restart) in batch 2, beside transaction 40. At every batch each table and each history
    equals the model of the transactions released by then: the held changes are versions only from batch 1 on, once,
    in LSN order, dated by their commit's ``source.ts_ms``. ``swap_fault``: the holding batch's and the releasing batch's
    first attempts each fail inside the unit's one catalog transaction, between two of its tables' swaps: nothing of
    that attempt lands (no table, no history, no held state), the batch's next attempt commits the unit whole, and the
    failed attempt's held file is not left on disk."""
    props, ck = catalog_properties, tmp_path / "ck"

    def failing_inside_the_swap(batch_id: int) -> None:
        """Run batch ``batch_id`` with its unit's first attempt failing between two of its tables' swaps: the
        attempt did not land anywhere (settled by reading the tables), the next attempt of the same batch lands in
        every table and history, and the failed attempt's held file is not left on disk."""
        files = held_files_on_disk(props)
        faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
        run(spark, entry, props, tmp_path, **options)
        assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS), batch_id
        faults.clear()
        named: set[str] = set()
        for n in (*TABLES, *(f"{t}__history" for t in TABLES)):
            table = load(props, n)
            landed = [s for s in lakesink_snapshots(table) if s["batch_id"] == batch_id]
            assert len(landed) == 1 and int(landed[0]["summary"][SUMMARY_COMMIT_ATTEMPT]) >= 2, (n, batch_id)
            named |= {f.removeprefix("file://") for f in held.held_files(table.properties)}
        assert held_files_on_disk(props) - files <= named, batch_id

    topics = cdc_debezium.Topics()
    t10 = [tx_change(DOCS, "c", 11, {"id": 1, "title": "d1"}, 10)]
    t10 += [tx_change(DOCS, "c", 12, {"id": 2, "title": "d2"}, 10), tx_change(NOTES, "c", 13, {"id": 1, "title": "n1"}, 10)]
    t20 = [tx_change(DOCS, "u", 21, {"id": 1, "title": "d1 by t20"}, 20), tx_change(NOTES, "c", 22, {"id": 2, "title": "n2"}, 20)]
    t20 += [tx_change(NOTES, "u", 23, {"id": 1, "title": "n1 by t20"}, 20), tx_change(DOCS, "d", 24, {"id": 2}, 20)]
    t30 = [tx_change(DOCS, "u", 31, {"id": 1, "title": "d1 by t30"}, 30)]
    t30 += [tx_change(DOCS, "c", 32, {"id": 2, "title": "d2 again"}, 30), tx_change(NOTES, "d", 33, {"id": 2}, 30)]
    t40 = [tx_change(NOTES, "u", 41, {"id": 1, "title": "n1 by t40"}, 40), tx_change(DOCS, "c", 42, {"id": 3, "title": "d3"}, 40)]
    b10, r10, e10 = transaction(t10)
    b20, r20, e20 = transaction(t20)
    b30, r30, e30 = transaction(t30)
    b40, r40, e40 = transaction(t40)
    # the records of t20's last change: a delete and its tombstone
    tail20 = [r for r in r20 if json.loads(r["key"])["payload"]["id"] == 2 and r["topic"] == "lake.public.docs"]
    assert len(tail20) == 2
    head20 = [r for r in r20 if r not in tail20]
    rounds = [
        # batch 0: t10 whole; t20 begun, three of its four changes (both tables): held back
        topics.stamp([b10, *r10, e10, b20, *head20]),
        # batch 1: t20's last change and its END (released), t30 whole; one of t20's changes delivered a second time
        topics.stamp([*tail20, head20[0], e20, b30, *r30, e30]),
        # batch 2: t20's tail and END re-sent after its release (a connector restart), t40 whole
        topics.stamp([*tail20, e20, b40, *r40, e40]),
    ]
    released_by = {0: t10, 1: t10 + t20 + t30, 2: t10 + t20 + t30 + t40}
    options = {"cdc_transactions": "hold"}

    def check(last: int) -> None:
        """At every batch up to ``last``: each table and each history equal the model of what that batch released."""
        for name in TABLES:
            table, history = load(props, name), load(props, name + "__history")
            assert_each_batch_once(table, name)
            assert_each_batch_once(history, name + "__history")
            assert_table_is_current_versions(table, history, ("id",))
            assert_snapshot_invariants(history)
            mine = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(table)}
            theirs = {s["batch_id"]: s["snapshot_id"] for s in lakesink_snapshots(history)}
            assert set(mine) == set(theirs) == set(range(last + 1)), name
            for b in range(last + 1):
                expected = history_model(released_by[b])[name]
                assert versions_at(history, theirs[b]) == expected, (name, b)
                rows = table.scan(snapshot_id=mine[b]).to_arrow().to_pylist()
                assert {r["id"]: r["title"] for r in rows} == mirror_model(released_by[b])[name], (name, b)

    def held_changes() -> int:
        tables = {name: load(props, name) for name in TABLES}
        query_id = json.loads((ck / "metadata").read_text())["id"]
        state = held.recorded(tables, query_id, None)
        assert state is not None
        return state.changes

    # batch 0, then its replay: t20 held, no version of it in either history
    write_json_round(tmp_path / "in", 0, rounds[0])
    if swap_fault:
        failing_inside_the_swap(0)
    else:
        run(spark, entry, props, tmp_path, **options)
    check(0)
    assert held_changes() == len(head20) == 3  # three changes, no tombstone among them
    replay(ck, 0)
    run(spark, entry, props, tmp_path, **options)
    check(0)
    assert held_changes() == 3
    # batch 1 (a restart of the query from the checkpoint between hold and release), then its replay
    write_json_round(tmp_path / "in", 1, rounds[1])
    if swap_fault:
        failing_inside_the_swap(1)
    else:
        run(spark, entry, props, tmp_path, **options)
    check(1)
    assert held_changes() == 0
    replay(ck, 1)
    run(spark, entry, props, tmp_path, **options)
    check(1)
    # batch 2: the re-sent tail of t20 is dropped, t40 applied
    write_json_round(tmp_path / "in", 2, rounds[2])
    run(spark, entry, props, tmp_path, **options)
    check(2)
    assert held_changes() == 0
    for name in TABLES:  # the end state, from the history alone
        assert versions_at(load(props, name + "__history")) == history_model(released_by[2])[name], name


@pytest.mark.parametrize("entry", FORMAT_FIRST)
def test_a_transaction_released_incomplete_then_its_missing_change_becomes_a_late_version_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """Transaction 50's END is at hand, one of its two changes is not (a compacted topic, a lost record): held, then
    released as it stands once it waited option cdc-transaction-wait (0 s: the next batch). Its missing change arrives
    two transactions later: it waits in turn, then is released -- a late version of its key in the history, between the
    versions around it by LSN (they are re-linked), and no change to the table (a newer change of the key is there).
    Each batch: the table and its history equal the model of the changes released by then. Before the fix
    (lakesink.sink.cdc.transactions.starting_state) a batch releasing nothing in a new run -- batch 1 here -- failed on
    both entry points on every restart: the history tables carry the held property as unit members, were taken for the
    sink's tables to record the empty batch in, and refused as routed tables named like histories (InvalidOptionError).
    """
    props, ck = catalog_properties, tmp_path / "ck"
    topics = cdc_debezium.Topics()
    t10 = [tx_change(DOCS, "c", 11, {"id": 1, "title": "d1"}, 10), tx_change(NOTES, "c", 12, {"id": 1, "title": "n1"}, 10)]
    t50 = [tx_change(DOCS, "u", 51, {"id": 1, "title": "d1 by t50"}, 50)]
    t50 += [tx_change(DOCS, "u", 52, {"id": 1, "title": "d1 again by t50"}, 50)]
    t60 = [tx_change(DOCS, "u", 61, {"id": 1, "title": "d1 by t60"}, 60), tx_change(NOTES, "d", 62, {"id": 1}, 60)]
    t70 = [tx_change(NOTES, "c", 71, {"id": 7, "title": "n7"}, 70)]
    b10, r10, e10 = transaction(t10)
    b50, r50, e50 = transaction(t50)
    b60, r60, e60 = transaction(t60)
    b70, r70, e70 = transaction(t70)
    missing = [r for r in r50 if json.loads(r["value"])["payload"]["source"]["lsn"] == 52]
    rounds = [
        topics.stamp([b10, *r10, e10]),
        topics.stamp([b50, *[r for r in r50 if r not in missing], e50]),  # held: one change of two at hand
        topics.stamp([b60, *r60, e60]),  # t50 released as it stands (it waited), then t60
        topics.stamp([*missing]),  # t50's missing change: no BEGIN/END at hand, held for the wait
        topics.stamp([b70, *r70, e70]),  # released, with t70
    ]
    released_by = {0: t10, 1: t10, 2: t10 + t50[:1] + t60, 3: t10 + t50[:1] + t60, 4: t10 + t50 + t60 + t70}
    for index, records in enumerate(rounds):
        write_json_round(tmp_path / "in", index, records)
        run(spark, entry, props, tmp_path, cdc_transactions="hold", cdc_transaction_wait=0)
        if index == 1:  # a restart between hold and release, replaying the holding batch
            replay(ck, 1)
            run(spark, entry, props, tmp_path, cdc_transactions="hold", cdc_transaction_wait=0)
        for name in TABLES:
            table, history = load(props, name), load(props, name + "__history")
            assert_table_is_current_versions(table, history, ("id",))
            assert versions_at(history) == history_model(released_by[index])[name], (name, index)
            assert {r["id"]: r["title"] for r in table.scan().to_arrow().to_pylist()} == mirror_model(released_by[index])[name], (
                name,
                index,
            )
            assert_each_batch_once(history, name + "__history")


@pytest.mark.parametrize("entry", FOREACH_FIRST)
def test_a_first_batch_holding_everything_makes_empty_tables_then_releases_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """The query's first batch holds its only transaction back (its END comes later): the tables are made empty, as the
    held changes would make them, carrying what is held (docs/cdc.md); no history has a version. A restart replays that
    batch, then the END releases it: each change a version once, in the releasing batch."""
    props, ck = catalog_properties, tmp_path / "ck"
    topics = cdc_debezium.Topics()
    t20 = [tx_change(DOCS, "c", 21, {"id": 1, "title": "d1"}, 20), tx_change(NOTES, "c", 22, {"id": 1, "title": "n1"}, 20)]
    t20 += [tx_change(DOCS, "u", 23, {"id": 1, "title": "d1 again"}, 20)]
    b20, r20, e20 = transaction(t20)
    rounds = [topics.stamp([b20, *r20]), topics.stamp([e20])]
    options = {"cdc_transactions": "hold"}
    write_json_round(tmp_path / "in", 0, rounds[0])
    run(spark, entry, props, tmp_path, **options)
    replay(ck, 0)
    run(spark, entry, props, tmp_path, **options)
    for name in TABLES:
        assert load(props, name).scan().to_arrow().num_rows == 0, name
        if exists(props, name + "__history"):
            assert versions_at(load(props, name + "__history")) == [], name
    write_json_round(tmp_path / "in", 1, rounds[1])
    run(spark, entry, props, tmp_path, **options)
    for name in TABLES:
        table, history = load(props, name), load(props, name + "__history")
        assert versions_at(history) == history_model(t20)[name], name
        assert {r["id"]: r["title"] for r in table.scan().to_arrow().to_pylist()} == mirror_model(t20)[name], name
        assert_table_is_current_versions(table, history, ("id",))
        assert_each_batch_once(history, name + "__history")


# --- a source primary key change ------------------------------------------------------------------------------------

LINES = "shop.lines"
LINE_TYPES = {"order_id": "long", "line": "int", "qty": "int"}
OLD, NEW = ("order_id",), ("order_id", "line")
LineVersion = tuple[Any, ...]


def line_change(op: str, lsn: int, image: dict[str, Any], key: tuple[str, ...]) -> Change:
    """A change of shop.lines keyed (its Kafka key) by ``key``, the source table's primary key at the time, committed at
    T0 + ``lsn`` seconds."""
    c = toast.change(LINES, op, lsn, image, LINE_TYPES, key)
    c["commit_ts"] = (T0 + datetime.timedelta(seconds=lsn)).isoformat()
    return c


def line(order_id: int, n: int, qty: int) -> dict[str, Any]:
    return {"order_id": order_id, "line": n, "qty": qty}


def line_records(changes: Sequence[Change], key: tuple[str, ...]) -> list[dict[str, Any]]:
    return toast.kafka_records(changes, key, schemas=True)


def line_history_model(changes: Sequence[Change], key: tuple[str, ...]) -> list[LineVersion]:
    """(order_id, line, qty, valid_from, valid_to, is_current, operation, change_order) of every change, the versions of
    a key (by ``key``) linked in LSN order; a delete's version holds its before image (here: the key)."""
    chains: dict[tuple[Any, ...], list[Change]] = {}
    for c in sorted(changes, key=lambda c: c["lsn"]):
        image = c["after"] if c["op"] != "d" else c["before"]
        chains.setdefault(tuple(image[k] for k in key), []).append(c)
    out = []
    for chain in chains.values():
        for place, c in enumerate(chain):
            nxt = chain[place + 1] if place + 1 < len(chain) else None
            deleted = c["op"] == "d"
            image = c["after"] if not deleted else c["before"]
            out.append(
                (
                    image["order_id"],
                    image.get("line"),
                    image.get("qty"),
                    utc_iso(c["commit_ts"]),
                    utc_iso(nxt["commit_ts"]) if nxt else None,
                    nxt is None and not deleted,
                    "delete" if deleted else "insert" if place == 0 or chain[place - 1]["op"] == "d" else "update",
                    c["lsn"],
                )
            )
    return sorted(out, key=lambda v: (v[0], v[1] or 0, v[7]))


def line_versions(history: Any) -> list[LineVersion]:
    return sorted(versions(history.scan().to_arrow(), ["order_id", "line", "qty"]), key=lambda v: (v[0], v[1] or 0, v[7]))


def lines_of(table: Any) -> list[tuple[int, int, int]]:
    return sorted((r["order_id"], r["line"], r["qty"]) for r in table.scan().to_arrow().to_pylist())


@pytest.mark.parametrize("entry", FORMAT_FIRST)
def test_a_source_key_change_with_history_fails_loudly_commits_nothing_then_goes_on(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """shop.lines is created keyed by the records' Kafka key (order_id), with its history; the source's key becomes
    (order_id, line) and the records' keys say so. The batch fails naming both keys on every restart; neither the table
    nor its history gets a snapshot of it (a history keyed by order_id would link the new lines as versions of one row).
    The error's way out names the history too (dropping the table alone, as without history, would leave the old rows
    current in the history for good). After it -- the table and its history dropped -- the same batch goes on: the
    table made keyed by the new key, the history's versions those of the changes since."""
    props = catalog_properties
    before = [line_change("c", 10, line(1, 1, 5), OLD), line_change("c", 11, line(2, 1, 6), OLD)]
    before += [line_change("u", 12, line(2, 1, 60), OLD)]
    write_json_round(tmp_path / "in", 0, line_records(before, OLD))
    run(spark, entry, props, tmp_path)
    table, history = load(props, LINES), load(props, LINES + "__history")
    assert table.schema().identifier_field_names() == {"order_id"}
    assert lines_of(table) == [(1, 1, 5), (2, 1, 60)]
    assert line_versions(history) == line_history_model(before, OLD)
    heads = (table.current_snapshot().snapshot_id, history.current_snapshot().snapshot_id)
    after = [line_change("c", 20, line(1, 2, 7), NEW), line_change("c", 21, line(1, 3, 8), NEW)]
    after += [line_change("u", 22, line(1, 2, 70), NEW), line_change("d", 23, {"order_id": 1, "line": 3}, NEW)]
    after += [line_change("c", 24, line(3, 1, 9), NEW)]
    write_json_round(tmp_path / "in", 1, line_records(after, NEW))
    for _ in range(2):  # every restart: as loud, nothing committed in the table or its history
        with pytest.raises(Exception, match=r"table shop\.lines is keyed by \(order_id\).*carry key \(order_id, line\)") as e:
            run(spark, entry, props, tmp_path)
        table, history = load(props, LINES), load(props, LINES + "__history")
        assert (table.current_snapshot().snapshot_id, history.current_snapshot().snapshot_id) == heads
        assert lines_of(table) == [(1, 1, 5), (2, 1, 60)]
        assert line_versions(history) == line_history_model(before, OLD)
        assert_table_is_current_versions(table, history, OLD)
        assert "drop its history table shop.lines__history too" in str(e.value)  # the way out names the history
    # the way out: the table and its history dropped (the old versions copied first), the stream restarted
    catalog = catalogs.load(None, dict(props))
    kept = load(props, LINES + "__history").scan().to_arrow()
    catalog.drop_table(("shop", "lines"))
    catalog.drop_table(("shop", "lines__history"))
    run(spark, entry, props, tmp_path)
    later = [line_change("u", 30, line(1, 2, 71), NEW), line_change("c", 31, line(2, 2, 4), NEW)]
    write_json_round(tmp_path / "in", 2, line_records(later, NEW))
    run(spark, entry, props, tmp_path)
    table, history = load(props, LINES), load(props, LINES + "__history")
    assert table.schema().identifier_field_names() == set(NEW)
    assert lines_of(table) == [(1, 2, 71), (2, 2, 4), (3, 1, 9)]
    assert line_versions(history) == line_history_model(after + later, NEW)
    assert_table_is_current_versions(table, history, NEW)
    assert_each_batch_once(table, LINES)
    assert sorted(kept.column("change_order").to_pylist()) == [10, 11, 12]  # the copy: the old key's versions


@pytest.mark.parametrize("entry", FOREACH_FIRST)
def test_a_batch_spanning_a_key_change_with_history_is_refused_then_goes_on_from_the_change(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    """A batch whose records switch from the old key to the new one (the source's ALTER within the batch, a delete under
    the old key before it -- its before image the old key alone): refused naming the history too, nothing committed in
    the table or its history; once both are dropped the same batch goes on, the history holding the versions of the
    changes from the key change's position on only (those before it belong to the old table, as in the table)."""
    props = catalog_properties
    zero = [line_change("c", 10, line(1, 1, 5), OLD), line_change("c", 11, line(2, 1, 6), OLD)]
    write_json_round(tmp_path / "in", 0, line_records(zero, OLD))
    run(spark, entry, props, tmp_path)
    heads = tuple(load(props, n).current_snapshot().snapshot_id for n in (LINES, LINES + "__history"))
    before = [line_change("u", 12, line(2, 1, 60), OLD), line_change("d", 13, {"order_id": 1}, OLD)]
    after = [line_change("c", 20, line(1, 2, 7), NEW), line_change("c", 21, line(1, 3, 8), NEW)]
    after += [line_change("u", 22, line(2, 1, 61), NEW)]
    write_json_round(tmp_path / "in", 1, line_records(before, OLD) + line_records(after, NEW))
    with pytest.raises(Exception, match=r"switch key.*drop \(or rename\) table shop\.lines and drop its history table") as e:
        run(spark, entry, props, tmp_path)
    assert "shop.lines__history" in str(e.value)
    assert tuple(load(props, n).current_snapshot().snapshot_id for n in (LINES, LINES + "__history")) == heads
    assert line_versions(load(props, LINES + "__history")) == line_history_model(zero, OLD)
    catalog = catalogs.load(None, dict(props))
    catalog.drop_table(("shop", "lines"))
    catalog.drop_table(("shop", "lines__history"))
    run(spark, entry, props, tmp_path)
    table, history = load(props, LINES), load(props, LINES + "__history")
    assert table.schema().identifier_field_names() == set(NEW)
    assert lines_of(table) == [(1, 2, 7), (1, 3, 8), (2, 1, 61)]
    assert line_versions(history) == line_history_model(after, NEW)
    assert_table_is_current_versions(table, history, NEW)
