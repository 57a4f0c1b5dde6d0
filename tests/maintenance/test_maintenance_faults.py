"""Maintenance against another writer (fault matrix row 26): a plain pyiceberg writer commits between a
compaction's, an expiry's or a manifest rewrite's preparation and its swap. The maintenance swap conflicts,
re-plans on the new head and lands; the other writer's rows are intact. Real SQLite catalogs, no Spark."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

import lakesink
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.maintenance import compaction, expiry
from tests.support.helpers import (
    Q1,
    arrow_rows,
    commit,
    committer_no_maintenance,
    expire_all_but,
    load,
    missing_referenced_files,
    raced,
    table_ids,
    write_task,
)

SCHEMA = arrow_rows([]).schema


def _run_with_another_writer(c: TableCommitter, faults: Any, step: Callable[[], Any]) -> tuple[Any, list[int]]:
    """Run ``step`` in a thread, pause it before its swap, let another writer append two rows, release it."""
    rows = pa.Table.from_pylist([{"id": -1, "user": "other"}, {"id": -2, "user": "other"}], schema=SCHEMA)
    return raced(faults, step, lambda: load(c).append(rows)), [-1, -2]


@pytest.mark.parametrize("what", ["compact", "expire", "rewrite-manifests"])
def test_another_writer_committing_during_maintenance(catalog_properties: dict[str, str], faults: Any, what: str) -> None:
    c = committer_no_maintenance(
        catalog_properties,
        {"commit.manifest-merge.enabled": "false", **expire_all_but(2)},
    )
    sent: list[int] = []
    for b in range(6):
        ids = list(range(b * 1000, b * 1000 + 3))
        assert commit(c, Q1, b, [write_task(c, Q1, b, ids)]).outcome is Outcome.COMMITTED
        sent += ids
    steps: dict[str, Callable[[], Any]] = {
        "compact": lambda: compaction.compact(load(c)),
        "expire": lambda: expiry.expire_snapshots(load(c)),
        "rewrite-manifests": lambda: lakesink.rewrite_manifests(load(c)),
    }
    report, other = _run_with_another_writer(c, faults, steps[what])
    sent += other
    assert report.status == "committed" and report.attempts == 2, report
    table = load(c)
    assert table_ids(table) == Counter(sent)  # the other writer's rows are intact, every batch's once
    assert missing_referenced_files(table) == []
    assert lakesink.verify(table).violations == []
    # the stream goes on
    assert commit(c, Q1, 6, [write_task(c, Q1, 6, [6000])]).outcome is Outcome.COMMITTED
    assert commit(c, Q1, 2, [write_task(c, Q1, 2, [2000])]).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter([*sent, 6000])
