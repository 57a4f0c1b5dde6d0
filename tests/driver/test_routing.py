"""Option route-by on the driver: one batch into many tables, one unit of commits (lakesink.driver.committers.routed).

No Spark: the routed task writer (lakesink.executor.routed_writer) writes real Parquet files, the tables live in real
SQLite catalogs (and moto's Glue for a catalog without multi-table commits); faults at named points, a SIGKILL in a
subprocess. Every row has a unique id; tables are compared as multisets.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from lakesink._pyiceberg import commit as seam_commit
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.errors import (
    CommitConflictError,
    DuplicateSinkError,
    InjectedFault,
    InvalidOptionError,
    ReplayMismatchError,
    RoutingError,
    SchemaMismatchError,
    TableIdentityChangedError,
    TableLocationError,
)
from lakesink.executor.messages import ROWS_ONLY, RowsDigest, TaskIds
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.options import SinkOptions, WriterKind
from lakesink.table.keys import SUMMARY_BATCH_TABLES, SUMMARY_BATCH_TABLES_DIGEST
from lakesink.table.routes import tables_digest
from tests.support.helpers import commit, lakesink_snapshots, raced, table_ids, write_task
from tests.support.job_process import run_script

Q = "routing-query"
OFFSETS = '[{"logOffset":0}]'
SCHEMA = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string())])


def options(props: Mapping[str, str], **extra: str) -> SinkOptions:
    return SinkOptions.from_mapping(
        {"route-by": "route", "namespace": "db", **{f"catalog.{k}": v for k, v in props.items()}, **extra}
    )


def routed(props: Mapping[str, str], schema: pa.Schema = SCHEMA, **extra: str) -> RoutedCommitter:
    return RoutedCommitter(options(props, **extra), schema)


def rows(data: Mapping[str | None, Sequence[int]], schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    ids = [i for ids in data.values() for i in ids]
    routes = [r for r, ids in data.items() for _ in ids]
    columns: dict[str, pa.Array] = {
        "id": pa.array(ids, pa.int64()),
        "user": pa.array([f"u{i}" for i in ids], pa.string()),
        "route": pa.array(routes, pa.string()),
    }
    for f in schema:
        if f.name not in columns:
            columns[f.name] = pa.array([f"{f.name}-{i}" for i in ids], f.type)
    return pa.RecordBatch.from_pydict({f.name: columns[f.name] for f in schema}, schema=schema)


def write(
    rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], *, template: bool = False, part: int = 0
) -> RoutedTaskResult:
    """One task's routed write, planned as foreach_batch plans (every table opened first) or, with ``template``, as
    format("lakesink") plans (no table opened: the template)."""
    batch = rows(data, pa.schema([f for f in SCHEMA] + [f for f in rc.tables.stream_schema if f.name not in SCHEMA.names]))
    plans = {} if template else rc.tables.plans(rc.tables.routes(set(data), batch_id), Q)
    plan = rc.tables.routed_plan(plans, Q, template=template)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=part, task_attempt_id=part))
    return writer.write([batch])


def run(rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], **kw: Any) -> RoutedOutcome:
    return commit_or_abort(rc, batch_id, [write(rc, batch_id, data, **kw)])


def commit_or_abort(
    rc: RoutedCommitter, batch_id: int, results: list[RoutedTaskResult], *, offsets: str = OFFSETS, run_id: str | None = None
) -> RoutedOutcome:
    """The unit committed, or aborted with the same results on an error (as both entry points do)."""
    try:
        return rc.commit_batch(BatchCall(Q, batch_id, offsets, run_id), results)
    except BaseException:
        rc.abort_batch(query_id=Q, batch_id=batch_id, results=results)
        raise


def ids(props: Mapping[str, str], name: str) -> Counter[int]:
    return table_ids(catalogs.load_table_fresh(None, dict(props), tuple(name.split("."))))


def exists(props: Mapping[str, str], name: str) -> bool:
    return catalogs.load(None, dict(props)).table_exists(tuple(name.split(".")))


def snapshots(props: Mapping[str, str], name: str) -> list[dict[str, Any]]:
    return lakesink_snapshots(catalogs.load_table_fresh(None, dict(props), tuple(name.split("."))))


def test_a_batch_lands_in_each_table_once_without_the_routing_column(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    out = run(rc, 0, {"a": [1, 2], "b": [3], "other.c": [4, 5, 6]})
    assert {t: o.outcome for t, o in out.tables.items()} == {
        "db.a": Outcome.COMMITTED,
        "db.b": Outcome.COMMITTED,
        "other.c": Outcome.COMMITTED,
    }
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3])
    assert ids(catalog_properties, "other.c") == Counter([4, 5, 6])
    table = catalogs.load_table_fresh(None, catalog_properties, ("db", "a"))
    assert table.schema().column_names == ["id", "user"]  # the routing column is not written
    digest = tables_digest(["db.a", "db.b", "other.c"])
    for name in ("db.a", "db.b", "other.c"):
        (snap,) = snapshots(catalog_properties, name)
        assert snap["batch_id"] == 0 and snap["summary"][SUMMARY_BATCH_TABLES] == "3"
        assert snap["summary"][SUMMARY_BATCH_TABLES_DIGEST] == digest
    # the same batch again (a replay): found in every table, nothing written, nothing committed
    again = run(rc, 0, {"a": [1, 2], "b": [3], "other.c": [4, 5, 6]})
    assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and len(snapshots(catalog_properties, "db.a")) == 1


def test_several_tasks_and_batches(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    sent: dict[str, Counter[int]] = {"db.a": Counter(), "db.b": Counter()}
    for b in range(3):
        results = [write(rc, b, {"a": [b * 100 + p], "b": [b * 100 + 50 + p]}, part=p) for p in range(2)]
        rc.commit_batch(BatchCall(Q, b, OFFSETS), results)
        sent["db.a"].update([b * 100, b * 100 + 1])
        sent["db.b"].update([b * 100 + 50, b * 100 + 51])
    for name, want in sent.items():
        assert ids(catalog_properties, name) == want
        assert [s["batch_id"] for s in snapshots(catalog_properties, name)] == [0, 1, 2]


def test_a_fault_inside_the_database_transaction_commits_no_table(catalog_properties: dict[str, str], faults: Any) -> None:
    rc = routed(catalog_properties, **{"table-property.commit.retry.num-retries": "0"})
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    with pytest.raises(CommitConflictError, match="nothing was committed"):
        run(rc, 0, {"a": [1], "b": [2]})
    assert faults.fired(CATALOG_BETWEEN_TABLE_SWAPS)
    assert ids(catalog_properties, "db.a") == Counter() and ids(catalog_properties, "db.b") == Counter()
    out = run(rc, 0, {"a": [1], "b": [2]})  # the replay commits both
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    assert ids(catalog_properties, "db.a") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])


def test_atomic_off_commits_table_by_table_and_a_replay_completes_the_batch(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    rc = routed(catalog_properties, atomic="off")
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 0, {"a": [1, 2], "b": [3, 4]})
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter()
    restarted = routed(catalog_properties, atomic="off")
    out = run(restarted, 0, {"a": [1, 2], "b": [3, 4]})  # the replay: skipped in a (nothing written), committed in b
    assert out.tables["db.a"].outcome is Outcome.REPLAY_SKIPPED and out.tables["db.b"].outcome is Outcome.COMMITTED
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3, 4])
    assert len(snapshots(catalog_properties, "db.a")) == 1


_KILLED = textwrap.dedent(
    """
    import json, sys
    from tests.driver.test_routing import routed, run
    props, extra = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    run(routed(props, **extra), 0, {"a": [1, 2, 3], "b": [10, 20], "c": [30]})
    print("committed: the kill did not happen")
    """
)


@pytest.mark.parametrize(
    ("point", "extra", "landed"),
    [
        (CATALOG_BETWEEN_TABLE_SWAPS, {}, set()),  # inside the SQL transaction: no table
        (DRIVER_BETWEEN_TABLE_COMMITS, {"atomic": "off"}, {"db.a"}),  # table by table: the first one only
    ],
)
def test_sigkill_inside_a_routed_commit_then_a_replay(
    catalog_properties: dict[str, str], faults: Any, point: str, extra: dict[str, str], landed: set[str]
) -> None:
    faults.arm(point, "kill")
    done = run_script(_KILLED, json.dumps(catalog_properties), json.dumps(extra))
    assert done.returncode == -9, done.stdout + done.stderr
    want = {"db.a": Counter([1, 2, 3]), "db.b": Counter([10, 20]), "db.c": Counter([30])}
    for name in want:
        assert ids(catalog_properties, name) == (want[name] if name in landed else Counter()), name
    out = run(routed(catalog_properties, **extra), 0, {"a": [1, 2, 3], "b": [10, 20], "c": [30]})
    assert {t for t, o in out.tables.items() if o.outcome is Outcome.REPLAY_SKIPPED} == landed
    for name in want:
        assert ids(catalog_properties, name) == want[name]
        assert len(snapshots(catalog_properties, name)) == 1


def test_another_writer_on_one_table_mid_batch_retries_the_whole_unit(catalog_properties: dict[str, str], faults: Any) -> None:
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2]})
    results = [write(rc, 1, {"a": [3], "b": [4]})]
    other = RoutedCommitter(options(catalog_properties, **{"sink-id": "other"}), SCHEMA)
    out = raced(
        faults,
        lambda: rc.commit_batch(BatchCall(Q, 1, OFFSETS), results),
        lambda: other.commit_batch(BatchCall("other-query", 0, OFFSETS), [write(other, 0, {"b": [99]})]),
    )
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    assert {o.retries for o in out.tables.values()} == {1}  # one retry of the whole unit, never a partial commit
    assert ids(catalog_properties, "db.a") == Counter([1, 3]) and ids(catalog_properties, "db.b") == Counter([2, 4, 99])
    a_snaps = snapshots(catalog_properties, "db.a")
    assert [s["summary"]["lakesink.commit-attempt"] for s in a_snaps] == ["1", "2"]


@pytest.mark.parametrize(
    "value",
    [
        "x'; DROP TABLE iceberg_tables; --",
        "../../etc/passwd",
        "db/../../x",
        "a.b..c",
        '"quoted"',
        "name with space",
        "",
        None,
        "ta\x00ble",
        "../a",
        "%2e%2e",
        "t" * 200,
    ],
)
def test_invalid_routing_values_fail_the_batch_naming_value_and_batch(
    catalog_properties: dict[str, str], value: str | None, tmp_path: Path
) -> None:
    rc = routed(catalog_properties)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(RoutingError, match="batch 7") as e:
        run(rc, 7, {"good": [1], value: [2]})
    assert repr(value)[:60].strip("'\"")[:20] in str(e.value) or value is None
    assert not exists(catalog_properties, "db.good")  # nothing created, nothing committed
    names = catalogs.load(None, catalog_properties).list_namespaces()
    assert names == []
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_values_differing_only_in_case_are_refused(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    with pytest.raises(RoutingError, match="differ only in case"):
        rc.tables.routes(["Orders", "orders"], 3)


def test_an_empty_batch_moves_the_markers_of_the_previous_batchs_tables(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2]})
    out = rc.commit_batch(BatchCall(Q, 1, OFFSETS), [RoutedTaskResult(Q, 1, 0, None, ())])
    assert {o.outcome for o in out.tables.values()} == {Outcome.EMPTY} and set(out.tables) == {"db.a", "db.b"}
    run(rc, 2, {"a": [3]})
    last = snapshots(catalog_properties, "db.a")[-1]
    assert last["batch_id"] == 2 and last["summary"]["lakesink.previous-batch-id"] == "1"
    assert ids(catalog_properties, "db.a") == Counter([1, 3])


def test_a_table_dropped_and_recreated_between_batches_is_a_loud_error(catalog_properties: dict[str, str]) -> None:
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2]})
    catalog = catalogs.load(None, catalog_properties)
    catalog.drop_table(("db", "a"))
    with pytest.raises(TableIdentityChangedError, match="dropped"):
        run(rc, 1, {"a": [3], "b": [4]})
    catalog.create_table(("db", "a"), schema=catalogs.load_table_fresh(None, catalog_properties, ("db", "b")).schema())
    with pytest.raises(TableIdentityChangedError, match="recreated"):
        run(rc, 1, {"a": [3], "b": [4]})
    assert ids(catalog_properties, "db.b") == Counter([2])  # nothing of batch 1 anywhere
    rc.new_run()  # a restart writes into the new table
    run(rc, 1, {"a": [3], "b": [4]})
    assert ids(catalog_properties, "db.a") == Counter([3]) and ids(catalog_properties, "db.b") == Counter([2, 4])


def test_a_table_renamed_between_batches_is_a_loud_error_and_keeps_its_rows(catalog_properties: dict[str, str]) -> None:
    """A rename is, for the running query, its table dropped: the batch fails naming it, nothing is committed to the
    renamed table nor anywhere else. A restart does not create a new table under the old name where the renamed one
    still keeps its files (refused naming both); a table the user creates under the old name elsewhere is written."""
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2]})
    catalog = catalogs.load(None, catalog_properties)
    catalog.rename_table(("db", "a"), ("db", "renamed"))
    with pytest.raises(TableIdentityChangedError, match="db.a"):
        run(rc, 1, {"a": [3], "b": [4]})
    assert ids(catalog_properties, "db.renamed") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    rc.new_run()
    with pytest.raises(TableLocationError, match=r"table db.a at .* overlaps table db.renamed.*dropped again"):
        run(rc, 1, {"a": [3], "b": [4]})
    assert not exists(catalog_properties, "db.a")  # the table lakesink had just created there was dropped again
    assert ids(catalog_properties, "db.renamed") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    renamed = catalog.load_table(("db", "renamed"))
    catalog.create_table(("db", "a"), schema=renamed.schema(), location=renamed.location() + "-new")
    rc.new_run()
    run(rc, 1, {"a": [3], "b": [4]})
    assert ids(catalog_properties, "db.a") == Counter([3]) and ids(catalog_properties, "db.b") == Counter([2, 4])
    assert ids(catalog_properties, "db.renamed") == Counter([1])


def _metadata_files(props: Mapping[str, str], name: str) -> list[str]:
    table = catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))
    folder = Path(table.metadata_location.removeprefix("file://")).parent
    return sorted(p.name for p in folder.glob("*.metadata.json"))


def test_a_batchs_new_tables_are_created_in_one_catalog_transaction_as_one_at_a_time_would(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three new tables in one batch: created together (no create_table of pyiceberg's), each as the one-at-a-time
    path creates a table (the fourth, alone in its batch): same schema, spec, sort order, properties, location scheme."""
    from pyiceberg.catalog.sql import SqlCatalog

    alone: list[tuple[str, ...]] = []
    real = SqlCatalog.create_table

    def counted(self: Any, ident: Any, *a: Any, **k: Any) -> Any:
        alone.append(tuple(ident))
        return real(self, ident, *a, **k)

    monkeypatch.setattr(SqlCatalog, "create_table", counted)
    rc = routed(catalog_properties, **{"partitioned-by": "bucket(4, id)"})
    run(rc, 0, {"a": [1], "b": [2], "c": [3]})
    assert alone == []
    run(rc, 1, {"a": [4], "d": [5]})
    assert alone == [("db", "d")]
    tables = {n: catalogs.load_table_fresh(None, catalog_properties, ("db", n)) for n in "abcd"}
    d = tables["d"]
    for name, t in tables.items():
        assert t.schema() == d.schema() and t.spec() == d.spec() and t.sort_order() == d.sort_order(), name
        assert t.format_version == d.format_version and t.location() == d.location()[: -len("d")] + name, name
        created_with = {k: v for k, v in t.properties.items() if not k.startswith("lakesink.last-batch.")}
        assert created_with == {k: v for k, v in d.properties.items() if not k.startswith("lakesink.last-batch.")}, name
        assert len(_metadata_files(catalog_properties, f"db.{name}")) == (3 if name == "a" else 2), name
    assert ids(catalog_properties, "db.a") == Counter([1, 4]) and ids(catalog_properties, "db.d") == Counter([5])
    assert ids(catalog_properties, "db.b") == Counter([2]) and ids(catalog_properties, "db.c") == Counter([3])


