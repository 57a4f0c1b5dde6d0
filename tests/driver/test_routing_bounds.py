"""Option route-by over many tables: what the driver keeps stays under its limits, whatever the number of tables
(issue 22, "scale and cost"; the long measurement is ``python -m benchmarks routing-scale``, docs/performance.md).

The driver as the sink runs it (a RoutedCommitter with automatic maintenance as its post-commit hook, every table's
maintenance due after every commit), with its limits lowered so that a few dozen tables exceed them. Checked
structurally, never on time: committers, tables read, maintainers and per-table turns within their limits; the
committers dropped are garbage (nothing else keeps them, or what they read); the process's threads and the catalog's
connections, after a few tables and after three times as many, stay under bounds that do not depend on the number
of tables.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.utils.concurrent import ExecutorFactory

from benchmarks.routing_scale import lakesink_state, process_sample
from lakesink.driver import catalogs, routing
from lakesink.driver.commit import TableCommitter
from lakesink.driver.routing import RoutedCommitter
from lakesink.executor.routed_writer import RoutedTaskWriter
from lakesink.maintenance import auto
from lakesink.options import SinkOptions
from tests.support.helpers import table_ids

Q = "bounds-query"
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string())])
COMMITTERS, TABLES_KEPT, MAINTAINERS = 4, 6, 8
PER_BATCH = 3


class Run:
    def __init__(self, props: dict[str, str]):
        options = SinkOptions.from_mapping(
            {
                "route-by": "route",
                "namespace": "db",
                "maintenance": "auto",
                "table-property.write.lakesink.maintenance.interval-ms": "0",  # a run due after every commit
                **{f"catalog.{k}": v for k, v in props.items()},
            }
        )
        self.rc = RoutedCommitter(options, SCHEMA, post_commit=auto.auto_maintenance)
        self.batch = 0
        self.sent: dict[str, Counter[int]] = {}
        self.committers: list[weakref.ref[TableCommitter]] = []

    def tables(self, names: list[str]) -> None:
        """One batch per ``PER_BATCH`` tables of ``names``, each row of a unique id."""
        for k in range(0, len(names), PER_BATCH):
            group = names[k : k + PER_BATCH]
            ids = [1000 * self.batch + j for j in range(2 * len(group))]
            routes = [group[j % len(group)] for j in range(len(ids))]
            for i, r in zip(ids, routes, strict=True):
                self.sent.setdefault(f"db.{r}", Counter())[i] += 1
            rows = pa.RecordBatch.from_pydict({"id": ids, "user": ["u"] * len(ids), "route": routes}, schema=SCHEMA)
            plan = self.rc.routed_plan(self.rc.plans(self.rc.routes(group, self.batch), Q), Q, template=False)
            result = RoutedTaskWriter(plan, query_id=Q, batch_id=self.batch, partition_id=0, task_attempt_id=0).write([rows])
            self.rc.commit_batch(query_id=Q, batch_id=self.batch, results=[result], source_offsets="[]")
            self.committers += [weakref.ref(c) for c in self.rc._committers.values()]
            self.batch += 1
            state = lakesink_state(self.rc)
            assert state["committers"] <= COMMITTERS and state["tables_kept"] <= TABLES_KEPT, state
            assert state["maintenance_threads"] <= auto.MAINTENANCE_THREADS, state
            assert _threads_named("lakesink-maintenance") <= auto.MAINTENANCE_THREADS
            assert _threads_named("lakesink-prepare") == 0  # a unit's prepare pool lives for one attempt

    def quiet(self) -> dict[str, Any]:
        """Every queued maintenance run done; then what the process holds."""
        maintainers = auto.kept_maintainers()
        for m in maintainers:
            m.wait(120)
        assert not any(m.pending for m in maintainers)
        gc.collect()
        return {**lakesink_state(self.rc), **process_sample(Path(self.rc.catalog.properties["uri"].removeprefix("sqlite:///")))}


def _threads_named(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routing, "_MAX_COMMITTERS", COMMITTERS)
    monkeypatch.setattr(catalogs, "_MAX_TABLES_KEPT", TABLES_KEPT)
    monkeypatch.setattr(auto, "MAX_MAINTAINERS", MAINTAINERS)


def test_driver_state_threads_and_connections_do_not_grow_with_the_number_of_tables(
    catalog_properties: dict[str, str], lowered: None
) -> None:
    baseline = threading.active_count()
    run = Run(catalog_properties)
    run.tables([f"t{i:03d}" for i in range(18)])
    first = run.quiet()
    run.tables([f"t{i:03d}" for i in range(18, 54)])  # twice as many tables again
    second = run.quiet()
    for state in (first, second):
        assert state["committers"] <= COMMITTERS and state["tables_kept"] <= TABLES_KEPT, state
        assert state["maintainers"] <= MAINTAINERS, state
        assert state["turns"] == 0, state  # nothing commits: no table's turns are kept
        assert state["maintenance_threads"] <= auto.MAINTENANCE_THREADS, state
    # threads: the maintenance runner's and pyiceberg's one worker pool (both of a fixed size), nothing per table
    threads = baseline + auto.MAINTENANCE_THREADS + ExecutorFactory.get_or_create()._max_workers  # type: ignore[attr-defined]
    assert first["threads_py"] <= threads and second["threads_py"] <= threads, (baseline, first, second)
    # connections: the catalog's one pool, whose idle connections are at most its size
    pool = run.rc.catalog.engine.pool  # type: ignore[attr-defined]
    assert first["db_fds"] <= pool.size() and second["db_fds"] <= pool.size(), (first, second)
    # the committers dropped are garbage: neither the maintainers nor anything else keeps them (or the tables they read)
    alive = {id(c) for ref in run.committers if (c := ref()) is not None}
    assert len(alive) <= COMMITTERS, len(alive)
    # and every batch landed exactly once, in its tables
    catalog = catalogs.load(None, catalog_properties)
    for name, ids in run.sent.items():
        assert table_ids(catalog.load_table(tuple(name.split(".")))) == ids, name
    assert len(run.sent) == 54


def test_maintenance_of_many_tables_runs_on_the_runners_few_threads(catalog_properties: dict[str, str], lowered: None) -> None:
    """Every table's maintenance was due after every commit: each ran, on at most MAINTENANCE_THREADS threads, and the
    maintainers forgotten (beyond the limit) are the idle ones."""
    run = Run(catalog_properties)
    names = [f"m{i:03d}" for i in range(24)]
    run.tables(names)
    run.tables(names)  # every table committed a second time: its run is due
    state = run.quiet()
    assert state["maintainers"] <= MAINTAINERS and state["maintenance_threads"] <= auto.MAINTENANCE_THREADS, state
    kept = auto.kept_maintainers()
    assert kept and all(m.runs >= 1 and m.last_error is None for m in kept[-MAINTAINERS:]), [
        (m.key, m.runs, m.last_error) for m in kept
    ]
