"""Commit latency per batch against an Iceberg REST catalog server (lakana, tests/support/rest_server.py) beside the SQLite
catalog, and the catalog round trips one batch makes.

The driver's side only (no Spark, so that the number is the catalog's): every interval (``--interval``, 1 s: a
1-second trigger) one batch's Parquet file is written by lakesink's task writer and committed by lakesink's driver
committer (``TableCommitter.commit_batch``: the replay re-check, the snapshot commit, its retries) -- the same code
both entry points commit through. The REST client talks to the server through the counting proxy of
tests/support/http_faults.py (no fault armed), which counts every HTTP request by kind (load, commit, config, ...): the goal
is a batch that finds no replay makes at most two catalog round trips (one read, one commit). Batch 0 is left out.
The table is read back at the end: ids 0..n-1, each once.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.commit_latency import percentiles, trend
from benchmarks.common import machine
from lakesink.driver.actions.batch import BatchCall
from lakesink.executor.messages import TaskIds

QUERY = "55555555-eeee-4000-8000-000000000005"


def _run(props: dict[str, str], namespace: str, batches: int, interval: float, proxy: Any | None) -> dict[str, Any]:
    from lakesink.driver.actions.batch import Outcome
    from lakesink.driver.committers.table import TableCommitter
    from lakesink.executor.task_writer import TaskWriter
    from lakesink.maintenance.auto import auto_maintenance
    from lakesink.options import SinkOptions, TableName
    from tests.support.helpers import arrow_rows

    sink = TableCommitter(
        SinkOptions(table=TableName((namespace,), "bench"), catalog_properties=props),
        post_commit=auto_maintenance,  # as the entry points make it
    )
    sink.table.open_table(arrow_rows([]).schema)
    commit_ms: list[float] = []
    load1: list[float] = []
    metadata_kib: list[float] = []
    requests: list[dict[str, int]] = []
    unusual: list[dict[str, Any]] = []
    lag = 0.0
    next_tick = time.monotonic()
    for b in range(batches + 1):
        plan = sink.write_plan(sink.table.reload_table(), QUERY)
        result = TaskWriter(plan, TaskIds(query_id=QUERY, batch_id=b, partition_id=0, task_attempt_id=0)).write(
            arrow_rows([b]).to_batches()
        )
        if proxy is not None:
            proxy.reset_counts()
        outcome = sink.commit_batch(BatchCall(QUERY, b, f'[{{"logOffset":{b}}}]'), [result])
        assert outcome.outcome is Outcome.COMMITTED, outcome
        if b > 0:
            commit_ms.append(outcome.commit_ms)
            load1.append(os.getloadavg()[0])
            if proxy is not None:
                requests.append(dict(Counter(e.kind for e in proxy.exchanges)))
                if len(proxy.exchanges) > 2:  # what a batch needing more than a read and a commit met
                    unusual.append({"batch": b, "exchanges": [(e.kind, e.status, e.fault) for e in proxy.exchanges]})
            # after the counts: this read of the table is the harness's, not the batch's
            metadata_kib.append(_metadata_bytes(sink.table.reload_table().metadata_location) / 1024)
        next_tick += interval
        sleep = next_tick - time.monotonic()
        if sleep > 0:
            time.sleep(sleep)
        else:
            lag -= sleep
            next_tick = time.monotonic()
    table = sink.table.reload_table()
    ids = Counter(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    exact = ids == Counter(range(batches + 1))
    out: dict[str, Any] = {
        "batches": batches,
        "commit_ms": percentiles(commit_ms),
        "commit_ms_mean": statistics.fmean(commit_ms) if commit_ms else None,
        "commit_ms_trend": trend(commit_ms),
        "seconds_behind_the_trigger": round(lag, 1),
        "exact": exact,
        "by_tenth": _by_tenth(commit_ms, load1, metadata_kib),
        "series": {
            "commit_ms": [round(v, 1) for v in commit_ms],
            "load1": load1,
            "metadata_kib": [round(v, 1) for v in metadata_kib],
        },
    }
    if unusual:
        out["batches_with_more_requests"] = unusual
    if requests:
        per_batch = [sum(r.values()) for r in requests]
        out["http_requests_per_batch"] = {"max": max(per_batch), "mean": statistics.fmean(per_batch)}
        out["http_requests_by_kind"] = dict(sum((Counter(r) for r in requests), Counter()))
    return out


def _metadata_bytes(location: str) -> int:
    """The size of the table's current metadata.json (the warehouses here are local folders)."""
    return Path(location.removeprefix("file:").removeprefix("//")).stat().st_size


def _by_tenth(commit_ms: list[float], load1: list[float], metadata_kib: list[float]) -> list[dict[str, Any]]:
    """Per tenth of the run: the median commit_ms, the median 1-minute load average, the metadata.json size at its end
    -- to tell growth with the table's history from the load of a shared machine."""
    n = len(commit_ms)
    out = []
    for k in range(10):
        lo, hi = k * n // 10, (k + 1) * n // 10
        if hi > lo:
            out.append(
                {
                    "batches": f"{lo + 1}-{hi}",
                    "commit_ms_p50": round(statistics.median(commit_ms[lo:hi]), 1),
                    "load1_p50": round(statistics.median(load1[lo:hi]), 2),
                    "metadata_kib": round(metadata_kib[hi - 1], 1),
                }
            )
    return out


def run(batches: int, interval: float, catalogs: tuple[str, ...]) -> dict[str, Any]:
    from tests.support.http_faults import FaultProxy
    from tests.support.rest_server import NAMESPACE, LakanaServer

    result: dict[str, Any] = {"machine": machine(), "batches": batches, "interval_s": interval, "catalogs": {}}
    with tempfile.TemporaryDirectory(prefix="lakesink-rest-bench-") as tmp:
        root = Path(tmp)
        if "sqlite" in catalogs:
            (root / "sql").mkdir()
            props = {"type": "sql", "uri": f"sqlite:///{root}/sql/catalog.db", "warehouse": f"file://{root}/sql"}
            result["catalogs"]["sqlite"] = _run(props, "bench", batches, interval, None)
        if "rest" in catalogs:
            server = LakanaServer.start()
            proxy = FaultProxy(server.uri).start()
            try:
                result["rest_server_start_s"] = round(server.start_s, 1)
                props = server.catalog_properties(root / "rest", uri=proxy.uri)
                result["catalogs"]["rest"] = _run(props, NAMESPACE, batches, interval, proxy)
            finally:
                proxy.stop()
                server.stop()
    return result
