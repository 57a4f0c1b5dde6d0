"""Commit time per batch against the number of tables a routed batch touches (option ``route-by``), and the catalog
round trips it makes.

The driver's side only (no Spark, so that the number is the commit's): every batch, one task's rows are routed into
``n`` tables of a SQLite catalog by lakesink's routed task writer (one small Parquet file per table, not timed), then
the batch is committed by lakesink's driver (``RoutedCommitter.commit_batch``: each table read, its action prepared
-- manifest, manifest list, metadata file -- and every table's row swapped in one database transaction), the code
both entry points commit through. Round trips are the SQL statements the catalog's engine executes during the
commit (SQLAlchemy's ``before_cursor_execute``). Batch 0 (which creates the tables) is left out. Every table is
read back at the end: each id once, in the table it was routed to.

Goal (docs/routing.md): a batch touching 100 tables committed in under 10 times the time of a batch touching one.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.commit_latency import percentiles
from benchmarks.common import machine
from lakesink.driver.actions.batch import BatchCall
from lakesink.executor.messages import TaskIds

QUERY = "66666666-eeee-4000-8000-000000000006"
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string())])


def _count_statements(engine: Any) -> Counter[str]:
    from sqlalchemy import event

    counts: Counter[str] = Counter()

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        counts[statement.split(None, 1)[0].upper()] += 1

    event.listen(engine, "before_cursor_execute", before)
    return counts


def run_tables(root: Path, tables: int, batches: int, rows_per_table: int) -> dict[str, Any]:
    from lakesink.driver import catalogs
    from lakesink.driver.committers.routed import RoutedCommitter
    from lakesink.executor.routed_writer import RoutedTaskWriter
    from lakesink.options import SinkOptions

    (root / "warehouse").mkdir(parents=True)
    props = {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}
    options = SinkOptions.from_mapping(
        {"route-by": "route", "namespace": "bench", "maintenance": "off", **{f"catalog.{k}": v for k, v in props.items()}}
    )
    rc = RoutedCommitter(options, SCHEMA)
    counts = _count_statements(rc.tables.catalog.engine)  # type: ignore[attr-defined]
    names = [f"t{i:04d}" for i in range(tables)]
    commit_ms: list[float] = []
    statements: list[dict[str, int]] = []
    next_id = 0
    for b in range(batches + 1):
        ids = list(range(next_id, next_id + tables * rows_per_table))
        next_id += len(ids)
        batch = pa.RecordBatch.from_pydict(
            {"id": ids, "user": [f"u{i % 7}" for i in ids], "route": [names[i % tables] for i in ids]}, schema=SCHEMA
        )
        plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(names, b), QUERY), QUERY, template=False)
        result = RoutedTaskWriter(plan, TaskIds(query_id=QUERY, batch_id=b, partition_id=0, task_attempt_id=0)).write([batch])
        counts.clear()
        started = time.perf_counter()
        rc.commit_batch(BatchCall(QUERY, b, f'[{{"logOffset":{b}}}]'), [result])
        if b > 0:
            commit_ms.append((time.perf_counter() - started) * 1000)
            statements.append(dict(counts))
    catalog = catalogs.load(None, props)
    exact = True
    for i, name in enumerate(names):
        got = Counter(catalog.load_table(("bench", name)).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
        want = Counter(x for x in range(next_id) if x % tables == i)
        exact = exact and got == want
    per_batch = [sum(s.values()) for s in statements]
    kinds: Counter[str] = Counter()
    for s in statements:
        kinds.update(s)
    return {
        "tables": tables,
        "batches": batches,
        "commit_ms": percentiles(commit_ms),
        "commit_ms_per_table": round(statistics.median(commit_ms) / tables, 2) if commit_ms else None,
        "catalog_statements_per_batch": statistics.median(per_batch) if per_batch else None,
        "catalog_statements_by_kind": {k: round(v / len(statements), 1) for k, v in sorted(kinds.items())},
        "exact": exact,
    }


def run(table_counts: tuple[int, ...], batches: int, rows_per_table: int, say: Any = print) -> dict[str, Any]:
    info = machine()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="lakesink-bench-routing-") as tmp:
        for n in table_counts:
            r = run_tables(Path(tmp) / f"n{n}", n, batches, rows_per_table)
            results[str(n)] = r
            say(
                f"{n} table(s): commit_ms {r['commit_ms']} per table {r['commit_ms_per_table']} statements per batch "
                f"{r['catalog_statements_per_batch']} {r['catalog_statements_by_kind']} exact={r['exact']}"
            )
    one = results.get("1", {}).get("commit_ms", {}).get("p50")
    for r in results.values():
        p50 = r["commit_ms"].get("p50")
        r["over_one_table"] = round(p50 / one, 2) if one and p50 else None
    return {"machine": info, "load_average_end": [round(x, 2) for x in __import__("os").getloadavg()], "runs": results}
