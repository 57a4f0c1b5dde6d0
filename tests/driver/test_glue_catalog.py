"""The driver's commit protocol against AWS Glue: pyiceberg's GlueCatalog against moto's Glue server on loopback,
with the table's files in moto's S3, through the HTTP fault layer (tests/support/http_faults.py).

Glue's commit is pyiceberg's ``GlueCatalog.commit_table``: read the Glue table (and its ``VersionId``), check the
commit's requirements against it, write the new metadata file, ``UpdateTable`` with that ``VersionId`` -- AWS Glue
refuses a stale one (``ConcurrentModificationException``, pyiceberg's CommitFailedException). moto 5.2 does not
check the VersionId (test below): a commit racing another between its read and its update would overwrite it. The
fault proxy enforces it the way Glue does, so that lakesink's re-check is tested against the real lock's behaviour.
botocore re-sends a failed ``UpdateTable`` by itself (standard retry mode, ``glue.max-retries`` 10): a commit whose
answer was lost comes back as a conflict with its own first request.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import boto3
import pyarrow as pa
import pytest
from pyiceberg.table import Table

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchOutcome, Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.executor.messages import TaskResult
from lakesink.options import TableName
from tests.support.catalog_servers import glue_properties
from tests.support.helpers import (
    assert_snapshot_invariants,
    commit_at_offset,
    lakesink_snapshots,
    open_committer,
    table_ids,
    write_reloaded_task,
)
from tests.support.http_faults import FaultProxy
from tests.support.s3 import ACCESS_KEY, REGION, SECRET_KEY

Q = "44444444-dddd-4000-8000-000000000004"
DATABASE = "lakesink_db"
"""A Glue database per test: moto's Glue is one catalog for the whole session (the property below names it)."""


def committer(props: dict[str, str]) -> TableCommitter:
    return open_committer(props, table=TableName((props[DATABASE],), "events"))


def write_task(c: TableCommitter, batch_id: int, ids: list[int], attempt: int = 0) -> TaskResult:
    return write_reloaded_task(c, Q, batch_id, ids, attempt)


def commit(c: TableCommitter, batch_id: int, results: list[TaskResult]) -> BatchOutcome:
    return commit_at_offset(c, Q, batch_id, results)


def table(props: dict[str, str]) -> Table:
    return catalogs.load_table_fresh(None, props, (props[DATABASE], "events"))


def assert_exactly_once(props: dict[str, str], sent: Counter[int]) -> Table:
    t = table(props)
    for snap in t.snapshots():  # every manifest list, manifest and data file the table references can be read
        for manifest in snap.manifests(t.io):
            for entry in manifest.fetch_manifest_entry(t.io, discard_deleted=False):
                assert t.io.new_input(entry.data_file.file_path).exists(), entry.data_file.file_path
    assert table_ids(t) == sent
    assert_snapshot_invariants(t)
    return t


def _other_writer(props: dict[str, str], ids: list[int]) -> None:
    t = table(props)
    t.append(pa.table({"id": pa.array(ids, pa.int64()), "user": pa.array(["other"] * len(ids))}))


def test_moto_does_not_enforce_glues_version_id(moto_server: Any) -> None:
    """What moto does with Glue's optimistic lock: it accepts an UpdateTable with a stale VersionId (AWS Glue
    refuses it). If this fails, moto enforces it now and the proxy's enforcement can go."""
    glue = boto3.client(
        "glue", endpoint_url=moto_server.endpoint, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )  # fmt: skip
    glue.create_database(DatabaseInput={"Name": "versioncheck"})
    glue.create_table(DatabaseName="versioncheck", TableInput={"Name": "t", "Parameters": {"v": "0"}})
    current = glue.get_table(DatabaseName="versioncheck", Name="t")["Table"]["VersionId"]
    glue.update_table(DatabaseName="versioncheck", TableInput={"Name": "t", "Parameters": {"v": "1"}}, VersionId=current)
    glue.update_table(DatabaseName="versioncheck", TableInput={"Name": "t", "Parameters": {"v": "2"}}, VersionId=current)
    assert glue.get_table(DatabaseName="versioncheck", Name="t")["Table"]["Parameters"] == {"v": "2"}


def test_without_the_version_check_a_racing_commit_is_lost(moto_server: Any) -> None:
    """Why the proxy enforces it: on moto alone, another writer committing between pyiceberg's read of the Glue
    table and its UpdateTable is silently overwritten (a lost update; lakesink's re-check cannot see it: both
    swaps 'succeed'). AWS Glue refuses the second UpdateTable instead."""
    proxy = FaultProxy(moto_server.endpoint).start()
    try:
        props = glue_properties(moto_server, proxy.uri, **{DATABASE: f"db_{uuid.uuid4().hex[:8]}"})
        sink = committer(props)
        result = write_task(sink, 0, [1, 2])
        proxy.arm("commit", "call-before", call=lambda: _other_writer(props, [-1]))
        assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
        assert table_ids(table(props)) == Counter([1, 2])  # the other writer's row is gone
    finally:
        proxy.stop()


