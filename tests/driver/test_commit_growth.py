"""Many batches into one table: the manifest list stays bounded (manifests are merged as Iceberg does), the
merge settings are honoured, and every row is still read back exactly once.

Real SQLite catalogs, real Parquet files and manifests (the commit-path benchmark drives the same code
for 10,000 batches: ``python -m benchmarks commit-path``).
"""

from __future__ import annotations

from collections import Counter

from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.table.markers import last_committed_batch
from tests.support.helpers import arrow_rows, assert_snapshot_invariants, commit, load, make_committer, table_ids, write_task

SCHEMA = arrow_rows([]).schema
Q = "33333333-cccc-4000-8000-000000000003"


def _committer(catalog_properties: dict[str, str], **properties: str) -> TableCommitter:
    c = make_committer(catalog_properties)
    table = c.table.open_table(SCHEMA)
    if properties:
        with table.transaction() as tx:
            tx.set_properties(properties)
    return c


def _run(c: TableCommitter, batches: int, *, start: int = 0) -> list[int]:
    """Batches ``start`` .. ``start + batches - 1``, batch ``b`` holding ids ``3b`` .. ``3b + 2``, each COMMITTED."""
    sent: list[int] = []
    for b in range(start, start + batches):
        ids = list(range(b * 3, b * 3 + 3))
        outcome = commit(c, Q, b, [write_task(c, Q, b, ids)])
        assert outcome.outcome is Outcome.COMMITTED
        sent += ids
    return sent


def _manifests(c: TableCommitter) -> int:
    table = load(c)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return len(snapshot.manifests(table.io))


def test_manifest_list_stays_bounded_and_rows_read_back_once(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties, **{"commit.manifest.min-count-to-merge": "4"})
    counts = []
    sent: list[int] = []
    for round_ in range(5):
        sent += _run(c, 6, start=round_ * 6)
        counts.append(_manifests(c))
    # 30 batches, one new manifest each: merged whenever 4 accumulate, never more than 4 in the list
    assert max(counts) <= 4, counts
    table = load(c)
    assert table_ids(table) == Counter(sent)
    assert len(table.snapshots()) == 30  # history is kept: one snapshot per batch
    assert_snapshot_invariants(table)
    marker = last_committed_batch(table.properties, Q)
    assert marker is not None and marker.batch_id == 29


def test_merge_can_be_switched_off_with_the_iceberg_property(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties, **{"commit.manifest-merge.enabled": "false", "commit.manifest.min-count-to-merge": "2"})
    sent = _run(c, 6)
    assert _manifests(c) == 6  # fast append: one manifest per batch
    assert table_ids(load(c)) == Counter(sent)


def test_merged_table_still_detects_replays_and_keeps_its_rows(catalog_properties: dict[str, str]) -> None:
    c = _committer(catalog_properties, **{"commit.manifest.min-count-to-merge": "2"})
    sent = _run(c, 5)
    replay = write_task(c, Q, 3, [9, 10, 11], attempt=9)
    assert commit(c, Q, 3, [replay]).outcome is Outcome.REPLAY_SKIPPED
    table = load(c)
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
