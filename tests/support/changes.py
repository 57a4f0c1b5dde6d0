"""A change stream as the upsert and CDC tests feed it to Spark and check what it leaves: one JSON file a round (one
round a batch, read in the order written: tests/support/stream_input.py), the rounds run through a failure between the
unit commit and Spark's commit log, and the model -- the tables computed in plain Python from the changes. Debezium's
Kafka records (tests/support/cdc_debezium.py) in such files are read by :func:`start_debezium`; :class:`DebeziumRounds`
writes changes (:func:`event`) as such records (the envelope's fields the sink reads) and runs the query over them.

The model applies the changes one by one in their order (a sequence number, a source position): a change with
``op`` 'd' removes its key's row, 't' (a truncate) empties its table, any other sets its key's row."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

import lakesink
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedTaskWriter
from lakesink.faults import DRIVER_AFTER_SWAP
from lakesink.options import SinkOptions
from lakesink.sink.staged import StagedCommitter, cdc_schema, staged_plan
from tests.support.helpers import fail_once_at, run_to_end
from tests.support.stream_input import write_stream_lines

C = TypeVar("C", bound=Mapping[str, Any])
R = TypeVar("R")

KAFKA_DDL = "topic STRING, key STRING, value STRING"
"""The columns of a Kafka record as the tests write them into JSON files."""


def write_json_round(src: Path, index: int, lines: Iterable[Mapping[str, Any]]) -> None:
    """Round ``index``: one file of JSON lines in ``src``, which Spark reads after the rounds written before it."""
    write_stream_lines(src, f"round-{index:03d}.json", [json.dumps(line) for line in lines])


def start_debezium(spark: Any, props: Mapping[str, str], src: Path, ck: Path, **options: Any) -> Any:
    """A foreach_batch query with option cdc-format=debezium and merge-schema over the Kafka records in ``src``, one
    file a batch, until it has read them (availableNow); ``options``: the sink's other keyword arguments."""
    df = spark.readStream.schema(KAFKA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    sink = lakesink.foreach_batch(cdc_format="debezium", merge_schema=True, catalog_properties=dict(props), **options)
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start()


def apply(
    rows: dict[Any, R], changes: Iterable[C], *, order: str, key: Callable[[C], Any], row: Callable[[C], R]
) -> dict[Any, R]:
    """``rows`` (one table's rows by key) after ``changes`` applied in the order of their field ``order``; returned."""
    for c in sorted(changes, key=lambda c: c[order]):
        if c["op"] == "t":
            rows.clear()
        elif c["op"] == "d":
            rows.pop(key(c), None)
        else:
            rows[key(c)] = row(c)
    return rows


def tables_model(
    changes: Iterable[C], *, table: str, order: str, key: Callable[[C], Any], row: Callable[[C], R]
) -> dict[str, dict[Any, R]]:
    """Every table's rows by key after ``changes`` (of the tables their field ``table`` names) applied in the order of
    their field ``order``; a truncate of a table no change wrote before makes no table."""
    tables: dict[str, dict[Any, R]] = {}
    for c in sorted(changes, key=lambda c: c[order]):
        if c["op"] == "t" and c[table] not in tables:
            continue
        apply(tables.setdefault(c[table], {}), [c], order=order, key=key, row=row)
    return tables


def rounds_through_a_failure(
    rounds: Sequence[R],
    faults: Any,
    *,
    failing: int,
    write: Callable[[int, R], object],
    run: Callable[[], object],
    check: Callable[[Sequence[R]], object],
) -> None:
    """Each round written, then run to its end as a query of its own (a restart from the checkpoint) and ``check``ed
    with the rounds so far -- but round ``failing``: its unit commits and the query fails before Spark's commit log
    (``DRIVER_AFTER_SWAP``), so the next run replays it (found in every table) before its own round."""
    for index, changes in enumerate(rounds):
        write(index, changes)
        if index == failing:
            fail_once_at(faults, DRIVER_AFTER_SWAP, run)
        else:
            run()
            check(rounds[: index + 1])


Event = dict[str, Any]
"""A change of a table (``schema.table``) at a source position ``lsn``, its row before and after."""


def event(table: str, op: str, lsn: int, before: Any = None, after: Any = None) -> Event:
    return {"table": table, "op": op, "lsn": lsn, "before": before, "after": after}


@dataclass
class DebeziumRounds:
    """Rounds of changes (:func:`event`) as Debezium's Kafka records in ``<tmp_path>/in`` (one file a round), read by a query
    of :func:`start_debezium` (``options``: the sink's other keyword arguments) checkpointed in ``<tmp_path>/ck``.

    A record's value: the envelope (before, after, op, ts_ms, source with connector, ``db``, schema, table, lsn),
    wrapped as with ``schemas.enable`` in every other record (by the round's index plus the record's); its key:
    ``key(event)`` as JSON (None: no key), wrapped with the value when ``wrap_key``. A delete is followed by its
    tombstone (same key, value null)."""

    spark: Any
    props: Mapping[str, str]
    tmp_path: Path
    db: str
    key: Callable[[Event], Any]
    wrap_key: bool
    options: dict[str, Any] = field(default_factory=dict)

    def records(self, events: Sequence[Event], index: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for n, e in enumerate(events):
            schema, table = e["table"].split(".")
            envelope = {
                "before": e["before"],
                "after": e["after"],
                "op": e["op"],
                "ts_ms": 1,
                "source": {"connector": "postgresql", "db": self.db, "schema": schema, "table": table, "lsn": e["lsn"]},
            }
            wrapped = (index + n) % 2 == 1  # schemas.enable
            value = {"schema": {"type": "struct"}, "payload": envelope} if wrapped else envelope
            key = self.key(e)
            if key is not None and wrapped and self.wrap_key:
                key = {"schema": {"type": "struct", "fields": []}, "payload": key}
            topic = f"lake.{e['table']}"
            text = None if key is None else json.dumps(key)
            out.append({"topic": topic, "key": text, "value": json.dumps(value)})
            if e["op"] == "d":
                out.append({"topic": topic, "key": text, "value": None})  # Debezium's tombstone after a delete
        return out

    def write(self, index: int, events: Sequence[Event]) -> None:
        """Round ``index``: ``events``' records in a file of their own."""
        write_json_round(self.tmp_path / "in", index, self.records(events, index))

    def start(self) -> Any:
        """A query (a restart from the checkpoint) that ends once it has read every round written."""
        return start_debezium(self.spark, self.props, self.tmp_path / "in", self.tmp_path / "ck", **self.options)

    def run(self) -> None:
        """:meth:`start`, run to its end."""
        run_to_end(self.start())

    def through_a_failure(
        self,
        rounds: Sequence[Sequence[Event]],
        faults: Any,
        *,
        failing: int,
        check: Callable[[Sequence[Sequence[Event]]], object],
    ) -> None:
        """:func:`rounds_through_a_failure` of ``rounds`` written and run by this."""
        rounds_through_a_failure(rounds, faults, failing=failing, write=self.write, run=self.run, check=check)


KAFKA_SCHEMA = pa.schema([("topic", pa.string()), ("key", pa.string()), ("value", pa.string())])
""":data:`KAFKA_DDL` as Arrow."""


def staged_cdc_batch(
    props: Mapping[str, str],
    ck: Path,
    query_id: str,
    batch_id: int,
    records: Sequence[Mapping[str, Any]],
    options: Mapping[str, str] | None = None,
    *,
    run_id: str = "r",
) -> None:
    """One micro-batch of ``format("lakesink")`` with option cdc-format over Kafka records (topic, key, value), without
    Spark: one staging task (lakesink.executor.staged) and the staged commit (lakesink.sink.staged); ``options``: the
    sink's other options; ``run_id``: the query's run (another one: a restart)."""
    sink_options = SinkOptions.from_mapping(
        {
            "cdc-format": "debezium",
            "merge-schema": "true",
            "checkpointLocation": str(ck),
            **(options or {}),
            **{f"catalog.{k}": v for k, v in props.items()},
        }
    )
    routed = RoutedCommitter(sink_options, cdc_schema(KAFKA_SCHEMA))
    c = StagedCommitter(routed, staged_plan(sink_options, KAFKA_SCHEMA, routed, query_id))
    ids = TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=batch_id, run_id=run_id)
    result = StagedTaskWriter(c.plan, ids).write(iter([pa.RecordBatch.from_pylist(list(records), schema=KAFKA_SCHEMA)]))
    c.commit_batch(BatchCall(query_id, batch_id, None, run_id), [result])
