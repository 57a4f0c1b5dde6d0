"""Debezium's transaction metadata: which source transactions a batch holds whole, in commit order (plain Python).

With ``provide.transaction.metadata=true`` a Debezium connector writes, besides the tables' change events, one
*transaction topic* (one partition, so in commit order) with a ``BEGIN`` and an ``END`` record per transaction::

    {"status": "BEGIN", "id": "571:53736952", "ts_ms": ..., "event_count": null, "data_collections": null}
    {"status": "END", "id": "571:53736952", "ts_ms": ..., "event_count": 2,
     "data_collections": [{"data_collection": "public.a", "event_count": 1}, ...]}

and every change event carries ``"transaction": {"id": ..., "total_order": ..., "data_collection_order": ...}``.

:func:`release` decides, from the ``END`` records at hand (their position in the transaction topic: Kafka's offset) and
the changes at hand per transaction (distinct ``total_order`` values, so a change Kafka delivered twice counts once),
which transactions a batch commits: in commit order, the longest prefix of transactions whose every change is at hand.
Every transaction after the first incomplete one is held back, whole or not (releasing a later one would show a state
the source never had: the later transaction without the earlier one). A transaction whose ``END`` has not arrived
committed after every ``END`` at hand (one partition), so it is held too. Changes without a ``transaction`` block
(a snapshot's reads, op ``r``) belong to no transaction and are released as they come.

Used on the driver by foreach_batch (lakesink.sink.transactions: :func:`release`) and by format("lakesink")'s commit
(lakesink.sink.staged_transactions: :func:`split_records`); no Spark, no catalog here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa

BEGIN, END = "BEGIN", "END"
STATUSES = (BEGIN, END)

METADATA_HINT = (
    "Debezium's transaction metadata (a record with status BEGIN or END, provide.transaction.metadata=true) is read "
    "by lakesink.foreach_batch(cdc_format='debezium', cdc_transactions='hold') (option 'cdc-transactions', on "
    "format('lakesink') too), which holds a source transaction back until it is whole"
)
"""The end of the error a transaction-metadata record gives without option ``cdc-transactions=hold``."""


@dataclass(frozen=True)
class End:
    """A transaction's ``END`` record: its id, how many changes it made, where it is in commit order, when it committed."""

    id: str
    event_count: int
    position: int
    """The record's offset in the transaction topic (one partition: commit order)."""
    ts_ms: int | None = None


@dataclass(frozen=True)
class Release:
    """What a batch commits and what it holds back, by transaction id."""

    released: tuple[str, ...]
    """The transactions the batch commits, in commit order."""
    held: frozenset[str]
    """The transactions it holds back (their changes, and their ``END`` when at hand)."""
    committed_ms: int | None
    """The commit time (``END``'s ``ts_ms``) of the last transaction released, None when none was."""
    waiting_for: str | None
    """The first transaction not whole: the one every held change waits for (None: nothing held)."""


def release(ends: Iterable[End], changes: Mapping[str, int], begins: Mapping[str, int] | None = None) -> Release:
    """The longest prefix, in commit order, of the transactions whose every change is at hand.

    ``ends``: the ``END`` records at hand (held back by earlier batches and this batch's); ``changes``: per transaction
    id, the number of its distinct changes at hand; ``begins``: per transaction id, the position of its ``BEGIN`` record
    at hand. A transaction with more changes than its ``event_count`` (a connector's duplicate with another
    ``total_order``) is whole; one with fewer waits. A ``BEGIN`` whose ``END`` is not at hand is a barrier: no
    transaction whose ``END`` comes after it in the topic is released (its own commit may come first)."""
    by_id: dict[str, End] = {}
    for end in sorted(ends, key=lambda e: e.position):
        by_id.setdefault(end.id, end)  # an END delivered twice: its first position
    open_ = sorted((position, tx) for tx, position in (begins or {}).items() if tx not in by_id)
    barrier = open_[0] if open_ else None
    released: list[str] = []
    committed_ms: int | None = None
    waiting_for: str | None = None
    for end in by_id.values():
        if barrier is not None and end.position > barrier[0]:
            waiting_for = barrier[1]
            break
        if changes.get(end.id, 0) < end.event_count:
            waiting_for = end.id
            break
        released.append(end.id)
        committed_ms = end.ts_ms if end.ts_ms is not None else committed_ms
    held = frozenset((set(changes) | set(by_id) | set(begins or {})) - set(released))
    if waiting_for is None and held:
        # a transaction begun and not ended, else one whose BEGIN and END have not arrived: after every END at hand
        waiting_for = barrier[1] if barrier is not None else min(held - set(by_id), default=None)
    return Release(tuple(released), held, committed_ms, waiting_for)


