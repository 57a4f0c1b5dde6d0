"""format("lakesink") with route-by on REST catalogs, on the driver (lakesink.driver.committers.routed), without Spark.

format("lakesink") plans once per run, before it sees a batch, so a table it has not opened is written with the
template. A REST server places its tables itself (lakana refuses a client's location and ``write.data.path``), so the
template writes such a table's files into the query's staging area under the checkpoint; at commit the driver creates
the table where the server places it, rewrites the rows into it, and commits. A staged file is never committed, and
the staging area is swept once a batch is settled.

Servers: the tests' own REST server with ``transactions/commit`` (tests/support/txn_rest_server.py; with
``transactions=False``, a server that commits table by table), and lakana (marker ``rest``). Every row has a unique id;
tables are compared as multisets, read back with pyiceberg, DuckDB and iceberg-rust.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.tables.staging import STAGING_FOLDER
from lakesink.errors import InjectedFault, InvalidOptionError
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.faults import DRIVER_AFTER_TABLE_CREATED, DRIVER_BEFORE_SWAP, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.table import storage
from tests.driver import test_routing as base
from tests.support.helpers import lakesink_snapshots, referenced_data_files, table_ids
from tests.support.http_faults import FaultProxy
from tests.support.job_process import run_script
from tests.support.txn_rest_server import TxnRestServer

Q = base.Q
DATA = {"a": [1, 2, 3], "b": [10, 20], "other.c": [30]}


def routed(props: Mapping[str, str], checkpoint: Path, namespace: str = "db", **extra: str) -> RoutedCommitter:
    opts = {"checkpointLocation": str(checkpoint), "namespace": namespace, **extra}
    return RoutedCommitter(base.options(props, **opts), base.SCHEMA)


def run(rc: RoutedCommitter, batch_id: int, data: Mapping[Any, Sequence[int]]) -> RoutedOutcome:
    """One task of a format("lakesink") batch: written with the plans of a run's start (the template), committed."""
    results: list[RoutedTaskResult] = [base.write(rc, batch_id, data, template=True)]
    try:
        return rc.commit_batch(BatchCall(Q, batch_id, base.OFFSETS), results)
    except BaseException:
        rc.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def staged_files(checkpoint: Path) -> list[Path]:
    root = checkpoint / STAGING_FOLDER
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def table(props: Mapping[str, str], name: str) -> Any:
    return catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))


def assert_read_back(props: Mapping[str, str], want: Mapping[str, Counter[int]]) -> None:
    """pyiceberg, DuckDB and iceberg-rust read each table as the ids sent to it; every data file of every table is
    under the table's own location, none in the staging area."""
    for name, ids in want.items():
        t = table(props, name)
        assert table_ids(t) == ids, name
        assert Counter(interop.duckdb_query(t.metadata_location, "SELECT id FROM t").column("id").to_pylist()) == ids, name
        assert Counter(interop.iceberg_rust_read(t.metadata_location).column("id").to_pylist()) == ids, name
        files = referenced_data_files(t)
        assert all(storage.is_under(f, t.location()) for f in files), (name, t.location(), files)
        assert not any(STAGING_FOLDER in f for f in files), name


def test_new_tables_are_staged_then_created_where_the_server_places_them_in_one_transaction(
    txn_catalog_properties: dict[str, str], txn_proxy: FaultProxy, tmp_path: Path
) -> None:
    ck = tmp_path / "checkpoint"
    rc = routed(txn_catalog_properties, ck)
    template = rc.tables.template()
    assert template is not None and template.staged and template.root == f"{ck}/{STAGING_FOLDER}"
    out = run(rc, 0, DATA)
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    out = run(rc, 1, {"a": [4], "b": [40]})
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    want = {"db.a": Counter([1, 2, 3, 4]), "db.b": Counter([10, 20, 40]), "other.c": Counter([30])}
    assert_read_back(txn_catalog_properties, want)
    assert staged_files(ck) == []  # rewritten, then deleted
    assert txn_proxy.count("transaction", forwarded=True) == 2 and txn_proxy.count("commit", forwarded=True) == 0
    # a replay of batch 1 written again with the template (a restarted run): found in both tables, nothing twice,
    # its staged files deleted
    again = run(routed(txn_catalog_properties, ck), 1, {"a": [4], "b": [40]})
    assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert_read_back(txn_catalog_properties, want)
    assert staged_files(ck) == []
    assert [s["batch_id"] for s in lakesink_snapshots(table(txn_catalog_properties, "db.a"))] == [0, 1]


