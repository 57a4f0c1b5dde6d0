"""format("lakesink") with option payload, without Spark: the staging tasks (lakesink.executor.staged) and the commit
(lakesink.sink.staged) driven directly on a real SQLite catalog -- the tables created from the tasks' joined payload
inferences, a key's rows in two tasks resolved over the whole batch, a replay skipped before any table file is
written, the staged files of an aborted batch (and a killed run's leftovers) deleted, later batches' kept."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa

from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedTaskResult, StagedTaskWriter
from lakesink.options import SinkOptions
from lakesink.sink.staged import StagedCommitter, staged_plan
from tests.support.helpers import lakesink_snapshots

RAW = pa.schema([("route", pa.string()), ("op", pa.string()), ("seq", pa.int64()), ("doc", pa.string())])


def _committer(props: dict[str, str], ck: Path, query_id: str) -> StagedCommitter:
    options = SinkOptions.from_mapping(
        {
            "route-by": "route",
            "payload": "doc",
            "upsert-key": "id",
            "delete-when": "op = 'd'",
            "order-by": "seq",
            "checkpointLocation": str(ck),
            **{f"catalog.{k}": v for k, v in props.items()},
        }
    )
    routed = RoutedCommitter(options, RAW)
    return StagedCommitter(routed, staged_plan(options, RAW, routed, query_id))


def _stage(
    c: StagedCommitter, query_id: str, batch_id: int, partition: int, rows: list[tuple[str, str, int, object]]
) -> StagedTaskResult:
    batch = pa.record_batch(
        [
            pa.array([r[0] for r in rows]),
            pa.array([r[1] for r in rows]),
            pa.array([r[2] for r in rows], pa.int64()),
            pa.array([json.dumps(r[3]) for r in rows]),
        ],
        schema=RAW,
    )
    writer = StagedTaskWriter(
        c.plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=partition, task_attempt_id=partition, run_id="run-1")
    )
    return writer.write(iter([batch]))


def _staged(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.rglob("*.parquet"))


def test_a_staged_batch_commits_once_and_leaves_no_staged_file(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    ck, query_id = tmp_path / "ck", str(uuid.uuid4())
    c = _committer(catalog_properties, ck, query_id)
    # two tasks; key 1 of db.a in both (the later order wins over the whole batch), db.b only in the second
    t0 = _stage(c, query_id, 0, 0, [("db.a", "c", 1, {"id": 1, "x": "old"}), ("db.a", "c", 2, {"id": 2, "x": "two"})])
    t1 = _stage(c, query_id, 0, 1, [("db.a", "u", 3, {"id": 1, "x": "new", "y": 1.5}), ("db.b", "c", 4, {"id": 9, "k": True})])
    assert len(_staged(ck)) == 2 and t0.file is not None and t1.rows == 2
    out = c.commit_batch(BatchCall(query_id, 0, None, "run-1"), [t0, t1])
    assert sorted(out.committed) == ["db.a", "db.b"]
    catalog = c.routed.tables.catalog
    a = catalog.load_table(("db", "a"))
    assert a.schema().column_names == ["id", "x", "y"]  # the two tasks' inferences joined
    assert sorted(a.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "x": "new", "y": 1.5},
        {"id": 2, "x": "two", "y": None},
    ]
    assert catalog.load_table(("db", "b")).scan().to_arrow().to_pylist() == [{"id": 9, "k": True}]
    assert _staged(ck) == []  # swept by the commit

    # the replay of batch 0 (a kill after the swap): staged again by new tasks, found committed in every table before
    # any table file is written, swept; a delete carrying only the key in batch 1
    again = _committer(catalog_properties, ck, query_id)
    r0 = _stage(again, query_id, 0, 0, [("db.a", "c", 1, {"id": 1, "x": "old"}), ("db.a", "c", 2, {"id": 2, "x": "two"})])
    r1 = _stage(
        again, query_id, 0, 1, [("db.a", "u", 3, {"id": 1, "x": "new", "y": 1.5}), ("db.b", "c", 4, {"id": 9, "k": True})]
    )
    data = sorted(p.name for p in (tmp_path / "warehouse").rglob("*.parquet"))
    replay = again.commit_batch(BatchCall(query_id, 0, None, "run-2"), [r0, r1])
    assert {o.outcome for o in replay.tables.values()} == {Outcome.REPLAY_SKIPPED}
    assert sorted(p.name for p in (tmp_path / "warehouse").rglob("*.parquet")) == data  # no table file written
    assert _staged(ck) == []
    d = _stage(again, query_id, 1, 0, [("db.a", "d", 5, {"id": 2})])
    again.commit_batch(BatchCall(query_id, 1, None, "run-2"), [d])
    a = catalog.load_table(("db", "a"))
    assert a.scan().to_arrow().to_pylist() == [{"id": 1, "x": "new", "y": 1.5}]
    assert [s["batch_id"] for s in lakesink_snapshots(a)] == [0, 1]


def test_an_abort_deletes_the_batchs_staged_files_and_a_killed_runs_but_keeps_later_batches(
    catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    ck, query_id = tmp_path / "ck", str(uuid.uuid4())
    c = _committer(catalog_properties, ck, query_id)
    _stage(c, query_id, 2, 0, [("db.a", "c", 1, {"id": 1})])  # a killed run's leftover of an earlier batch
    failed = _stage(c, query_id, 3, 0, [("db.a", "c", 2, {"id": 2})])
    _stage(c, query_id, 3, 1, [("db.a", "c", 3, {"id": 3})])  # a task whose result Spark's abort does not pass
    later = _stage(c, query_id, 4, 0, [("db.a", "c", 4, {"id": 4})])
    assert len(_staged(ck)) == 4
    c.abort_batch(query_id=query_id, batch_id=3, results=[failed])
    assert later.file is not None and _staged(ck) == [Path(later.file).name]
    assert not c.routed.tables.catalog.table_exists(("db", "a"))  # nothing of it reached a table
