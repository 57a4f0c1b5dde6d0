"""The state a table depends on, where every engine's maintenance sees it live (issue 51, items 11 and 12): every
lakesink commit of a table with an order file (option order-by) or a held file (option cdc-transactions=hold) attaches
a state file -- a Puffin file in the table metadata's ``statistics`` list holding a copy of each -- to its snapshot
(lakesink.table.state_files). Iceberg Java's remove_orphan_files deletes the order and held files (no metadata
references them) and keeps statistics files; so here the files are deleted as it deletes them, and the stream must go
on: a stale insert after a delete stays deleted, the held changes are released when their transaction completes. A
state lost with every copy is a loud error naming the recovery, never forgotten. SQLite catalogs, no Spark; the real
Iceberg Java engine runs the same on tests/deploy/test_state_files_java.py."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver.actions import held
from lakesink.errors import LakesinkError
from lakesink.maintenance.compaction import compact
from lakesink.maintenance.expiry import expire_snapshots
from lakesink.maintenance.manifest_rewrite import rewrite_manifests
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.table import state_files
from lakesink.table.keys import PROPERTY_STATE_FILE, PROPERTY_UPSERT_ORDER_FILE
from tests.driver import test_cdc_transactions as cdc
from tests.driver import test_routing_upserts as routing
from tests.driver.test_upsert_order import make, run, state
from tests.support import routed_upserts


def local(path: str) -> Path:
    return Path(path.removeprefix("file://"))


def head(table: Any) -> int:
    snapshot_id = table.metadata.current_snapshot_id
    assert snapshot_id is not None
    return int(snapshot_id)


def attached(table: Any) -> dict[int, str]:
    """Per snapshot: the statistics file the table metadata lists for it."""
    return {s.snapshot_id: s.statistics_path for s in table.metadata.statistics}


def test_a_deleted_order_file_is_read_from_the_state_file_and_a_stale_insert_stays_deleted(
    catalog_properties: dict[str, str],
) -> None:
    """Fails before the change: the batch after the order file's deletion fails ("its order file ... is missing"),
    every retry; with the property removed (the documented way out then) the stale insert brought key 1 back."""
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False), (2, "two", 2, False)])
    run(c, 1, [(1, "", 5, True)])  # a tombstone: key 1 deleted at order 5
    table = c.table.reload_table()
    order_file = table.properties[PROPERTY_UPSERT_ORDER_FILE]
    recorded = state_files.current(table.properties)
    assert recorded is not None and recorded.holds == (order_file,)
    assert attached(table)[head(table)] == recorded.path  # listed: live to every engine
    run(c, 2, [(2, "newer", 7, False)])  # no delete: the same state file, attached to the new snapshot too
    table = c.table.reload_table()
    assert attached(table)[head(table)] == recorded.path
    os.remove(local(order_file))  # what Iceberg Java's remove_orphan_files does to it
    run(c, 3, [(1, "stale", 3, False), (3, "three", 8, False)])  # older than the delete: stays deleted
    assert state(c) == {2: ("newer", 7), 3: ("three", 8)}
    run(c, 4, [(3, "", 9, True)])  # a new tombstone: a new order file and a state file holding it
    table = c.table.reload_table()
    now = state_files.current(table.properties)
    assert now is not None and now.holds == (table.properties[PROPERTY_UPSERT_ORDER_FILE],) and now.path != recorded.path
    run(c, 5, [(1, "stale", 4, False), (3, "stale", 8, False)])
    assert state(c, readers=True) == {2: ("newer", 7)}


def test_a_table_carrying_an_order_file_without_a_state_file_gets_one_on_its_next_commit(
    catalog_properties: dict[str, str],
) -> None:
    """A table an earlier lakesink wrote (the order file's property, no state file, nothing in its statistics): its
    next commit attaches a state file holding the order file, and from then on the file's loss is survived."""
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False)])
    run(c, 1, [(1, "", 5, True)])
    table = c.table.reload_table()
    with table.transaction() as tx:  # back to what an earlier lakesink left: no state file
        tx.remove_properties(PROPERTY_STATE_FILE)
        with tx.update_statistics() as stats:
            for s in table.metadata.statistics:
                stats.remove_statistics(s.snapshot_id)
    table = c.table.reload_table()
    assert table.metadata.statistics == [] and PROPERTY_STATE_FILE not in table.properties
    run(c, 2, [(2, "two", 6, False)])
    table = c.table.reload_table()
    recorded = state_files.current(table.properties)
    assert recorded is not None and recorded.holds == (table.properties[PROPERTY_UPSERT_ORDER_FILE],)
    assert attached(table)[head(table)] == recorded.path
    os.remove(local(table.properties[PROPERTY_UPSERT_ORDER_FILE]))
    run(c, 3, [(1, "stale", 3, False)])
    assert state(c) == {2: ("two", 6)}