def end_of(payload: object) -> End | None:
    """A transaction record's ``END``, recognised by its shape (``status``, ``id``, ``event_count``; no ``op``), with
    position -1 (the caller knows the offset); None for a ``BEGIN`` or anything else."""
    if not isinstance(payload, dict) or "op" in payload or payload.get("status") != END:
        return None
    tx, count = payload.get("id"), payload.get("event_count")
    if not isinstance(tx, str) or not isinstance(count, int):
        return None
    ts = payload.get("ts_ms")
    return End(tx, count, -1, ts if isinstance(ts, int) else None)


def is_transaction_record(payload: object) -> bool:
    """A record of the transaction topic: ``status`` BEGIN or END, an ``id``, no ``op``."""
    return isinstance(payload, dict) and "op" not in payload and payload.get("status") in STATUSES and "id" in payload


def payload_of(value: str | bytes | None) -> object:
    """A Kafka value's JSON, without the JsonConverter's ``schemas.enable`` wrapper (None: a tombstone)."""
    if value is None:
        return None
    whole = json.loads(value)
    if isinstance(whole, dict) and "schema" in whole and "payload" in whole:
        return whole["payload"]
    return whole


CHANGE = "change"


@dataclass(frozen=True)
class RecordsSplit:
    """A batch's Kafka records (with what the previous batch held back) split by :func:`release`."""

    released: pa.Table
    """The change records the batch commits (of released transactions, or of none), in the records' order."""
    held: pa.Table
    """The records it holds back: the changes of transactions not released, and their ``BEGIN`` and ``END`` records."""
    decision: Release
    held_changes: int
    oldest_ms: int | None
    """The oldest held change's ``ts_ms`` (None: none held, or none carries one)."""


def split_records(records: pa.Table, *, value: str = "value", offset: str = "offset") -> RecordsSplit:
    """:func:`release` over Arrow records (Kafka's ``value`` and ``offset`` columns; the others carried along), in plain
    Python: what foreach_batch's Spark SQL (lakesink.sink.transactions) computes, for a caller without Spark. The
    ``BEGIN`` and ``END`` records of released transactions are dropped; a value that is no JSON is a change of no
    transaction (the parser after this step refuses it)."""
    kinds: list[str] = []
    txs: list[str | None] = []
    ends: list[End] = []
    begins: dict[str, int] = {}
    seen: dict[str, set[object]] = {}
    times: list[int | None] = []
    values, offsets = records.column(value).to_pylist(), records.column(offset).to_pylist()
    for row, (v, off) in enumerate(zip(values, offsets, strict=True)):
        try:
            payload = payload_of(v)
        except ValueError:
            payload = None
        if is_transaction_record(payload):
            assert isinstance(payload, dict)
            end = end_of(payload)
            kinds.append(END if end is not None else BEGIN)
            txs.append(str(payload["id"]))
            times.append(None)
            if not isinstance(off, int):
                raise ValueError(f"the record of transaction {payload['id']} has no offset ({off!r}): its commit order")
            if end is not None:
                ends.append(End(end.id, end.event_count, off, end.ts_ms))
            else:
                begins.setdefault(str(payload["id"]), off)
            continue
        block = payload.get("transaction") if isinstance(payload, dict) else None
        tx = block.get("id") if isinstance(block, dict) else None
        kinds.append(CHANGE)
        txs.append(tx if isinstance(tx, str) else None)
        ts = payload.get("ts_ms") if isinstance(payload, dict) else None
        times.append(ts if isinstance(ts, int) else None)
        if isinstance(tx, str):
            order = block.get("total_order") if isinstance(block, dict) else None
            seen.setdefault(tx, set()).add(order if order is not None else ("row", row))
    decision = release(ends, {tx: len(orders) for tx, orders in seen.items()}, begins)
    released = [k == CHANGE and (t is None or t not in decision.held) for k, t in zip(kinds, txs, strict=True)]
    held = [t is not None and t in decision.held for t in txs]
    held_times = [ts for k, h, ts in zip(kinds, held, times, strict=True) if h and k == CHANGE and ts is not None]
    return RecordsSplit(
        released=records.filter(pa.array(released, pa.bool_())),
        held=records.filter(pa.array(held, pa.bool_())),
        decision=decision,
        held_changes=sum(1 for k, h in zip(kinds, held, strict=True) if h and k == CHANGE),
        oldest_ms=min(held_times, default=None),
    )
