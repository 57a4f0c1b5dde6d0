"""The holes of issue 10 in the replay check, on real catalogs and real Parquet files (no Spark here; the
Spark versions of the same cases are in tests/sink/test_replay_identity_spark.py):

- a batch replayed over other source offsets is refused, never skipped (ReplayMismatchError);
- several sinks of one query writing one table: each exactly-once under its own sink id; the same id twice
  in one run is a loud DuplicateSinkError, never a silent skip;
- a table dropped and recreated, or a branch deleted, during a run: nothing committed into the new one;
- what crosses from tasks to the driver stays small, and the replay check does not walk the history.
"""

from __future__ import annotations

import pickle
from collections import Counter

import pyarrow as pa
import pytest

from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import DuplicateSinkError, ReplayMismatchError, TableIdentityChangedError
from lakesink.executor.messages import TaskIds, TaskResult
from lakesink.executor.task_writer import TaskWriter
from lakesink.options import SinkOptions, TableName
from lakesink.table.markers import SnapshotIndex, last_committed_batch
from tests.support.helpers import (
    arrow_rows,
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    load,
    sink_committer,
    table_ids,
)

SCHEMA = arrow_rows([]).schema
Q = "33333333-cccc-4000-8000-000000000003"
OFFSETS_A = '[{"logOffset":4}]'
OFFSETS_B = '[{"logOffset":7}]'
RUN1 = "run-1"
RUN2 = "run-2"


@pytest.fixture
def catalog_properties(any_catalog_properties: dict[str, str]) -> dict[str, str]:
    return any_catalog_properties


def sink(props: dict[str, str], *, sink_id: str | None = None, branch: str = "main") -> TableCommitter:
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=props, sink_id=sink_id, branch=branch))
    c.table.open_table(SCHEMA)
    return c


def write(c: TableCommitter, batch_id: int, ids: list[int], *, attempt: int = 0, run_id: str | None = RUN1) -> TaskResult:
    plan = c.write_plan(c.table.reload_table(), Q)
    writer = TaskWriter(plan, TaskIds(query_id=Q, batch_id=batch_id, partition_id=0, task_attempt_id=attempt, run_id=run_id))
    return writer.write(arrow_rows(ids).to_batches())


def commit(  # type: ignore[no-untyped-def]
    c: TableCommitter, batch_id: int, results: list[TaskResult], offsets: str | None = OFFSETS_A, run_id: str | None = RUN1
):
    return c.commit_batch(BatchCall(Q, batch_id, offsets, run_id), results)


# --- item 2: a replay over other input ---------------------------------------------------------------


