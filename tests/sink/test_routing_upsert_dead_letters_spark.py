"""Option route-by with upsert-key, delete-when, order-by and dead-letter-table on the stream's own columns, through
both entry points in real local Spark: each routed table equals a plain-Python model of its changes, and the
dead-letter table holds exactly the changes that are dead letters (``invalid-route``, ``reject-when``,
``null-upsert-key``, ``required-null``), committed in the batch's unit. A failure after the batch's files are written,
before the unit's swap, leaves nothing; the restart commits the batch once. ``max-rejected-fraction`` counts every row
of the batch: over it nothing is committed, and a restart with a higher limit commits the batch once.

Every change has a unique ``seq``; the stream, the model and the expected dead letters are the driver test's
(tests/driver/test_routing_upsert_dead_letters.py). Table db.r exists before the query with a NOT NULL column: with
format("lakesink") its rows are written with the template and rewritten into it at the commit (where a required null
is found)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from lakesink.driver import catalogs
from lakesink.faults import DRIVER_BEFORE_SWAP
from lakesink.table import dead_letters as dl
from lakesink.table.keys import SUMMARY_UPSERT_MODE
from tests.driver.test_routing_upsert_dead_letters import (
    DEAD,
    SCHEMA,
    TABLES,
    Change,
    letters,
    model,
    stream,
    tables,
    want_letters,
)
from tests.support.helpers import (
    assert_each_batch_once,
    assert_snapshot_invariants,
    create_required_value_table,
    data_files_on_disk,
    fail_once_at,
    lakesink_snapshots,
    referenced_data_files,
    run_to_end,
    start_sink,
)

pytestmark = pytest.mark.spark

DDL = "route STRING, id LONG, value STRING, seq LONG, op STRING"


def write_round(src: Path, index: int, changes: Sequence[Change]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"round-{index:03d}.json"
    path.write_text("".join(json.dumps({n: c[n] for n in SCHEMA.names}) + "\n" for c in changes))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))


ROUTED_UPSERTS = {"route_by": "route", "namespace": "db", "upsert_key": "id", "order_by": "seq", "delete_when": "op = 'd'"}


def start(spark: Any, props: dict[str, str], src: Path, ck: Path, entry: str, fraction: str = "1") -> Any:
    df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
    rejects: dict[str, Any] = {"dead_letter_table": DEAD, "reject_when": "op = 'x'", "max_rejected_fraction": float(fraction)}
    if entry == "format":  # its tasks resolve each table's rows by key: every row of a (table, key) in one task
        return start_sink(df.repartition(2, "route", "id"), entry, ck, props, **ROUTED_UPSERTS, **rejects)
    return start_sink(df, entry, ck, props, mode="update", **ROUTED_UPSERTS, **rejects)


def assert_once(props: dict[str, str]) -> None:
    """Every table (and the dead letters) holds each batch once, and no data file it does not reference."""
    for name in (*TABLES, DEAD):
        table = catalogs.load(None, props).load_table(tuple(name.split(".")))
        assert_snapshot_invariants(table)
        assert_each_batch_once(table, name)
        assert data_files_on_disk(table) <= referenced_data_files(table), name  # an aborted batch left no file


@pytest.mark.parametrize(("entry", "mode"), [("foreach", "cow"), ("format", "cow"), ("foreach", "mor"), ("format", "mor")])
def test_routed_upsert_dead_letters_equal_the_model_across_a_failure_before_the_unit_and_a_rejected_fraction(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, mode: str
) -> None:
    """``mor``: every table set merge-on-read after the first batch; each later batch's upserts there are row deltas
    (position delete files) in the same unit as the dead letters."""
    props = catalog_properties
    create_required_value_table(props, ("db", "r"))
    batches, s = stream()
    src, ck = tmp_path / "in", tmp_path / "ck"
    write_round(src, 0, batches[0])
    run_to_end(start(spark, props, src, ck, entry))
    assert tables(props) == model(batches[:1], s.kinds)
    assert letters(props) == want_letters(batches[:1], s.kinds)
    if mode == "mor":
        for name in TABLES:
            catalogs.load(None, props).load_table(tuple(name.split("."))).transaction().set_properties(
                {"write.merge.mode": "merge-on-read"}
            ).commit_transaction()
    write_round(src, 1, batches[1])
    # the batch's files written (tables and dead letters), then the failure
    fail_once_at(faults, DRIVER_BEFORE_SWAP, lambda: run_to_end(start(spark, props, src, ck, entry)))
    assert tables(props) == model(batches[:1], s.kinds)  # nothing of the failed batch
    assert letters(props) == want_letters(batches[:1], s.kinds)
    write_round(src, 2, batches[2])
    run_to_end(start(spark, props, src, ck, entry))  # replays batch 1 (committed once), then batch 2
    assert tables(props) == model(batches, s.kinds)
    assert letters(props) == want_letters(batches, s.kinds)
    assert {k for k, _, _ in s.kinds.values()} == {dl.INVALID_ROUTE, dl.REJECT_WHEN, dl.NULL_UPSERT_KEY, dl.REQUIRED_NULL}
    assert_once(props)
    # batch 3: 3 of its 5 rows are dead letters (60%), over max-rejected-fraction 0.5: nothing of it is committed
    three = [
        s.c("a", 1),
        s.c("a", 7, "x", letter=(dl.REJECT_WHEN, None)),
        s.c("b", None, "c", letter=(dl.NULL_UPSERT_KEY, "id")),
        s.c("r", 1, value=None, letter=(dl.REQUIRED_NULL, "value")),
        s.c("b", 9, "c"),
    ]
    write_round(src, 3, three)
    with pytest.raises(StreamingQueryException, match="3 of 5 row"):
        run_to_end(start(spark, props, src, ck, entry, fraction="0.5"))
    assert tables(props) == model(batches, s.kinds)
    assert letters(props) == want_letters(batches, s.kinds)
    run_to_end(start(spark, props, src, ck, entry, fraction="0.6"))  # the restart with a higher limit: once
    everything = [*batches, three]
    assert tables(props) == model(everything, s.kinds)
    assert letters(props) == want_letters(everything, s.kinds)
    assert_once(props)
    got = Counter(kind for _, kind, _, _, _ in letters(props).elements())
    assert got == Counter(k for k, _, _ in s.kinds.values())
    if mode == "mor":  # every upsert batch after the first one a row delta, never a file rewritten
        for name in TABLES:
            table: Any = catalogs.load(None, props).load_table(tuple(name.split(".")))
            summaries = [table.metadata.snapshot_by_id(x["snapshot_id"]).summary for x in lakesink_snapshots(table)]
            assert {x.get(SUMMARY_UPSERT_MODE) for x in summaries[1:]} == {"merge-on-read"}, name
            assert not any(int(x.get("deleted-data-files") or 0) for x in summaries[1:]), name
