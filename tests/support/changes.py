"""A change stream as the upsert and CDC tests feed it to Spark and check what it leaves: one JSON file a round (one
round a batch, read in the order written: tests/support/stream_input.py), the rounds run through a failure between the
unit commit and Spark's commit log, and the model -- the tables computed in plain Python from the changes. Debezium's
Kafka records (tests/support/cdc_debezium.py) in such files are read by :func:`start_debezium`.

The model applies the changes one by one in their order (a sequence number, a source position): a change with
``op`` 'd' removes its key's row, 't' (a truncate) empties its table, any other sets its key's row."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lakesink
from lakesink.faults import DRIVER_AFTER_SWAP
from tests.support.helpers import fail_once_at
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
