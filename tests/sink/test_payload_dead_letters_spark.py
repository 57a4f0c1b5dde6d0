"""Option payload with a dead-letter table in real local Spark, through both entry points (foreach_batch, and
format("lakesink"), whose commit writes the tables and the dead letters from the staged rows) (route-by, upsert-key,
order-by, delete-when): a payload value that does not fit its existing table's column is a dead letter
``payload-value`` (the table, the column, the original row), committed in the same unit as the batch's tables; the
batch's other changes commit. A dead-lettered change is not applied at all: its key resolves from the batch's other
changes (or keeps its row). A failure between the files and the unit commit leaves nothing; the restart commits the
batch once; a failure after the unit commit is replayed without a dead letter twice. The same input through the two
entry points gives the same tables and the same dead letters (every column but the time and the query id).

The oracle is a model in plain Python: unique ids, the changes applied in ``seq`` order without the misfits; the
tables and the dead letters compared as multisets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP
from lakesink.table import dead_letters as dl
from tests.conftest import sql_catalog_properties
from tests.sink.test_payload_spark import Change, write_round
from tests.support.changes import KAFKA_DDL
from tests.support.helpers import assert_snapshot_invariants, data_files_on_disk, fail_once_at, referenced_data_files, run_to_end

pytestmark = pytest.mark.spark

DEAD = "db.dead"
ENTRIES = ["foreach", "format"]


def changes() -> tuple[list[list[Change]], set[int]]:
    """Two batches (the first creates the tables), and the seq of each change that does not fit its table."""
    seq = iter(range(1, 10_000))
    misfits: set[int] = set()

    def c(route: str, op: str, doc: dict[str, Any], misfit: bool = False) -> Change:
        change = {"route": route, "op": op, "seq": next(seq), "doc": doc}
        if misfit:
            misfits.add(change["seq"])  # type: ignore[arg-type]
        return change

    one = [c("db.p", "c", {"id": i, "n": i, "s": f"s{i}"}) for i in range(1, 7)]
    one += [c("db.q", "c", {"id": 100 + i, "amount": i + 0.5}) for i in range(3)]
    two = [c("db.p", "u", {"id": 1, "n": 10, "s": "one"})]
    two += [c("db.p", "u", {"id": 2, "n": "two", "s": "two"}, misfit=True)]  # key 2 keeps its row
    two += [c("db.p", "u", {"id": 3, "n": 30, "s": "three"}), c("db.p", "u", {"id": 3, "n": "x", "s": "3x"}, misfit=True)]
    two += [c("db.p", "u", {"id": 4, "n": "y", "s": "4y"}, misfit=True), c("db.p", "u", {"id": 4, "n": 40, "s": "four"})]
    two += [c("db.p", "d", {"id": 5, "n": "bad", "s": None})]  # a delete reads only its key: applied
    two += [c("db.p", "c", {"id": 7, "n": 7, "s": "seven"}), c("db.p", "c", {"id": 8, "n": "eight", "s": None}, misfit=True)]
    two += [c("db.q", "u", {"id": 100, "amount": "lots"}, misfit=True), c("db.q", "c", {"id": 110, "amount": 2.5})]
    three = [c("db.p", "u", {"id": 7, "n": 7.5, "s": "x"}, misfit=True), c("db.p", "c", {"id": 9, "n": 9, "s": "nine"})]
    three += [c("db.q", "u", {"id": 101, "amount": "none"}, misfit=True), c("db.q", "u", {"id": 102, "amount": 0.25})]
    return [one, two, three], misfits


def model(batches: list[list[Change]], misfits: set[int]) -> dict[str, Counter[tuple[Any, ...]]]:
    tables: dict[str, dict[int, dict[str, Any]]] = {"db.p": {}, "db.q": {}}
    for change in sorted((c for b in batches for c in b if c["seq"] not in misfits), key=lambda c: c["seq"]):
        rows = tables[change["route"]]
        if change["op"] == "d":
            rows.pop(change["doc"]["id"], None)
        else:
            rows[change["doc"]["id"]] = change["doc"]
    columns = {"db.p": ("id", "n", "s"), "db.q": ("id", "amount")}
    return {t: Counter(tuple(doc.get(f) for f in columns[t]) for doc in rows.values()) for t, rows in tables.items()}


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str = "foreach", **more: str) -> Any:
    """The stream of ``src`` into the routed tables with option payload and a dead-letter table; ``more``: options
    more (foreach_batch's keywords spelt as options with '_')."""
    df = spark.readStream.schema("route STRING, op STRING, seq LONG, doc STRING").option("maxFilesPerTrigger", 1).json(str(src))
    options = {
        "route_by": "route",
        "payload": "doc",
        "upsert_key": "id",
        "delete_when": "op = 'd'",
        "order_by": "seq",
        "dead_letter_table": DEAD,
        **more,
    }
    if entry == "format":  # the executors stage the rows; the commit writes the tables and the dead letters
        lakesink.register(spark)
        writer = df.writeStream.format("lakesink")
        for k, v in {
            **{k.replace("_", "-"): v for k, v in options.items()},
            **{f"catalog.{k}": v for k, v in props.items()},
        }.items():
            writer = writer.option(k, v)
        return writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    sink = lakesink.foreach_batch(**options, catalog_properties=props)  # type: ignore[arg-type]
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def tables(props: dict[str, str]) -> dict[str, Counter[tuple[Any, ...]]]:
    catalog = catalogs.load(None, props)
    columns = {"db.p": ("id", "n", "s"), "db.q": ("id", "amount")}
    out = {}
    for name, fields in columns.items():
        table = catalog.load_table(tuple(name.split(".")))
        assert_snapshot_invariants(table)
        assert data_files_on_disk(table) <= referenced_data_files(table), name  # an aborted batch left no file
        out[name] = Counter(tuple(r[f] for f in fields) for r in table.scan().to_arrow().to_pylist())
    return out


def letters(props: dict[str, str]) -> Counter[tuple[Any, ...]]:
    dead = catalogs.load(None, props).load_table(("db", "dead"))
    out: Counter[tuple[Any, ...]] = Counter()
    for r in dead.scan().to_arrow().to_pylist():
        row = json.loads(r[dl.ROW])
        out[(row["seq"], r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE], r[dl.BATCH_ID], row["route"], row["doc"])] += 1
    return out


