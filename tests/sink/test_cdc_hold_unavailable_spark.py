"""Options cdc-transactions=hold and dead-letter-table together, with Debezium's unavailable-value placeholder (issue 51,
items 5 and 6), in real local Spark on both entry points.

A batch that releases a transaction holding a change with the placeholder and no value to keep (an unavailable-value
dead letter) while it holds back another transaction is written a second time (lakesink.sink.commit.commit_routed):
the second writing must commit the same held state and held file as a batch written once -- no held change lost or
released early, no held file left behind by the first writing -- its dead letter once, and a replay of the batch must
change nothing.

Records: Debezium's PostgreSQL connector's, built field by field (tests/support/cdc_debezium.py: the Kafka key's
schema and payload, the envelope, the ``source`` block, the ``transaction`` block of
``provide.transaction.metadata=true``, and the transaction topic's BEGIN/END), with Kafka's ``offset`` per topic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions import held
from tests.driver.test_cdc_unavailable import TYPES, as_stored, row, unchanged_toast
from tests.sink import test_cdc_unavailable_spark as unavailable_spark
from tests.support import cdc_debezium, toast
from tests.support.helpers import assert_each_batch_once, run_to_end, start_sink

pytestmark = pytest.mark.spark

ENTRIES = ["foreach", "format"]
DOCS = "public.docs"
DEAD = "audit.dead_letters"
DDL = "topic STRING, key STRING, value STRING, offset LONG"
Change = dict[str, Any]


def tx_change(op: str, lsn: int, image: dict[str, Any], commit_lsn: int) -> Change:
    """A change of transaction ``700 + commit_lsn`` committed at ``commit_lsn`` (a delete: ``image`` its before image)."""
    c = toast.change(DOCS, op, lsn, image, TYPES, ("id",))
    c["txid"], c["commit_lsn"] = 700 + commit_lsn, commit_lsn
    return c


class Topics(cdc_debezium.Topics):
    """Kafka's topics of the stream: each record with its topic's next offset."""

    def transaction(self, changes: Sequence[Change]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        """A transaction's BEGIN, its changes' records, its END (stamped later: the caller orders delivery)."""
        blocks = cdc_debezium.transaction_blocks(list(changes))
        tx = cdc_debezium.transaction_id(changes[0])
        assert tx is not None
        begin, end = cdc_debezium.transaction_records(tx, cdc_debezium.commit_ms(changes[0]), [DOCS] * len(changes), schemas=True)
        records = [
            r
            for c, b in zip(changes, blocks, strict=True)
            for r in cdc_debezium.records(c, "shop", ("id",), schemas=True, transaction=b)
        ]
        return [begin], records, end


def write(src: Path, index: int, records: Sequence[dict[str, Any]]) -> None:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"batch-{index:03d}.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # maxFilesPerTrigger=1 takes the oldest first


def model(changes: Sequence[Change], letters: Sequence[Change]) -> dict[int, dict[str, Any]]:
    """public.docs after ``changes`` in source order, the dead letters not applied; a placeholder keeps the value the
    row holds (tests/sink/test_cdc_unavailable_spark.py's model)."""
    return unavailable_spark.model([[c for c in changes if c not in letters]]).get(DOCS, {})


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_held_transaction_and_an_unavailable_value_dead_letter_in_one_batch_written_twice(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], entry: str
) -> None:
    props, src, ck = catalog_properties, tmp_path / "in", tmp_path / "ck"
    topics = Topics()
    # batch 0: transaction 10 inserts docs 1 and 2, whole
    t10 = [tx_change("c", 10, row(1, "one"), 10), tx_change("c", 11, row(2, "two"), 10)]
    b, r, e = topics.transaction(t10)
    write(src, 0, topics.stamp(b + r + [e]))
    # batch 1: transaction 20, whole: doc 1 updated with its TOASTed values unchanged (kept), doc 7 -- never inserted --
    # the same way (no value to keep: a dead letter), doc 3 inserted; transaction 30 begins, updates doc 2 (its body
    # unchanged) and deletes doc 1, its END in the next batch: held back
    t20 = [
        tx_change("u", 20, unchanged_toast(1, "one v2"), 20),
        tx_change("u", 21, unchanged_toast(7, "never inserted"), 20),
        tx_change("c", 22, row(3, "three"), 20),
    ]
    t30 = [tx_change("u", 30, unchanged_toast(2, "two v2"), 30), tx_change("d", 31, {"id": 1}, 30)]
    b20, r20, e20 = topics.transaction(t20)
    b30, r30, e30 = topics.transaction(t30)
    write(src, 1, topics.stamp(b20 + r20 + [e20] + b30 + r30))
    dead = [t20[1]]

    def go() -> None:
        df = spark.readStream.schema(DDL).option("maxFilesPerTrigger", 1).json(str(src))
        run_to_end(
            start_sink(
                df,
                entry,
                ck,
                props,
                cdc_format="debezium",
                cdc_transactions="hold",
                merge_schema=True,
                dead_letter_table=DEAD,
            )
        )

    def docs() -> dict[int, dict[str, Any]]:
        table = catalogs.load(None, dict(props)).load_table(("public", "docs"))
        assert_each_batch_once(table, DOCS)
        return {r["id"]: r for r in table.scan().to_arrow().to_pylist()}

    def letters() -> list[tuple[str, str, int, int]]:
        table = catalogs.load(None, dict(props)).load_table(tuple(DEAD.split(".")))
        rows = table.scan().to_arrow().to_pylist()
        return sorted(
            (r["error"], r["table"], r["batch_id"], json.loads(json.loads(r["row"])["value"])["payload"]["after"]["id"])
            for r in rows
        )

    def held_state() -> held.HeldState:
        table = catalogs.load(None, dict(props)).load_table(("public", "docs"))
        query_id = json.loads((ck / "metadata").read_text())["id"]
        state = held.recorded({DOCS: table}, query_id, None)
        assert state is not None
        return state

    def held_on_disk(batch_id: int) -> set[str]:
        """The held files batch ``batch_id`` of the query left (named ``<prefix><query id>-<batch id>-<uuid>``)."""
        warehouse = Path(props["warehouse"].removeprefix("file://"))
        query_id = json.loads((ck / "metadata").read_text())["id"]
        return {p.name for p in warehouse.rglob(f"{held.HELD_FILE_PREFIX}{query_id}-{batch_id}-*")}

    def check_batch_1() -> None:
        assert docs() == as_stored(model(t10 + t20, dead), schemas=True)
        assert letters() == [("unavailable-value", DOCS, 1, 7)]
        state = held_state()
        assert state.batch_id == 1 and state.changes == len(t30), state
        assert state.file is not None
        held_values = pq.read_table(state.file.removeprefix("file://")).column("value").to_pylist()
        # the held file: transaction 30 as delivered so far, its BEGIN and its changes (a tombstone is no change)
        assert sorted(held_values) == sorted(r["value"] for r in b30 + r30 if r["value"] is not None)
        assert held_on_disk(1) == {Path(state.file).name}  # no held file of the first writing left behind

    go()
    check_batch_1()
    (ck / "commits" / "1").unlink()  # a restart before Spark's commit log: batch 1 replayed
    (ck / "commits" / ".1.crc").unlink(missing_ok=True)
    go()
    check_batch_1()
    # batch 2: transaction 30's END: released, doc 2 keeps its body, doc 1 deleted
    write(src, 2, topics.stamp([e30]))
    go()
    assert docs() == as_stored(model(t10 + t20 + t30, dead), schemas=True)
    assert letters() == [("unavailable-value", DOCS, 1, 7)]
    state = held_state()
    assert state.batch_id == 2 and state.changes == 0, state
