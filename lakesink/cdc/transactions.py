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

What was released is remembered (:class:`Memory`, kept with the held records in the batch's commit): Kafka Connect
delivers at least once, so after a connector restart Debezium produces the tail of a transaction already released
again -- its changes, its ``END`` (at a new offset), sometimes its ``BEGIN``. A record of a transaction among the
last :data:`RELEASED_IDS_KEPT` released whole is dropped (counted: ``redelivered``), never held. A transaction that
cannot become whole -- an ``END`` whose changes are not all at hand (a compacted topic dropped one; a table whose topic
is not read), or changes whose ``BEGIN`` and ``END`` are not at hand (a redelivered change of a transaction released
longer ago, a lost ``END``) -- is released as it stands once it waited ``wait_ms`` since it was first held (counted:
``incomplete``, logged by the caller); a ``BEGIN`` without its ``END`` (a transaction still open) waits without bound.

Used on the driver by foreach_batch (lakesink.sink.cdc.transactions: :func:`release`) and by format("lakesink")'s commit
(lakesink.sink.cdc.staged_transactions: :func:`split_records`); no Spark, no catalog here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


RELEASED_IDS_KEPT = 10_000
"""How many of the last transactions released whole :class:`Memory` keeps: a redelivered record of one of them is
dropped. Kafka Connect re-sends what it produced since its last offset flush (``offset.flush.interval.ms``, 60 s by
default): 10,000 transactions cover that at ~160 transactions/s; an older redelivered change waits ``wait_ms`` and is
released as a change of no known transaction (its order then finds it stale)."""


@dataclass(frozen=True)
class Memory:
    """What the batches before released, and since when the transactions held back that may never be whole wait."""

    released: tuple[str, ...] = ()
    """The ids of the last :data:`RELEASED_IDS_KEPT` transactions released whole, oldest first."""
    since: Mapping[str, int] = field(default_factory=dict)
    """Per transaction held back that is not whole and not open (its ``END`` at hand, or neither ``BEGIN`` nor ``END``):
    the wall-clock time (ms) a batch first held it so."""


@dataclass(frozen=True)
class Release:
    """What a batch commits and what it holds back, by transaction id."""

    released: tuple[str, ...]
    """The transactions the batch commits, in commit order (those released incomplete among them)."""
    held: frozenset[str]
    """The transactions it holds back (their changes, and their ``END`` when at hand)."""
    committed_ms: int | None
    """The commit time (``END``'s ``ts_ms``) of the last transaction released, None when none was."""
    waiting_for: str | None
    """The first transaction not whole: the one every held change waits for (None: nothing held)."""
    dropped: frozenset[str] = frozenset()
    """Transactions an earlier batch released whole, delivered again: their records are dropped."""
    incomplete: tuple[str, ...] = ()
    """Transactions released as they stand after waiting ``wait_ms`` (an ``END`` whose changes never all came, or
    changes whose ``BEGIN`` and ``END`` never came)."""
    memory: Memory = field(default_factory=Memory)
    """What the next batch starts from."""


def release(
    ends: Iterable[End],
    changes: Mapping[str, int],
    begins: Mapping[str, int] | None = None,
    *,
    memory: Memory | None = None,
    now_ms: int | None = None,
    wait_ms: int | None = None,
) -> Release:
    """The longest prefix, in commit order, of the transactions whose every change is at hand.

    ``ends``: the ``END`` records at hand (held back by earlier batches and this batch's); ``changes``: per transaction
    id, the number of its distinct changes at hand; ``begins``: per transaction id, the position of its ``BEGIN`` record
    at hand. A transaction with more changes than its ``event_count`` (a connector's duplicate with another
    ``total_order``) is whole; one with fewer waits. A ``BEGIN`` whose ``END`` is not at hand is a barrier: no
    transaction whose ``END`` comes after it in the topic is released (its own commit may come first).

    ``memory``: what earlier batches released (a transaction among ``memory.released`` is dropped) and since when the
    held ones wait; with ``now_ms`` and ``wait_ms``, a transaction not whole and not open that has waited ``wait_ms``
    is released as it stands."""
    memory = memory if memory is not None else Memory()
    begins = dict(begins or {})
    ends = list(ends)
    known = set(memory.released)
    dropped = frozenset((set(changes) | {e.id for e in ends} | set(begins)) & known)
    changes = {tx: n for tx, n in changes.items() if tx not in dropped}
    begins = {tx: p for tx, p in begins.items() if tx not in dropped}

    def waited(tx: str) -> bool:
        since = memory.since.get(tx)
        return wait_ms is not None and now_ms is not None and since is not None and now_ms - since >= wait_ms

    by_id: dict[str, End] = {}
    for end in sorted((e for e in ends if e.id not in dropped), key=lambda e: e.position):
        by_id.setdefault(end.id, end)  # an END delivered twice: its first position
    open_ = sorted((position, tx) for tx, position in begins.items() if tx not in by_id)
    barrier = open_[0] if open_ else None
    released: list[str] = []
    incomplete: list[str] = []
    committed_ms: int | None = None
    waiting_for: str | None = None
    for end in by_id.values():
        if barrier is not None and end.position > barrier[0]:
            waiting_for = barrier[1]
            break
        if changes.get(end.id, 0) < end.event_count:
            if not waited(end.id):
                waiting_for = end.id
                break
            incomplete.append(end.id)
        released.append(end.id)
        committed_ms = end.ts_ms if end.ts_ms is not None else committed_ms
    # changes of a transaction whose BEGIN and END are not at hand: not a barrier; released once they waited
    stray = sorted(set(changes) - set(by_id) - set(begins))
    for tx in stray:
        if waited(tx):
            incomplete.append(tx)
            released.append(tx)
    held = frozenset((set(changes) | set(by_id) | set(begins)) - set(released))
    if waiting_for is None and held:
        # a transaction begun and not ended, else one whose BEGIN and END have not arrived: after every END at hand
        waiting_for = barrier[1] if barrier is not None else min(held - set(by_id), default=None)
    whole = [tx for tx in released if tx not in incomplete]
    clocked = {tx for tx in held if tx not in begins or tx in by_id}  # not open: its END at hand, or a stray
    since = {tx: memory.since.get(tx, now_ms) for tx in sorted(clocked) if now_ms is not None or tx in memory.since}
    remembered = Memory(
        released=(*memory.released, *whole)[-RELEASED_IDS_KEPT:],
        since={tx: t for tx, t in since.items() if t is not None},
    )
    return Release(tuple(released), held, committed_ms, waiting_for, dropped, tuple(incomplete), remembered)


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
    redelivered: int = 0
    """The change records dropped: of transactions an earlier batch released whole (:attr:`Release.dropped`)."""


def split_records(
    records: pa.Table,
    *,
    value: str = "value",
    offset: str = "offset",
    memory: Memory | None = None,
    now_ms: int | None = None,
    wait_ms: int | None = None,
) -> RecordsSplit:
    """:func:`release` over Arrow records (Kafka's ``value`` and ``offset`` columns; the others carried along), in plain
    Python: what foreach_batch's Spark SQL (lakesink.sink.cdc.transactions) computes, for a caller without Spark. The
    ``BEGIN`` and ``END`` records of released transactions are dropped, and every record of a transaction an earlier
    batch released (``memory``); a value that is no JSON is a change of no transaction (the parser after this step
    refuses it)."""
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
    counts = {tx: len(orders) for tx, orders in seen.items()}
    decision = release(ends, counts, begins, memory=memory, now_ms=now_ms, wait_ms=wait_ms)
    gone = decision.held | decision.dropped
    released = [k == CHANGE and (t is None or t not in gone) for k, t in zip(kinds, txs, strict=True)]
    held = [t is not None and t in decision.held for t in txs]
    held_times = [ts for k, h, ts in zip(kinds, held, times, strict=True) if h and k == CHANGE and ts is not None]
    return RecordsSplit(
        released=records.filter(pa.array(released, pa.bool_())),
        held=records.filter(pa.array(held, pa.bool_())),
        decision=decision,
        held_changes=sum(1 for k, h in zip(kinds, held, strict=True) if h and k == CHANGE),
        oldest_ms=min(held_times, default=None),
        redelivered=sum(1 for k, t in zip(kinds, txs, strict=True) if k == CHANGE and t is not None and t in decision.dropped),
    )