def test_a_table_created_meanwhile_makes_each_table_create_itself_and_leaves_no_stray_file(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer creates db.b between the batch's read of its tables and their creation: the transaction creating
    a, b, c fails as a whole (none created, the metadata files it wrote deleted), each table then creates itself and
    db.b, the other writer's table, is written -- every id once, no metadata file of the failed attempt left."""
    real = seam_commit.read_at_once
    theirs: list[str] = []

    def read_then_another_creates_b(catalog: Any, identifiers: Any, **kw: Any) -> Any:
        found = real(catalog, identifiers, **kw)
        if theirs:
            return found
        other = catalogs.load(None, catalog_properties)
        other.create_namespace_if_not_exists("db")
        b = other.create_table(
            ("db", "b"),
            schema=Schema(NestedField(9, "id", LongType(), required=False), NestedField(7, "user", StringType(), required=False)),
        )
        theirs.append(str(b.metadata.table_uuid))
        return found

    monkeypatch.setattr(seam_commit, "read_at_once", read_then_another_creates_b)
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2], "c": [3]})
    assert theirs and str(catalogs.load_table_fresh(None, catalog_properties, ("db", "b")).metadata.table_uuid) == theirs[0]
    assert ids(catalog_properties, "db.a") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    assert ids(catalog_properties, "db.c") == Counter([3])
    for name in ("db.a", "db.b", "db.c"):  # its creation and the batch's commit, nothing of the failed transaction
        assert len(_metadata_files(catalog_properties, name)) == 2, (name, _metadata_files(catalog_properties, name))


