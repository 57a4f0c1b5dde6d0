"""lakesink database-to-lake example: a database's Debezium change stream into one Iceberg table per source table.

What it does, on the embedded default catalog (a SQLite file and a warehouse under $LAKESINK_HOME):

1. plays a small seeded "database" of three tables with different primary keys (``shop.customers`` keyed by ``id``,
   ``shop.order_lines`` by ``(order_id, line)``, ``shop.stock`` by ``sku``): inserts, updates (to null too),
   deletes, a key changed (a delete and an insert), a truncate; and writes its changes as the Kafka records
   Debezium's PostgreSQL connector sends (``topic``, ``key``, ``value`` with Kafka Connect's ``schemas.enable``
   wrapper, a tombstone after each delete), one JSON file per round: a replayable source;
2. streams the folder with ``foreachBatch(lakesink.foreach_batch(cdc_format="debezium", merge_schema=True))`` --
   no per-table configuration: each table is created with its columns typed by the Connect schema and its key from
   the records' Kafka keys; every batch is one atomic unit over its tables -- in two runs (a restart from the
   checkpoint halfway);
3. checks every Iceberg table against the database's final state, row for row and column for column.

    .venv/bin/python examples/cdc_database.py [--dir DIR]      (default folder: ./cdc-database-run)
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import random
import shutil
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's Python workers: this interpreter (its venv)
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

import lakesink  # noqa: E402
from lakesink.driver import catalogs  # noqa: E402

DECIMAL = "org.apache.kafka.connect.data.Decimal"
TABLES: dict[str, tuple[tuple[str, ...], list[dict[str, Any]]]] = {
    "shop.customers": (
        ("id",),
        [
            {"type": "int32", "field": "id"},
            {"type": "string", "field": "name"},
            {"type": "int32", "name": "io.debezium.time.Date", "field": "since"},
        ],
    ),
    "shop.order_lines": (
        ("order_id", "line"),
        [
            {"type": "int64", "field": "order_id"},
            {"type": "int16", "field": "line"},
            {"type": "bytes", "name": DECIMAL, "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
            {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "at"},
        ],
    ),
    "shop.stock": (("sku",), [{"type": "string", "field": "sku"}, {"type": "double", "field": "qty"}]),
}


def encoded(field: dict[str, Any], value: Any) -> Any:
    """A typed value as Debezium writes it in JSON."""
    if value is None:
        return None
    if field.get("name") == DECIMAL:
        unscaled = int(value.scaleb(2))
        return base64.b64encode(unscaled.to_bytes(8, "big", signed=True)).decode()
    if field.get("name") == "io.debezium.time.Date":
        return (value - dt.date(1970, 1, 1)).days
    if field.get("name") == "io.debezium.time.ZonedTimestamp":
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value


class Database:
    """The source: its tables as dicts (key -> row), and the Kafka records of every change, round by round."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rows: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {t: {} for t in TABLES}
        self.lsn = 1000
        self.records: list[dict[str, Any]] = []

    def value(self, table: str, column: str) -> Any:
        r = self.rng
        if r.random() < 0.15 and column not in TABLES[table][0]:
            return None
        return {
            "id": r.randrange(50),
            "name": r.choice(["Ada", "Bo", "Cy", "Dee", "Eve"]) + str(r.randrange(100)),
            "since": dt.date(2020, 1, 1) + dt.timedelta(days=r.randrange(2000)),
            "order_id": r.randrange(10),
            "line": r.randrange(1, 4),
            "price": Decimal(r.randrange(-10_000, 100_000)).scaleb(-2),
            "at": dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=r.randrange(10**13)),
            "sku": f"sku-{r.randrange(30)}",
            "qty": r.choice([0.5, -0.0, 12.25, 1e300]),
        }[column]

    def emit(self, table: str, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
        self.lsn += 10
        key_columns, fields = TABLES[table]
        schema, name = table.split(".")
        row_schema = {"type": "struct", "fields": fields, "optional": True}

        def enc(row: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if row is None else {f["field"]: encoded(f, row[f["field"]]) for f in fields}

        payload = {
            "before": enc(before),
            "after": enc(after),
            "op": op,
            "ts_ms": 0,
            "source": {"connector": "postgresql", "db": "shop", "schema": schema, "table": name, "lsn": self.lsn},
        }
        value: dict[str, Any] = {
            "schema": {"type": "struct", "fields": [{**row_schema, "field": "before"}, {**row_schema, "field": "after"}]}
        }
        value["payload"] = payload
        image = after or before
        key = (
            None
            if image is None
            else json.dumps({c: encoded(f, image[c]) for f in fields for c in key_columns if f["field"] == c})
        )
        self.records.append({"topic": f"lake.{table}", "key": key, "value": json.dumps(value)})
        if op == "d":
            self.records.append({"topic": f"lake.{table}", "key": key, "value": None})  # Debezium's tombstone

    def change(self) -> None:
        table = self.rng.choice(sorted(TABLES))
        key_columns, fields = TABLES[table]
        rows = self.rows[table]
        kind = self.rng.choice(["insert", "insert", "update", "update", "delete", "rekey"])
        if kind == "insert" or not rows:
            row = {f["field"]: self.value(table, f["field"]) for f in fields}
            key = tuple(row[c] for c in key_columns)
            if key in rows:
                return
            rows[key] = row
            self.emit(table, "c", None, row)
            return
        key = self.rng.choice(sorted(rows, key=str))
        old = rows[key]
        if kind == "delete":
            del rows[key]
            self.emit(table, "d", old, None)
        elif kind == "update":
            column = self.rng.choice([f["field"] for f in fields if f["field"] not in key_columns])
            new = {**old, column: self.value(table, column)}
            rows[key] = new
            self.emit(table, "u", old, new)
        else:  # a primary key changed: Debezium sends a delete of the old key and an insert of the new one
            new = {**old, **{c: self.value(table, c) for c in key_columns}}
            new_key = tuple(new[c] for c in key_columns)
            if new_key in rows:
                return
            del rows[key]
            rows[new_key] = new
            self.emit(table, "d", old, None)
            self.emit(table, "c", None, new)

    def truncate(self, table: str) -> None:
        self.rows[table].clear()
        self.emit(table, "t", None, None)


def run_stream(spark: SparkSession, source: Path, checkpoint: Path) -> None:
    changes = spark.readStream.schema("topic STRING, key STRING, value STRING").option("maxFilesPerTrigger", 1).json(str(source))
    query = (
        changes.writeStream.foreachBatch(lakesink.foreach_batch(cdc_format="debezium", merge_schema=True))  # type: ignore[arg-type]
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="cdc-database-run", help="the run's folder (source files, checkpoint)")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    folder = Path(args.dir).resolve()
    shutil.rmtree(folder, ignore_errors=True)
    source, checkpoint = folder / "debezium", folder / "checkpoint"
    source.mkdir(parents=True)

    db = Database(seed=32)
    rounds: list[list[dict[str, Any]]] = []
    for n in range(args.rounds):
        db.records = []
        for _ in range(40):
            db.change()
        if n == args.rounds // 2:
            db.truncate("shop.stock")
            for _ in range(5):
                db.change()
        rounds.append(db.records)

    def write(n: int) -> None:
        path = source / f"round-{n:03d}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rounds[n]))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    half = args.rounds // 2
    for n in range(half):  # the first run reads half the rounds; the second, restarted from the checkpoint, the rest
        write(n)
    run_stream(spark, source, checkpoint)
    for n in range(half, args.rounds):
        write(n)
    run_stream(spark, source, checkpoint)
    spark.stop()

    catalog = catalogs.load(None, {})
    wrong = 0
    for table, (key_columns, _) in TABLES.items():
        iceberg = catalog.load_table(tuple(table.split(".")))
        got = iceberg.scan().to_arrow().to_pylist()
        have = {tuple(r[c] for c in key_columns): r for r in got}
        want = db.rows[table]
        types = ", ".join(f"{f.name} {f.field_type}" for f in iceberg.schema().fields)
        same = have == want and len(have) == len(got) and iceberg.schema().identifier_field_names() == set(key_columns)
        wrong += not same
        verdict = "equal" if same else "DIFFERENT"
        print(f"{table:18} rows: {len(got):4}  key: {', '.join(key_columns):15} columns: {types}  {verdict}")
    print("OK" if not wrong else f"{wrong} table(s) differ from the database")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
