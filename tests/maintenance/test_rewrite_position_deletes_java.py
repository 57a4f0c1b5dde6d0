"""lakesink's rewrite of position delete files read by Iceberg's Java engine (issue 52; marker ``deploy``:
``make test-deploy``): Spark 3.5 + Iceberg 1.9.2's SparkCatalog on the same PostgreSQL catalog
(tests/support/java_engine.py), nothing mocked.

Delete files of both engines (lakesink's merge-on-read row deltas, Java's merge-on-read ``DELETE``) merged by
lakesink's rewrite: Java reads the model at the head and as of every snapshot, its ``position_deletes`` metadata table
lists exactly the merged positions, and its own merge-on-read ``DELETE`` after the rewrite applies beside them.
"""

from __future__ import annotations

from collections import Counter

import pytest
from pyiceberg.table import Table

from lakesink.audit import verify
from lakesink.driver import catalogs
from lakesink.driver.actions.row_delta import delete_target
from lakesink.maintenance import position_deletes
from lakesink.options import Maintenance, SinkOptions, TableName
from tests.deploy.test_java_engine import CATALOG, java, java_table, shared  # noqa: F401 (fixtures)
from tests.deploy.test_row_delta_java import _java_ids
from tests.driver.test_row_delta import commit_delta, delta_of, live_delete_files, positions_of, read_everywhere, write_deletes
from tests.support.helpers import arrow_rows, commit_batches, sink_committer
from tests.support.java_engine import JavaEngine

pytestmark = [pytest.mark.spark, pytest.mark.deploy]


def test_java_reads_the_rewritten_position_deletes_of_both_engines(
    shared: dict[str, str],  # noqa: F811
    java: JavaEngine,  # noqa: F811
    java_table: str,  # noqa: F811
) -> None:
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=shared, maintenance=Maintenance.OFF))
    c.table.open_table(arrow_rows([]).schema)
    sent = commit_batches(c, 5, rows=11)

    def load() -> Table:
        return catalogs.load(None, shared).load_table(("db", "events"))

    def everywhere(model: Counter[int], what: str) -> None:
        table = load()
        assert {reader: ids == model for reader, ids in read_everywhere(table).items()} == {
            "pyiceberg": True,
            "duckdb": True,
            "iceberg-rust": True,
        }, what
        assert _java_ids(java, java_table) == model, f"Java: {what}"

    ours = [[0, 1004], [2000, 3007], [3, 2010]]
    for i, ids in enumerate(ours):
        table = load()
        commit_delta(table, delta_of(write_deletes(delete_target(table), positions_of(table, ids)), batch_id=90 + i))
    java.sql(f"ALTER TABLE {CATALOG}.{java_table} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
    theirs = [1, 1005, 4000]
    java.sql(f"DELETE FROM {CATALOG}.{java_table} WHERE id IN ({', '.join(map(str, theirs))})")
    model = Counter(sent) - Counter(i for ids in ours for i in ids) - Counter(theirs)
    everywhere(model, "before the rewrite")
    before = load()
    assert len(live_delete_files(before)) >= 4
    head_before = before.current_snapshot()
    assert head_before is not None

    report = position_deletes.rewrite_position_deletes(before, min_input_files=2)
    assert report.status == "committed", report.status
    assert len(live_delete_files(load())) == 1
    everywhere(model, "after the rewrite")
    assert _java_ids(java, java_table, head_before.snapshot_id) == model, "Java as of the snapshot before the rewrite"
    listed = java.sql(f"SELECT delete_file_path, count(*) FROM {CATALOG}.{java_table}.position_deletes GROUP BY 1")
    assert listed == [[report.added_files[0], len(sent) - sum(model.values())]]
    operation = java.sql(f"SELECT operation FROM {CATALOG}.{java_table}.snapshots ORDER BY committed_at DESC LIMIT 1")
    assert operation == [["replace"]]
    audit = verify(load())
    assert audit.ok, audit.human()

    # Java's merge-on-read DELETE after the rewrite: its delete file beside the rewritten one
    more = [5, 2002]
    java.sql(f"DELETE FROM {CATALOG}.{java_table} WHERE id IN ({', '.join(map(str, more))})")
    everywhere(model - Counter(more), "after Java's DELETE")