def test_a_creation_whose_commit_outcome_is_unknown_keeps_its_files_and_the_tables_are_written(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction creating a, b and c lands, but its commit raises (a connection lost on the reply): the metadata
    files it wrote are kept (a row names them), each table then finds itself created and is written -- every id once,
    every table readable (deleting the files would have left three tables pointing at nothing)."""
    from sqlalchemy.exc import OperationalError

    from lakesink._pyiceberg import sql_catalog

    class LostReply(sql_catalog.Session):  # type: ignore[misc,name-defined]
        lost = 0

        def commit(self) -> None:
            super().commit()
            if LostReply.lost == 0:
                LostReply.lost += 1
                raise OperationalError("COMMIT", {}, Exception("connection lost after the commit"))

    monkeypatch.setattr(sql_catalog, "Session", LostReply)
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2], "c": [3]})
    assert LostReply.lost == 1
    for name, i in (("db.a", 1), ("db.b", 2), ("db.c", 3)):
        assert ids(catalog_properties, name) == Counter([i]), name
        table = catalogs.load_table_fresh(None, catalog_properties, tuple(name.split(".")))
        (created_with,) = [e.metadata_file for e in table.metadata.metadata_log]  # the file the transaction wrote
        assert Path(created_with.removeprefix("file://")).exists(), name


def test_tables_created_together_are_checked_as_one_created_alone(catalog_properties: dict[str, str]) -> None:
    """db.a renamed away keeps its files at db.a's default location: a batch creating db.a and db.c together is refused
    as one creating db.a alone (TableLocationError, db.a dropped again); nothing of the batch is committed anywhere."""
    rc = routed(catalog_properties)
    run(rc, 0, {"a": [1], "b": [2]})
    catalogs.load(None, catalog_properties).rename_table(("db", "a"), ("db", "renamed"))
    rc = routed(catalog_properties)
    with pytest.raises(TableLocationError, match=r"table db.a at .* overlaps table db.renamed.*dropped again"):
        run(rc, 1, {"a": [3], "b": [4], "c": [5]})
    assert not exists(catalog_properties, "db.a")
    assert ids(catalog_properties, "db.renamed") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()


def _existing_table(props: Mapping[str, str], name: str) -> None:
    catalog = catalogs.load(None, dict(props))
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(
        ("db", name),
        schema=Schema(NestedField(7, "user", StringType(), required=False), NestedField(9, "id", LongType(), required=False)),
    )


WIDE = pa.schema([("id", pa.int64()), ("user", pa.string()), ("route", pa.string()), ("extra", pa.string())])


def test_an_existing_table_takes_its_own_columns_by_name(catalog_properties: dict[str, str]) -> None:
    _existing_table(catalog_properties, "old")
    rc = routed(catalog_properties, WIDE)
    batch = pa.RecordBatch.from_pydict(
        {"id": [1, 2, 3], "user": ["x", "y", "z"], "route": ["old", "new", "old"], "extra": [None, "e", None]},
        schema=WIDE,
    )
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(["old", "new"], 0), Q), Q, template=False)
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write([batch])
    rc.commit_batch(BatchCall(Q, 0, OFFSETS), [result])
    old = catalogs.load_table_fresh(None, catalog_properties, ("db", "old"))
    assert old.schema().column_names == ["user", "id"]
    assert sorted(old.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"user": "x", "id": 1},
        {"user": "z", "id": 3},
    ]
    new = catalogs.load_table_fresh(None, catalog_properties, ("db", "new"))
    assert new.scan().to_arrow().to_pylist() == [{"id": 2, "user": "y", "extra": "e"}]


def test_a_value_in_a_column_the_table_lacks_fails_naming_table_and_column(catalog_properties: dict[str, str]) -> None:
    _existing_table(catalog_properties, "old")
    rc = routed(catalog_properties, WIDE)
    batch = pa.RecordBatch.from_pydict(
        {"id": [1, 2], "user": ["x", "y"], "route": ["old", "old"], "extra": [None, "lost?"]}, schema=WIDE
    )
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(["old"], 4), Q), Q, template=False)
    with pytest.raises(SchemaMismatchError, match=r"table db\.old has no column 'extra'.*batch 4.*merge-schema"):
        RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=4, partition_id=0, task_attempt_id=0)).write([batch])
    assert ids(catalog_properties, "db.old") == Counter()
    # with merge-schema the column is added in the batch's commit
    rc = routed(catalog_properties, WIDE, **{"merge-schema": "true"})
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(["old"], 4), Q), Q, template=False)
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=4, partition_id=0, task_attempt_id=0)).write([batch])
    rc.commit_batch(BatchCall(Q, 4, OFFSETS), [result])
    old = catalogs.load_table_fresh(None, catalog_properties, ("db", "old"))
    assert old.schema().column_names == ["user", "id", "extra"]
    assert sorted(r["extra"] or "" for r in old.scan().to_arrow().to_pylist()) == ["", "lost?"]


def test_format_lakesink_template_creates_tables_at_commit_or_rewrites_into_a_different_one(
    catalog_properties: dict[str, str],
) -> None:
    """format("lakesink") plans before it sees the batch: unknown tables are written with the template; the commit
    creates them as the template says, or rewrites the rows into a table someone made otherwise."""
    _existing_table(catalog_properties, "old")  # field ids and column order unlike the template's
    rc = routed(catalog_properties)
    out = run(rc, 0, {"new": [1, 2], "old": [3]}, template=True)
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED}
    assert ids(catalog_properties, "db.new") == Counter([1, 2]) and ids(catalog_properties, "db.old") == Counter([3])
    old = catalogs.load_table_fresh(None, catalog_properties, ("db", "old"))
    assert old.scan().to_arrow().to_pylist() == [{"user": "u3", "id": 3}]
    assert all(p.startswith(old.location()) for p in old.inspect.files().column("file_path").to_pylist())
    # a replay of the batch with the template: found committed in both tables, nothing twice
    again = run(routed(catalog_properties), 0, {"new": [1, 2], "old": [3]}, template=True)
    assert {o.outcome for o in again.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert ids(catalog_properties, "db.new") == Counter([1, 2]) and ids(catalog_properties, "db.old") == Counter([3])


def test_two_queries_create_and_write_the_same_tables(catalog_properties: dict[str, str]) -> None:
    one, two = routed(catalog_properties), routed(catalog_properties)
    r1 = [write(one, 0, {"a": [1], "b": [2]}, template=True)]
    r2 = [write(two, 0, {"a": [10], "b": [20]}, template=True)]
    one.commit_batch(BatchCall(Q, 0, OFFSETS), r1)  # creates both tables
    two.commit_batch(BatchCall("second-query", 0, OFFSETS), r2)  # finds them
    assert ids(catalog_properties, "db.a") == Counter([1, 10]) and ids(catalog_properties, "db.b") == Counter([2, 20])


def test_options_refused_with_routing() -> None:
    with pytest.raises(InvalidOptionError, match="not both"):
        SinkOptions.from_mapping({"route-by": "route", "table": "db.t"})
    with pytest.raises(InvalidOptionError, match="complete"):
        SinkOptions.from_mapping({"route-by": "route", "output-mode": "complete"})
    # upserts route (tests/driver/test_routing_upserts.py): the options parse, update mode too, and with dead letters
    # (tests/driver/test_routing_upsert_dead_letters.py)
    routed_upserts = SinkOptions.from_mapping({"route-by": "route", "upsert-key": "id", "output-mode": "update"})
    assert routed_upserts.upsert_key == ("id",) and routed_upserts.routing is not None
    with pytest.raises(InvalidOptionError, match="output mode 'update' needs option 'upsert-key'"):
        SinkOptions.from_mapping({"route-by": "route", "output-mode": "update"})
    lettered = SinkOptions.from_mapping({"route-by": "route", "upsert-key": "id", "dead-letter-table": "db.letters"})
    assert lettered.upsert_key == ("id",) and lettered.dead_letter_table is not None and lettered.routing is not None
    # writer='spark' routes (tests/sink/test_routing_spark_writer.py), upserts too (Spark resolves them:
    # tests/sink/test_routing_upserts_spark.py), but not a payload (expanded in Python workers); 'driver' writes
    # on the driver with the routed tasks' writer (tests/sink/test_routing_driver_spark.py)
    assert SinkOptions.from_mapping({"route-by": "route", "writer": "spark"}).routing is not None
    spark_upserts = SinkOptions.from_mapping({"route-by": "route", "writer": "spark", "upsert-key": "id"})
    assert spark_upserts.upsert_key == ("id",) and spark_upserts.routing is not None
    with pytest.raises(InvalidOptionError, match="writer='spark' cannot be used with option 'payload'.*Python workers"):
        SinkOptions.from_mapping({"route-by": "route", "writer": "spark", "payload": "p"})
    on_driver = SinkOptions.from_mapping({"route-by": "route", "writer": "driver", "payload": "p"})
    assert on_driver.writer is WriterKind.DRIVER and on_driver.routing is not None
    with pytest.raises(InvalidOptionError, match="'atomic' must be one of"):
        SinkOptions.from_mapping({"route-by": "route", "atomic": "sometimes"})
    with pytest.raises(InvalidOptionError, match="need option 'route-by'"):
        SinkOptions.from_mapping({"table": "db.t", "namespace": "db"})
    with pytest.raises(InvalidOptionError, match="option 'namespace'"):
        SinkOptions.from_mapping({"route-by": "route", "namespace": "../x"})


def test_the_routing_column_must_exist_and_be_a_string(catalog_properties: dict[str, str]) -> None:
    with pytest.raises(InvalidOptionError, match="does not have"):
        routed(catalog_properties, pa.schema([("id", pa.int64())]))
    with pytest.raises(InvalidOptionError, match="must be a string"):
        routed(catalog_properties, pa.schema([("id", pa.int64()), ("route", pa.int64())]))


def test_a_single_table_sink_is_not_disturbed_by_a_routed_one(catalog_properties: dict[str, str]) -> None:
    """A routed query and a single-table sink write one table: each exactly once."""
    from tests.support.helpers import make_committer

    rc = routed(catalog_properties)
    run(rc, 0, {"events": [1, 2]})
    single = make_committer(catalog_properties)
    single.table.open_table(pa.schema([("id", pa.int64()), ("user", pa.string())]))
    commit(single, "single-query", 0, [write_task(single, "single-query", 0, [3])])
    assert ids(catalog_properties, "db.events") == Counter([1, 2, 3])


def test_atomic_required_refuses_a_catalog_without_multi_table_commits(glue_catalog_properties: dict[str, str]) -> None:
    props = {k: v for k, v in glue_catalog_properties.items()}
    with pytest.raises(InvalidOptionError, match=r"'atomic' is 'required'.*cannot commit several tables"):
        routed(props, atomic="required")


def test_glue_commits_table_by_table_and_a_replay_completes(glue_catalog_properties: dict[str, str], faults: Any) -> None:
    props = dict(glue_catalog_properties)
    ns = f"db_{uuid.uuid4().hex[:8]}"
    rc = RoutedCommitter(options(props, namespace=ns), SCHEMA)
    assert not rc.tables.atomic
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 0, {"a": [1], "b": [2]})
    assert ids(props, f"{ns}.a") == Counter([1]) and ids(props, f"{ns}.b") == Counter()
    run(RoutedCommitter(options(props, namespace=ns), SCHEMA), 0, {"a": [1], "b": [2]})
    assert ids(props, f"{ns}.a") == Counter([1]) and ids(props, f"{ns}.b") == Counter([2])


SIX: dict[str | None, list[int]] = {f"t{i}": [i] for i in range(6)}


def test_a_large_unit_is_prepared_in_parallel_and_a_conflict_on_a_later_table_rolls_back_every_row(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """Six tables: prepared on a pool of threads, the first row swapped alone, the other five in one statement (one
    compare-and-swap each): another writer moving the fifth table rolls the whole unit back, and it is retried."""
    rc = routed(catalog_properties)
    run(rc, 0, SIX)
    results = [write(rc, 1, {name: [100 + ids[0]] for name, ids in SIX.items()})]
    other = RoutedCommitter(options(catalog_properties, **{"sink-id": "other"}), SCHEMA)
    out = raced(
        faults,
        lambda: rc.commit_batch(BatchCall(Q, 1, OFFSETS), results),
        lambda: other.commit_batch(BatchCall("other-query", 0, OFFSETS), [write(other, 0, {"t4": [999]})]),
    )
    assert {o.outcome for o in out.tables.values()} == {Outcome.COMMITTED} and {o.retries for o in out.tables.values()} == {1}
    for name, first in SIX.items():
        extra = [999] if name == "t4" else []
        assert ids(catalog_properties, f"db.{name}") == Counter([first[0], 100 + first[0], *extra]), name
        attempts = [s["summary"]["lakesink.commit-attempt"] for s in snapshots(catalog_properties, f"db.{name}")]
        assert attempts[-1] == "2"  # no table kept the first attempt's swap


def test_a_fault_inside_the_transaction_of_a_large_unit_commits_no_table(catalog_properties: dict[str, str], faults: Any) -> None:
    rc = routed(catalog_properties, **{"table-property.commit.retry.num-retries": "0"})
    faults.arm(CATALOG_BETWEEN_TABLE_SWAPS, "raise")
    with pytest.raises(CommitConflictError, match="nothing was committed"):
        run(rc, 0, SIX)
    for name in SIX:
        assert ids(catalog_properties, f"db.{name}") == Counter()
    run(rc, 0, SIX)
    for name, want in SIX.items():
        assert ids(catalog_properties, f"db.{name}") == Counter(want)


# --- option event-time: every routed table must have the column (issue 30, item 12) -----------------------------


TIMED = pa.schema([*SCHEMA, pa.field("ts", pa.timestamp("us", tz="UTC"))])


def timed_rows(data: Mapping[str | None, Sequence[int]], *, untimed: str) -> pa.RecordBatch:
    """Rows with an event time, except those routed to ``untimed`` (a table without the column takes only nulls in it)."""
    import datetime as dt

    batch = rows(data, SCHEMA)
    at = [
        None if r == untimed else dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i)
        for r, ids in data.items()
        for i in ids
    ]
    return batch.append_column(TIMED.field("ts"), pa.array(at, TIMED.field("ts").type))


@pytest.mark.parametrize("planned", ["foreach_batch", "format_lakesink"])
def test_event_time_with_a_routed_table_without_the_column_is_refused_before_anything_is_committed(
    catalog_properties: dict[str, str], planned: str
) -> None:
    """A single table without the event-time column is refused at start; a routed table without it failed every batch
    at commit (with atomic=off after the tables before it had committed: every replay failing the same way). Now it is
    refused when the table is opened (foreach_batch: before any file is written; format("lakesink"), whose tasks wrote
    it with the template: at commit, before any table's commit), naming the option, the table, the column and the fix.
    The tables that have the column are unaffected once the option is dropped or the table fixed."""
    from lakesink.driver.actions.completeness import BatchTime

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    cat.create_table(("db", "old"), Schema(NestedField(1, "id", LongType()), NestedField(2, "user", StringType())))
    rc = routed(catalog_properties, TIMED, **{"event-time": "ts", "atomic": "off"})
    data: dict[str | None, list[int]] = {"a": [1, 2], "old": [3]}
    time = BatchTime(None, "ts")
    with pytest.raises(InvalidOptionError) as refused:
        if planned == "foreach_batch":
            rc.tables.plans(rc.tables.routes(set(data), 0), Q)  # the tables are opened before any file is written
            raise AssertionError("planned")
        plan = rc.tables.routed_plan({}, Q, template=True)
        result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write(
            [timed_rows(data, untimed="old")]
        )
        try:
            rc.commit_batch(BatchCall(Q, 0, OFFSETS, time=time), [result])
        finally:
            rc.abort_batch(query_id=Q, batch_id=0, results=[result])
    message = str(refused.value)
    for part in ("'event-time'", "db.old", "'ts'", "nothing was committed", "add column"):
        assert part in message, (part, message)
    assert not exists(catalog_properties, "db.a") or ids(catalog_properties, "db.a") == Counter()
    assert ids(catalog_properties, "db.old") == Counter()
    # the fix the message names: the column added to the table; the same batch lands everywhere
    with cat.load_table(("db", "old")).update_schema() as update:
        update.add_column("ts", TimestamptzType())
    again = routed(catalog_properties, TIMED, **{"event-time": "ts", "atomic": "off"})
    plans = again.tables.plans(again.tables.routes(set(data), 0), Q) if planned == "foreach_batch" else {}
    plan = again.tables.routed_plan(plans, Q, template=planned != "foreach_batch")
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write(
        [timed_rows(data, untimed="old")]
    )
    again.commit_batch(BatchCall(Q, 0, OFFSETS, time=time), [result])
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.old") == Counter([3])


@pytest.mark.parametrize("planned", ["foreach_batch", "format_lakesink"])
def test_event_time_with_merge_schema_adds_the_column_to_a_routed_table_in_the_batchs_commit(
    catalog_properties: dict[str, str], planned: str
) -> None:
    """With merge-schema the batch's commit adds the event-time column to a table without it: the commit reads the event
    times with the schema it leaves (before: with the table's schema as read, which lacks the column -- every batch
    failed at commit)."""
    from lakesink.driver.actions.completeness import BatchTime

    cat = catalogs.load(None, dict(catalog_properties))
    cat.create_namespace_if_not_exists(("db",))
    cat.create_table(("db", "old"), Schema(NestedField(1, "id", LongType()), NestedField(2, "user", StringType())))
    rc = routed(catalog_properties, TIMED, **{"event-time": "ts", "merge-schema": "true"})
    data: dict[str | None, list[int]] = {"a": [1, 2], "old": [3, 4]}
    plans = rc.tables.plans(rc.tables.routes(set(data), 0), Q) if planned == "foreach_batch" else {}
    plan = rc.tables.routed_plan(plans, Q, template=planned != "foreach_batch")
    result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write(
        [timed_rows(data, untimed="none")]
    )
    rc.commit_batch(BatchCall(Q, 0, OFFSETS, time=BatchTime(None, "ts")), [result])
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.old") == Counter([3, 4])
    old = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", "old"))
    assert "ts" in old.schema().column_names
    summary = old.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary.get("lakesink.event-time-max") is not None, summary


# --- a routed batch is one unit: "already committed?" decided for the whole batch (fault matrix 38) ---------------------

OTHER_OFFSETS = '[{"logOffset":7}]'


def replay(
    rc: RoutedCommitter,
    batch_id: int,
    data: Mapping[str | None, Sequence[int]],
    *,
    offsets: str = OFFSETS,
    run_id: str | None = None,
) -> RoutedOutcome:
    """A replay of ``batch_id`` as foreach_batch runs it: tables planned, the batch decided before any file is written,
    the files written, the unit committed (aborted on an error)."""
    plans = rc.tables.plans(rc.tables.routes(set(data), batch_id), Q)
    rc.check_replay_at_plan(BatchCall(Q, batch_id, offsets, run_id), plans)
    plan = rc.tables.routed_plan(plans, Q, template=False)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=0))
    results = [writer.write([rows(data)])]
    return commit_or_abort(rc, batch_id, results, offsets=offsets, run_id=run_id)


def commit_unchecked(rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], **kw: Any) -> RoutedOutcome:
    """The same replay reaching the commit without the check at plan time (format("lakesink"), or a batch the plan saw
    in none of its tables): the commit's loop must decide it before any table is swapped (``kw``: commit_or_abort's
    offsets and run id)."""
    return commit_or_abort(rc, batch_id, [write(rc, batch_id, data)], **kw)


def files_under(props: Mapping[str, str], name: str) -> list[Path]:
    root = Path(props["warehouse"].removeprefix("file://")) / f"{name.replace('.', '.db/', 1)}" / "data"
    return sorted(root.rglob("*.parquet")) if root.exists() else []


@pytest.mark.parametrize("atomic", ["auto", "off"])
@pytest.mark.parametrize("at_plan", [True, False], ids=["checked-at-plan", "checked-in-the-loop"])
def test_a_replay_over_other_offsets_into_other_tables_commits_nothing_in_any_table(
    catalog_properties: dict[str, str], atomic: str, at_plan: bool
) -> None:
    """Batch 0 went to db.a and db.b; a replay over other offsets routes to db.a and db.c: a loud error before db.c is
    committed (the documented recovery -- restore offsets/0 and restart -- then leaves every row once)."""
    first: dict[str | None, list[int]] = {"a": [1, 2], "b": [3]}
    run(routed(catalog_properties, atomic=atomic), 0, first)
    rc = routed(catalog_properties, atomic=atomic)
    other: dict[str | None, list[int]] = {"a": [1, 2], "c": [4]}
    with pytest.raises(ReplayMismatchError, match="other source offsets"):
        (replay if at_plan else commit_unchecked)(rc, 0, other, offsets=OTHER_OFFSETS)
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()
    assert not exists(catalog_properties, "db.c") or files_under(catalog_properties, "db.c") == []
    # the recovery: the committed offsets restored, the same batch replayed: skipped everywhere, nothing twice
    out = replay(routed(catalog_properties, atomic=atomic), 0, first)
    assert {o.outcome for o in out.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()


@pytest.mark.parametrize("at_plan", [True, False], ids=["checked-at-plan", "checked-in-the-loop"])
def test_a_second_routed_sink_of_the_same_run_commits_nothing_in_any_table(
    catalog_properties: dict[str, str], at_plan: bool
) -> None:
    """Two routed sinks of one run with the same sink id: the second finds db.a holding the batch of this very run, a
    loud DuplicateSinkError before its db.c is committed."""
    run_id = "run-1"
    rc = routed(catalog_properties)
    commit_unchecked(rc, 0, {"a": [1], "b": [2]}, run_id=run_id)
    second = routed(catalog_properties)
    with pytest.raises(DuplicateSinkError, match="same run of the query"):
        (replay if at_plan else commit_unchecked)(second, 0, {"a": [3], "c": [4]}, run_id=run_id)
    assert ids(catalog_properties, "db.a") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()


def test_two_batches_planned_through_one_committer_are_decided_in_the_other_order(catalog_properties: dict[str, str]) -> None:
    """Issue 53 ("a batch is a value"): what a routed batch's planning learned (BatchPlans: its plans, its tables as
    read) is handed on, not kept by the committer. Batch 0 is in db.a and db.b; another run plans a replay of batch 0
    over other source offsets, then batch 1 into db.c, and decides them in the other order: batch 1 is new in db.c and
    lands there alone; the replay of batch 0 is refused at plan time against its own tables as read (checked against
    the tables of the batch planned last, db.c, it found none holding batch 0 and passed)."""
    run(routed(catalog_properties), 0, {"a": [1], "b": [2]})
    rc = routed(catalog_properties)
    zero = rc.tables.plans(rc.tables.routes({"a", "b"}, 0), Q)
    one = rc.tables.plans(rc.tables.routes({"c"}, 1), Q)
    assert set(zero) == {"db.a", "db.b"} and set(one) == {"db.c"}
    rc.check_replay_at_plan(BatchCall(Q, 1, OTHER_OFFSETS), one)
    writer = RoutedTaskWriter(rc.tables.routed_plan(one, Q, template=False), TaskIds(Q, 1, 0, 0))
    out = commit_or_abort(rc, 1, [writer.write([rows({"c": [3]})])], offsets=OTHER_OFFSETS)
    assert {n: o.outcome for n, o in out.tables.items()} == {"db.c": Outcome.COMMITTED}
    with pytest.raises(ReplayMismatchError, match="other source offsets"):
        rc.check_replay_at_plan(BatchCall(Q, 0, OTHER_OFFSETS), zero)
    assert ids(catalog_properties, "db.a") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([2])
    assert ids(catalog_properties, "db.c") == Counter([3])


def counted_only(result: RoutedTaskResult) -> RoutedTaskResult:
    """A task's result whose tables' digests are counts alone, as route-by with writer='spark' records them where the
    batch's tables are committed as one unit (lakesink.sink.spark.split: kind ROWS_ONLY, ``<rows>``)."""
    tables = tuple(
        dataclasses.replace(t, rows_digest=RowsDigest(t.rows_digest.rows, 0, ROWS_ONLY) if t.rows_digest else None)
        for t in result.tables
    )
    return dataclasses.replace(result, tables=tables)


