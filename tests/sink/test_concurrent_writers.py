"""Two streaming queries and a third writer doing plain appends, all on one table at the same time.

Every row must be there exactly once, each query's batches once and without gaps, and the conflicts
must have been retried (counted from the snapshots' lakesink.commit-attempt).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from tests.conftest import sql_catalog_properties
from tests.support.helpers import (
    Stream,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    lakesink_snapshots,
    table_ids,
    wait_until,
    write_json_input,
)

pytestmark = pytest.mark.spark

SCHEMA = pa.schema(
    [("id", pa.int64()), ("ts", pa.timestamp("us", "UTC")), ("user", pa.string()), ("amount", pa.float64()), ("kind", pa.int32())]
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_streams_and_a_plain_writer_on_one_table(spark: Any, tmp_path: Path, request: Any, faults: Any, kind: str) -> None:
    props = sql_catalog_properties(kind, tmp_path, request)
    cat = catalogs.load(None, props)
    cat.create_namespace("db")
    cat.create_table(
        ("db", "events"),
        schema=SCHEMA,
        properties={"commit.retry.num-retries": "30", "commit.retry.min-wait-ms": "5", "commit.retry.max-wait-ms": "500"},
    )
    a = Stream(spark, tmp_path / "a", props, "format")
    b = Stream(spark, tmp_path / "b", props, "foreach")
    a.add_input(files=6, rows_per_file=20)
    b.sent = write_json_input(b.src, files=6, rows_per_file=20, start=500_000)  # ids apart from a's
    plain: list[int] = []
    stop = threading.Event()

    def plain_writer() -> None:
        i = 0
        while not stop.is_set() and i < 40:
            rows = [{"id": 900_000 + i, "user": "plain"}]
            try:
                catalogs.load(None, props).load_table(("db", "events")).append(pa.Table.from_pylist(rows, schema=SCHEMA))
                plain.append(900_000 + i)
                i += 1
            except Exception:
                # a lost race (pyiceberg retried and gave up) or a locked SQLite file: nothing landed, try again
                # (an append whose outcome is unknown would make this writer's own count unreliable; the
                # SQL catalog's commit is one transaction, so an error means it did not land)
                time.sleep(0.01)
            time.sleep(0.02)

    faults.arm(DRIVER_BEFORE_SWAP, "pause")  # one certain conflict: the first commit waits for the plain writer
    qa = a.start()
    qb = b.start()
    writer = threading.Thread(target=plain_writer)
    try:
        faults.wait_reached(DRIVER_BEFORE_SWAP)
        writer.start()
        wait_until(lambda: len(plain) >= 3, what="three commits of the plain writer")
        faults.release(DRIVER_BEFORE_SWAP)
        qa.awaitTermination(300)
        qb.awaitTermination(300)
    finally:
        stop.set()
        qa.stop()
        qb.stop()
        if writer.is_alive() or writer.ident:
            writer.join(60)
    table = cat.load_table(("db", "events"))
    assert table_ids(table) == Counter(a.sent + b.sent + plain)
    assert_snapshot_invariants(table)
    snaps = lakesink_snapshots(table)
    assert sorted(s["batch_id"] for s in snaps if s["query_id"] == a.query_id) == list(range(6))
    assert sorted(s["batch_id"] for s in snaps if s["query_id"] == b.query_id) == list(range(6))
    conflicts = sum(int(s["summary"]["lakesink.commit-attempt"]) - 1 for s in snaps)
    assert conflicts >= 1, "the forced conflict must have been retried"
    print(f"{kind}: {len(snaps)} stream commits, {len(plain)} plain appends, {conflicts} conflicts retried")
    assert_files_are_referenced(table)
