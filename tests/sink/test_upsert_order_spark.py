"""Option order-by across batches with real Spark, on both entry points: a change stream whose files deliver older
changes after newer ones, then the same source replayed from an older position (a second query reading the earlier
files again): the table must equal the model "highest order value wins per key, deletes included" through every
reader, and the replay must leave it as it was (tests/driver/test_upsert_order.py checks the same without Spark).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.table.keys import SUMMARY_UPSERT_STALE
from tests.jobs.upsert_job import EVENTS_DDL, upsert_sink
from tests.sink.test_upserts_spark import Event, assert_every_reader_sees, write_events
from tests.support.helpers import lakesink_snapshots, run_to_end

pytestmark = pytest.mark.spark


def shuffled_stream(seed: int, batches: int, per_batch: int, keys: int) -> list[list[Event]]:
    """Unique event ids and sequence numbers, delivered out of order across files; deletes and re-inserts."""
    rng = random.Random(seed)
    events: list[Event] = []
    for eid in range(1, batches * per_batch + 1):
        op = "d" if rng.random() < 0.3 else rng.choice(["c", "u"])
        events.append({"eid": eid, "id": rng.randrange(keys), "value": f"v{eid}", "seq": eid, "op": op})
    rng.shuffle(events)
    return [events[b * per_batch : (b + 1) * per_batch] for b in range(batches)]


def model(batches: Sequence[Sequence[Event]]) -> dict[int, tuple[int, str]]:
    """id -> (eid, value): per key, the event with the highest seq ever delivered; absent when it is a delete."""
    best: dict[int, Event] = {}
    for events in batches:
        for e in events:
            if e["id"] not in best or e["seq"] >= best[e["id"]]["seq"]:
                best[e["id"]] = e
    return {k: (e["eid"], e["value"]) for k, e in best.items() if e["op"] != "d"}


def run(spark: Any, entry: str, src: Path, ck: Path, props: dict[str, str]) -> None:
    df = spark.readStream.schema(EVENTS_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    if entry == "foreach":
        w = df.writeStream.foreachBatch(upsert_sink(props))
    else:
        w = df.repartition(2, "id").writeStream.format("lakesink").option("table", "db.events")
        for k, v in props.items():
            w = w.option(f"catalog.{k}", v)
        w = w.option("upsert-key", "id").option("delete-when", "op = 'd'").option("order-by", "seq")
    q = w.option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    run_to_end(q)


@pytest.mark.parametrize("entry", ["foreach", "format"])
def test_an_older_change_never_overwrites_a_newer_one_and_a_replay_from_an_older_position_changes_nothing(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    stream = shuffled_stream(seed=31, batches=3, per_batch=60, keys=20)
    write_events(tmp_path / "in", stream)
    run(spark, entry, tmp_path / "in", tmp_path / "ck", catalog_properties)
    want = model(stream)
    assert_every_reader_sees(catalog_properties, want)
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    snaps = lakesink_snapshots(table)
    assert [s["batch_id"] for s in snaps] == [0, 1, 2]
    assert sum(int(s["summary"].get(SUMMARY_UPSERT_STALE, 0)) for s in snaps) > 0  # older changes did arrive later

    # the source replayed from an older position: a new query (checkpoint) reading the first two files again
    write_events(tmp_path / "replay", stream[:2])
    run(spark, entry, tmp_path / "replay", tmp_path / "ck-replay", catalog_properties)
    assert_every_reader_sees(catalog_properties, want)