@pytest.mark.parametrize("at_plan", [True, False], ids=["checked-at-plan", "checked-in-the-loop"])
def test_a_replay_completing_a_batch_whose_tables_recorded_counts_alone_is_refused(
    catalog_properties: dict[str, str], at_plan: bool
) -> None:
    """Issue 51, item 13, on the Arrow path (foreach_batch checked at plan time; format("lakesink")'s commit in the
    loop): batch 0 committed as one unit with counts alone (ids 1, 2, 3 to a, c, b), db.c dropped since, a replay whose
    changed lookup sends 1 to c and 2 to a. The counts match (1 each); completing c would leave a=[1] b=[3] c=[1]. The
    replay is refused, nothing committed in any table."""
    rc = routed(catalog_properties)
    first: dict[str | None, list[int]] = {"a": [1], "c": [2], "b": [3]}
    commit_or_abort(rc, 0, [counted_only(write(rc, 0, first))])
    assert snapshots(catalog_properties, "db.a")[0]["summary"]["lakesink.batch-rows-digest"] == "1"
    catalogs.load(None, catalog_properties).drop_table(("db", "c"))  # (its files stay where they were)
    dropped = files_under(catalog_properties, "db.c")
    moved: dict[str | None, list[int]] = {"c": [1], "a": [2], "b": [3]}
    with pytest.raises(ReplayMismatchError, match="recorded the batch's rows as a count alone"):
        (replay if at_plan else commit_unchecked)(routed(catalog_properties), 0, moved)
    assert ids(catalog_properties, "db.a") == Counter([1]) and ids(catalog_properties, "db.b") == Counter([3])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()
    assert files_under(catalog_properties, "db.c") == dropped  # the replay's files deleted


