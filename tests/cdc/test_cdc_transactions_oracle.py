"""The PostgreSQL oracle held back by source transaction (issue 32, item 5): the seeded workload's Debezium records with
their transaction metadata (tests/support/cdc_oracle.py, cdc_debezium.py: each change's ``transaction`` block, the
transaction topic's BEGIN/END records, from the slot's real transaction boundaries) delivered as a Kafka consumer
would read the eleven tables' topics and the transaction topic: each topic up to a seeded cut per micro-batch, so
that batches cut transactions anywhere (a change before its END, an END before some of its changes, a transaction
over several tables with its tables' changes in different batches). Both entry points with cdc-transactions=hold
stream them through SIGKILLs (inside a unit's database transaction, after a unit's swap) and restarts from the
checkpoint: foreach_batch (the driver kills itself at the point) and format("lakesink") (the whole job -- JVM, commit
worker -- SIGKILLed while the commit worker waits at the point), the latter over fewer micro-batches (issue 34: the
suite's time; its cuts still split transactions, over several tables too, and its kills still fall mid-transaction).

Checked: after EVERY committed batch (each table as of its snapshot of that batch, read back from its history), the
tables together equal the PostgreSQL state after a whole prefix of the source's transactions in commit order -- the
same prefix for every table (the slot's changes replayed, which tests/cdc/test_oracle.py proves equal to
``SELECT *``); at the end every table equals ``SELECT *`` of its PostgreSQL table (pyiceberg and DuckDB). The cuts are
checked to split transactions (and, applied as they come, to show a state PostgreSQL never had): the check can fail.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from lakesink.audit import interop
from lakesink.cdc import transactions
from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP
from lakesink.table.keys import SUMMARY_UPSERT_MODE
from tests.support import cdc_debezium, cdc_oracle
from tests.support.cdc_oracle import TABLES
from tests.support.helpers import lakesink_snapshots
from tests.support.job_process import start_job

pytestmark = pytest.mark.spark

RECORDS = pa.schema([("value", pa.string()), ("offset", pa.int64())])

SEED = 5
RUNS = {
    # entry point: (micro-batches, the batches of the first clean run; the next batch is killed twice, then the rest)
    "foreach": (8, 3),
    "format": (5, 2),
}
State = dict[str, dict[tuple[Any, ...], dict[str, Any]]]
"""table -> primary key -> the row's non-null columns (a column a table does not have yet is null)"""


def topics(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every topic's Kafka records in order, with the round each came from (the tables' topics and the transaction
    topic; Connect schemas in the values)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for sub in (cdc_oracle.DEBEZIUM_SCHEMAS, cdc_oracle.TRANSACTIONS_SCHEMAS):
        for path in sorted((folder / sub).glob("round-*.jsonl")):
            n = int(path.stem.split("-")[1])
            for line in path.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                out.setdefault(record["topic"], []).append({**record, "round": n})
    for records in out.values():
        assert [r["offset"] for r in records] == list(range(len(records)))  # Kafka's offsets, over all rounds
    return out


