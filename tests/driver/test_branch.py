"""Write-audit-publish: option ``branch``, the branch-aware replay check, ``publish``."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from click.testing import CliRunner

import lakesink
from lakesink.cli import main
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import PublishRefusedError
from lakesink.options import SinkOptions, TableName
from lakesink.table.markers import last_committed_batch
from tests.support.helpers import arrow_rows, commit, load, make_committer, sink_committer, table_ids, write_task

Q = "44444444-dddd-4000-8000-000000000004"


def branch_committer(props: dict[str, str], branch: str = "audit") -> TableCommitter:
    return sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=props, branch=branch))


def ids_on(table: Any, branch: str) -> Counter[int]:
    table.refresh()
    head = table.metadata.snapshot_by_name(branch)
    return Counter(table.scan(snapshot_id=head.snapshot_id).to_arrow().column("id").to_pylist()) if head else Counter()


def cli(props: dict[str, str], *args: str) -> Any:
    return CliRunner().invoke(main, [*args, *[f"--catalog-property={k}={v}" for k, v in props.items()]])


def test_batches_commit_to_the_branch_only(catalog_properties: dict[str, str]) -> None:
    m = make_committer(catalog_properties)
    commit(m, "other-query", 0, [write_task(m, "other-query", 0, [1])])  # main has a snapshot: the branch starts there
    b = branch_committer(catalog_properties)
    commit(b, Q, 0, [write_task(b, Q, 0, [10, 11])])
    commit(b, Q, 1, [write_task(b, Q, 1, [12])])
    t = load(b)
    assert ids_on(t, "main") == Counter([1])
    assert ids_on(t, "audit") == Counter([1, 10, 11, 12])
    marker = last_committed_batch(t.properties, Q)
    assert marker is not None and (marker.batch_id, marker.branch) == (1, "audit")
    assert commit(b, Q, 1, [write_task(b, Q, 1, [12])]).outcome is Outcome.REPLAY_SKIPPED
    assert ids_on(load(b), "audit") == Counter([1, 10, 11, 12])


def test_a_batch_on_main_does_not_make_the_branch_skip(catalog_properties: dict[str, str]) -> None:
    b = branch_committer(catalog_properties)
    b.table.open_table(arrow_rows([]).schema)
    commit(b, Q, 0, [write_task(b, Q, 0, [1])])
    commit(b, Q, 1, [write_task(b, Q, 1, [2])])
    # the same query id's batch 2 lands on main (e.g. the query ran once without the option): the marker is main's
    m = make_committer(catalog_properties)
    commit(m, Q, 2, [write_task(m, Q, 2, [3])])
    assert last_committed_batch(load(m).properties, Q).branch == "main"  # type: ignore[union-attr]
    # Iceberg's Spark sink would look at main, see batch 2 and skip it on the branch: lakesink walks the branch
    assert commit(b, Q, 2, [write_task(b, Q, 2, [3])]).outcome is Outcome.COMMITTED
    assert ids_on(load(b), "audit") == Counter([1, 2, 3])
    assert lakesink.verify(load(b), branch="audit").ok


def test_a_reset_branch_replays_its_batches(catalog_properties: dict[str, str]) -> None:
    b = branch_committer(catalog_properties)
    b.table.open_table(arrow_rows([]).schema)
    for batch in range(3):
        commit(b, Q, batch, [write_task(b, Q, batch, [batch])])
    t = load(b)
    first = next(r.snapshot_id for r in lakesink.history(t) if r.batch_id == 0)
    t.manage_snapshots().remove_branch("audit").commit()
    load(b).manage_snapshots().create_branch(first, "audit").commit()  # the audit rejected batches 1 and 2
    assert ids_on(load(b), "audit") == Counter([0])
    # the marker still says batch 2, but its snapshot is not in the branch's history any more: batch 1 is replayed
    assert commit(b, Q, 1, [write_task(b, Q, 1, [1])]).outcome is Outcome.COMMITTED
    assert commit(b, Q, 1, [write_task(b, Q, 1, [1])]).outcome is Outcome.REPLAY_SKIPPED
    assert commit(b, Q, 2, [write_task(b, Q, 2, [2])]).outcome is Outcome.COMMITTED
    assert ids_on(load(b), "audit") == Counter([0, 1, 2])
    assert lakesink.verify(load(b), branch="audit").ok


def test_publish_fast_forwards_main_after_verify(catalog_properties: dict[str, str]) -> None:
    m = make_committer(catalog_properties)
    commit(m, "seed", 0, [write_task(m, "seed", 0, [1])])
    b = branch_committer(catalog_properties)
    commit(b, Q, 0, [write_task(b, Q, 0, [2])])
    commit(b, Q, 1, [write_task(b, Q, 1, [3])])
    before = load(b).metadata.snapshot_by_name("main").snapshot_id  # type: ignore[union-attr]
    r = cli(catalog_properties, "publish", "db.events", "--branch", "audit", "--json")
    assert r.exit_code == 0, r.output
    result = json.loads(r.output)
    t = load(b)
    assert result["main_before"] == before and result["main_after"] == t.metadata.snapshot_by_name("audit").snapshot_id  # type: ignore[union-attr]
    assert not result["forced"] and result["verify"]["ok"]
    assert ids_on(t, "main") == Counter([1, 2, 3]) == table_ids(t)


def test_publish_refuses_a_branch_that_fails_verify(catalog_properties: dict[str, str]) -> None:
    b = branch_committer(catalog_properties)
    b.table.open_table(arrow_rows([]).schema)
    commit(b, Q, 0, [write_task(b, Q, 0, [1])])
    load(b).append(arrow_rows([1]), branch="audit", snapshot_properties={"lakesink.query-id": Q, "lakesink.batch-id": "0"})
    base = load(b).metadata.snapshot_by_name("main")  # an empty table gets an empty snapshot to branch from
    assert base is not None and base.summary is not None and base.summary["lakesink.branch-base"] == "audit"
    r = cli(catalog_properties, "publish", "db.events", "--branch", "audit")
    assert r.exit_code == 1
    assert "publish refused" in r.output and f"batch 0 of query {Q} was committed 2 times" in r.output
    assert load(b).metadata.snapshot_by_name("main").snapshot_id == base.snapshot_id  # type: ignore[union-attr]
    r = cli(catalog_properties, "publish", "db.events", "--branch", "audit", "--force")
    assert r.exit_code == 0 and "FORCED" in r.output, r.output
    assert ids_on(load(b), "main") == Counter([1, 1])


def test_publish_refuses_when_main_moved(catalog_properties: dict[str, str]) -> None:
    m = make_committer(catalog_properties)
    commit(m, "seed", 0, [write_task(m, "seed", 0, [1])])
    b = branch_committer(catalog_properties)
    commit(b, Q, 0, [write_task(b, Q, 0, [2])])
    commit(m, "seed", 1, [write_task(m, "seed", 1, [3])])  # main moves on after the branch was made
    with pytest.raises(PublishRefusedError, match="is not an ancestor"):
        lakesink.publish(load(b), branch="audit")
    assert ids_on(load(b), "main") == Counter([1, 3])
    result = lakesink.publish(load(b), branch="audit", force=True)
    assert result.forced and ids_on(load(b), "main") == Counter([1, 2])


def test_publish_rechecks_a_commit_to_main_that_lands_during_its_swap(
    catalog_properties: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another engine commits to main after publish read the table and before its swap: the swap conflicts, the
    next attempt finds main is no longer behind the branch and refuses; the other engine's rows stay on main."""
    from lakesink.audit import publishing

    m = make_committer(catalog_properties)
    commit(m, "seed", 0, [write_task(m, "seed", 0, [1])])
    b = branch_committer(catalog_properties)
    commit(b, Q, 0, [write_task(b, Q, 0, [2])])
    real = publishing._Publish.prepare
    attempts: list[int] = []

    def racing(self: Any, table: Any, attempt: int) -> Any:
        attempts.append(attempt)
        if attempt == 1:
            load(m).append(arrow_rows([3]))  # another engine, on main, between the read and the swap
        return real(self, table, attempt)

    monkeypatch.setattr(publishing._Publish, "prepare", racing)
    with pytest.raises(PublishRefusedError, match="main moved to .* while publishing"):
        lakesink.publish(load(b), branch="audit")
    assert attempts == [1, 2]
    assert ids_on(load(b), "main") == Counter([1, 3]) and ids_on(load(b), "audit") == Counter([1, 2])


@pytest.mark.spark
def test_stream_writes_to_a_branch_then_publishes(stream: Any) -> None:
    stream.add_input(files=2, rows_per_file=30)
    stream.run(branch="audit")
    t = stream.table
    assert ids_on(t, "main") == Counter()
    assert ids_on(t, "audit") == Counter(stream.sent)
    stream.add_input(files=1, rows_per_file=30)
    stream.run(branch="audit")
    assert ids_on(stream.table, "audit") == Counter(stream.sent)
    report = lakesink.verify(stream.table, branch="audit")
    assert report.ok and [(q.first_batch, q.last_batch) for q in report.queries] == [(0, 2)], report.human()
    lakesink.publish(stream.table, branch="audit")
    stream.assert_exactly_once()
