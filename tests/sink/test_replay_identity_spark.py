"""Issue 10's replay and identity holes through real Spark queries, real checkpoints and real restarts.

- a checkpoint repaired by hand (offsets/N and commits/N deleted while more input arrived): Spark re-plans
  batch N over more input; lakesink refuses it loudly (before: "already committed", the new rows lost);
- two lakesink sinks in one foreachBatch function: each once per batch, across a crash between the two calls;
  without distinct sink ids a loud error (before: the second silently skipped);
- ``query.stop()`` while ``commit()`` is between its manifests and the swap: the abort Spark runs in another
  worker must not delete files of a commit that then lands.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

import lakesink
from lakesink.faults import DRIVER_BEFORE_SWAP
from tests.support.helpers import (
    TABLE,
    StreamInput,
    assert_snapshot_invariants,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
    table_ids,
)

pytestmark = pytest.mark.spark


class Pipeline(StreamInput):
    first_id = 1_000
    rows_per_file = 20

    def writer(self, entry: str, df: Any, **kwargs: Any) -> Any:
        if entry == "format":
            w = df.writeStream.format("lakesink").option("table", TABLE)
            for k, v in self.props.items():
                w = w.option(f"catalog.{k}", v)
        else:
            w = df.writeStream.foreachBatch(lakesink.foreach_batch(TABLE, catalog_properties=self.props, **kwargs))
        return self.until_read(w)

    def run(self, writer: Any) -> None:
        q = writer.start()
        run_to_end(q)

    @property
    def table(self) -> Any:
        from lakesink.driver import catalogs

        return catalogs.load(None, self.props).load_table(("db", "events"))


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_hand_repaired_checkpoint_over_more_input_is_refused_then_recovers(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    p = Pipeline(spark, tmp_path, catalog_properties)
    p.add_input(3)
    p.run(p.writer(entry, p.source(1)))  # batches 0, 1, 2: one file each
    committed = Counter(p.sent)
    assert table_ids(p.table) == committed
    # the user "repairs" the checkpoint: the last batch's offset and commit entries deleted, more input arrives
    saved = (p.ck / "offsets" / "2").read_text()
    for log in ("offsets", "commits"):  # with Hadoop's checksum files, as a user deleting them by hand would
        (p.ck / log / "2").unlink()
        (p.ck / log / ".2.crc").unlink(missing_ok=True)
    p.add_input(2)
    snapshots = len(p.table.snapshots())
    with pytest.raises(StreamingQueryException) as info:
        p.run(p.writer(entry, p.source(None)))  # no rate limit: batch 2 is re-planned over files 3..5
    message = str(info.value)
    assert "ReplayMismatchError" in message or "other source offsets" in message
    assert "batch 2" in message and '"logOffset":2' in message
    assert table_ids(p.table) == committed and len(p.table.snapshots()) == snapshots  # nothing committed
    # the recovery the error names: the committed offsets restored, then a restart writes the new rows once
    (p.ck / "offsets" / "2").write_text(saved)
    p.run(p.writer(entry, p.source(None)))
    assert table_ids(p.table) == Counter(p.sent)
    assert_snapshot_invariants(p.table)


def test_two_sinks_in_one_foreach_batch_each_once_across_a_crash_between_them(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    p = Pipeline(spark, tmp_path, catalog_properties)
    p.add_input(4)
    even = lakesink.foreach_batch(TABLE, catalog_properties=p.props, sink_id="even")
    odd = lakesink.foreach_batch(TABLE, catalog_properties=p.props, sink_id="odd")
    crash = {"armed": True}

    def both(df: Any, batch_id: int) -> None:
        even(df.filter(F.col("id") % 2 == 0), batch_id)
        if batch_id == 2 and crash["armed"]:
            crash["armed"] = False
            raise RuntimeError("the driver dies between the two sinks")
        odd(df.filter(F.col("id") % 2 == 1), batch_id)

    def writer() -> Any:
        return p.until_read(p.source(1).writeStream.foreachBatch(both))

    with pytest.raises(StreamingQueryException, match="dies between the two sinks"):
        p.run(writer())
    p.run(writer())  # restart: batch 2 replays; "even" skips it, "odd" writes it
    table = p.table
    assert table_ids(table) == Counter(p.sent)
    assert_snapshot_invariants(table)
    per_sink = Counter((s["sink_id"], s["batch_id"]) for s in lakesink_snapshots(table))
    assert per_sink == Counter({(sink, b): 1 for sink in ("even", "odd") for b in range(4)})


def test_two_sinks_without_sink_ids_fail_loudly(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    p = Pipeline(spark, tmp_path, catalog_properties)
    p.add_input(1)
    first = lakesink.foreach_batch(TABLE, catalog_properties=p.props)
    second = lakesink.foreach_batch(TABLE, catalog_properties=p.props)

    def both(df: Any, batch_id: int) -> None:
        first(df.filter(F.col("id") % 2 == 0), batch_id)
        second(df.filter(F.col("id") % 2 == 1), batch_id)

    with pytest.raises(StreamingQueryException) as info:
        p.run(p.until_read(p.source(1).writeStream.foreachBatch(both)))
    assert "DuplicateSinkError" in str(info.value) and "sink_id" in str(info.value)
    assert table_ids(p.table) == Counter(i for i in p.sent if i % 2 == 0)  # only what the first sink committed


def test_two_sinks_without_sink_ids_stay_loud_after_a_restart_then_ids_write_every_row_once(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    """Issue 51, item 10 (one table): the second sink without an id of its own fails loudly, and a restart that changes
    nothing fails again -- it must not take the first sink's commit of the batch for a replay of its own and skip its
    rows (before: the restart completed silently, the odd ids lost). Given an id, the restart writes them once."""
    p = Pipeline(spark, tmp_path, catalog_properties)
    p.add_input(1)

    def writer(second_id: str | None) -> Any:
        first = lakesink.foreach_batch(TABLE, catalog_properties=p.props)
        second = lakesink.foreach_batch(TABLE, catalog_properties=p.props, sink_id=second_id)

        def both(df: Any, batch_id: int) -> None:
            first(df.filter(F.col("id") % 2 == 0), batch_id)
            second(df.filter(F.col("id") % 2 == 1), batch_id)

        return p.until_read(p.source(1).writeStream.foreachBatch(both))

    for _ in range(2):  # the first run, then a restart that changes nothing
        with pytest.raises(StreamingQueryException, match="DuplicateSinkError") as info:
            p.run(writer(None))
        assert "sink_id" in str(info.value)
        assert table_ids(p.table) == Counter(i for i in p.sent if i % 2 == 0)
    p.run(writer("odd"))  # the fix the error names: the restart writes the second sink's rows once
    assert table_ids(p.table) == Counter(p.sent)
    assert_snapshot_invariants(p.table)


def test_stop_during_commit_never_deletes_files_of_a_commit_that_lands(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any
) -> None:
    """Measured on pyspark 4.3: query.stop() does not interrupt the JVM's wait for commit(); once the commit
    returned (landed), Spark tries to abort the batch anyway ("is aborting" / "failed to abort" in its log). The
    table must reference only files that exist, and a restart must finish the input exactly once. The race with
    an abort running *during* the commit is covered without Spark in tests/driver/test_replay_identity.py."""
    p = Pipeline(spark, tmp_path, catalog_properties)
    p.add_input(2)
    faults.arm(DRIVER_BEFORE_SWAP, "pause")
    q = p.writer("format", p.source(1)).start()
    faults.wait_reached(DRIVER_BEFORE_SWAP)  # commit() of batch 0 wrote its manifests, swap pending
    stopper = threading.Thread(target=q.stop)
    stopper.start()
    time.sleep(5)  # give Spark time to interrupt the batch and run its abort in another worker
    faults.release(DRIVER_BEFORE_SWAP)
    stopper.join(300)
    assert not stopper.is_alive()
    table = p.table
    missing = {f for f in referenced_data_files(table) if not Path(f.removeprefix("file://")).exists()}
    assert not missing, f"the table references deleted files: {missing}"
    # a restart finishes the input exactly once
    p.run(p.writer("format", p.source(1)))
    assert table_ids(p.table) == Counter(p.sent)
    assert_snapshot_invariants(p.table)
    shutil.rmtree(p.ck, ignore_errors=True)
