"""The walk of one batch's commit, counted (issue 31: "the walk of one batch shorter"): which of lakesink's modules the
driver's commit of one batch enters, traced with ``sys.setprofile`` (and ``threading.setprofile`` for the threads the
commit starts: a unit of tables is prepared on a pool).

Two entry points, without Spark (the commit is the driver's; Spark only calls it):

- ``format("lakesink")``: Spark's ``commit(messages, batchId)`` on a writer made in a commit worker (a fresh committer,
  as Spark makes one per commit: :func:`lakesink.sink.datasource.stream_writer` called from a frame of Spark's
  streaming sink runner), its task results written by the executors' code (TaskWriter, RoutedTaskWriter);
- ``foreach_batch``: the commit of a batch whose files are written (``commit_or_abort`` for one table,
  ``commit_routed`` for route-by), with the committer the sink made at the query's first batch.

Each walk is of batch 1 of a query whose batch 0 committed in the same process (a reused worker's steady state: the
catalog open, the tables created), on a SQLite catalog, automatic maintenance on (the entry points' hook) and nothing
else configured. tests/test_walk.py holds the counts; docs/architecture.md ("Where a batch gets committed") gives them.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakesink._pyspark import STREAMING_SINK_RUNNER
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskIds, WritePlan
from lakesink.executor.routed_writer import RoutedPlan, RoutedTaskWriter
from lakesink.executor.stream_writer import LakesinkStreamWriter
from lakesink.executor.task_writer import TaskWriter
from lakesink.maintenance.auto import auto_maintenance
from lakesink.options import SinkOptions
from lakesink.sink import datasource
from lakesink.sink.commit import commit_or_abort, commit_routed
from lakesink.table.routes import Route

QUERY = "33333333-cccc-4000-8000-000000000003"
SCHEMA = StructType([StructField("id", LongType(), False), StructField("user", StringType()), StructField("route", StringType())])
TABLES = ("a", "b")
"""The tables of the routed walks (namespace ``db``)."""


@contextmanager
def traced() -> Iterator[set[str]]:
    """The lakesink modules whose Python functions are called inside the block (module names, packages' ``__init__``
    as the package), on this thread and on the threads started inside it."""
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name == "lakesink" or name.startswith("lakesink."):
                entered.add(name)

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield entered
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type,unused-ignore]


def _checkpoint(root: Path) -> str:
    """A query's checkpoint as Spark leaves it before batches 0 and 1 commit: its id, the offset log's entries."""
    (root / "offsets").mkdir(parents=True)
    (root / "metadata").write_text(json.dumps({"id": QUERY}) + "\n")
    for batch in (0, 1):
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{batch}}}\n')
    return str(root)


def _rows(batch: int, routed: bool) -> pa.Table:
    ids = list(range(batch * 100, batch * 100 + 10))
    columns: dict[str, pa.Array] = {"id": pa.array(ids, pa.int64()), "user": pa.array([f"u{i % 7}" for i in ids])}
    if routed:
        columns["route"] = pa.array([TABLES[i % len(TABLES)] for i in ids])
    return pa.table(columns)


def _options(props: dict[str, str], checkpoint: str, *, routed: bool) -> dict[str, str]:
    target = {"route-by": "route", "namespace": "db"} if routed else {"table": "db.events"}
    return {**target, "checkpointLocation": checkpoint, **{f"catalog.{k}": v for k, v in props.items()}}


def _in_commit_worker(make: Callable[[], LakesinkStreamWriter]) -> LakesinkStreamWriter:
    """The writer ``make`` returns when Spark's streaming sink runner calls it (a commit worker's writer)."""
    scope: dict[str, Any] = {"__name__": STREAMING_SINK_RUNNER, "make": make}
    exec("writer = make()", scope)  # a frame of the runner's module: lakesink._pyspark.in_streaming_sink_runner
    writer: LakesinkStreamWriter = scope["writer"]
    return writer


def stream_commit_walk(props: dict[str, str], root: Path, *, routed: bool) -> set[str]:
    """``format("lakesink")``: the modules Spark's ``commit()`` of batch 1 enters in a commit worker (one table
    ``db.events``, or route-by to ``db.a`` and ``db.b``); batch 0 committed the same way before."""
    checkpoint = _checkpoint(root / "checkpoint")
    raw = _options(props, checkpoint, routed=routed)
    schema = SCHEMA if routed else StructType(SCHEMA.fields[:2])
    walks: list[set[str]] = []
    for batch in (0, 1):
        run = datasource.stream_writer(SinkOptions.from_spark_options(raw, overwrite=False), schema)  # the run's plan
        plan, ids, rows = run._plan, TaskIds(QUERY, batch, 0, batch), _rows(batch, routed).to_batches()
        if isinstance(plan, RoutedPlan):
            message: object = RoutedTaskWriter(plan, ids).write(rows)
        else:
            assert isinstance(plan, WritePlan)
            message = TaskWriter(plan, ids).write(rows)
        writer = _in_commit_worker(lambda: datasource.stream_writer(SinkOptions.from_spark_options(raw, overwrite=False), schema))
        with traced() as walk:  # batch 0 traced too, but only batch 1's walk is returned
            writer.commit([message], batch)  # type: ignore[list-item]
        walks.append(walk)
    return walks[-1]


def foreach_commit_walk(props: dict[str, str], *, routed: bool) -> set[str]:
    """``foreach_batch``: the modules the commit of batch 1 enters once its files are written (one table ``db.events``
    through ``commit_or_abort``; route-by to ``db.a`` and ``db.b`` through ``commit_routed``), with the committer the
    sink made at its first batch (batch 0, committed the same way)."""
    options = SinkOptions.from_mapping({k: v for k, v in _options(props, "", routed=routed).items() if k != "checkpointLocation"})
    return _foreach_routed(options) if routed else _foreach_table(options)


def _foreach_routed(options: SinkOptions) -> set[str]:
    rc = RoutedCommitter(options, _rows(0, True).schema, post_commit=auto_maintenance)
    routes = [Route(("db",), t) for t in TABLES]
    walks: list[set[str]] = []
    for batch in (0, 1):
        call = BatchCall(QUERY, batch, f'[{{"logOffset":{batch}}}]')
        plans = rc.tables.plans(rc.tables.routes([str(r) for r in routes], batch), QUERY)
        plan = rc.tables.routed_plan(plans, QUERY, template=False)
        results = [RoutedTaskWriter(plan, TaskIds(QUERY, batch, 0, batch)).write(_rows(batch, True).to_batches())]
        with traced() as walk:
            commit_routed(rc, call, routes=routes, plans=plans, write=lambda _letters: results, batch_time=lambda: None)  # noqa: B023
        walks.append(walk)
    return walks[-1]


def _foreach_table(options: SinkOptions) -> set[str]:
    schema = _rows(0, False).schema
    c = TableCommitter(options, post_commit=auto_maintenance)
    table = c.table.open_table(schema)
    walks: list[set[str]] = []
    for batch in (0, 1):
        plan = c.write_plan(table if batch == 0 else c.table.reload_table(), QUERY, schema)
        results = [TaskWriter(plan, TaskIds(QUERY, batch, 0, batch)).write(_rows(batch, False).to_batches())]
        call = BatchCall(QUERY, batch, f'[{{"logOffset":{batch}}}]')
        with traced() as walk:
            commit_or_abort(
                c,
                query_id=QUERY,
                batch_id=batch,
                results=results,
                commit=lambda: c.commit_batch(call, results, table_uuid=plan.table_uuid),  # noqa: B023
            )
        walks.append(walk)
    return walks[-1]
