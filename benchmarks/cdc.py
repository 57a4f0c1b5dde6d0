"""A change stream into many tables (issue 32, "Performance"): lakesink against what a Spark user writes today,
``foreachBatch`` looping Iceberg's Java ``MERGE INTO`` over the tables each micro-batch changed.

**The changes** (seeded, :func:`workload`): ``tables`` tables ``t000...`` with the same key column ``id``; a Parquet
folder with one file per micro-batch, columns ``route, op, seq, id, name, amount, qty`` (``op`` ``c``/``u``/``d``,
``seq`` the change's position, a delete carries only its key). Batch 0 loads ``rows_per_table`` rows into every
table (not measured: it creates the tables). Then:

- **the trigger batches**: for each trigger interval ``T`` (seconds), ``batches`` batches of ``rate * T`` changes
  (what a ``T``-second trigger collects at ``rate`` changes per second), each over tables picked at random (all of
  them, in practice), 40 % inserts of new keys, 45 % updates and 15 % deletes of live keys, several changes of one
  key in a batch included (the latest ``seq`` wins);
- **the sweep batches**: for each ``k`` of ``sweep``, one batch changing exactly ``k`` tables with ``rate / tables``
  changes each: the batch's cost as a function of the number of tables it changes.

Every engine reads the same folder with Spark's file source, one file per batch (``maxFilesPerTrigger=1``,
``availableNow``: the trigger interval only sets how many changes a batch holds; the batches run back to back), and
the time of each batch is its ``durationMs.triggerExecution`` from the query progress (the whole micro-batch:
planning, reading the file, writing and committing). changes/s = the batch's changes / that time.

**The engines**, each run into fresh tables and compared at the end, row for row, with a Python model of the
changes (a run whose tables differ from the model fails the benchmark):

- ``lakesink``: ``foreach_batch(route_by="route", upsert_key="id", delete_when="op = 'd'", order_by="seq")`` in
  this process's pyspark 4 session, on a SQLite catalog; each batch is one atomic unit over its tables.
  Its commit time per batch is read from lakesink's own log line (``commit_ms``).
- ``java-cow`` / ``java-mor``: Spark 3.5 with Iceberg's runtime 1.9.2 (benchmarks/cdc_java_job.py, run in the
  ``.venv-iceberg-java`` interpreter as a child process with its own JVM), tables copy-on-write or merge-on-read,
  ``foreachBatch`` deduplicating the batch per key and running one ``MERGE INTO`` per changed table, on a SQLite
  catalog through Iceberg's JdbcCatalog.

Repetitions are interleaved (repetition i: lakesink then Java when i is even, Java then lakesink when odd) so
that the machine's load hits both alike; the load average is recorded around each run.
"""

from __future__ import annotations

import logging
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import java_sink
from benchmarks.common import summarise
from tests.support.pg import PostgresServer

SCHEMA = pa.schema(
    [
        ("route", pa.string()),
        ("op", pa.string()),
        ("seq", pa.int64()),
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("qty", pa.int32()),
    ]
)
SPARK_SCHEMA = "route STRING, op STRING, seq BIGINT, id BIGINT, name STRING, amount DOUBLE, qty INT"
COLUMNS = ("id", "name", "amount", "qty", "op", "seq")
JAVA_JOB = Path(__file__).resolve().parent / "cdc_java_job.py"
PATHS = ("lakesink", "java-cow", "java-mor")
LABELS = {
    "lakesink": "lakesink foreach_batch (route-by + upsert-key)",
    "java-cow": "foreachBatch + MERGE INTO, copy-on-write",
    "java-mor": "foreachBatch + MERGE INTO, merge-on-read",
}
NAMESPACE = "cdc"


def table_names(tables: int) -> list[str]:
    return [f"t{i:03d}" for i in range(tables)]


