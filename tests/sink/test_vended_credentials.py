"""Vended storage credentials from a REST catalog, both entry points, with moto's S3 on loopback.

A REST catalog that vends credentials answers each table load (the client sent ``X-Iceberg-Access-Delegation:
vended-credentials``, which pyiceberg does) with short-lived storage credentials in the response's ``config``;
pyiceberg builds the table's FileIO from them. lakana 0.20 vends none, so the fault proxy in front of it adds them
to every table response, and a second proxy in front of moto's S3 (which checks no credentials) refuses a request
signed with an expired one (403 ``ExpiredToken``, as S3 does).

Measured here (pyspark 4.3): both entry points make a batch's write plan, and so the executors' FileIO, afresh
for every micro-batch -- ``foreach_batch`` loads the table at every batch, and Spark calls the data source's
``streamWriter()`` again for every micro-batch of ``format("lakesink")``. So credentials that rotate at every commit
(those vended before a commit expire when it lands) never reach a later batch. The limit is the batch itself: a
credential that expires while a batch writes fails that batch's tasks (Spark retries them with the same plan), the
query fails with the storage's error, nothing of the batch is committed, and a restart writes it with fresh
credentials, exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.catalog_servers import moto_proxy
from tests.support.helpers import Stream, lakesink_snapshots
from tests.support.http_faults import FaultProxy
from tests.support.rest_server import TOKEN

pytestmark = pytest.mark.spark


@pytest.fixture
def s3_gate(moto_server: Any) -> Iterator[FaultProxy]:
    """The credential check in front of moto's S3."""
    yield from moto_proxy(moto_server, FaultProxy.check_s3_credentials)


@pytest.fixture
def vending(lakana: Any, rest_proxy: FaultProxy, moto_server: Any, s3_gate: FaultProxy) -> dict[str, str]:
    """A REST environment on S3 whose table responses carry credentials that expire at the next commit; the
    client's catalog properties hold no storage credential of their own."""
    bucket = moto_server.create_bucket()
    prefix = lakana.new_s3_environment(bucket, moto_server.properties())  # the server's own access to S3
    rest_proxy.vend(s3_gate.vend_s3_credentials)
    rest_proxy.after_commit = s3_gate.expire_s3_credentials
    return {"type": "rest", "uri": rest_proxy.uri, "token": TOKEN, "prefix": prefix}


def _data_file_keys(gate: FaultProxy) -> dict[str, str | None]:
    """Data file written -> the access key it was written with."""
    return {e.path.rsplit("/", 1)[-1]: e.key for e in gate.exchanges if e.method == "PUT" and "/data/" in e.path}


def _stream(spark: Any, tmp_path: Path, vending: dict[str, str], entry: str) -> tuple[Stream, dict[str, str]]:
    """A stream into bronze.events with three input files, and the sink options of ``entry`` on S3 (no hadoop-aws in
    pyspark: foreach_batch takes the Arrow path)."""
    s = Stream(spark, tmp_path, vending, entry, table="bronze.events")
    s.add_input(files=3, rows_per_file=20)
    return s, ({"writer": "arrow"} if entry == "foreach" else {})


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_credentials_rotating_at_every_commit_never_reach_a_later_batch(
    spark: Any, tmp_path: Path, vending: dict[str, str], s3_gate: FaultProxy, entry: str
) -> None:
    s, options = _stream(spark, tmp_path, vending, entry)
    s.run(**options)
    s.assert_exactly_once()
    assert len(lakesink_snapshots(s.table)) == 3
    assert s3_gate.s3_refusals() == 0
    keys = _data_file_keys(s3_gate)
    assert len(keys) == 3 and len(set(keys.values())) == 3, keys  # each batch with credentials of its own


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_credentials_expiring_while_a_batch_writes_fail_it_loudly_and_the_restart_writes_it_once(
    spark: Any, tmp_path: Path, vending: dict[str, str], s3_gate: FaultProxy, entry: str
) -> None:
    s, options = _stream(spark, tmp_path, vending, entry)
    s.run(**options)  # three batches
    s.add_input(files=1, rows_per_file=20)
    # the next data file's request finds every credential expired: the batch's writes are refused
    s3_gate.arm("s3", "call-before", call=s3_gate.expire_s3_credentials, match="/data/")
    message = s.run_failing(**options)
    assert "ACCESS_DENIED" in message or "ExpiredToken" in message, message[-3000:]  # pyarrow: "AWS Error ACCESS_DENIED"
    assert len(lakesink_snapshots(s.table)) == 3  # nothing of the failed batch
    s.run(**options)  # the restart: a new plan, fresh credentials
    s.assert_exactly_once()
    assert len(lakesink_snapshots(s.table)) == 4
