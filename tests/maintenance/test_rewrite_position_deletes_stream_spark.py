"""Rewrites of position delete files inside a running merge-on-read stream with ``maintenance=auto`` (issue 52), on both
entry points, real Spark (local mode), a SQLite catalog.

The sink's automatic maintenance rewrites the delete files between batches (its commits take their turns between the
process's batches); a rewrite that lands between a batch's lookup and its swap -- another process's (another stream's
automatic maintenance, the CLI) -- is no conflict: the new files keep the old data sequence numbers (Iceberg Java's
row-delta validation counts only deletes newer than the lookup's snapshot), so the batch lands with the positions its
first lookup found, without looking its keys up again. Rows are compared with the plain-Python model of the change
stream in every reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.maintenance import auto
from lakesink.table.keys import (
    COMPACT_MIN_INPUT_FILES,
    MAINTENANCE_INTERVAL_MS,
    OPERATION_REWRITE_POSITION_DELETES,
    REWRITE_DELETES_MIN_INPUT_FILES,
    SUMMARY_COMMIT_ATTEMPT,
    SUMMARY_OPERATION,
    SUMMARY_UPSERT_MODE,
)
from tests.jobs.upsert_job import EVENTS_DDL, upsert_sink
from tests.maintenance.test_rewrite_position_deletes_spark import _rewrite_elsewhere
from tests.sink.test_merge_on_read_spark import (
    MOR,
    assert_every_reader_sees,
    delete_files,
    load,
    model,
    unreferenced_delete_files,
)
from tests.sink.test_upserts_spark import change_stream, write_events
from tests.support.helpers import run_to_end, wait_until

pytestmark = pytest.mark.spark

#: merge-on-read; the sink's maintenance runs after every batch and rewrites from two delete files, never compacts
#: (a compaction rewrites the data files the positions name: a real conflict, not what is tested here)
AUTO_REWRITES = {
    **MOR,
    MAINTENANCE_INTERVAL_MS: "0",
    REWRITE_DELETES_MIN_INPUT_FILES: "2",
    COMPACT_MIN_INPUT_FILES: "1000",
}


def _writer(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str, table_properties: dict[str, str]) -> Any:
    """The stream of tests/jobs/upsert_job.py on ``entry``, creating its table with ``table_properties`` (the sink's
    maintainer reads its interval when the sink first commits; an existing table must have them)."""
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    if entry == "format":
        lakesink.register(spark)
        w = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        for k, v in table_properties.items():
            w = w.option(f"table-property.{k}", v)
        w = w.option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    else:
        w = df.writeStream.foreachBatch(upsert_sink(props, table_properties))
    return w.option("checkpointLocation", str(ck)).trigger(availableNow=True)


def _idle_here() -> None:
    """This process's maintainers done with their queued runs (foreach_batch's maintenance runs in this process)."""
    for maintainer in list(auto._maintainers.values()):
        maintainer.wait(120)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_rewrites_in_a_running_merge_on_read_stream_cost_no_second_lookup_and_keep_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any, entry: str
) -> None:
    """1. The stream's automatic maintenance rewrites the delete files between batches; every batch lands on its first
    attempt and the table equals the model. 2. While a batch waits at its swap (its lookup done, its delete files
    written), another process rewrites the delete files: the batch lands on the next attempt of the same swap loop
    (summary ``lakesink.commit-attempt`` 2, its parent the rewrite), with no second lookup, every reader equal to the
    model and no delete file left behind."""
    # 500 keys inserted, then a few changes per batch: no data file reaches compaction's delete ratio (30 %), so the
    # delete files stay for the rewrite to merge
    stream = [
        [{"eid": k, "id": k, "value": f"v{k}", "seq": k, "op": "c"} for k in range(500)],
        *change_stream(seed=31, batches=5, per_batch=20, keys=500, first_eid=1000),
    ]
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:4])
    run_to_end(_writer(spark, catalog_properties, src, ck, entry, AUTO_REWRITES).start())

    def rewrites() -> list[Any]:
        t = load(catalog_properties)
        return [s for s in t.snapshots() if (s.summary or {}).get(SUMMARY_OPERATION) == OPERATION_REWRITE_POSITION_DELETES]

    wait_until(lambda: len(rewrites()) >= 1, timeout=240)  # the automatic run after a batch, in the committing process
    _idle_here()
    assert_every_reader_sees(catalog_properties, model(stream[:4]))
    table = load(catalog_properties)
    batches = [s for s in table.snapshots() if (s.summary or {}).get(SUMMARY_UPSERT_MODE) == "merge-on-read"]
    assert len(batches) >= 3 and {s.summary[SUMMARY_COMMIT_ATTEMPT] for s in batches} == {"1"}

    # from here on the stream's own maintenance rewrites nothing: the rewrite below is another process's
    rewrites_off = {**AUTO_REWRITES, REWRITE_DELETES_MIN_INPUT_FILES: "1000"}
    with load(catalog_properties).transaction() as tx:
        tx.set_properties(rewrites_off)
    write_events(src, stream[4:5], start=4)
    run_to_end(_writer(spark, catalog_properties, src, ck, entry, rewrites_off).start())
    _idle_here()
    assert len(delete_files(load(catalog_properties))) >= 2
    write_events(src, stream[5:], start=5)
    caplog.set_level("WARNING", logger="lakesink")
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    # the query started in this thread (a format("lakesink") source registered in a session is found from the thread
    # that starts the query)
    query = _writer(spark, catalog_properties, src, ck, entry, rewrites_off).start()
    try:
        wait_until(lambda: faults.reached(DRIVER_BEFORE_SWAP), timeout=240)
        assert _rewrite_elsewhere(catalog_properties) == "committed"
    finally:
        faults.release(DRIVER_BEFORE_SWAP)
    run_to_end(query)

    table = load(catalog_properties)
    last = table.current_snapshot()
    assert last is not None and last.summary is not None
    assert last.summary[SUMMARY_UPSERT_MODE] == "merge-on-read"
    parent = table.metadata.snapshot_by_id(last.parent_snapshot_id)
    assert parent is not None and parent.summary is not None
    assert parent.summary[SUMMARY_OPERATION] == OPERATION_REWRITE_POSITION_DELETES
    # one lookup: the same swap loop's second attempt landed (a second lookup starts a new loop at attempt 1)
    assert last.summary[SUMMARY_COMMIT_ATTEMPT] == "2", json.dumps(dict(last.summary.additional_properties))
    assert "looking the keys up again" not in caplog.text
    assert unreferenced_delete_files(table) == []
    assert_every_reader_sees(catalog_properties, model(stream))
