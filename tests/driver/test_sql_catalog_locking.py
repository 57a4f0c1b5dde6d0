"""Commits on SQL catalogs while a second, real process holds the catalog's lock or writes to the same table.

The failure these tests pin (issue 10, item 0): on SQLite, a reader holding a read transaction makes our
COMMIT fail with "database is locked" after the busy timeout. SQLite then keeps the transaction open;
SQLAlchemy 2.x marks it finished anyway and returns the connection to its pool without rolling it back. The
next read through that connection sees our own uncommitted compare-and-swap, so the settle path reported the
batch "committed" -- and the read's own rollback then threw the write away: logged, in Spark's commit log,
not in the table.

The second processes (tests/jobs/sql_lock_procs.py) are real: a holder with a plain sqlite3 / psycopg2 connection
and a writer appending with plain pyiceberg. Barriers, not sleeps: a test waits for the holder's answer and
for the committer's own catalog error before it releases the lock.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.table import Table
from sqlalchemy import event, text

from lakesink.audit import verify
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import LakesinkError
from tests.support.helpers import (
    arrow_rows,
    commit,
    lakesink_snapshots,
    load,
    make_committer,
    table_ids,
    write_json_input,
    write_task,
)
from tests.support.timeouts import guard

ROOT = Path(__file__).resolve().parents[2]
Q1 = "11111111-aaaa-4000-8000-000000000001"
WRITER_FIRST_ID = 1_000_000_000  # the other writer's ids; lakesink's are below
COMMITTED = re.compile(r"lakesink: table=\S+ query=(\S+) batch=(\d+) committed ")


class Holder:
    """A second process holding the catalog database's lock (see tests/jobs/sql_lock_procs.py)."""

    def __init__(self, uri: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.sql_lock_procs", "holder", uri],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def _say(self, cmd: str, answer: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        got = self.proc.stdout.readline().strip()
        assert got == answer, f"lock holder answered {got!r} to {cmd!r}"

    def hold(self) -> None:
        self._say("hold", "held")

    def release(self) -> None:
        self._say("release", "released")

    def cycle(self, hold_s: float, free_s: float) -> None:
        self._say(f"cycle {hold_s} {free_s}", "cycling")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


class Writer:
    """A second process appending to db.events with plain pyiceberg, one row per commit."""

    def __init__(self, props: dict[str, str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.sql_lock_procs", "writer", json.dumps(props), str(WRITER_FIRST_ID)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def stop(self) -> tuple[list[int], list[int]]:
        """Stop it; the ids whose append returned and the ids whose append raised."""
        out, _ = self.proc.communicate(timeout=guard(120))
        got = json.loads(out.strip().splitlines()[-1])
        return got["ok"], got["failed"]


@pytest.fixture
def holder(any_catalog_properties: dict[str, str]) -> Iterator[Holder]:
    h = Holder(any_catalog_properties["uri"])
    yield h
    h.close()


def _catalog_errors(committer: TableCommitter) -> threading.Event:
    """An event set when the committer's SQL catalog sees a database error (the lock refused something)."""
    seen = threading.Event()
    event.listen(committer.table.catalog.engine, "handle_error", lambda ctx: seen.set())  # type: ignore[attr-defined]
    return seen


def _waiting_on_a_lock(uri: str) -> bool:
    """PostgreSQL: some session is waiting for a lock (our compare-and-swap behind the holder's row lock)."""
    from sqlalchemy import create_engine

    engine = create_engine(uri)
    try:
        with engine.connect() as c:
            n = c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")).scalar()
        return bool(n)
    finally:
        engine.dispose()


def _wait_for(predicate: Any, what: str, timeout_s: float = 120) -> None:
    done = threading.Event()
    deadline = threading.Timer(timeout_s, done.set)
    deadline.start()
    try:
        while not done.is_set():
            if predicate():
                return
            done.wait(0.05)
        raise AssertionError(f"timed out waiting for {what}")
    finally:
        deadline.cancel()


def _assert_logged_batches_are_in_table(log_text: str, committer: TableCommitter, query_id: str) -> None:
    logged = sorted({int(b) for q, b in COMMITTED.findall(log_text) if q == query_id})
    in_table = sorted({s["batch_id"] for s in lakesink_snapshots(load(committer)) if s["query_id"] == query_id})
    assert set(logged) <= set(in_table), f"logged committed but not in the table: {sorted(set(logged) - set(in_table))}"


def test_commit_refused_by_the_lock_is_reported_committed_only_when_in_the_table(
    any_catalog_properties: dict[str, str], holder: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    """SQLite: the reader's lock makes our COMMIT fail with "database is locked"; PostgreSQL: the holder's row
    lock makes our compare-and-swap wait. Either way the batch lands exactly once and is logged only then."""
    caplog.set_level(logging.INFO, logger="lakesink")
    c = make_committer(any_catalog_properties)
    c.table.open_table(arrow_rows([]).schema)
    commit(c, Q1, 0, [write_task(c, Q1, 0, [0, 1])])
    errors = _catalog_errors(c)
    result = write_task(c, Q1, 1, list(range(2, 40)))
    holder.hold()
    box: list[BatchOutcome | BaseException] = []

    def run() -> None:
        try:
            box.append(commit(c, Q1, 1, [result]))
        except BaseException as e:  # noqa: BLE001 -- reported by the assertions below
            box.append(e)

    t = threading.Thread(target=run)
    t.start()
    uri = any_catalog_properties["uri"]
    if uri.startswith("sqlite"):
        _wait_for(lambda: errors.is_set() or not t.is_alive(), "the lock to refuse our commit")
    else:
        _wait_for(lambda: _waiting_on_a_lock(uri) or not t.is_alive(), "our commit to wait for the row lock")
    holder.release()
    t.join(180)
    assert not t.is_alive()
    outcome = box[0]
    assert isinstance(outcome, BatchOutcome), f"commit raised {outcome!r}"
    assert outcome.outcome is Outcome.COMMITTED
    table = load(c)
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == [0, 1], "batch 1 was reported committed but is not in the table"
    assert table_ids(table) == Counter(range(40))
    _assert_logged_batches_are_in_table(caplog.text, c, Q1)
    assert verify(table).ok


def test_failed_sqlite_commit_leaves_no_open_transaction(catalog_properties: dict[str, str]) -> None:
    """A commit refused by the lock is rolled back at once: no read of ours sees it, and it never lands later."""
    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace("db")
    table = catalog.create_table(("db", "events"), schema=arrow_rows([]).schema)
    table.append(arrow_rows([1]))
    before = catalog.load_table(("db", "events")).metadata_location
    holder = Holder(catalog_properties["uri"])
    try:
        holder.hold()
        with pytest.raises(Exception, match="database is locked"):
            catalog.load_table(("db", "events")).append(arrow_rows([2]))
        # the very next read, through the catalog's own pool, sees the committed state only
        assert catalog.load_table(("db", "events")).metadata_location == before
        holder.release()
    finally:
        holder.close()
    catalog.create_namespace("other")  # more work through the same pool cannot carry the failed write in
    assert catalog.load_table(("db", "events")).metadata_location == before
    assert table_ids(catalog.load_table(("db", "events"))) == Counter([1])
    assert catalogs.load_table_fresh(None, catalog_properties, ("db", "events")).metadata_location == before


def test_settle_reads_through_a_connection_of_its_own(catalog_properties: dict[str, str]) -> None:
    """load_table_fresh opens (and closes) its own catalog: it never sees what the cached catalog's pool holds."""
    cached = catalogs.load(None, catalog_properties)
    cached.create_namespace("db")
    cached.create_table(("db", "events"), schema=arrow_rows([]).schema).append(arrow_rows([1]))
    engine = cached.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:  # an uncommitted write in one of the cached catalog's connections
        conn.execute(text("UPDATE iceberg_tables SET metadata_location = 'file:///nowhere.json'"))
        fresh = catalogs.load_table_fresh(None, catalog_properties, ("db", "events"))
        assert fresh.metadata_location != "file:///nowhere.json"
        conn.rollback()


def _commit_until_settled(c: TableCommitter, batch_id: int, ids: list[int]) -> None:
    """Commit a batch as a restarted query would: after a lakesink error, again with new files."""
    for attempt in range(6):
        try:
            outcome = commit(c, Q1, batch_id, [write_task(c, Q1, batch_id, ids, attempt=attempt)])
        except LakesinkError:
            continue
        assert outcome.outcome in (Outcome.COMMITTED, Outcome.REPLAY_SKIPPED)
        return
    raise AssertionError(f"batch {batch_id} did not commit in 6 runs")


def test_batches_beside_a_lock_holder_and_a_pyiceberg_writer_land_exactly_once(
    any_catalog_properties: dict[str, str], holder: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="lakesink")
    c = make_committer(any_catalog_properties)
    c.table.open_table(arrow_rows([]).schema)
    sqlite = any_catalog_properties["uri"].startswith("sqlite")
    # SQLite: held longer than the 5 s busy timeout, so some of our COMMITs are refused; PostgreSQL: waits
    holder.cycle(6.0 if sqlite else 2.0, 0.5)
    writer = Writer(any_catalog_properties)
    sent: list[int] = []
    try:
        for batch_id in range(5):
            ids = list(range(batch_id * 100, batch_id * 100 + 50))
            _commit_until_settled(c, batch_id, ids)
            sent += ids
    finally:
        ok, failed = writer.stop()
        holder.release()
    table = load(c)
    got = table_ids(table)
    ours = Counter({i: n for i, n in got.items() if i < WRITER_FIRST_ID})
    assert ours == Counter(sent)
    theirs = Counter({i: n for i, n in got.items() if i >= WRITER_FIRST_ID})
    assert all(theirs[i] == 1 for i in ok), "the other writer's acknowledged appends are in the table once"
    assert all(theirs[i] <= 1 for i in failed)
    assert [s["batch_id"] for s in lakesink_snapshots(table)] == list(range(5))
    _assert_logged_batches_are_in_table(caplog.text, c, Q1)
    assert verify(table).ok


@pytest.mark.spark
def test_stream_beside_a_lock_holder_and_a_pyiceberg_writer(
    any_catalog_properties: dict[str, str], holder: Holder, tmp_path: Path
) -> None:
    """format("lakesink") in its own Spark driver (so its commit worker's log is captured) with small
    one-file batches, while the holder takes the lock in turns and a pyiceberg writer appends."""
    props = any_catalog_properties
    src, ck = tmp_path / "input", tmp_path / "checkpoint"
    sent = write_json_input(src, files=6, rows_per_file=20)
    # the stream creates the table with its own schema; the holder and the writer start once its first batch is in
    env = {k: v for k, v in os.environ.items() if k != "LAKESINK_FAULTS_DIR"}
    env["LAKESINK_LOG_LEVEL"] = "INFO"

    def start_job() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.sql_lock_procs", "stream", json.dumps(props), str(src), str(ck)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    job = start_job()
    writer: Writer | None = None
    err = ""
    try:
        _wait_for(lambda: _has_table(props) or job.poll() is not None, "the stream to create the table", 300)
        holder.cycle(6.0 if props["uri"].startswith("sqlite") else 2.0, 0.5)
        writer = Writer(props)
        for run in range(4):
            if run:  # a batch lost every attempt to the other writer or the lock: restart, as a user would
                job = start_job()
            out, job_err = job.communicate(timeout=guard(900))
            err += job_err
            if job.returncode == 0 or "CommitConflictError" not in job_err:
                break
    finally:
        if job.poll() is None:
            job.kill()
        ok, failed = writer.stop() if writer is not None else ([], [])
        holder.release()
    assert job.returncode == 0 and "STREAM DONE" in out, err[-4000:]
    print(*re.findall(r"batch=\d+ committed .*", err), f"other writer: {len(ok)} ok, {len(failed)} failed", sep="\n")
    query_id = json.loads((ck / "metadata").read_text())["id"]
    table = _read_table(props)
    got = Counter(table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
    assert Counter({i: n for i, n in got.items() if i < WRITER_FIRST_ID}) == Counter(sent)
    assert all(got[i] == 1 for i in ok)
    assert all(got[i] <= 1 for i in failed)
    logged = {int(b) for q, b in COMMITTED.findall(err) if q == query_id}
    in_table = {s["batch_id"] for s in lakesink_snapshots(table) if s["query_id"] == query_id}
    assert logged, err[-4000:]
    assert logged <= in_table, f"logged committed but not in the table: {sorted(logged - in_table)}"
    report = verify(table)
    assert report.ok, report.human()


def _read_table(props: dict[str, str]) -> Table:
    """The table as a new process would read it: a catalog instance of its own, plain pyiceberg."""
    catalog = load_catalog("lakesink", **props)
    try:
        return catalog.load_table(("db", "events"))
    finally:
        catalog.close()


def _has_table(props: dict[str, str]) -> bool:
    try:
        return _read_table(props).current_snapshot() is not None
    except Exception:
        return False