def test_an_order_file_lost_with_every_copy_is_a_loud_error_naming_the_recovery(catalog_properties: dict[str, str]) -> None:
    """Never forgotten silently: with the order file and its state file gone, the batch fails, nothing committed."""
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False)])
    run(c, 1, [(1, "", 5, True)])
    table = c.table.reload_table()
    recorded = state_files.current(table.properties)
    assert recorded is not None
    os.remove(local(table.properties[PROPERTY_UPSERT_ORDER_FILE]))
    os.remove(local(recorded.path))
    head = table.metadata.current_snapshot_id
    with pytest.raises(LakesinkError, match="no state file of the table .* holds a copy of it.*Restore the file"):
        run(c, 2, [(1, "stale", 3, False)])
    assert c.table.reload_table().metadata.current_snapshot_id == head


def test_a_deleted_held_file_is_read_from_the_state_file_and_released_when_its_transaction_completes(
    catalog_properties: dict[str, str],
) -> None:
    """Option cdc-transactions=hold, the batches of tests/driver/test_cdc_transactions.py: t1 begun in batch 0 and held
    (its END later); the held file deleted as Iceberg Java's remove_orphan_files deletes it; batch 1 brings the END.
    Fails before the change ("the file of the changes batch 0 held back ... is missing. Restore the file")."""
    props = catalog_properties
    rc = routing.routed(props)
    t1 = [cdc.change("t1", 1, "a", 1, "one", 2, False, 1002), cdc.change("t1", 2, "b", 1, "uno", 3, False, 1003)]
    first = [
        {**cdc.change(None, 0, "a", 9, "snap", 1, False, 1001), "offset": 0},
        {**cdc.begin("t1"), "offset": 0},
        {**t1[0], "offset": 1},
        {**t1[1], "offset": 0},
    ]
    cdc.run_batch(rc, props, 0, pa.Table.from_pylist(first, cdc.RECORDS))
    tables = cdc.tables(props)
    record = held.recorded(tables, cdc.Q, None)
    assert record is not None and record.changes == 2 and record.file is not None
    home = next(t for t in tables.values() if state_files.current(t.properties) is not None)
    recorded = state_files.current(home.properties)
    assert recorded is not None and record.file in recorded.holds
    os.remove(local(record.file))
    cdc.run_batch(rc, props, 1, pa.Table.from_pylist([{**cdc.end("t1", 2, 1003), "offset": 1}], cdc.RECORDS))
    assert routed_upserts.values_seen(props, ("a", "b")) == {"db.a": {1: "one", 9: "snap"}, "db.b": {1: "uno"}}
    latest = held.recorded(cdc.tables(props), cdc.Q, None)
    assert latest is not None and latest.batch_id == 1 and latest.changes == 0


def test_the_state_file_is_a_puffin_file_every_reader_of_the_metadata_takes(catalog_properties: dict[str, str]) -> None:
    """The Puffin layout (magic, blobs, footer with its length and flags) and a statistics entry listing no blob:
    pyiceberg reads the metadata back; the blob holds the order file's bytes."""
    c = make(catalog_properties)
    run(c, 0, [(1, "one", 1, False)])
    run(c, 1, [(1, "", 5, True)])
    table = c.table.reload_table()
    recorded = state_files.current(table.properties)
    assert recorded is not None
    data = local(recorded.path).read_bytes()
    assert data[:4] == b"PFA1" and data[-4:] == b"PFA1" and len(data) == recorded.size
    order_file = table.properties[PROPERTY_UPSERT_ORDER_FILE]
    assert state_files.read_blobs(table, recorded.path) == {order_file: local(order_file).read_bytes()}
    entry = next(s for s in table.metadata.statistics if s.statistics_path == recorded.path)
    assert entry.blob_metadata == [] and entry.file_footer_size_in_bytes == recorded.footer


def test_lakesinks_own_compaction_manifest_rewrite_expiry_and_orphan_removal_keep_the_state_file(
    catalog_properties: dict[str, str],
) -> None:
    """lakesink's own maintenance commits attach the state file to their snapshots too: after a compaction and a
    manifest rewrite (the head is theirs), an expiry keeping only the head and the orphan clean-up, the order file is
    deleted as another engine's orphan removal deletes it -- and a stale insert after the delete stays deleted. Fails
    before the change (the batch after the deletion fails, every retry)."""
    c = make(catalog_properties)
    for b in range(4):
        run(c, b, [(b, f"v{b}", b + 1, False)])
    run(c, 4, [(1, "", 10, True)])
    run(c, 5, [(5, "five", 11, False)])
    order_file = c.table.reload_table().properties[PROPERTY_UPSERT_ORDER_FILE]
    compact(c.table.reload_table(), min_input_files=2)
    rewrite_manifests(c.table.reload_table(), min_count=1)
    table = c.table.reload_table()
    summary = table.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary.operation.value == "replace"  # the head is a maintenance commit's
    recorded = state_files.current(table.properties)
    assert recorded is not None and attached(table)[head(table)] == recorded.path
    expire_snapshots(table, older_than=datetime.now(timezone.utc) + timedelta(days=1), retain_last=1)
    remove_orphan_files(c.table.reload_table(), older_than=timedelta(0), other_writers_older_than=timedelta(0))
    assert local(recorded.path).exists()
    os.remove(local(order_file))
    run(c, 6, [(1, "stale", 5, False)])
    assert state(c, readers=True) == {0: ("v0", 1), 2: ("v2", 3), 3: ("v3", 4), 5: ("five", 11)}