@pytest.mark.parametrize("atomic", ["auto", "off"])
@pytest.mark.parametrize("at_plan", [True, False], ids=["checked-at-plan", "checked-in-the-loop"])
@pytest.mark.parametrize(
    "again",
    [{"a": [1, 2], "c": [3]}, {"a": [1, 2, 3]}, {"b": [3], "a": [1, 2], "c": [4]}],
    ids=["row-moved-to-another-table", "fewer-tables", "one-more-table"],
)
def test_a_replay_over_the_same_offsets_into_another_set_of_tables_is_a_loud_error(
    catalog_properties: dict[str, str], atomic: str, at_plan: bool, again: dict[str | None, list[int]]
) -> None:
    """The routing column is computed from a lookup that changed between the run and its replay: the same offsets send
    the batch's rows to another set of tables. Neither skipped in the tables that hold it while committed in the
    others (row 3 in db.b and db.c), nor committed anywhere: a loud error naming the tables."""
    run(routed(catalog_properties, atomic=atomic), 0, {"a": [1, 2], "b": [3]})
    rc = routed(catalog_properties, atomic=atomic)
    with pytest.raises(ReplayMismatchError, match=r"another set of tables.*db\.a") as e:
        (replay if at_plan else commit_unchecked)(rc, 0, again)
    assert "Nothing was committed or deleted in any table" in str(e.value)
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3])
    assert not exists(catalog_properties, "db.c") or ids(catalog_properties, "db.c") == Counter()
    for name in ("db.a", "db.b"):
        assert len(snapshots(catalog_properties, name)) == 1


