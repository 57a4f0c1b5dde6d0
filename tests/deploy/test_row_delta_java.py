"""Iceberg's Java engine and lakesink's merge-on-read files on one table (issue 52 items 4 and 5; marker ``deploy``:
``make test-deploy``): Spark 3.5 + Iceberg 1.9.2's SparkCatalog on the same PostgreSQL catalog
(tests/support/java_engine.py), nothing mocked.

- lakesink's position delete files (the executors' writer, committed as a row delta) read by Java as by pyiceberg,
  DuckDB and iceberg-rust, at the head and ``VERSION AS OF`` each snapshot; Java's ``position_deletes`` metadata table
  lists them;
- Java's own merge-on-read ``DELETE`` beside them, then lakesink's compaction, which applies both engines' position
  deletes and drops the delete files: every reader, Java included, reads the model before and after.
"""

from __future__ import annotations

from collections import Counter

import pytest
from pyiceberg.table import Table

from lakesink.audit import verify
from lakesink.driver import catalogs
from lakesink.driver.actions.row_delta import delete_target
from lakesink.maintenance import compaction
from lakesink.options import Maintenance, SinkOptions, TableName
from tests.deploy.test_java_engine import CATALOG, java, java_table, shared  # noqa: F401 (fixtures)
from tests.driver.test_row_delta import commit_delta, delta_of, live_delete_files, positions_of, read_everywhere, write_deletes
from tests.support.helpers import arrow_rows, commit_batches, sink_committer
from tests.support.java_engine import JavaEngine

pytestmark = [pytest.mark.spark, pytest.mark.deploy]


def _java_ids(engine: JavaEngine, table: str, snapshot_id: int | None = None) -> Counter[int]:
    engine.sql(f"REFRESH TABLE {CATALOG}.{table}")
    at = f" VERSION AS OF {snapshot_id}" if snapshot_id is not None else ""
    return Counter(r[0] for r in engine.sql(f"SELECT id FROM {CATALOG}.{table}{at}"))


def test_java_reads_lakesinks_position_deletes_and_lakesink_compacts_javas(
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
    java_table: str,  # noqa: F811
) -> None:
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=shared, maintenance=Maintenance.OFF))
    c.table.open_table(arrow_rows([]).schema)
    sent = commit_batches(c, 5, rows=11)

    def load() -> Table:
        return catalogs.load(None, shared).load_table(("db", "events"))

    table = load()
    ours = [0, 3, 1004, 2000, 2010, 3007]
    commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, ours), tasks=2)))
    model = Counter(sent) - Counter(ours)
    table = load()
    head = table.current_snapshot()
    assert head is not None
    assert {reader: ids == model for reader, ids in read_everywhere(table).items()} == {
        "pyiceberg": True,
        "duckdb": True,
        "iceberg-rust": True,
    }
    assert _java_ids(java, java_table) == model, "Java at the head"
    assert _java_ids(java, java_table, head.snapshot_id) == model, "Java as of the row delta's snapshot"
    assert _java_ids(java, java_table, head.parent_snapshot_id) == Counter(sent), "Java as of the snapshot before"
    listed = java.sql(f"SELECT delete_file_path, count(*) FROM {CATALOG}.{java_table}.position_deletes GROUP BY 1")
    assert sorted(n for _, n in listed) == sorted(e.data_file.record_count for e in live_delete_files(table))
    summary = java.sql(
        f"SELECT summary['total-position-deletes'], operation FROM {CATALOG}.{java_table}.snapshots "
        "ORDER BY committed_at DESC LIMIT 1"
    )
    assert summary == [[str(len(ours)), "delete"]]

    # Java's own merge-on-read DELETE beside lakesink's
    java.sql(f"ALTER TABLE {CATALOG}.{java_table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    theirs = [1, 1005, 4000, 4004]
    java.sql(f"DELETE FROM {CATALOG}.{java_table} WHERE id IN ({', '.join(map(str, theirs))})")
    model -= Counter(theirs)
    table = load()
    assert len(live_delete_files(table)) > 2, "Java's DELETE wrote no delete files (was it a copy-on-write?)"
    assert {reader: ids == model for reader, ids in read_everywhere(table).items()} == dict.fromkeys(read_everywhere(table), True)
    assert _java_ids(java, java_table) == model
    # verify on both engines' row deltas: no false summary-mismatch (Java's added-files-size counts its delete files),
    # and every live delete file checked
    audit = verify(table)
    assert audit.ok and audit.files_checked == len(table.inspect.files()), audit.human()

    # lakesink's compaction applies both engines' position deletes and drops every delete file
    report = compaction.compact(load())
    assert report.status == "committed", report.status
    table = load()
    assert not live_delete_files(table)
    assert verify(table).ok, verify(table).human()  # a replace that applied both engines' deletes keeps the live rows
    assert {reader: ids == model for reader, ids in read_everywhere(table).items()} == dict.fromkeys(read_everywhere(table), True)
    assert _java_ids(java, java_table) == model, "Java after lakesink's compaction"
