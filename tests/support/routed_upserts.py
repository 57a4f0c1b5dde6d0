"""Option route-by with upsert-key on the driver, without Spark: the change stream's model, the batch's tasks as
foreach_batch runs them, a table read back by key (tests/driver/test_routing_upserts.py,
tests/driver/test_routed_table_keys.py)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall, Outcome
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.errors import CommitConflictError, InjectedFault
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskResult, RoutedTaskWriter
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.options import SinkOptions
from tests.support.helpers import data_files_on_disk, lakesink_snapshots, referenced_data_files

Event = tuple[str, Any, str, int, bool]
"""(table, key, value, sequence number, is a delete)"""

BETWEEN_TABLES = [
    (CATALOG_BETWEEN_TABLE_SWAPS, {"table-property.commit.retry.num-retries": "0"}, False),  # inside the SQL transaction
    (DRIVER_BETWEEN_TABLE_COMMITS, {"atomic": "off"}, True),  # table by table: the first table only
]
"""(fault point, extra options, whether one table holds the batch after the fault) of a fault between the tables of
a batch (:meth:`RoutedUpserts.fault_between_tables_then_replay`)."""


def routed_upsert_options(props: Mapping[str, str], **extra: str) -> SinkOptions:
    """Each row to table ``db.<route>``, upserted by ``id`` (or the table's own key), latest ``seq`` wins, op 'd' deletes."""
    return SinkOptions.from_mapping(
        {
            "route-by": "route",
            "namespace": "db",
            "upsert-key": "id",
            "order-by": "seq",
            "delete-when": "op = 'd'",
            **{f"catalog.{k}": v for k, v in props.items()},
            **extra,
        }
    )


def change_stream(seed: int, batches: int, per_batch: int, pick: Callable[[random.Random], tuple[str, Any]]) -> list[list[Event]]:
    """Unique sequence numbers; each event's table and key from ``pick``, a quarter of them deletes."""
    rng = random.Random(seed)
    seq, out = 0, []
    for _ in range(batches):
        events: list[Event] = []
        for _ in range(per_batch):
            seq += 1
            table, key = pick(rng)
            events.append((table, key, f"v{seq}", seq, rng.random() < 0.25))
        out.append(events)
    return out


def model(batches: Sequence[Sequence[Event]]) -> dict[str, dict[Any, tuple[str, int]]]:
    """Each table's rows after the stream, by key: (value, sequence number) of its latest event unless a delete."""
    state: dict[str, dict[Any, tuple[str, int]]] = {}
    for events in batches:
        for table, key, value, seq, deleted in sorted(events, key=lambda e: e[3]):
            rows = state.setdefault(f"db.{table}", {})
            if deleted:
                rows.pop(key, None)
            else:
                rows[key] = (value, seq)
    return state


def write_tasks(
    rc: RoutedCommitter,
    query_id: str,
    batch_id: int,
    events: Sequence[Event],
    rows: Callable[[Sequence[Event]], pa.RecordBatch],
    *,
    tasks: int,
    deletes_computed: bool,
    facts: BatchFacts = NO_FACTS,
) -> list[RoutedTaskResult]:
    """The batch's tasks as foreach_batch runs them: every (table, key) in one task, as its repartition by each table's
    key does; ``rows``: a task's events as the stream's rows; ``facts``: what the batch's changes carry."""
    plans = rc.tables.plans(rc.tables.routes({e[0] for e in events}, batch_id), query_id, facts)
    plan = rc.tables.routed_plan(plans, query_id, template=False, deletes_computed=deletes_computed)
    parts: list[list[Event]] = [[] for _ in range(tasks)]
    for e in events:
        parts[zlib.crc32(f"{e[0]}/{e[1]}".encode()) % tasks].append(e)
    results = []
    for t, part in enumerate(parts):
        writer = RoutedTaskWriter(
            plan, TaskIds(query_id=query_id, batch_id=batch_id, partition_id=t, task_attempt_id=batch_id * 10 + t)
        )
        results.append(writer.write([rows(part)] if part else []))
    return results


def commit_or_abort(
    rc: RoutedCommitter,
    query_id: str,
    batch_id: int,
    results: list[RoutedTaskResult],
    offsets: str,
    facts: BatchFacts = NO_FACTS,
) -> RoutedOutcome:
    """The batch committed, or aborted (its files deleted) when the commit fails, as foreach_batch does."""
    try:
        return rc.commit_batch(BatchCall(query_id, batch_id, offsets), results, facts)
    except BaseException:
        rc.abort_batch(query_id=query_id, batch_id=batch_id, results=results)
        raise


def table_state(
    props: Mapping[str, str], tables: Sequence[str], key: Callable[[str, dict[str, Any]], Any]
) -> dict[str, dict[Any, tuple[str, int]]]:
    """Each table's rows by key (``key``: a row's key in the named table), as the model holds them; a key twice fails."""
    out = {}
    for name in tables:
        table = catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))
        rows = table.scan().to_arrow().to_pylist()
        keys = [key(name, r) for r in rows]
        assert len(keys) == len(set(keys)), f"{name}: a key is in the table more than once"
        out[name] = {key(name, r): (r["value"], r["seq"]) for r in rows}
    return out