def test_a_faithful_replay_completing_a_batch_table_by_table_is_still_completed(
    catalog_properties: dict[str, str], faults: Any
) -> None:
    """The rule's other half: a batch found in some of its tables, replayed over the same offsets into the same set of
    tables, completes the others (checked at plan time and in the loop)."""
    rc = routed(catalog_properties, atomic="off")
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 0, {"a": [1, 2], "b": [3], "c": [4]})
    faults.clear()
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter()
    out = replay(routed(catalog_properties, atomic="off"), 0, {"a": [1, 2], "b": [3], "c": [4]})
    assert out.tables["db.a"].outcome is Outcome.REPLAY_SKIPPED
    assert out.tables["db.b"].outcome is Outcome.COMMITTED and out.tables["db.c"].outcome is Outcome.COMMITTED
    assert ids(catalog_properties, "db.b") == Counter([3]) and ids(catalog_properties, "db.c") == Counter([4])
    digest = tables_digest(["db.a", "db.b", "db.c"])
    for name in ("db.a", "db.b", "db.c"):
        table = catalogs.load_table_fresh(None, catalog_properties, tuple(name.split(".")))
        marker = json.loads(table.properties[f"lakesink.last-batch.{Q}"])
        assert marker["tables"] == digest, name  # the marker records the batch's set of tables


