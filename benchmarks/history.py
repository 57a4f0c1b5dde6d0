"""Option history's cost (issue 55): the same change stream through foreach_batch into one upserted table, with and
without its history table, time per batch compared in the same session.

**The changes** (seeded, :func:`workload`): a Parquet folder with one file per micro-batch, columns ``op, seq, id,
name, amount, ts``. Batch 0 loads ``keys`` rows (not measured: it creates the tables). Then ``batches`` batches of
``changes`` changes each: 40 % inserts of new keys, 45 % updates and 15 % deletes of live keys, several changes of one
key in a batch included (the latest ``seq`` wins in the table; every one is a version in the history).

**The runs**: ``foreach_batch("db.t", upsert_key="id", delete_when="op = 'd'", order_by="seq")`` into fresh tables,
``history="on", history_time="ts"`` or not; repetitions interleaved (with first in even repetitions, without first in
odd ones) so that the machine's load hits both alike. A batch's time is its ``durationMs.triggerExecution`` from the
query progress (the whole micro-batch). Every run's table is checked against a Python model of the changes, and the
history's row count against the distinct changes (a run that differs fails the benchmark).
"""

from __future__ import annotations

import datetime
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import catalog_properties, summarise

SCHEMA = pa.schema(
    [
        ("op", pa.string()),
        ("seq", pa.int64()),
        ("id", pa.int64()),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)
MODES = ("without", "with")
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def workload(folder: Path, *, keys: int, batches: int, changes: int, seed: int = 55) -> list[list[dict[str, Any]]]:
    """The batches (batch 0 the load), written one Parquet file per batch with increasing modification times."""
    rng = random.Random(seed)
    seq = 0
    live: list[int] = []
    next_id = 0
    out: list[list[dict[str, Any]]] = []

    def row(op: str, key: int) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return {
            "op": op,
            "seq": seq,
            "id": key,
            "name": f"n{seq}",
            "amount": rng.random() * 100,
            "ts": T0 + datetime.timedelta(seconds=seq),
        }

    load = []
    for _ in range(keys):
        load.append(row("c", next_id))
        live.append(next_id)
        next_id += 1
    out.append(load)
    for _ in range(batches):
        batch = []
        for _ in range(changes):
            pick = rng.random()
            if pick < 0.40 or not live:
                batch.append(row("c", next_id))
                live.append(next_id)
                next_id += 1
            elif pick < 0.85:
                batch.append(row("u", rng.choice(live)))
            else:
                key = live.pop(rng.randrange(len(live)))
                batch.append(row("d", key))
        out.append(batch)
    folder.mkdir(parents=True, exist_ok=True)
    for i, events in enumerate(out):
        path = folder / f"part-{i:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(events, schema=SCHEMA), path)
        stamp = 1_700_000_000 + i
        os.utime(path, (stamp, stamp))
    return out


def model(batches: list[list[dict[str, Any]]]) -> dict[int, str]:
    """The table (id -> name): every change applied in seq order."""
    state: dict[int, str] = {}
    for events in batches:
        for e in sorted(events, key=lambda e: e["seq"]):
            if e["op"] == "d":
                state.pop(e["id"], None)
            else:
                state[e["id"]] = e["name"]
    return state


def run(
    spark: Any,
    root: Path,
    *,
    keys: int,
    batches: int,
    changes: int,
    reps: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    import lakesink
    from lakesink.driver import catalogs

    folder = root / "changes"
    data = workload(folder, keys=keys, batches=batches, changes=changes)
    expected = model(data)
    per_batch: dict[str, list[float]] = {m: [] for m in MODES}
    ratios: list[float] = []
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        order = MODES if rep % 2 else tuple(reversed(MODES))
        medians: dict[str, float] = {}
        for mode in order:
            where = root / f"rep{rep}-{mode}"
            props = catalog_properties(where)
            sink = lakesink.foreach_batch(
                "db.t",
                catalog_properties=props,
                upsert_key="id",
                delete_when="op = 'd'",
                order_by="seq",
                history="on" if mode == "with" else None,
                history_time="ts" if mode == "with" else None,
            )
            df = spark.readStream.schema(_ddl()).option("maxFilesPerTrigger", 1).parquet(str(folder))
            started = time.monotonic()
            q = (
                df.writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(where / "ck"))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            wall = time.monotonic() - started
            measured = [p for p in q.recentProgress if p.get("batchId", 0) > 0 and p["numInputRows"]]
            times = [p["durationMs"]["triggerExecution"] / 1000 for p in measured]
            catalog = catalogs.load(None, props)
            got = {r["id"]: r["name"] for r in catalog.load_table(("db", "t")).scan().to_arrow().to_pylist()}
            if got != expected:
                raise AssertionError(f"rep {rep} {mode}: the table differs from the model")
            if mode == "with":
                versions = catalog.load_table(("db", "t__history")).scan().to_arrow().num_rows
                if versions != sum(len(b) for b in data):
                    raise AssertionError(f"rep {rep}: the history holds {versions} versions, not one per change")
            per_batch[mode].extend(times)
            medians[mode] = statistics.median(times)
            runs.append({"rep": rep, "mode": mode, "batch_s": times, "wall_s": wall})
            say(f"history rep {rep} {mode}: median {medians[mode]:.2f} s/batch over {len(times)} batches")
        ratios.append(medians["with"] / medians["without"])
    return {
        "workload": {"keys": keys, "batches": batches, "changes_per_batch": changes, "reps": reps},
        "summary": {
            "without_s_per_batch": summarise(per_batch["without"]),
            "with_s_per_batch": summarise(per_batch["with"]),
            "ratio_with_over_without": summarise(ratios),
        },
        "runs": runs,
    }


def _ddl() -> str:
    return "op string, seq long, id long, name string, amount double, ts timestamp"