def workload(
    folder: Path,
    *,
    tables: int,
    rows_per_table: int,
    rate: int,
    triggers: Sequence[int],
    batches: int,
    sweep: Sequence[int],
    seed: int = 32,
) -> dict[str, Any]:
    """Write the change files into ``folder``; return the batches' descriptions and the model's final rows."""
    rng = random.Random(seed)
    names = table_names(tables)
    live: dict[str, dict[int, tuple[Any, ...]]] = {n: {} for n in names}
    next_id = dict.fromkeys(names, 0)
    seq = 0
    folder.mkdir(parents=True, exist_ok=True)
    described: list[dict[str, Any]] = []

    def row_for(table: str, op: str, key: int) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        if op == "d":
            live[table].pop(key)
            return {"route": table, "op": op, "seq": seq, "id": key, "name": None, "amount": None, "qty": None}
        values = (f"{table}-{key}-{rng.randrange(10**6)}", round(rng.uniform(0, 1000), 2), rng.randrange(100))
        live[table][key] = (*values, op, seq)
        return {"route": table, "op": op, "seq": seq, "id": key, "name": values[0], "amount": values[1], "qty": values[2]}

    def change(table: str) -> dict[str, Any]:
        x = rng.random()
        if not live[table] or x < 0.40:
            key = next_id[table]
            next_id[table] += 1
            return row_for(table, "c", key)
        key = rng.choice(list(live[table]))  # a live key: an update, or a delete
        return row_for(table, "u" if x < 0.85 else "d", key)

    def write(kind: str, rows: list[dict[str, Any]], **extra: Any) -> None:
        n = len(described)
        path = folder / f"batch-{n:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # the file source takes files by modification time
        described.append({"batch": n, "kind": kind, "changes": len(rows), "tables": len({r["route"] for r in rows}), **extra})

    write("load", [row_for(t, "c", i) for t in names for i in range(rows_per_table)])
    for t in names:
        next_id[t] = rows_per_table
    for k in sweep:
        chosen = rng.sample(names, min(k, tables))
        per_table = max(1, rate // tables)
        write("sweep", [change(t) for _ in range(per_table) for t in chosen], sweep_tables=k)
    for trigger in triggers:
        for _ in range(batches):
            write("trigger", [change(rng.choice(names)) for _ in range(rate * trigger)], trigger_s=trigger)
    model = [{"route": t, **dict(zip(COLUMNS, (key, *v), strict=True))} for t in names for key, v in sorted(live[t].items())]
    return {"batches": described, "model_rows": len(model), "model": model}


class CommitLog(logging.Handler):
    """lakesink's log lines ``... batch=N committed ... commit_ms=X`` (one per table of a routed unit): per batch,
    the tables committed and the largest ``commit_ms`` (the unit's)."""

    PATTERN = re.compile(r"batch=(\d+) committed .*commit_ms=([0-9.]+)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.batches: dict[int, dict[str, float]] = {}

    PHASES = re.compile(r"route-by batch=(\d+) tables=\d+ find_ms=(\d+) plan_ms=(\d+) write_job_ms=(\d+)")

    def emit(self, record: logging.LogRecord) -> None:
        phases = self.PHASES.search(record.getMessage())
        if phases:  # foreach_batch's own timing of a routed batch: the job finding its tables, the planning, the write job
            b = self.batches.setdefault(int(phases.group(1)), {"tables": 0, "commit_ms": 0.0})
            b["find_ms"], b["plan_ms"], b["write_job_ms"] = (float(phases.group(i)) for i in (2, 3, 4))
        m = self.PATTERN.search(record.getMessage())
        if m:
            b = self.batches.setdefault(int(m.group(1)), {"tables": 0, "commit_ms": 0.0})
            b["tables"] += 1
            b["commit_ms"] = max(b["commit_ms"], float(m.group(2)))


def _progress(q: Any) -> list[dict[str, Any]]:
    return [
        {
            "batch_id": int(p["batchId"]),
            "rows": int(p["numInputRows"]),
            "add_batch_ms": float((p.get("durationMs") or {}).get("addBatch", 0)),
            "trigger_ms": float((p.get("durationMs") or {}).get("triggerExecution", 0)),
        }
        for p in q.recentProgress
        if p.get("numInputRows")
    ]


def read_lakesink(props: dict[str, str], tables: Sequence[str]) -> list[dict[str, Any]]:
    from lakesink.driver import catalogs

    catalog = catalogs.load(None, props)
    rows: list[dict[str, Any]] = []
    for t in tables:
        data = catalog.load_table((NAMESPACE, t)).scan(selected_fields=COLUMNS).to_arrow()
        rows += [{"route": t, **r} for r in data.select(list(COLUMNS)).to_pylist()]
    return rows


def same_rows(actual: list[dict[str, Any]], model: list[dict[str, Any]]) -> dict[str, Any]:
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["route"], r["id"], r["name"], r["amount"], r["qty"], r["op"], r["seq"])

    a, m = sorted(map(key, actual)), sorted(map(key, model))
    return {"equals_model": a == m, "rows": len(a), "model_rows": len(m)}


def timed_stream(
    spark: Any, sink: Any, schema: str, changes: Path, checkpoint: str, *, output_mode: str = "append"
) -> tuple[float, list[dict[str, Any]]]:
    """Spark's file source over ``changes`` (one file per batch, ``availableNow``) into the ``foreachBatch`` function
    ``sink``: the seconds from start to end and, per batch with rows, its progress with lakesink's commit time and
    phases (from its log lines)."""
    handler = CommitLog()
    logger = logging.getLogger("lakesink")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(changes))
        started = time.perf_counter()
        q = stream.writeStream.outputMode(output_mode).foreachBatch(sink).option("checkpointLocation", checkpoint)
        q = q.trigger(availableNow=True).start()
        q.awaitTermination()
        seconds = time.perf_counter() - started
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    batches = _progress(q)
    for b in batches:
        commit = handler.batches.get(b["batch_id"], {})
        b["commit_ms"] = commit.get("commit_ms")
        b["tables_committed"] = commit.get("tables")
        for phase in ("find_ms", "plan_ms", "write_job_ms"):
            b[phase] = commit.get(phase)
    return seconds, batches