def test_route_namespaces_keep_routed_tables_in_the_allowed_namespaces(catalog_properties: dict[str, str]) -> None:
    """A routing value can name any table of the catalog (option namespace is only the default of values naming
    none): with option route-namespaces, a value naming a table in another namespace fails the batch naming the value,
    the batch and the option, before anything is created or committed; values in the allowed namespaces land."""
    rc = routed(catalog_properties, **{"route-namespaces": "db, sales.eu"})
    not_allowed = r"'other\.payments' \(namespace 'other' is not one of option 'route-namespaces' \(db, sales\.eu\)\)"
    with pytest.raises(RoutingError, match=rf"batch 4: .*{not_allowed}"):
        run(rc, 4, {"a": [1], "other.payments": [2]})
    assert not exists(catalog_properties, "db.a") and not exists(catalog_properties, "other.payments")
    with pytest.raises(RoutingError, match="namespace 'sales' is not one of"):  # compared level by level, exactly
        rc.tables.routes(["sales.orders"], 5)
    with pytest.raises(RoutingError, match="namespace 'DB' is not one of"):  # case included
        rc.tables.routes(["DB.a"], 5)
    out = run(rc, 5, {"a": [1], "db.b": [2], "sales.eu.orders": [3]})
    assert {t: o.outcome for t, o in out.tables.items()} == {
        "db.a": Outcome.COMMITTED,
        "db.b": Outcome.COMMITTED,
        "sales.eu.orders": Outcome.COMMITTED,
    }
    assert ids(catalog_properties, "db.a") + ids(catalog_properties, "db.b") == Counter([1, 2])
    assert ids(catalog_properties, "sales.eu.orders") == Counter([3])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"route-namespaces": ""}, "comma-separated list"),
        ({"route-namespaces": "db,,x"}, "without empty items"),
        ({"route-namespaces": "db, a b"}, r"'a b': each level must be"),
        ({"route-namespaces": "x"}, r"option 'namespace' 'db' is not one of option 'route-namespaces' \(x\)"),
    ],
)
def test_route_namespaces_is_checked_when_the_sink_is_made(
    catalog_properties: dict[str, str], extra: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        options(catalog_properties, **extra)


def test_route_namespaces_needs_route_by() -> None:
    with pytest.raises(InvalidOptionError, match=r"'route-namespaces'.* need option 'route-by'"):
        SinkOptions.from_mapping({"table": "db.t", "route-namespaces": "db"})


def test_foreach_batch_takes_route_namespaces_as_a_list_or_a_string() -> None:
    import lakesink

    for given in (["db", "sales.eu"], "db,sales.eu"):
        sink = lakesink.foreach_batch(route_by="route", namespace="db", route_namespaces=given)
        assert sink.options.routing is not None
        assert sink.options.routing.allowed_namespaces == (("db",), ("sales", "eu"))


def _replay_with_template(
    rc: RoutedCommitter, batch_id: int, data: Mapping[str | None, Sequence[int]], **kw: Any
) -> RoutedOutcome:
    """The replay as format("lakesink") runs it in a new run: no table planned, every row written with the template."""
    return commit_or_abort(rc, batch_id, [write(rc, batch_id, data, template=True)], **kw)


@pytest.mark.parametrize(
    "how",
    [replay, commit_unchecked, _replay_with_template],
    ids=["foreach-checked-at-plan", "foreach-checked-in-the-loop", "format-lakesink-template"],
)
def test_a_replay_completing_a_batch_that_moves_rows_between_the_same_tables_is_a_loud_error(
    catalog_properties: dict[str, str], faults: Any, how: Any
) -> None:
    """Issue 30: atomic=off, a crash between the two tables' commits of batch 0 (db.a committed, db.b not), then a
    replay over the same offsets whose route (a lookup that changed meanwhile) swaps the rows of db.a and db.b: the same
    set of tables, the same row counts. Completing db.b would commit ids 1 and 2 twice and lose 3 and 4: a loud error,
    nothing committed in either table; the documented recovery (the route restored) then completes the batch."""
    first: dict[str | None, list[int]] = {"a": [1, 2], "b": [3, 4]}
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(routed(catalog_properties, atomic="off"), 0, first)
    faults.clear()
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter()
    marker = json.loads(catalogs.load_table_fresh(None, catalog_properties, ("db", "a")).properties[f"lakesink.last-batch.{Q}"])
    assert marker["rows"].startswith("2:")  # the rows the batch routed to db.a, recorded with its commit
    swapped: dict[str | None, list[int]] = {"a": [3, 4], "b": [1, 2]}
    with pytest.raises(ReplayMismatchError, match=r"other rows to table\(s\) that hold it: db\.a") as e:
        how(routed(catalog_properties, atomic="off"), 0, swapped)
    assert "not yet in db.b" in str(e.value) and "Nothing was committed in any table" in str(e.value)
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter()
    assert len(snapshots(catalog_properties, "db.a")) == 1 and files_under(catalog_properties, "db.b") == []
    # the recovery: the route restored, the batch replayed: completed in db.b, every id once
    out = how(routed(catalog_properties, atomic="off"), 0, first)
    assert out.tables["db.a"].outcome is Outcome.REPLAY_SKIPPED and out.tables["db.b"].outcome is Outcome.COMMITTED
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3, 4])


@pytest.mark.parametrize("atomic", ["auto", "off"])
def test_a_replay_found_in_every_table_is_skipped_even_when_it_routes_rows_otherwise(
    catalog_properties: dict[str, str], atomic: str
) -> None:
    """The check's other half: a batch found in all its tables has nothing to complete, so a replay that routes its rows
    otherwise among the same tables is skipped everywhere (format("lakesink") writes every row again and compares)."""
    run(routed(catalog_properties, atomic=atomic), 0, {"a": [1, 2], "b": [3, 4]})
    out = _replay_with_template(routed(catalog_properties, atomic=atomic), 0, {"a": [3, 4], "b": [1, 2]})
    assert {o.outcome for o in out.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert ids(catalog_properties, "db.a") == Counter([1, 2]) and ids(catalog_properties, "db.b") == Counter([3, 4])


def test_format_lakesink_records_an_empty_batch_in_the_tables_of_the_previous_batch(catalog_properties: dict[str, str]) -> None:
    """format("lakesink") commits in a commit worker that keeps nothing between batches (a new RoutedCommitter each
    time): an empty routed batch is recorded in the tables of option namespace that hold the sink's last batch, found
    in the catalog, so that ``lakesink verify`` sees no gap (before: recorded nowhere, "batch id(s) 1 missing")."""
    from lakesink.audit.invariants import verify

    run(routed(catalog_properties), 0, {"a": [1], "b": [2]}, template=True)
    out = routed(catalog_properties).commit_batch(BatchCall(Q, 1, OFFSETS), [])
    assert set(out.tables) == {"db.a", "db.b"} and {o.outcome for o in out.tables.values()} == {Outcome.EMPTY}
    run(routed(catalog_properties), 2, {"a": [3]}, template=True)
    last = snapshots(catalog_properties, "db.a")[-1]
    assert last["batch_id"] == 2 and last["summary"]["lakesink.previous-batch-id"] == "1"
    report = verify(catalogs.load_table_fresh(None, catalog_properties, ("db", "a")))
    assert not report.violations, report.violations
    assert ids(catalog_properties, "db.a") == Counter([1, 3]) and ids(catalog_properties, "db.b") == Counter([2])
    # the replay of the empty batch (a crash before Spark's commit log) records nothing twice
    again = routed(catalog_properties).commit_batch(BatchCall(Q, 1, OFFSETS), [])
    assert {o.outcome for o in again.tables.values()} <= {Outcome.EMPTY, Outcome.REPLAY_SKIPPED}


def _not_utf8_rows(users: Sequence[bytes]) -> pa.RecordBatch:
    """Rows of table a whose ``user`` holds the given bytes as strings (a binary column cast to string in Spark)."""
    n = len(users)
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(1, n + 1), pa.int64()),
            "user": pa.array(list(users), pa.binary()).view(pa.string()),
            "route": pa.array(["a"] * n, pa.string()),
        },
        schema=SCHEMA,
    )


_NOT_UTF8 = pytest.mark.parametrize(
    "users",
    [[b"ok", b"\xff\xfe bad"], [b"a", b"b\xff", b"c"]],
    ids=["a-files-bound", "neither-bound"],  # before: a bare UnicodeDecodeError; a file holding it silently
)


@_NOT_UTF8
def test_a_string_that_is_not_utf8_fails_the_task_naming_table_and_column(
    catalog_properties: dict[str, str], users: list[bytes]
) -> None:
    """Issue 30, item 2b: an Iceberg string is UTF-8; a value that is not is refused before it is written, with an error
    that names the table, the column and the fix, and the task leaves no file."""
    rc = routed(catalog_properties)
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes({"a"}, 0), Q), Q, template=False)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0))
    with pytest.raises(SchemaMismatchError, match=r"column 'user' of table db\.a .* 1 row\(s\) .* not UTF-8") as e:
        writer.write([_not_utf8_rows(users)])
    assert "dead-letter-table" in str(e.value)
    assert files_under(catalog_properties, "db.a") == [] and ids(catalog_properties, "db.a") == Counter()