@pytest.mark.parametrize("entry", ENTRIES)
def test_payload_values_that_do_not_fit_are_dead_letters_in_the_batch_unit_across_failures_before_and_after_it(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    batches, misfits = changes()
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_round(src, 0, batches[0])
    run_to_end(start(spark, catalog_properties, src, ck, entry))
    assert tables(catalog_properties) == model(batches[:1], misfits)
    assert letters(catalog_properties) == Counter()
    write_round(src, 1, batches[1])
    # the batch's files written (tables and dead letters), then the failure
    fail_once_at(faults, DRIVER_BEFORE_SWAP, lambda: run_to_end(start(spark, catalog_properties, src, ck, entry)))
    assert tables(catalog_properties) == model(batches[:1], misfits)  # nothing of the failed batch
    assert letters(catalog_properties) == Counter()
    run_to_end(start(spark, catalog_properties, src, ck, entry))  # the restart replays batch 1: committed once
    assert tables(catalog_properties) == model(batches[:2], misfits)

    def want(upto: int) -> Counter[tuple[Any, ...]]:
        return Counter(
            (
                c["seq"],
                dl.PAYLOAD_VALUE,
                "amount" if c["route"] == "db.q" else "n",
                c["route"],
                b,
                c["route"],
                json.dumps(c["doc"]),
            )
            for b, batch in enumerate(batches[:upto])
            for c in batch
            if c["seq"] in misfits
        )

    assert letters(catalog_properties) == want(2)
    dead = catalogs.load(None, catalog_properties).load_table(("db", "dead"))
    message = next(r[dl.MESSAGE] for r in dead.scan().to_arrow().to_pylist() if json.loads(r[dl.ROW])["doc"].find('"two"') > 0)
    assert "table db.p, column 'n' (int64): a payload holds 'two'" in message
    write_round(src, 2, batches[2])
    # the unit committed (tables and dead letters), then the failure
    fail_once_at(faults, DRIVER_AFTER_SWAP, lambda: run_to_end(start(spark, catalog_properties, src, ck, entry)))
    assert tables(catalog_properties) == model(batches, misfits)
    assert letters(catalog_properties) == want(3)
    run_to_end(start(spark, catalog_properties, src, ck, entry))  # the restart replays batch 2: found, not written again
    assert tables(catalog_properties) == model(batches, misfits)
    assert letters(catalog_properties) == want(3)
    assert list((ck / "lakesink").rglob("*.parquet")) == []  # format: every staged file swept


def dead_letter_rows(props: dict[str, str]) -> Counter[tuple[Any, ...]]:
    """Every dead letter but its time and its query id."""
    dead = catalogs.load(None, props).load_table(("db", "dead")).scan().to_arrow().to_pylist()
    keep = (dl.ERROR, dl.COLUMN, dl.MESSAGE, dl.ROW, dl.TABLE, dl.BATCH_ID)
    return Counter(tuple(r[k] for k in keep) for r in dead)


def test_both_entry_points_make_the_same_tables_and_dead_letters_of_the_same_input(
    spark: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every kind of dead letter a routed payload stream has (payload-value, invalid-route, null-upsert-key,
    reject-when), its row, message, column and table: foreach_batch's and format("lakesink")'s equal."""
    seq = iter(range(1, 10_000))

    def c(route: str | None, op: str, doc: dict[str, Any] | None) -> Change:
        return {"route": route, "op": op, "seq": next(seq), "doc": doc}

    one = [c("db.p", "c", {"id": i, "n": i, "s": f"s{i}"}) for i in range(1, 5)]
    one += [c("db.q", "c", {"id": 100, "amount": 1.5, "when": "2024-01-31"})]
    two = [c("db.p", "u", {"id": 1, "n": "one", "s": "x"}), c("db.p", "u", {"id": 2, "n": 20, "s": "two"})]
    two += [c("db.q", "u", {"id": 100, "amount": [1], "when": None}), c("db.q", "c", {"id": 101, "amount": 2, "when": "x"})]
    two += [c("", "c", {"id": 5, "n": 5}), c(None, "c", {"id": 6}), c("db.dead", "c", {"id": 7})]
    two += [c("db.p", "c", {"id": None, "n": 9, "s": "no key"}), c("db.p", "c", {"n": 10, "s": "no key field"})]
    two += [c("db.p", "c", {"id": 11, "n": 11, "s": "rejected"}), c("db.p", "d", {"id": 3, "n": "bad", "s": None})]
    two += [c("db.p", "c", {"id": 12, "n": 12, "s": 'é\u0001"/'})]
    rejected = next(x["seq"] for x in two if x["doc"] and x["doc"].get("s") == "rejected")
    got = {}
    for entry in ENTRIES:
        (tmp_path / entry).mkdir()
        props = sql_catalog_properties("sqlite", tmp_path / entry, request)
        src, ck = tmp_path / entry / "in", tmp_path / entry / "ck"
        for i, batch in enumerate((one, two)):
            write_round(src, i, batch)
            run_to_end(start(spark, props, src, ck, entry, reject_when=f"seq = {rejected}"))
        got[entry] = (tables_of(props), dead_letter_rows(props))
    assert got["foreach"] == got["format"]
    letters_kinds = Counter((r[0], r[1], r[4], r[5]) for r in got["format"][1].elements())
    assert letters_kinds == Counter(
        {
            (dl.PAYLOAD_VALUE, "n", "db.p", 1): 1,
            (dl.PAYLOAD_VALUE, "amount", "db.q", 1): 1,
            (dl.INVALID_ROUTE, "route", "", 1): 1,
            (dl.INVALID_ROUTE, "route", None, 1): 1,
            (dl.INVALID_ROUTE, "route", "db.dead", 1): 1,
            (dl.NULL_UPSERT_KEY, "id", "db.p", 1): 2,
            (dl.REJECT_WHEN, None, "db.p", 1): 1,
        }
    )
    p, q = got["format"][0]["db.p"], got["format"][0]["db.q"]
    assert sorted(p) == [(1, 1, "s1"), (2, 20, "two"), (4, 4, "s4"), (12, 12, 'é\u0001"/')]
    assert sorted(q) == [(100, 1.5, "2024-01-31"), (101, 2.0, "x")]


def tables_of(props: dict[str, str]) -> dict[str, Counter[tuple[Any, ...]]]:
    """Every table of namespace db but the dead letters, as multisets of rows (columns in the table's order)."""
    catalog = catalogs.load(None, props)
    out = {}
    for ident in catalog.list_tables("db"):
        if ident[-1] != "dead":
            rows = catalog.load_table(ident).scan().to_arrow().to_pylist()
            out[".".join(ident)] = Counter(tuple(r.values()) for r in rows)
    return out


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_debezium_change_that_does_not_fit_is_a_dead_letter_holding_the_kafka_record(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    from tests.sink.test_cdc_format_spark import stream
    from tests.support.changes import event

    acc = "public.accounts"
    one = [event(acc, "r", 100 + i, None, {"id": i, "name": f"a{i}", "balance": i * 1.5}) for i in range(4)]
    two = [event(acc, "u", 200, None, {"id": 1, "name": "fits", "balance": 2.5})]
    two += [event(acc, "u", 201, None, {"id": 2, "name": "bad", "balance": "lots"})]  # a string for a double column
    two += [event(acc, "c", 202, None, {"id": 9, "name": "new", "balance": 9.0})]
    cdc = stream(spark, catalog_properties, tmp_path)  # its records only: the query is this test's
    src, ck = tmp_path / "in", tmp_path / "ck"
    sink = lakesink.foreach_batch(
        cdc_format="debezium", upsert_key="id", dead_letter_table=DEAD, catalog_properties=catalog_properties
    )

    def run() -> None:
        df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
        if entry == "format":
            lakesink.register(spark)
            writer = df.writeStream.format("lakesink")
            options = {"cdc-format": "debezium", "upsert-key": "id", "dead-letter-table": DEAD}
            for k, v in {**options, **{f"catalog.{k}": v for k, v in catalog_properties.items()}}.items():
                writer = writer.option(k, v)
            run_to_end(writer.option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
            return
        run_to_end(df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start())

    cdc.write(0, one)
    run()
    cdc.write(1, two)
    run()
    table = catalogs.load(None, catalog_properties).load_table(("public", "accounts"))
    got = Counter(tuple(r.values()) for r in table.scan(selected_fields=("id", "name", "balance")).to_arrow().to_pylist())
    assert got == Counter({(0, "a0", 0.0): 1, (1, "fits", 2.5): 1, (2, "a2", 3.0): 1, (3, "a3", 4.5): 1, (9, "new", 9.0): 1})
    dead = catalogs.load(None, catalog_properties).load_table(("db", "dead")).scan().to_arrow().to_pylist()
    assert [(r[dl.ERROR], r[dl.COLUMN], r[dl.TABLE], r[dl.BATCH_ID]) for r in dead] == [
        (dl.PAYLOAD_VALUE, "balance", "public.accounts", 1)
    ]
    row = json.loads(dead[0][dl.ROW])
    sent = next(r for r in cdc.records(two, 1) if '"lots"' in (r["value"] or ""))
    assert {k: row[k] for k in ("topic", "key", "value")} == sent  # the Kafka record as it came
    assert not [k for k in row if k.startswith("cdc_") or k.startswith("__lakesink")]
