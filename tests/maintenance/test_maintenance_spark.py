"""maintenance=auto in real Spark streams (issue 11): both entry points, table properties given as options."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import lakesink
from tests.support.helpers import Stream, expire_all_but, table_ids

pytestmark = pytest.mark.spark

PROPS = {
    "write.lakesink.maintenance.interval-ms": "0",  # a run after every batch
    "write.lakesink.compact.min-input-files": "2",
    **expire_all_but(3),
}


def test_auto_maintenance_in_a_stream_keeps_every_row_once(stream: Stream) -> None:
    stream.add_input(files=6, rows_per_file=20)
    extra: dict[str, Any]
    if stream.entry == "format":
        extra = {f"table-property.{k}": v for k, v in PROPS.items()}
    else:
        extra = {"table_properties": PROPS}
    stream.run(**extra)
    table = stream.table
    assert {k: table.properties.get(k) for k in PROPS} == PROPS
    assert table_ids(table) == Counter(stream.sent)
    report = lakesink.verify(table)
    assert report.violations == [], report.violations
    # maintenance ran: fewer live files than batches, or the history was expired
    assert len(table.snapshots()) < 6 or len(table.inspect.files()) < 6
    # a restart with more input goes on exactly once, markers intact
    stream.add_input(files=2, rows_per_file=20)
    stream.run(**extra)
    assert table_ids(stream.table) == Counter(stream.sent)


def test_restart_from_the_checkpoint_after_lakesinks_own_maintenance_expired_its_batches(stream: Stream) -> None:
    """Fault matrix row 10 with lakesink's own maintenance (compaction, manifest rewrite, then expiry deleting the
    files only the expired snapshots referenced): batch 2 replayed from the checkpoint is recognised from its marker,
    new input is committed once, verify is clean and no referenced file is missing."""
    from datetime import datetime, timezone

    from lakesink.maintenance import expiry
    from tests.support.helpers import missing_referenced_files, referenced_data_files

    stream.add_input(files=3, rows_per_file=20)
    stream.run(maintenance="off")
    assert lakesink.compact(stream.table, min_input_files=2).status == "committed"
    assert lakesink.rewrite_manifests(stream.table).status.startswith(("committed", "nothing"))
    report = expiry.expire_snapshots(stream.table, older_than=datetime.now(timezone.utc), retain_last=1)
    assert report.status == "committed" and report.deleted_files  # the batches' own files are gone
    assert len(stream.table.snapshots()) == 1
    (stream.ck / "commits" / "2").unlink()
    (stream.ck / "commits" / ".2.crc").unlink(missing_ok=True)
    stream.add_input(files=1, rows_per_file=20)
    stream.run(maintenance="off")  # batch 2 replays (recognised), batch 3 is new
    table = stream.table
    assert table_ids(table) == Counter(stream.sent)
    verified = lakesink.verify(table)
    assert verified.violations == [], verified.violations
    assert missing_referenced_files(table) == [] and referenced_data_files(table)