@_NOT_UTF8
def test_a_string_that_is_not_utf8_is_a_dead_letter_with_a_dead_letter_table(
    catalog_properties: dict[str, str], users: list[bytes]
) -> None:
    rc = routed(catalog_properties, **{"dead-letter-table": "db.dead"})
    plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes({"a"}, 0), Q), Q, template=False)
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0))
    bad = [i + 1 for i, u in enumerate(users) if not _is_utf8(u)]
    commit_or_abort(rc, 0, [writer.write([_not_utf8_rows(users)])])
    assert ids(catalog_properties, "db.a") == Counter(i for i in range(1, len(users) + 1) if i not in bad)
    dead = catalogs.load_table_fresh(None, catalog_properties, ("db", "dead")).scan().to_arrow().to_pylist()
    assert Counter((json.loads(r["row"])["id"], r["error"], r["column"]) for r in dead) == Counter(
        (i, "not-utf8", "user") for i in bad
    )


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_an_invalid_route_is_checked_before_a_string_that_is_not_utf8(catalog_properties: dict[str, str]) -> None:
    """Invalid routes are checked first (docs/dead-letters.md): a task whose rows hold both, in any order, fails with
    the RoutingError naming the routing value, as before the UTF-8 check existed."""
    rc = routed(catalog_properties)
    plan = rc.tables.routed_plan({}, Q, template=True)
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([1, 2], pa.int64()),
            "user": pa.array([b"\xc3\xff", b"ok"], pa.binary()).view(pa.string()),
            "route": pa.array([b"a", b"\xff"], pa.binary()).view(pa.string()),
        },
        schema=SCHEMA,
    )
    writer = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0))
    with pytest.raises(RoutingError, match="not valid UTF-8"):
        writer.write([batch])


def test_a_batch_opening_many_tables_reads_them_at_once_and_asks_for_their_namespace_once(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch routing to 12 tables, 2 of them existing: their plans read the tables in one catalog query (no
    load per table), ask for the namespace once in the process (not once per table created), create the other 10
    (together: lakesink.driver.catalogs.create_at_once), and open the 2 as they are. Then the namespace is dropped
    behind the process's back (its tables with it) and a new sink's batch routes to 2 new tables there: the creation
    together says the namespace is gone, each table then creates itself, the namespace is made again, both tables are
    created and committed, every id once."""
    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace("db")
    for name in ("t00", "t01"):
        catalog.create_table(("db", name), schema=Schema(NestedField(1, "id", LongType(), required=False)))
    rc = routed(catalog_properties)
    calls: Counter[str] = Counter()
    for method in ("load_table", "create_namespace_if_not_exists", "create_table"):
        real = getattr(rc.tables.catalog, method)

        def counted(*a: Any, _real: Any = real, _name: str = method, **k: Any) -> Any:
            try:
                return _real(*a, **k)
            except NoSuchTableError:
                calls[f"{_name} (not found)"] += 1
                raise
            finally:
                calls[_name] += 1

        monkeypatch.setattr(rc.tables.catalog, method, counted)
    routes = rc.tables.routes([f"t{i:02d}" for i in range(12)], 0)
    plans = rc.tables.plans(routes, Q)
    assert sorted(plans) == [f"db.t{i:02d}" for i in range(12)]
    # no table looked for one by one before it is created (on main 8da9c98: 10 lookups not found, 10 namespace asks)
    assert calls["load_table (not found)"] == 0, calls
    # the 10 created together, in one catalog transaction (before 2026-11-26: 10 create_table calls)
    assert (calls["create_table"], calls["create_namespace_if_not_exists"]) == (0, 1), calls
    assert sorted(catalog.list_tables("db")) == [("db", f"t{i:02d}") for i in range(12)]
    assert {n: p.table_uuid for n, p in plans.items() if n in ("db.t00", "db.t01")} == {
        f"db.{n}": str(catalog.load_table(("db", n)).metadata.table_uuid) for n in ("t00", "t01")
    }
    monkeypatch.undo()
    for ident in catalog.list_tables("db"):
        catalog.drop_table(ident)
    catalog.drop_namespace("db")
    again = routed(catalog_properties)  # the process's one catalog object: it made "db" before, in its view
    run(again, 0, {"n1": [1, 2], "n2": [3]})
    assert {n: table_ids(catalog.load_table(("db", n))) for n in ("n1", "n2")} == {"n1": Counter([1, 2]), "n2": Counter([3])}


def loads_of(rc: RoutedCommitter, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The tables the routed committer's catalog loads (parses) from now on, in order (until monkeypatch.undo())."""
    loads: list[tuple[str, ...]] = []
    real = rc.tables.catalog.load_table

    def counted(ident: Any, *a: Any, **k: Any) -> Any:
        loads.append(tuple(ident))
        return real(ident, *a, **k)

    monkeypatch.setattr(rc.tables.catalog, "load_table", counted)
    return loads


def test_format_lakesink_opens_the_tables_it_wrote_at_the_start_of_a_run_with_one_read_each_at_most(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """format("lakesink") at the start of a run plans the tables of option ``namespace`` that the query wrote: 6 of
    them (and one it did not write, planned by none) are read in one catalog query, which serves the location check
    against the namespace's tables too, and each is opened as read -- every table read once at most (on main 3399c05:
    14 loads, each table twice: once to find the query's marker, once for the location check, with the tables this
    process had just committed read again). Only the planned tables are kept for their next read. Their plans are the
    tables' own (UUIDs), and the run's next batch commits each id once."""
    data: dict[str | None, list[int]] = {f"w{i}": [i] for i in range(6)}
    run(routed(catalog_properties), 0, data)
    catalog = catalogs.load(None, catalog_properties)
    catalog.create_table(("db", "other"), schema=Schema(NestedField(1, "id", LongType(), required=False)))
    rc = routed(catalog_properties)  # a new run
    loads = loads_of(rc, monkeypatch)
    plans = rc.tables.written_plans(Q)
    assert sorted(plans) == [f"db.w{i}" for i in range(6)]
    assert len(loads) <= 7 and len(loads) == len(set(loads)), loads  # one read of each table at most
    # kept for their next read: the tables planned, not the one only looked at (a namespace of many large tables the
    # stream does not write must not stay in the driver's memory)
    loads.clear()
    seam_commit.load_table(rc.tables.catalog, ("db", "w0"))
    assert loads == []
    seam_commit.load_table(rc.tables.catalog, ("db", "other"))
    assert loads == [("db", "other")]
    monkeypatch.undo()
    assert {n: p.table_uuid for n, p in plans.items()} == {
        n: str(catalog.load_table(tuple(n.split("."))).metadata.table_uuid) for n in plans
    }
    run(rc, 1, {f"w{i}": [10 + i] for i in range(6)})
    assert {f"w{i}": table_ids(catalog.load_table(("db", f"w{i}"))) for i in range(6)} == {
        f"w{i}": Counter([i, 10 + i]) for i in range(6)
    }


def test_the_location_check_does_not_keep_the_namespaces_other_tables(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first batch creating a table in a namespace of 3 other tables checks its location against theirs (read in
    one catalog query) without keeping them for a next read: the driver keeps the tables it writes, not every table
    of the namespaces it writes into."""
    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace("db")
    for name in ("a", "b", "c"):
        catalog.create_table(("db", name), schema=Schema(NestedField(1, "id", LongType(), required=False)))
    rc = routed(catalog_properties)
    run(rc, 0, {"n1": [1, 2]})
    loads = loads_of(rc, monkeypatch)
    for name in ("a", "b", "c", "n1"):
        seam_commit.load_table(rc.tables.catalog, ("db", name))
    assert loads == [("db", "a"), ("db", "b"), ("db", "c")]  # n1 kept (written), the others read anew
    monkeypatch.undo()
    assert table_ids(catalog.load_table(("db", "n1"))) == Counter([1, 2])