def values_seen(props: Mapping[str, str], names: Iterable[str]) -> dict[str, dict[int, str]]:
    """What a reader sees of tables ``db.<name>``: each one that can be loaded and holds rows, its ``value`` by ``id``."""
    catalog = catalogs.load(None, dict(props))
    out: dict[str, dict[int, str]] = {}
    for t in names:
        try:
            rows = catalog.load_table(("db", t)).scan().to_arrow().to_pylist()
        except Exception:
            continue
        if rows:
            out[f"db.{t}"] = {r["id"]: r["value"] for r in rows}
    return out


@dataclass(frozen=True)
class RoutedUpserts:
    """How a test module drives its routed upsert sink: its committer, a batch run through it, its tables read back."""

    routed: Callable[..., RoutedCommitter]
    """``routed(props, **extra options)``: a new committer (a restarted query)."""
    run: Callable[[RoutedCommitter, int, Any], RoutedOutcome]
    """``run(committer, batch id, events)``: the batch's tasks written, the batch committed."""
    state: Callable[[Mapping[str, str], Sequence[str]], Mapping[str, Any]]
    """``state(props, tables)``: the tables' rows by key, as :func:`model` holds them."""

    def fault_between_tables_then_replay(
        self, faults: Any, point: str, some_landed: bool, props: Mapping[str, str], extra: Mapping[str, str], stream: Any
    ) -> None:
        """A routed batch (batch 1 of ``stream``, after batch 0) fails at ``point`` between its tables: with
        ``some_landed`` (atomic=off) the first table only holds it, else none; a restarted committer's replay skips
        what landed and commits the rest, then batch 2 commits. Then every table equals the model, holds each batch
        once and no data file it does not reference."""
        rc = self.routed(props, **extra)
        self.run(rc, 0, stream[0])
        before = self.state(props, sorted(model(stream[:1])))
        faults.arm(point, "raise")
        with pytest.raises((InjectedFault, CommitConflictError)):
            self.run(rc, 1, stream[1])
        assert faults.fired(point)
        faults.clear()
        after = self.state(props, sorted(before))
        changed = {n for n in before if after[n] != before[n]}
        assert bool(changed) == some_landed and len(changed) <= 1  # atomic: none; atomic=off: the first table only
        restarted = self.routed(props, **extra)
        out = self.run(restarted, 1, stream[1])  # the replay: a table holding the batch is skipped, the others commit
        assert {t for t, o in out.tables.items() if o.outcome is Outcome.REPLAY_SKIPPED} == changed
        self.run(restarted, 2, stream[2])
        want = model(stream)
        assert self.state(props, sorted(want)) == want
        for name in want:
            table = catalogs.load_table_fresh(None, dict(props), tuple(name.split(".")))
            batches = [s["summary"]["lakesink.batch-id"] for s in lakesink_snapshots(table)]
            assert len(batches) == len(set(batches)), f"{name} holds a batch twice: {batches}"
            assert data_files_on_disk(table) <= referenced_data_files(table)