def run_lakesink(
    spark: Any,
    changes: Path,
    root: Path,
    rep: int,
    tables: Sequence[str],
    model: list[dict[str, Any]],
    props: dict[str, str],
) -> dict[str, Any]:
    import lakesink

    sink = lakesink.foreach_batch(
        route_by="route",
        namespace=NAMESPACE,
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        output_mode="update",
        catalog_properties=props,
    )
    checkpoint = str(root / f"ck-lakesink-{rep}")
    seconds, batches = timed_stream(spark, sink, SPARK_SCHEMA, changes, checkpoint, output_mode="update")
    check = same_rows(read_lakesink(props, tables), model)
    return {"path": "lakesink", "rep": rep, "seconds": seconds, "batches": batches, **check}


JAVA_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), *(SCHEMA.field(c) for c in COLUMNS if c != "id")])


def load_tables(props: dict[str, str], load: Path, tables: Sequence[str], modes: Sequence[str], rep: int) -> None:
    """The Java runs' tables, created and loaded with batch 0's rows by pyiceberg (not measured: one append per
    table here instead of a MERGE per table through Spark, which cost minutes of setup per run on this machine)."""
    import pyarrow.compute as pc
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(java_sink.CATALOG, **props)  # the catalog name Iceberg's Java side looks its tables up under
    rows = pq.read_table(load)
    for mode in modes:
        ns = f"{mode}_{rep}"
        catalog.create_namespace((ns,))
        how = "copy-on-write" if mode == "cow" else "merge-on-read"
        properties = {"format-version": "2", **{f"write.{op}.mode": how for op in ("merge", "update", "delete")}}
        for name in tables:
            table = catalog.create_table((ns, name), schema=JAVA_SCHEMA, properties=properties)
            part = rows.filter(pc.equal(rows["route"], name)).select(list(COLUMNS)).cast(JAVA_SCHEMA)
            table.append(part)


