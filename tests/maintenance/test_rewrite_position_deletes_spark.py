"""Rewriting position delete files of a table written by lakesink's merge-on-read upserts through foreach_batch with real
Spark (issue 52): the delete files are the executors' own, the rows compared with a plain-Python model of the change
stream in every reader (pyiceberg, DuckDB, iceberg-rust), before and after the rewrite, and after more batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lakesink.faults import ENV_FAULTS_DIR
from lakesink.maintenance import compaction, position_deletes
from tests.sink.test_merge_on_read_spark import (
    MOR,
    assert_every_reader_sees,
    delete_files,
    load,
    model,
    run,
    sink,
    unreferenced_delete_files,
)
from tests.sink.test_upserts_spark import change_stream, write_events
from tests.support.helpers import raced

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("partitioned_by", [None, "bucket(4, id)"])
def test_a_merge_on_read_streams_delete_files_rewritten_between_batches_keep_the_model_in_every_reader(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], partitioned_by: str | None
) -> None:
    """Five merge-on-read batches leave a delete file per batch (and partition); the rewrite merges them, the table
    reads as the model in every reader; three more batches (updating and deleting rows whose earlier deletes are in
    the rewritten file) and a compaction keep it so."""
    stream = change_stream(seed=21, batches=8, per_batch=40, keys=20)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:5])
    s = sink(catalog_properties, table_properties=MOR, maintenance="off", partitioned_by=partitioned_by)
    run(spark, src, ck, s)
    assert_every_reader_sees(catalog_properties, model(stream[:5]))
    before = delete_files(load(catalog_properties))
    assert len(before) >= 4

    report = position_deletes.rewrite_position_deletes(load(catalog_properties), min_input_files=2)
    assert report.status == "committed", report.status
    after = delete_files(load(catalog_properties))
    assert len(after) < len(before) and set(report.added_files) <= set(after)
    assert_every_reader_sees(catalog_properties, model(stream[:5]))

    write_events(src, stream[5:], start=5)
    run(spark, src, ck, s)
    assert_every_reader_sees(catalog_properties, model(stream))
    assert compaction.compact(load(catalog_properties), min_input_files=2).status == "committed"
    assert_every_reader_sees(catalog_properties, model(stream))


def _rewrite_elsewhere(props: dict[str, str]) -> str:
    """lakesink's rewrite of position deletes run by another process (no fault armed there): its status."""
    code = (
        "import json, sys; from lakesink.driver import catalogs; from lakesink.maintenance import position_deletes; "
        "t = catalogs.load(None, json.loads(sys.argv[1])).load_table(('db', 'events')); "
        "print(position_deletes.rewrite_position_deletes(t, min_input_files=2).status)"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_FAULTS_DIR}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(props)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(done.stdout.strip().splitlines()[-1])


def test_a_rewrite_between_a_batchs_lookup_and_its_swap_keeps_every_change(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, caplog: Any
) -> None:
    """The rewrite lands while a merge-on-read batch waits at its swap: the rewritten delete file keeps the old data
    sequence numbers, so it is no conflict (Iceberg Java's row-delta rule) and the batch lands on the next attempt of
    its swap with its first lookup's positions, without looking its keys up again; nothing the rewrite replaced comes
    back, nothing the batch deleted survives, no delete file is left behind."""
    stream = change_stream(seed=5, batches=5, per_batch=40, keys=15)
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_events(src, stream[:4])
    s = sink(catalog_properties, table_properties=MOR, maintenance="off")
    run(spark, src, ck, s)
    assert len(delete_files(load(catalog_properties))) >= 2
    write_events(src, stream[4:], start=4)
    caplog.set_level("WARNING", logger="lakesink")
    rewritten: list[str] = []
    result = raced(faults, lambda: run(spark, src, ck, s), lambda: rewritten.append(_rewrite_elsewhere(catalog_properties)))
    assert result is None, result
    assert rewritten == ["committed"]
    table = load(catalog_properties)
    parent = table.metadata.snapshot_by_id(table.current_snapshot().parent_snapshot_id)
    assert parent.summary["lakesink.operation"] == "rewrite-position-deletes"
    assert "looking the keys up again" not in caplog.text
    assert table.current_snapshot().summary["lakesink.commit-attempt"] == "2"  # the same swap loop: one lookup
    assert unreferenced_delete_files(table) == []
    assert_every_reader_sees(catalog_properties, model(stream))