def test_replay_over_other_offsets_is_refused_naming_both_and_commits_or_deletes_nothing(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    assert commit(c, 0, [write(c, 0, [1, 2])]).outcome is Outcome.COMMITTED
    before = (len(load(c).snapshots()), data_files_on_disk(load(c)))
    # the checkpoint was repaired: batch 0 re-planned over more input (ids 1..4), in a new run
    replay = write(c, 0, [1, 2, 3, 4], attempt=1, run_id=RUN2)
    with pytest.raises(ReplayMismatchError) as info:
        commit(c, 0, [replay], offsets=OFFSETS_B, run_id=RUN2)
    message = str(info.value)
    for part in ("db.events", Q, "batch 0", OFFSETS_A, OFFSETS_B, "restore the checkpoint"):
        assert part in message
    table = load(c)
    assert table_ids(table) == Counter([1, 2])
    assert len(table.snapshots()) == before[0]
    assert {f.path for f in replay.files} <= data_files_on_disk(table)  # nothing deleted either


def test_faithful_replay_with_the_same_offsets_is_skipped(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    commit(c, 0, [write(c, 0, [1, 2])])
    replay = write(c, 0, [1, 2], attempt=1, run_id=RUN2)
    # the same offsets, written with other JSON spacing, are the same offsets
    assert commit(c, 0, [replay], offsets='[ {"logOffset": 4} ]', run_id=RUN2).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter([1, 2])


def test_replay_detected_before_writing_is_checked_against_the_offsets_too(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    commit(c, 0, [write(c, 0, [1, 2])])
    plan = c.write_plan(c.table.reload_table(), Q)
    assert plan.last_committed_batch == 0
    skipped = TaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0, run_id=RUN2)).skip_replay(
        iter(())
    )
    with pytest.raises(ReplayMismatchError):
        commit(c, 0, [skipped], offsets=OFFSETS_B, run_id=RUN2)
    assert commit(c, 0, [skipped], offsets=OFFSETS_A, run_id=RUN2).outcome is Outcome.REPLAY_SKIPPED


def test_replay_of_an_older_batch_over_other_offsets_is_refused(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    commit(c, 0, [write(c, 0, [1])], offsets=OFFSETS_A)
    commit(c, 1, [write(c, 1, [2])], offsets=OFFSETS_B)
    with pytest.raises(ReplayMismatchError, match="batch 0"):
        commit(c, 0, [write(c, 0, [1, 9], attempt=2, run_id=RUN2)], offsets='[{"logOffset":5}]', run_id=RUN2)
    assert table_ids(load(c)) == Counter([1, 2])


def test_unreadable_offsets_are_said_in_the_log_and_the_replay_skipped(catalog_properties, caplog) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    commit(c, 0, [write(c, 0, [1])])
    with caplog.at_level("WARNING", logger="lakesink"):
        outcome = commit(c, 0, [write(c, 0, [1], attempt=1, run_id=RUN2)], offsets=None, run_id=RUN2)
    assert outcome.outcome is Outcome.REPLAY_SKIPPED
    assert "source offsets cannot be compared" in caplog.text and "not readable" in caplog.text


# --- item 3: several sinks of one query --------------------------------------------------------------


def test_two_sinks_with_their_own_ids_each_land_once_per_batch(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    a, b = sink(catalog_properties, sink_id="big"), sink(catalog_properties, sink_id="small")
    for batch_id in range(3):
        assert commit(a, batch_id, [write(a, batch_id, [batch_id * 10])]).outcome is Outcome.COMMITTED
        assert commit(b, batch_id, [write(b, batch_id, [batch_id * 10 + 1])]).outcome is Outcome.COMMITTED
    table = load(a)
    assert table_ids(table) == Counter([0, 1, 10, 11, 20, 21])
    sinks = [s["summary"].get("lakesink.sink-id") for s in lakesink_snapshots(table)]
    assert sinks == ["big", "small"] * 3
    assert last_committed_batch(table.properties, Q, "big").batch_id == 2  # type: ignore[union-attr]
    assert last_committed_batch(table.properties, Q, "small").batch_id == 2  # type: ignore[union-attr]
    assert last_committed_batch(table.properties, Q) is None


def test_same_sink_id_twice_in_one_run_is_a_loud_error_naming_sink_id(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    first, second = sink(catalog_properties), sink(catalog_properties)
    commit(first, 0, [write(first, 0, [1, 2])])
    extra = write(second, 0, [3, 4])
    with pytest.raises(DuplicateSinkError, match="sink_id") as info:
        commit(second, 0, [extra])
    assert "same run" in str(info.value)
    table = load(first)
    assert table_ids(table) == Counter([1, 2])
    assert {f.path for f in extra.files}.isdisjoint(data_files_on_disk(table))


def test_same_sink_id_twice_is_refused_before_writing_too(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    """foreach_batch finds the batch committed when it plans: the second call of the same run must not be a skip."""
    first, second = sink(catalog_properties), sink(catalog_properties)
    commit(first, 0, [write(first, 0, [1, 2])])
    plan = second.write_plan(second.table.reload_table(), Q)
    skipped = TaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0, run_id=RUN1)).skip_replay(
        iter(())
    )
    with pytest.raises(DuplicateSinkError):
        commit(second, 0, [skipped])


def test_kill_between_two_sinks_then_restart_lands_each_once(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    a, b = sink(catalog_properties, sink_id="a"), sink(catalog_properties, sink_id="b")
    commit(a, 0, [write(a, 0, [1])])
    commit(b, 0, [write(b, 0, [2])])
    commit(a, 1, [write(a, 1, [3])])
    # the driver died here, before sink b wrote batch 1; the restarted run replays batch 1 through both sinks
    a2, b2 = sink(catalog_properties, sink_id="a"), sink(catalog_properties, sink_id="b")
    assert commit(a2, 1, [write(a2, 1, [3], attempt=5, run_id=RUN2)], run_id=RUN2).outcome is Outcome.REPLAY_SKIPPED
    assert commit(b2, 1, [write(b2, 1, [4], attempt=5, run_id=RUN2)], run_id=RUN2).outcome is Outcome.COMMITTED
    table = load(a)
    assert table_ids(table) == Counter([1, 2, 3, 4])
    assert_snapshot_invariants(table)


def test_each_sinks_marker_survives_expiry_of_its_snapshots(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    a, b = sink(catalog_properties, sink_id="a"), sink(catalog_properties, sink_id="b")
    commit(a, 0, [write(a, 0, [1])])
    commit(b, 0, [write(b, 0, [2])])
    table = load(a)
    table.append(arrow_rows([100]))  # another writer, so that both sinks' snapshots can expire
    table = load(a)
    old = [s.snapshot_id for s in table.snapshots()][:-1]
    table.maintenance.expire_snapshots().by_ids(old).commit()
    assert len(load(a).snapshots()) == 1
    for s, ids in ((a, [1]), (b, [2])):
        assert commit(s, 0, [write(s, 0, ids, attempt=3, run_id=RUN2)], run_id=RUN2).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(a)) == Counter([1, 2, 100])


def test_main_and_audit_branch_from_one_query_with_sink_ids(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    main = sink(catalog_properties, sink_id="main")
    audit = sink(catalog_properties, sink_id="audit", branch="audit")
    for batch_id in range(2):
        commit(main, batch_id, [write(main, batch_id, [batch_id])])
        commit(audit, batch_id, [write(audit, batch_id, [100 + batch_id])])
    table = load(main)
    assert table_ids(table) == Counter([0, 1])
    audit_head = table.metadata.snapshot_by_name("audit")
    assert audit_head is not None
    rows = table.scan(snapshot_id=audit_head.snapshot_id).to_arrow()
    assert Counter(rows["id"].to_pylist()) == Counter([100, 101])


# --- item 4: the table or the branch changes identity ------------------------------------------------


def test_table_dropped_and_recreated_elsewhere_gets_nothing_of_the_batch(catalog_properties, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    commit(c, 0, [write(c, 0, [1])])
    pending = write(c, 1, [2, 3])  # written for the old table
    c.table.catalog.drop_table(("db", "events"))
    other = tmp_path / "elsewhere"
    c.table.catalog.create_table(("db", "events"), schema=load_schema(c, pending), location=f"file://{other}")
    with pytest.raises(TableIdentityChangedError, match="dropped and recreated"):
        commit(c, 1, [pending])
    table = load(c)
    assert table.current_snapshot() is None and table.location() == f"file://{other}"
    assert not any(p.exists() for p in (other / "data").rglob("*.parquet")) if (other / "data").exists() else True


def load_schema(c: TableCommitter, result: TaskResult):  # type: ignore[no-untyped-def]
    from lakesink._pyiceberg import io as seam

    return seam.new_table_schema(SCHEMA)


def test_branch_deleted_mid_run_is_not_recreated_as_a_root(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties, branch="audit")
    commit(c, 0, [write(c, 0, [1])])
    pending = write(c, 1, [2])
    load(c).manage_snapshots().remove_branch("audit").commit()
    with pytest.raises(TableIdentityChangedError, match="branch 'audit'.*deleted"):
        commit(c, 1, [pending])
    table = load(c)
    assert "audit" not in table.metadata.refs
    assert all(s.parent_snapshot_id is not None or s.snapshot_id == table.snapshots()[0].snapshot_id for s in table.snapshots())
    # a restart does not silently recreate it either
    with pytest.raises(TableIdentityChangedError, match="CREATE BRANCH"):
        sink(catalog_properties, branch="audit")


# --- item 6: weight on the driver, and the replay check's cost -----------------------------------------


def test_task_results_carry_a_schema_digest_not_the_schema(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    wide = pa.schema([pa.field("id", pa.int64())] + [pa.field(f"column_{i:04d}", pa.string()) for i in range(1000)])
    c.table.catalog.drop_table(("db", "events"))
    c.table.open_table(wide)
    plan = c.write_plan(c.table.reload_table(), Q)
    batch = pa.record_batch([pa.array([1], pa.int64())] + [pa.array(["x"]) for _ in range(1000)], schema=wide)
    result = TaskWriter(plan, TaskIds(query_id=Q, batch_id=0, partition_id=0, task_attempt_id=0)).write([batch])
    without_files = pickle.dumps(TaskResult(**{**result.__dict__, "files": ()}))
    assert len(pickle.dumps(plan.schema)) > 50_000  # what each result carried before
    assert len(without_files) < 2_000
    assert commit(c, 0, [result]).outcome is Outcome.COMMITTED


HISTORY = 40


def test_replay_check_visits_only_the_commits_since_the_marker(catalog_properties, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    c = sink(catalog_properties)
    table = load(c)
    # history that is not ours: 40 commits, 8 times the walk's bound below (a walk into the history fails). Each
    # pyiceberg commit deep-copies the table metadata, all snapshots included: n commits cost O(n^2), 150 took 30 s
    for i in range(HISTORY):
        table.append(arrow_rows([10_000 + i]))
    commit(c, 0, [write(c, 0, [1])])
    table = load(c)
    for i in range(3):  # three commits of other writers since our batch
        table.append(arrow_rows([20_000 + i]))
    table = load(c)
    visited: list[int] = []
    real = SnapshotIndex.ancestors

    def counting(self: SnapshotIndex, head):  # type: ignore[no-untyped-def]
        for s in real(self, head):
            visited.append(s.snapshot_id)
            yield s

    monkeypatch.setattr(SnapshotIndex, "ancestors", counting)
    index = SnapshotIndex(table.metadata)
    done = c.table.last(table, Q, index=index)
    assert done is not None and done.batch_id == 0
    assert len(table.snapshots()) == HISTORY + 4 and len(visited) <= 5
    assert len(index.by_id) <= 5  # the snapshots indexed: the newest few, not the history


# --- item 8: an abort racing a commit still in flight (format("lakesink")) ---------------------------


def test_abort_in_another_worker_waits_for_the_commit_in_flight(catalog_properties, tmp_path, faults) -> None:  # type: ignore[no-untyped-def]
    """What Spark would do if query.stop() interrupted commit(): abort() in another worker with the complete
    messages while the first worker is between its manifests and the swap. The abort must wait for the commit's
    outcome (here: landed) and keep the files the table then references.

    (pyspark 4.3 itself waits for commit() to return before it aborts: tests/sink/test_replay_identity_spark.py.)"""
    import json
    import threading
    from pathlib import Path

    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from lakesink.faults import DRIVER_BEFORE_SWAP
    from lakesink.options import SinkOptions
    from lakesink.sink.datasource import stream_writer

    ck = tmp_path / "checkpoint"
    (ck / "offsets").mkdir(parents=True)
    (ck / "metadata").write_text(json.dumps({"id": Q}))
    (ck / "offsets" / "0").write_text('v1\n{}\n{"logOffset":0}\n')
    options = {"table": "db.events", "checkpointLocation": str(ck), **{f"catalog.{k}": v for k, v in catalog_properties.items()}}
    schema = StructType([StructField("id", LongType()), StructField("user", StringType())])
    committing = stream_writer(SinkOptions.from_spark_options(options, overwrite=False), schema)
    aborting = stream_writer(SinkOptions.from_spark_options(options, overwrite=False), schema)
    c = sink(catalog_properties)
    result = write(c, 0, [1, 2, 3])
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    errors: list[BaseException] = []
    committer = threading.Thread(target=lambda: committing.commit([result], 0))
    committer.start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)

    def abort() -> None:
        try:
            aborting.abort([result], 0)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    aborter = threading.Thread(target=abort)
    aborter.start()
    aborter.join(3)
    assert aborter.is_alive(), "the abort did not wait for the commit in flight"
    faults.release(DRIVER_BEFORE_SWAP)
    committer.join(120)
    aborter.join(120)
    assert not errors
    table = load(c)
    assert table_ids(table) == Counter([1, 2, 3])
    assert all(Path(f.path.removeprefix("file://")).exists() for f in result.files)


# --- table properties: parsed once, on the driver, before any task runs -------------------------------


def test_a_bad_table_property_fails_the_plan_on_the_driver_naming_it(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    from lakesink.errors import InvalidOptionError

    c = sink(catalog_properties)
    load(c).transaction().set_properties({"write.target-file-size-bytes": "lots"}).commit_transaction()
    with pytest.raises(InvalidOptionError, match="table db.events.*write.target-file-size-bytes='lots' is not an integer"):
        c.write_plan(c.table.reload_table(), Q)
    load(c).transaction().set_properties(
        {"write.target-file-size-bytes": "1048576", "write.metadata.metrics.default": "sometimes"}
    ).commit_transaction()
    with pytest.raises(InvalidOptionError, match="table db.events has a table property lakesink's writer cannot use"):
        c.write_plan(c.table.reload_table(), Q)


def test_verify_accounts_for_each_sink_of_a_query_on_its_own(catalog_properties) -> None:  # type: ignore[no-untyped-def]
    from lakesink.audit import verify

    a, b = sink(catalog_properties, sink_id="a"), sink(catalog_properties, sink_id="b")
    for batch_id in range(3):
        commit(a, batch_id, [write(a, batch_id, [batch_id])])
        commit(b, batch_id, [write(b, batch_id, [100 + batch_id])])
    report = verify(load(a), show_progress=False)
    assert report.ok, report.human()
    assert sorted((q.sink_id, q.first_batch, q.last_batch) for q in report.queries) == [("a", 0, 2), ("b", 0, 2)]
    assert "(sink a)" in report.human()