def run_java(
    changes: Path,
    expected: Path,
    root: Path,
    rep: int,
    tables: Sequence[str],
    modes: Sequence[str],
    catalog_props: Callable[[], dict[str, str]],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    props = catalog_props()
    load_tables(props, changes / "batch-00000.parquet", tables, modes, rep)
    conf = java_sink.conf(props, driver_memory="2g")
    after_load = root / f"changes-java-{rep}"
    after_load.mkdir()
    for f in sorted(changes.glob("batch-*.parquet"))[1:]:
        os.link(f, after_load / f.name)  # the same files, the same modification times
    job = {
        "conf": conf,
        "changes": str(after_load),
        "first_batch": 1,
        "expected": str(expected),
        "tables": list(tables),
        "modes": list(modes),
        "root": str(root),
        "rep": rep,
    }
    r = java_sink.run_job(job, root / f"java-{rep}.json", say, script=JAVA_JOB)
    return r["runs"]  # type: ignore[no-any-return]


def summary(runs: list[dict[str, Any]], described: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path and per batch kind: changes/s (median and spread over the repetitions); per-batch times of the
    sweep; the ratio lakesink / each Java mode paired repetition by repetition."""
    kinds: dict[str, list[int]] = {}
    for d in described:
        if d["kind"] == "trigger":
            kinds.setdefault(f"trigger_{d['trigger_s']}s", []).append(d["batch"])
        elif d["kind"] == "sweep":
            kinds.setdefault(f"sweep_{d['sweep_tables']}", []).append(d["batch"])
    changes = {d["batch"]: d["changes"] for d in described}

    def rate_of(run: dict[str, Any], batch_ids: list[int]) -> float:
        by_id = {b["batch_id"]: b for b in run["batches"]}
        secs = sum(by_id[i]["trigger_ms"] for i in batch_ids) / 1000
        return float(sum(changes[i] for i in batch_ids) / secs)

    def ms_of(run: dict[str, Any], batch_ids: list[int], key: str = "trigger_ms") -> float | None:
        by_id = {b["batch_id"]: b for b in run["batches"]}
        vals = [by_id[i].get(key) for i in batch_ids]
        return None if any(v is None for v in vals) else float(statistics.median(float(v) for v in vals))

    out: dict[str, Any] = {}
    paths = [p for p in PATHS if any(r["path"] == p for r in runs)]
    for p in paths:
        mine = [r for r in runs if r["path"] == p]
        out[p] = {
            kind: {
                "changes_per_s": summarise([rate_of(r, ids) for r in mine]),
                "batch_ms": summarise([ms_of(r, ids) or 0.0 for r in mine]),
                **({"commit_ms": summarise([ms_of(r, ids, "commit_ms") or 0.0 for r in mine])} if p == "lakesink" else {}),
            }
            for kind, ids in kinds.items()
        }
    ratios: dict[str, Any] = {}
    if "lakesink" in paths:
        for p in paths[1:]:
            ratios[p] = {}
            for kind, ids in kinds.items():
                paired = []
                for rep in sorted({r["rep"] for r in runs}):
                    lk = next((r for r in runs if r["path"] == "lakesink" and r["rep"] == rep), None)
                    jv = next((r for r in runs if r["path"] == p and r["rep"] == rep), None)
                    if lk and jv:
                        paired.append(rate_of(lk, ids) / rate_of(jv, ids))
                ratios[p][kind] = summarise(paired)
    return {"paths": out, "ratio_lakesink_to": ratios}


def _batch_line(r: dict[str, Any]) -> str:
    return "batch ms: " + ", ".join(f"{b['batch_id']}: {b['trigger_ms']:.0f}" for b in r["batches"])


def run(
    spark: Any,
    root: Path,
    *,
    tables: int,
    rows_per_table: int,
    rate: int,
    triggers: Sequence[int],
    batches: int,
    sweep: Sequence[int],
    reps: int,
    paths: Sequence[str],
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    changes = root / "changes"
    w = workload(
        changes, tables=tables, rows_per_table=rows_per_table, rate=rate, triggers=triggers, batches=batches, sweep=sweep
    )
    model = w.pop("model")
    expected = root / "expected.parquet"
    pq.write_table(
        pa.Table.from_pylist(model, schema=pa.schema([SCHEMA.field("route"), *(SCHEMA.field(c) for c in COLUMNS)])), expected
    )
    say(f"cdc: {len(w['batches'])} batches, {sum(b['changes'] for b in w['batches']):,} changes, model {len(model):,} rows")
    names = table_names(tables)
    java_modes = [p.removeprefix("java-") for p in paths if p.startswith("java-")]
    java_why = java_sink.unavailable() if java_modes else None
    if java_why:
        say(f"  Java MERGE INTO skipped: {java_why}")
        java_modes = []
    runs: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    server = PostgresServer.start()
    counter = iter(range(10**6))

    def catalog_props() -> dict[str, str]:
        """A fresh database of the PostgreSQL server and a fresh warehouse: one catalog per run."""
        warehouse = root / f"warehouse-{next(counter)}"
        warehouse.mkdir(parents=True)
        return {"type": "sql", "uri": server.create_database(), "warehouse": f"file://{warehouse}"}

    def lake(rep: int) -> None:
        before = os.getloadavg()
        r = run_lakesink(spark, changes, root, rep, names, model, catalog_props())
        r["load_average"] = [round(x, 2) for x in (*before, *os.getloadavg())]
        runs.append(r)
        say(f"  rep {rep} lakesink: {r['seconds']:.1f} s, equals the model: {r['equals_model']}, {_batch_line(r)}")

    def java(rep: int) -> None:
        before = os.getloadavg()
        for r in run_java(changes, expected, root, rep, names, java_modes, catalog_props, say):
            r["load_average"] = [round(x, 2) for x in (*before, *os.getloadavg())]
            runs.append(r)
            say(f"  rep {rep} {r['path']}: {_batch_line(r)}")

    try:
        for rep in range(1, reps + 1):
            steps: list[Callable[[int], None]] = []
            if "lakesink" in paths:
                steps.append(lake)
            if java_modes:
                steps.append(java)
            for step in steps if rep % 2 == 1 else steps[::-1]:
                loads.append({"rep": rep, "step": step.__name__, "load_average": [round(x, 2) for x in os.getloadavg()]})
                step(rep)
    finally:
        server.stop()
    bad = [f"{r['path']} rep {r['rep']}" for r in runs if not r["equals_model"]]
    if bad:
        raise RuntimeError(f"the final tables differ from the model of the changes: {', '.join(bad)}")
    return {
        "tables": tables,
        "rows_per_table": rows_per_table,
        "rate": rate,
        "triggers_s": list(triggers),
        "batches_per_trigger": batches,
        "sweep": list(sweep),
        "reps": reps,
        "workload": w,
        "java_skipped": java_why,
        "runs": runs,
        "loads": loads,
        "summary": summary(runs, w["batches"]),
    }