def deliveries(by_topic: Mapping[str, list[dict[str, Any]]], seed: int, batches: int) -> list[list[dict[str, Any]]]:
    """Each topic consumed up to a seeded cut per micro-batch (the last takes the rest); the first batch holds the
    snapshot (round 0, no transaction) whole, and records of no topic are in order across topics."""
    rng = random.Random(seed)
    at = {name: sum(1 for r in records if r["round"] == 0) for name, records in by_topic.items()}
    out: list[list[dict[str, Any]]] = []
    for b in range(batches):
        rows: list[dict[str, Any]] = []
        for name, records in sorted(by_topic.items()):
            cut = len(records) if b == batches - 1 else min(len(records), at[name] + rng.randint(0, 2 * len(records) // batches))
            rows.extend(records[at[name] if b else 0 : cut])
            at[name] = cut
        rng.shuffle(rows)
        out.append(rows)
    return out


def tx_of(record: Mapping[str, Any]) -> str | None:
    """The transaction of a Kafka record (a change's block, or a BEGIN/END's id); None: a snapshot read, a tombstone."""
    if record["value"] is None:
        return None
    payload = json.loads(record["value"])["payload"]
    if record["topic"] == cdc_debezium.TRANSACTION_TOPIC:
        return str(payload["id"])
    block = payload.get("transaction")
    return None if block is None else str(block["id"])


def split_transactions(batches: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, set[int]]:
    """The transactions whose records (changes, BEGIN, END) are in more than one micro-batch, with those batches."""
    seen: dict[str, set[int]] = {}
    for b, records in enumerate(batches):
        for r in records:
            tx = tx_of(r)
            if tx is not None:
                seen.setdefault(tx, set()).add(b)
    return {tx: bs for tx, bs in seen.items() if len(bs) > 1}


def shown(rows: Mapping[str, Iterable[Mapping[str, Any]]], keys: Mapping[str, Sequence[str]]) -> State:
    """Tables' rows as compared: by primary key, null columns left out, timestamptz in UTC, empty tables left out."""
    out: State = {}
    for table, table_rows in rows.items():
        by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in table_rows:
            key = tuple(r[k] for k in keys[table])
            assert key not in by_key, f"{table}: key {key} twice"
            by_key[key] = {c: _utc(v) for c, v in r.items() if v is not None}
        if by_key:
            out[table] = by_key
    return out


def _utc(value: Any) -> Any:
    return value.astimezone(dt.timezone.utc) if isinstance(value, dt.datetime) and value.tzinfo is not None else value


def prefix_states(changes: Sequence[dict[str, Any]]) -> list[State]:
    """PostgreSQL's tables after each whole prefix of its transactions in commit order (0: the snapshot alone)."""
    keys = {t.qualified: t.key for t in TABLES}
    snapshot = [c for c in changes if c["op"] == "r"]
    txs = cdc_oracle.transactions_of(changes)
    out = []
    for k in range(len(txs) + 1):
        replayed = cdc_oracle.replay([*snapshot, *(c for _, members in txs[:k] for c in members)])
        out.append(shown({t: rows.values() for t, rows in replayed.items()}, keys))
    return out


def naive_states(changes: Sequence[dict[str, Any]], batches: Sequence[Sequence[Mapping[str, Any]]]) -> list[State]:
    """The tables after each batch when every change is applied as it comes (cdc-transactions=off): the control."""
    keys = {t.qualified: t.key for t in TABLES}
    by_tx_order = {(tx, i + 1): c for tx, members in cdc_oracle.transactions_of(changes) for i, c in enumerate(members)}
    snapshot = [c for c in changes if c["op"] == "r"]
    delivered: list[dict[str, Any]] = list(snapshot)
    out = []
    for records in batches:
        for r in records:
            tx = tx_of(r)
            if tx is not None and r["topic"] != cdc_debezium.TRANSACTION_TOPIC:
                delivered.append(by_tx_order[(tx, json.loads(r["value"])["payload"]["transaction"]["total_order"])])
        replayed = cdc_oracle.replay(sorted(delivered, key=lambda c: c["seq"]))
        out.append(shown({t: rows.values() for t, rows in replayed.items()}, keys))
    return out


def committed_states(props: Mapping[str, str]) -> dict[int, State]:
    """What a reader saw after each batch that committed rows: every table as of its snapshot of that batch, or of
    the last batch before it that changed it (a table without one: empty, or not made yet)."""
    catalog = catalogs.load(None, dict(props))
    keys = {t.qualified: t.key for t in TABLES}
    history: dict[str, list[tuple[int, int]]] = {}
    tables = {}
    for t in TABLES:
        if catalog.table_exists((t.schema, t.name)):
            tables[t.qualified] = catalog.load_table((t.schema, t.name))
            snaps = [(s["batch_id"], s["snapshot_id"]) for s in lakesink_snapshots(tables[t.qualified])]
            assert [b for b, _ in snaps] == sorted({b for b, _ in snaps}), f"{t.qualified} holds a batch twice: {snaps}"
            history[t.qualified] = snaps
    # a table that a batch did not change is read as of the same snapshot as before: each snapshot is scanned once
    scanned: dict[tuple[str, int], list[dict[str, Any]]] = {}

    def rows_at(name: str, snapshot_id: int) -> list[dict[str, Any]]:
        if (name, snapshot_id) not in scanned:
            scanned[name, snapshot_id] = tables[name].scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
        return scanned[name, snapshot_id]

    out: dict[int, State] = {}
    for b in sorted({b for snaps in history.values() for b, _ in snaps}):
        rows: dict[str, list[dict[str, Any]]] = {}
        for name, snaps in history.items():
            at = [sid for batch, sid in snaps if batch <= b]
            rows[name] = rows_at(name, at[-1]) if at else []
        out[b] = shown(rows, keys)
    return out


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None, entry: str, mor: bool = False) -> Any:
    mode = ("hold" if entry == "foreach" else "hold-format") + ("-mor" if mor else "")
    return start_job("tests.jobs.cdc_oracle_job", json.dumps(props), str(src), str(ck), mode, faults_dir=faults_dir)


def _write(src: Path, index: int, records: Sequence[Mapping[str, Any]]) -> None:
    path = src / f"batch-{index:04d}.jsonl"
    fields = ("topic", "key", "value", "offset")
    path.write_text("".join(json.dumps({f: r[f] for f in fields}) + "\n" for r in records), encoding="utf-8")
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # Spark's file source: in order


@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("mode", ["copy-on-write", "merge-on-read"])
@pytest.mark.parametrize("entry", list(RUNS))
def test_the_postgresql_oracle_held_back_by_transaction_shows_whole_transactions_after_every_batch(
    captured: tuple[str, Path], tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str, mode: str
) -> None:
    """``merge-on-read``: the tables lakesink makes say write.merge.mode=merge-on-read: every batch's upserts into them
    are row deltas (position deletes), the released changes of held transactions included."""
    dsn, folder = captured
    mor = mode == "merge-on-read"
    props = catalog_properties
    count, clean = RUNS[entry]
    changes = list(cdc_oracle.read_changes(folder))
    txs = cdc_oracle.transactions_of(changes)
    batches = deliveries(topics(folder), SEED, count)
    split = split_transactions(batches)
    spanning = {tx for tx, members in txs if len({c["table"] for c in members}) > 1}
    assert len(split) > 0 and split.keys() & spanning, "the cuts split no transaction (over several tables)"
    prefixes = prefix_states(changes)
    naive = naive_states(changes, batches)
    assert any(state not in prefixes for state in naive), "applied as they come, no batch would show half a transaction"
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()

    def run(upto: int, point: str | None) -> None:
        for b in range(upto):
            if not (src / f"batch-{b:04d}.jsonl").exists():
                _write(src, b, batches[b])
        if point is not None:
            # foreach_batch: the point runs in the driver, which kills itself there; format("lakesink"): it runs in
            # Spark's commit worker, and the whole job (JVM, workers) is SIGKILLed while the worker waits at it
            faults.arm(point, "kill" if entry == "foreach" else "pause")
        proc = _job(props, src, ck, str(faults.folder) if point else None, entry, mor)
        if point is not None and entry == "format":
            reached = Path(faults.folder) / f"{point}.reached"
            deadline = time.monotonic() + 900
            while not reached.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if reached.exists():
                os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=900)
        if point is not None:  # killed at the point
            assert faults.fired(point), err[-3000:]
            assert proc.returncode == -signal.SIGKILL, err[-3000:]
            faults.clear()
        else:
            assert proc.returncode == 0 and "CDC JOB DONE" in out, err[-3000:]

    run(clean, None)
    query_id = str(json.loads((ck / "metadata").read_text())["id"])
    catalog = catalogs.load(None, props)
    first = {t.qualified: catalog.load_table((t.schema, t.name)) for t in TABLES}
    before = held.recorded(first, query_id, None)
    assert before is not None and before.batch_id == clean - 1 and before.changes > 0, before  # killed next mid-transaction
    run(clean + 2, CATALOG_BETWEEN_TABLE_SWAPS)  # batch <clean>'s unit, inside its database transaction: nothing lands
    killed = held.recorded({t.qualified: catalog.load_table((t.schema, t.name)) for t in TABLES}, query_id, None)
    assert killed == before, (killed, before)  # nothing of the killed unit in any table
    run(clean + 2, DRIVER_AFTER_SWAP)  # the same batch again: its unit lands, the job dies before Spark's commit log
    landed = held.recorded({t.qualified: catalog.load_table((t.schema, t.name)) for t in TABLES}, query_id, None)
    assert landed is not None and landed.batch_id == clean, landed
    run(count, None)  # that batch replayed (found committed), then the rest

    seen = committed_states(props)
    assert len(seen) >= count // 2, sorted(seen)
    reached = []
    for b, state in sorted(seen.items()):
        matches = [k for k, s in enumerate(prefixes) if s == state]
        assert matches, f"after batch {b} a reader sees a state PostgreSQL never had at a commit (half a transaction)"
        reached.append(max(matches))
    assert reached == sorted(reached), reached  # never back to an earlier state
    assert reached[-1] == len(txs)

    expected = cdc_oracle.expected_tables(dsn)
    with cdc_oracle.connect(dsn) as conn, conn.cursor() as cur:
        columns = {t.qualified: list(cdc_oracle.column_types(cur, t.qualified)) for t in TABLES}
    for t in TABLES:
        table = catalog.load_table((t.schema, t.name))
        assert table.schema().column_names == columns[t.qualified], t.qualified
        want = expected[t.qualified]
        assert _rows(table.scan().to_arrow().to_pylist(), t.key) == want, f"{t.qualified} (pyiceberg)"
        assert _rows(interop.duckdb_read(table.metadata_location).to_pylist(), t.key) == want, f"{t.qualified} (DuckDB)"
    tables_now = {t.qualified: catalog.load_table((t.schema, t.name)) for t in TABLES}
    last = held.recorded(tables_now, query_id, None)
    assert last is not None and last.batch_id == count - 1 and last.changes == 0
    # nothing held: the last batch's file holds no record, only the ids of the transactions released (redeliveries)
    rows, memory = held.read(next(iter(tables_now.values())).io, last)
    assert rows is not None and rows.num_rows == 0 and memory.released
    staged = list((ck / "lakesink").rglob("*.parquet")) if (ck / "lakesink").exists() else []
    assert staged == [], f"staged files left behind: {staged}"
    if mor:
        deltas = 0
        for name, table in tables_now.items():
            for snap in lakesink_snapshots(table):
                summary = snap["summary"]
                if SUMMARY_UPSERT_MODE in summary:
                    assert summary[SUMMARY_UPSERT_MODE] == "merge-on-read", (name, snap["batch_id"], summary)
                    deltas += int(summary.get("added-position-deletes", "0")) > 0
        assert deltas, "no batch wrote a position delete: the test proves nothing"


