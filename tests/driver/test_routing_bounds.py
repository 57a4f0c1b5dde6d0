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
import json
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.utils.concurrent import ExecutorFactory

from benchmarks.routing_scale import lakesink_state, process_sample
from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.driver.tables import routed_tables
from lakesink.errors import RoutingError
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskWriter
from lakesink.maintenance import auto
from lakesink.options import SinkOptions
from lakesink.table import dead_letters as dl
from lakesink.table.routes import MAX_NAMESPACE_CHARS, routing_value
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
            tables = self.rc.tables
            plan = tables.routed_plan(tables.plans(tables.routes(group, self.batch), Q), Q, template=False)
            result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=self.batch, partition_id=0, task_attempt_id=0)).write(
                [rows]
            )
            self.rc.commit_batch(BatchCall(Q, self.batch, "[]"), [result])
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
        return {**lakesink_state(self.rc), **process_sample(Path(self.rc.tables.catalog.properties["uri"].removeprefix("sqlite:///")))}


def _threads_named(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routed_tables, "MAX_COMMITTERS", COMMITTERS)
    monkeypatch.setattr(seam_commit, "_MAX_TABLES_KEPT", TABLES_KEPT)
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
    pool = run.rc.tables.catalog.engine.pool  # type: ignore[attr-defined]
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


# --- issue 30: per-row failures of a routed batch (fault-matrix row 40) -----------------------------------------------

LONG_NS = f"{'a' * 128}.{'b' * 128}"
"""Two namespace levels of 128 characters each passed validation, then became a 260-byte folder (``<namespace>.db``)."""
LONGEST_NS = f"{'a' * 128}.{'b' * (MAX_NAMESPACE_CHARS - 129)}"
"""The longest namespace a route may name: its folder 255 bytes, its name 252 characters (SQL catalogs keep 255)."""
ROW_SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string())])


def routed_batch(props: dict[str, str], rows: Sequence[tuple[int, bytes, bytes | None]], **extra: str) -> RoutedOutcome:
    """One batch through the routed sink as foreach_batch runs it (the routing column's distinct values, read as bytes,
    then one routed task), committed; ``rows``: (id, user's bytes, route's bytes)."""
    options = SinkOptions.from_mapping(
        {"route-by": "route", "namespace": "db", **extra, **{f"catalog.{k}": v for k, v in props.items()}}
    )
    rc = RoutedCommitter(options, ROW_SCHEMA)
    batch = pa.record_batch(
        [
            pa.array([i for i, _, _ in rows], pa.int64()),
            pa.array([u for _, u, _ in rows], pa.binary()).view(pa.string()),  # bytes as Spark sends them, unchecked
            pa.array([r for _, _, r in rows], pa.binary()).view(pa.string()),
        ],
        schema=ROW_SCHEMA,
    )
    values = {routing_value(r) for _, _, r in rows}
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(values, 0), Q), Q, template=False)
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write([batch])
    return rc.commit_batch(BatchCall(Q, 0, "[]"), [result])


def dead_letters(props: dict[str, str]) -> dict[int, dict[str, Any]]:
    table = catalogs.load(None, props).load_table(("db", "dead"))
    return {json.loads(r[dl.ROW])["id"]: r for r in table.scan().to_arrow().to_pylist()}


def test_a_route_too_long_for_a_folder_or_a_catalog_column_is_a_dead_letter(any_catalog_properties: dict[str, str]) -> None:
    """SQLite and PostgreSQL (whose name columns are 255 characters): the longest valid route is created and written;
    one past it is an invalid-route dead letter, and the batch lands (before: its table's creation failed on every
    attempt, with or without a dead-letter table)."""
    props = any_catalog_properties
    longest = f"{LONGEST_NS}.{'t' * 128}"
    rows = [(1, b"u1", b"a"), (2, b"u2", f"{LONG_NS}.t".encode()), (3, b"u3", longest.encode())]
    out = routed_batch(props, rows, **{"dead-letter-table": "db.dead"})
    assert sorted(out.committed) == sorted(["db.a", longest]) and out.dead_letters is not None
    catalog = catalogs.load(None, props)
    assert table_ids(catalog.load_table(("db", "a"))) == Counter([1])
    assert table_ids(catalog.load_table((*LONGEST_NS.split("."), "t" * 128))) == Counter([3])
    letter = dead_letters(props)
    assert set(letter) == {2}
    assert (letter[2][dl.ERROR], letter[2][dl.COLUMN], letter[2][dl.TABLE]) == (dl.INVALID_ROUTE, "route", f"{LONG_NS}.t")
    assert "at most 252" in letter[2][dl.MESSAGE]
    assert not catalog.namespace_exists(tuple(LONG_NS.split(".")))


def test_without_a_dead_letter_table_a_route_too_long_fails_the_batch_naming_it(catalog_properties: dict[str, str]) -> None:
    with pytest.raises(RoutingError, match="the namespace is 257 characters, at most 252"):
        routed_batch(catalog_properties, [(1, b"u1", b"a"), (2, b"u2", f"{LONG_NS}.t".encode())])
    assert not catalogs.load(None, catalog_properties).table_exists(("db", "a"))  # nothing created, nothing committed


def test_a_route_or_a_rejected_row_that_is_not_utf8_is_a_dead_letter_with_its_exact_bytes(
    catalog_properties: dict[str, str],
) -> None:
    """A routing value that is not UTF-8 (``CAST(unhex('FF') AS STRING)``, a Kafka key) is an invalid-route dead letter;
    a row whose data column is not UTF-8 and matches reject-when is a reject-when dead letter; each row's JSON keeps the
    exact bytes (before: UnicodeDecodeError in the task)."""
    rows = [
        (1, b"u1", b"a"),
        (2, b"u2", b"\xff"),
        (3, b"caf\xc3\xa9\xfe", b"db.a\xfe"),  # both columns not UTF-8
        (4, b"\xff\xfe", b"a"),  # a good route, rejected by reject-when
    ]
    out = routed_batch(catalog_properties, rows, **{"dead-letter-table": "db.dead", "reject-when": "id = 4"})
    assert out.committed == ["db.a"] and out.dead_letters is not None
    assert table_ids(catalogs.load(None, catalog_properties).load_table(("db", "a"))) == Counter([1])
    letter = dead_letters(catalog_properties)
    assert {i: (r[dl.ERROR], r[dl.TABLE]) for i, r in letter.items()} == {
        2: (dl.INVALID_ROUTE, "\\xff"),
        3: (dl.INVALID_ROUTE, "db.a\\xfe"),
        4: (dl.REJECT_WHEN, "db.a"),
    }
    assert "not valid UTF-8: byte 0xFF at offset 0" in letter[2][dl.MESSAGE]
    for i, user, route in rows[1:]:
        row = json.loads(letter[i][dl.ROW])
        assert row["user"].encode("utf-8", "surrogateescape") == user
        assert row["route"].encode("utf-8", "surrogateescape") == route


def test_without_a_dead_letter_table_a_route_that_is_not_utf8_fails_the_batch_naming_it(
    catalog_properties: dict[str, str],
) -> None:
    with pytest.raises(RoutingError, match=r"holds b'\\xff' \(not valid UTF-8: byte 0xFF at offset 0"):
        routed_batch(catalog_properties, [(1, b"u1", b"a"), (2, b"u2", b"\xff")])
