"""Second processes for tests/driver/test_sql_catalog_locking.py: they hold the SQL catalog's lock, or write to the
same table with plain pyiceberg, while lakesink commits.

``python -m tests.jobs.sql_lock_procs holder <sqlalchemy uri>``
    reads commands on stdin: ``hold`` takes the lock (SQLite: a read transaction on ``iceberg_tables``, the
    shared lock a JDBC reader holds while a result set is open; PostgreSQL: ``SELECT ... FOR UPDATE`` on
    the ``iceberg_tables`` rows) and answers ``held``; ``release`` ends the transaction and answers
    ``released``; ``cycle <hold_s> <free_s>`` holds and releases in turns until the next command or the
    end of stdin.
``python -m tests.jobs.sql_lock_procs writer <catalog properties json> <first id>``
    appends one row at a time (ids ``first id``, ``first id + 1``, ...) to ``db.events`` with plain pyiceberg
    until stdin closes, then prints ``{"ok": [...], "failed": [...]}`` (ids whose append returned, ids whose
    append raised).
``python -m tests.jobs.sql_lock_procs stream <catalog properties json> <input folder> <checkpoint>``
    a Spark driver of its own streaming the JSON input into ``db.events`` with ``format("lakesink")``, one file
    per batch (its stderr carries the commit worker's log lines).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any


def _holder(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        import sqlite3

        conn: Any = sqlite3.connect(uri[len("sqlite:///") :], isolation_level=None, timeout=60, check_same_thread=False)

        def take() -> None:
            conn.execute("BEGIN")
            conn.execute("SELECT * FROM iceberg_tables").fetchall()

        def free() -> None:
            if conn.in_transaction:
                conn.execute("COMMIT")
    else:
        import psycopg2

        conn = psycopg2.connect(uri.replace("postgresql+psycopg2://", "postgresql://"))

        def take() -> None:
            with conn.cursor() as cur:
                cur.execute("SELECT * FROM iceberg_tables FOR UPDATE")
                cur.fetchall()

        def free() -> None:
            conn.commit()

    stop = threading.Event()
    cycler: threading.Thread | None = None

    def cycle(hold_s: float, free_s: float) -> None:
        try:
            while not stop.is_set():
                take()
                stop.wait(hold_s)
                free()
                stop.wait(free_s)
        except Exception as e:  # the test must not pass without the lock ever being held
            print(f"holder: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            os._exit(1)

    def end_cycle() -> None:
        nonlocal cycler
        if cycler is not None:
            stop.set()
            cycler.join()
            stop.clear()
            cycler = None

    for line in sys.stdin:
        cmd, *args = line.split()
        end_cycle()
        if cmd == "hold":
            take()
        elif cmd == "release":
            free()
        elif cmd == "cycle":
            cycler = threading.Thread(target=cycle, args=(float(args[0]), float(args[1])))
            cycler.start()
        print({"hold": "held", "release": "released", "cycle": "cycling"}[cmd], flush=True)
    end_cycle()


def _writer(props_json: str, first_id: int) -> None:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    props = json.loads(props_json)
    catalog = SqlCatalog(props.pop("name", "lakesink"), **props)
    table = catalog.load_table(("db", "events"))
    done = threading.Event()

    def wait_for_end_of_stdin() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_end_of_stdin, daemon=True).start()
    ok: list[int] = []
    failed: list[int] = []
    i = first_id
    while not done.is_set():
        rows = pa.table({"id": pa.array([i], pa.int64()), "user": pa.array([f"w{i}"], pa.string())})
        try:
            table = catalog.load_table(("db", "events"))
            table.append(rows)
            ok.append(i)
            done.wait(0.2)  # a busy neighbour, not one that wins every race
        except Exception as e:  # plain pyiceberg: conflicts and "database is locked" are expected here
            failed.append(i)
            print(f"writer: append of {i} raised {type(e).__name__}", file=sys.stderr, flush=True)
            time.sleep(0.05)
        i += 1
    print(json.dumps({"ok": ok, "failed": failed}), flush=True)


def _stream(props_json: str, src: str, checkpoint: str) -> None:
    from pyspark.sql import SparkSession

    import lakesink
    from tests.jobs.jvm import short_lived
    from tests.support.helpers import SCHEMA_DDL

    spark = short_lived(SparkSession.builder.master("local[2]")).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)
    w = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(src).writeStream.format("lakesink")
    for k, v in json.loads(props_json).items():
        w = w.option(f"catalog.{k}", v)
    q = w.option("table", "db.events").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    q.awaitTermination()
    print("STREAM DONE", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "holder":
        _holder(sys.argv[2])
    elif sys.argv[1] == "stream":
        _stream(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1] == "writer":
        _writer(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown role {sys.argv[1]!r}")
