"""``python -m benchmarks.dead_letters [ROWS]``: the CPU a task spends sorting rows into good rows and dead letters.

One process, no Spark: the same TaskWriter the Python workers run, writing ROWS rows (default 1,000,000; id, a
required string, a double, a struct with a required field) into a fresh SQLite catalog's table, without a dead-letter
table (today's path), with one and no bad row, with ``reject-when`` evaluated on Arrow, and with 1% of the rows null in
a required column. Best of three, CPU seconds of the process (pyarrow's threads included).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName

_TABLE = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("user", pa.string(), nullable=False),
        pa.field("amount", pa.float64()),
        pa.field("address", pa.struct([pa.field("city", pa.string(), nullable=False)])),
    ]
)
_STREAM = pa.schema(
    [("id", pa.int64()), ("user", pa.string()), ("amount", pa.float64()), ("address", pa.struct([("city", pa.string())]))]
)


def _rows(n: int, bad_every: int) -> list[pa.RecordBatch]:
    users = [None if bad_every and i % bad_every == 0 else f"user-{i % 997}" for i in range(n)]
    table = pa.table(
        {"id": range(n), "user": users, "amount": [float(i % 1000) for i in range(n)], "address": [{"city": "c"}] * n},
        schema=_STREAM,
    )
    batches: list[pa.RecordBatch] = table.to_batches(max_chunksize=10_000)
    return batches


def _cpu(committer: TableCommitter, batches: list[pa.RecordBatch], **checks: Any) -> float:
    plan = committer.write_plan(committer.table.load(), "bench")
    if plan.row_checks is not None:
        plan = replace(plan, row_checks=replace(plan.row_checks, **checks))
    best = float("inf")
    for attempt in range(3):
        started = time.process_time()
        TaskWriter(plan, TaskIds(query_id="bench", batch_id=attempt, partition_id=0, task_attempt_id=attempt)).write(batches)
        best = min(best, time.process_time() - started)
    return best


def main(rows: int) -> list[tuple[str, float]]:
    work = Path(tempfile.mkdtemp(prefix="lakesink-bench-dead-letters-"))
    (work / "warehouse").mkdir()
    props = {"type": "sql", "uri": f"sqlite:///{work}/catalog.db", "warehouse": f"file://{work}/warehouse"}
    plain = TableCommitter(SinkOptions(table=TableName(("db",), "plain"), catalog_properties=props))
    plain.table.open_table(_TABLE)
    checked = TableCommitter(
        SinkOptions(table=TableName(("db",), "checked"), catalog_properties=props, dead_letter_table=TableName(("db",), "dead"))
    )
    checked.table.open_table(_TABLE)
    good = _rows(rows, 0)
    return [
        ("no dead-letter table (today)", _cpu(plain, good)),
        ("dead-letter table, no bad row", _cpu(checked, good)),
        ("dead-letter table + reject-when 'amount < 0'", _cpu(checked, good, reject_when="amount < 0")),
        ("dead-letter table, 1% of rows null in a required column", _cpu(checked, _rows(rows, 100))),
    ]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    for label, seconds in main(n):
        print(f"{label:58s} {seconds:6.2f} s CPU  {n / seconds / 1000:8.0f}k rows/s")
