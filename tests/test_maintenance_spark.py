"""maintenance=auto in real Spark streams (issue 11): both entry points, table properties given as options."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import lakesink
from tests.helpers import Stream, table_ids

pytestmark = pytest.mark.spark

PROPS = {
    "write.lakesink.maintenance.interval-ms": "0",  # a run after every batch
    "write.lakesink.compact.min-input-files": "2",
    "history.expire.max-snapshot-age-ms": "0",
    "history.expire.min-snapshots-to-keep": "3",
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