def _rows(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    out = {tuple(r[k] for k in key): {c: _utc(v) for c, v in r.items()} for r in rows}
    assert len(out) == len(rows), "a key is in the table more than once"
    return out


@pytest.mark.parametrize("entry", list(RUNS))
def test_the_cuts_split_transactions_and_the_control_sees_half_of_one(captured: tuple[str, Path], entry: str) -> None:
    """Without Spark: the deliveries split transactions (over several tables too), and the same batches applied as
    they come show, after some batch, a state PostgreSQL never had -- what the held run above must never show; the
    first clean run ends holding changes back (the kills fall mid-transaction)."""
    _, folder = captured
    changes = list(cdc_oracle.read_changes(folder))
    count, clean = RUNS[entry]
    batches = deliveries(topics(folder), SEED, count)
    split = split_transactions(batches)
    txs = cdc_oracle.transactions_of(changes)
    spanning = {tx for tx, members in txs if len({c["table"] for c in members}) > 1}
    assert len(split) >= 5 and len(split.keys() & spanning) >= 2, (len(split), len(split.keys() & spanning))
    prefixes = prefix_states(changes)
    halves = [b for b, state in enumerate(naive_states(changes, batches)) if state not in prefixes]
    assert halves, "no batch shows half a transaction"
    assert sum(len(r) for r in batches) == sum(len(rs) for rs in topics(folder).values())  # every record once
    back: pa.Table | None = None
    held_after = []
    for records in batches:  # the plain-Python decision each batch's commit makes (lakesink.cdc.transactions)
        delivered = pa.Table.from_pylist([{"value": r["value"], "offset": r["offset"]} for r in records], RECORDS)
        decided = transactions.split_records(pa.concat_tables([back, delivered]) if back is not None else delivered)
        back = decided.held
        held_after.append(decided.held_changes)
    assert held_after[clean - 1] > 0 and held_after[clean] > 0 and held_after[-1] == 0, held_after