def test_a_restarted_run_writes_the_tables_of_its_namespace_directly(
    txn_catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """At a run's start the tables of option namespace that the query wrote are opened: their files go straight into
    them; a table outside the namespace is still staged and rewritten."""
    ck = tmp_path / "checkpoint"
    run(routed(txn_catalog_properties, ck), 0, DATA)
    rc = routed(txn_catalog_properties, ck)
    plans = rc.tables.written_plans(Q)
    assert sorted(plans) == ["db.a", "db.b"]
    plan = rc.tables.routed_plan(plans, Q, template=True)
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=1, partition_id=0, task_attempt_id=0)).write(
        [base.rows({"a": [5], "other.c": [31]})]
    )
    by_table = {t.table: t for t in result.tables}
    assert not by_table["db.a"].templated and by_table["other.c"].templated
    assert all(storage.is_under(f.path, table(txn_catalog_properties, "db.a").location()) for f in by_table["db.a"].result.files)
    rc.commit_batch(BatchCall(Q, 1, base.OFFSETS), [result])
    assert_read_back(txn_catalog_properties, {"db.a": Counter([1, 2, 3, 5]), "other.c": Counter([30, 31])})
    assert staged_files(ck) == []


_KILLED = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from tests.driver.test_routing_rest_format import DATA, routed, run
    props, ck, extra = json.loads(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    run(routed(props, ck, **extra), 0, DATA)
    print("committed: the kill did not happen")
    """
)


def _killed_run(props: Mapping[str, str], ck: Path, extra: Mapping[str, str]) -> None:
    done = run_script(_KILLED, json.dumps(dict(props)), str(ck), json.dumps(dict(extra)))
    assert done.returncode == -9, done.stdout + done.stderr[-4000:]


@pytest.mark.parametrize(
    ("txn_server_options", "point", "extra"),
    [
        # the first table created, nothing written into it yet: an empty table is left behind
        pytest.param({}, DRIVER_AFTER_TABLE_CREATED, {}, id="after-creation-atomic"),
        # every table created and its rows rewritten into it, the transaction not sent: unreferenced files
        pytest.param({}, DRIVER_BEFORE_SWAP, {}, id="before-the-transaction"),
        # a server without transactions/commit: the first table committed, the others not
        pytest.param({"transactions": False}, DRIVER_BETWEEN_TABLE_COMMITS, {}, id="between-table-commits"),
    ],
    indirect=["txn_server_options"],
)
def test_sigkill_between_creation_and_commit_then_the_replay_lands_once(
    txn_catalog_properties: dict[str, str],
    txn_server: TxnRestServer,
    faults: Any,
    tmp_path: Path,
    point: str,
    extra: dict[str, str],
) -> None:
    ck = tmp_path / "checkpoint"
    faults.arm(point, "kill")
    _killed_run(txn_catalog_properties, ck, extra)
    catalog = catalogs.load(None, txn_catalog_properties)
    created = [n for n in ("db.a", "db.b", "other.c") if catalog.table_exists(tuple(n.split(".")))]
    assert created, "the kill came after a table was created"
    landed = {n for n in created if table_ids(table(txn_catalog_properties, n))}
    if point == DRIVER_BETWEEN_TABLE_COMMITS:
        assert landed == {"db.a"}  # table by table: the first one only
    else:
        assert landed == set()  # an empty table (or three), never a partial batch
    # the replay: a new run, the tables written with the template again, the missing ones completed
    out = run(routed(txn_catalog_properties, ck, **extra), 0, DATA)
    assert {t for t, o in out.tables.items() if o.outcome is Outcome.REPLAY_SKIPPED} == landed
    want = {"db.a": Counter([1, 2, 3]), "db.b": Counter([10, 20]), "other.c": Counter([30])}
    assert_read_back(txn_catalog_properties, want)
    for name in want:
        assert [s["batch_id"] for s in lakesink_snapshots(table(txn_catalog_properties, name))] == [0], name
    assert staged_files(ck) == []  # the killed run's staged files too
    # the killed run's rewritten files are in the tables' own locations: the orphan clean-up collects them and
    # keeps every live file
    for name, ids in want.items():
        t = table(txn_catalog_properties, name)
        lakesink.remove_orphan_files(t, older_than=timedelta(0))
        t = table(txn_catalog_properties, name)
        on_disk = {str(p) for p in Path(t.location().removeprefix("file://")).joinpath("data").rglob("*.parquet")}
        assert {f"file://{p}" for p in on_disk} == referenced_data_files(t), name
        assert table_ids(t) == ids


@pytest.mark.parametrize("txn_server_options", [{"transactions": False}], indirect=True)
def test_atomic_required_is_refused_at_start_on_a_server_without_transactions(
    txn_catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(InvalidOptionError, match=r"option 'atomic' is 'required', but catalog .*RestCatalog"):
        routed(txn_catalog_properties, tmp_path / "checkpoint", atomic="required")
    rc = routed(txn_catalog_properties, tmp_path / "checkpoint")  # auto: table by table
    assert not rc.tables.atomic
    run(rc, 0, DATA)
    assert_read_back(txn_catalog_properties, {"db.a": Counter([1, 2, 3]), "db.b": Counter([10, 20]), "other.c": Counter([30])})


def test_a_table_another_query_creates_meanwhile_is_written_once_by_each(
    txn_catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    one, two = routed(txn_catalog_properties, tmp_path / "ck1"), routed(txn_catalog_properties, tmp_path / "ck2")
    r1 = [base.write(one, 0, {"a": [1], "b": [2]}, template=True)]
    r2 = [base.write(two, 0, {"a": [10], "b": [20]}, template=True)]
    one.commit_batch(BatchCall(Q, 0, base.OFFSETS), r1)  # creates both tables
    two.commit_batch(BatchCall("second-query", 0, base.OFFSETS), r2)  # finds them
    assert_read_back(txn_catalog_properties, {"db.a": Counter([1, 10]), "db.b": Counter([2, 20])})
    assert staged_files(tmp_path / "ck1") == staged_files(tmp_path / "ck2") == []


def test_an_aborted_batch_leaves_no_staged_file_and_its_replay_lands_once(
    txn_catalog_properties: dict[str, str], faults: Any, tmp_path: Path
) -> None:
    ck = tmp_path / "checkpoint"
    faults.arm(DRIVER_BEFORE_SWAP, "raise")
    with pytest.raises(InjectedFault):
        run(routed(txn_catalog_properties, ck), 0, DATA)
    out = run(routed(txn_catalog_properties, ck), 0, DATA)
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    assert_read_back(txn_catalog_properties, {"db.a": Counter([1, 2, 3]), "db.b": Counter([10, 20]), "other.c": Counter([30])})
    assert staged_files(ck) == []


@pytest.mark.rest
def test_lakana_places_the_tables_and_each_batch_lands_once_table_by_table(
    rest_catalog_properties: dict[str, str], faults: Any, tmp_path: Path
) -> None:
    """lakana refuses a client's location and write.data.path, and has no transactions/commit: tables are created
    where it places them (``managed/...-<id>``), batches committed table by table, a crash between two tables'
    commits completed by the replay."""
    ck = tmp_path / "checkpoint"
    data = {"a": [1, 2], "silver.b": [3]}
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(routed(rest_catalog_properties, ck, namespace="bronze"), 0, data)
    out = run(routed(rest_catalog_properties, ck, namespace="bronze"), 0, data)
    assert {o.outcome for o in out.tables.values()} == {Outcome.REPLAY_SKIPPED, Outcome.COMMITTED}
    run(routed(rest_catalog_properties, ck, namespace="bronze"), 1, {"a": [4], "silver.b": [5]})
    assert_read_back(rest_catalog_properties, {"bronze.a": Counter([1, 2, 4]), "silver.b": Counter([3, 5])})
    assert "managed" in table(rest_catalog_properties, "bronze.a").location()
    assert staged_files(ck) == []


def test_a_staging_area_lakesink_cannot_write_is_refused_at_start(txn_catalog_properties: dict[str, str], tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    rc = routed(txn_catalog_properties, blocked / "checkpoint")
    with pytest.raises(InvalidOptionError, match=r"staging area .*a-file/checkpoint/lakesink/staging .*places its tables itself"):
        rc.tables.check_staging()
    routed(txn_catalog_properties, tmp_path / "checkpoint").tables.check_staging()  # a folder it can write: accepted
    assert staged_files(tmp_path / "checkpoint") == []  # the probe is gone