@pytest.fixture
def props(glue_catalog_properties: dict[str, str]) -> dict[str, str]:
    return {**glue_catalog_properties, DATABASE: f"db_{uuid.uuid4().hex[:8]}"}


def test_batches_commit_once_and_a_replay_is_skipped(props: dict[str, str], glue_proxy: FaultProxy) -> None:
    sink = committer(props)
    sent: Counter[int] = Counter()
    for b in range(3):
        ids = [b * 10, b * 10 + 1]
        assert commit(sink, b, [write_task(sink, b, ids)]).outcome is Outcome.COMMITTED
        sent.update(ids)
    assert commit(sink, 2, [write_task(sink, 2, [20, 21], attempt=1)]).outcome is Outcome.REPLAY_SKIPPED
    t = assert_exactly_once(props, sent)
    assert [s["batch_id"] for s in lakesink_snapshots(t)] == [0, 1, 2]


def test_writer_racing_inside_the_glue_commit_is_refused_rechecked_and_both_land(
    props: dict[str, str], glue_proxy: FaultProxy
) -> None:
    """Another writer commits between pyiceberg's read of the Glue table and lakesink's UpdateTable: the VersionId
    is stale, Glue refuses (ConcurrentModificationException), lakesink re-reads, re-checks and commits again."""
    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    glue_proxy.arm("commit", "call-before", call=lambda: _other_writer(props, [-1]))
    assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
    t = assert_exactly_once(props, Counter([1, 2, -1]))
    (snap,) = lakesink_snapshots(t)
    assert snap["summary"]["lakesink.commit-attempt"] == "2"
    assert glue_proxy.count("commit", forwarded=False) == 1  # the refused UpdateTable


@pytest.mark.parametrize("status", [500, 503])
def test_update_applied_and_its_answer_lost_is_resent_by_botocore_and_counts_once(
    props: dict[str, str], glue_proxy: FaultProxy, status: int
) -> None:
    """Glue applied the UpdateTable; its answer is lost (5xx). botocore re-sends it with the same VersionId, which
    is stale now: ConcurrentModificationException, a CommitFailedException for a commit that landed. Its files must
    stay (before: the manifests were deleted on the conflict and the table referenced missing files)."""
    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    glue_proxy.arm("commit", "status-after", status=status)
    outcome = commit(sink, 0, [result])
    assert outcome.outcome is Outcome.COMMITTED
    assert glue_proxy.count("commit") == 2  # botocore's re-send, inside one lakesink attempt
    t = assert_exactly_once(props, Counter([1, 2]))
    assert outcome.snapshot_id == t.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_update_refused_before_applying_is_resent_and_lands_once(props: dict[str, str], glue_proxy: FaultProxy) -> None:
    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    glue_proxy.arm("commit", "status-before", status=503)
    assert commit(sink, 0, [result]).outcome is Outcome.COMMITTED
    assert_exactly_once(props, Counter([1, 2]))


def test_update_refused_for_permission_fails_fast_and_keeps_no_doubt(props: dict[str, str], glue_proxy: FaultProxy) -> None:
    """Glue answers AccessDeniedException (the principal lacks glue:UpdateTable): botocore does not re-send it, lakesink
    reads the table (not landed), does not retry, and raises CatalogPermissionError naming the refusal and the
    privilege; a definite refusal never lands later, so the abort deletes the batch's files."""
    import json

    from lakesink.errors import CatalogPermissionError

    sink = committer(props)
    result = write_task(sink, 0, [1, 2])
    denied = {
        "__type": "AccessDeniedException",
        "message": "User: arn:aws:iam::123456789012:user/lakesink is not authorized to perform: glue:UpdateTable",
    }
    glue_proxy.arm("commit", "status-before", status=400, body=json.dumps(denied).encode())
    with pytest.raises(CatalogPermissionError, match=r"AccessDeniedException.*glue:UpdateTable") as info:
        commit(sink, 0, [result])
    assert not info.value.retryable
    assert glue_proxy.count("commit") == 1
    sink.abort_batch(query_id=Q, batch_id=0, results=[result])
    assert not any(table(props).io.new_input(f.path).exists() for f in result.files)
    assert commit(sink, 0, [write_task(sink, 0, [1, 2], attempt=1)]).outcome is Outcome.COMMITTED
    assert_exactly_once(props, Counter([1, 2]))
