"""Option cdc-transactions=hold on foreach_batch: a source transaction cut by two micro-batches held back until whole.

Before a batch's Debezium records are parsed (lakesink.sink.foreach), the records the previous batch held back
(lakesink.driver.actions.held: named by its unit's tables) are read first and joined to the batch's. One Spark job
over the union finds the transaction topic's ``END`` records (by their shape: ``status``, ``id``, ``event_count``; their
Kafka ``offset`` is their commit order) and counts each transaction's distinct changes at hand; the driver decides
which transactions are released (lakesink.cdc.transactions.release: the longest whole prefix in commit order). The
batch goes on with the released changes (and the changes of no transaction: a snapshot's reads); the others, with
the ``BEGIN``/``END`` records of transactions not released, are collected to the driver and recorded in the batch's own unit
commit (lakesink.driver.committers.routed). The ``BEGIN`` and ``END`` records of released transactions are dropped; a
``BEGIN`` without its ``END`` holds back every transaction that ends after it (lakesink.cdc.transactions.release).

A batch that releases no change while no table records what the sink holds back (the query's first batches, one
transaction open) has no table to record it in: its held changes' tables are created, as the changes would make them
(their payloads' columns and keys, foreach_batch's inference over the held changes), and committed in its unit with no
row, each carrying the record (:func:`homes`; BatchFacts.held_homes). Readers see those tables empty: the state
before the held transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink.cdc import transactions
from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.driver.actions.held import HeldBack
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.errors import InvalidOptionError
from lakesink.options import CDC_TRANSACTIONS, Routing, SinkOptions, TableName
from lakesink.table.routes import Route, parse_route

log = logging.getLogger("lakesink")

OFFSET = "offset"
"""Kafka's offset column: the commit order of the transaction topic's records (one partition)."""
_KIND, _TX, _TX_ORDER, _TX_COUNT, _TX_TS = (
    "__lakesink_tx_kind",
    "__lakesink_tx_id",
    "__lakesink_tx_order",
    "__lakesink_tx_count",
    "__lakesink_tx_ts",
)
_HELPERS = (_KIND, _TX, _TX_ORDER, _TX_COUNT, _TX_TS)
_PARSED = "__lakesink_tx_record"
_CHANGE, _BEGIN, _END = "change", "begin", "end"
_META = "status STRING, id STRING, event_count LONG, ts_ms LONG, op STRING, `transaction` STRUCT<id: STRING, total_order: LONG>"


@dataclass
class Split:
    """A batch split into the changes it releases and what it holds back."""

    released: DataFrame
    """The batch's records to parse and commit (the stream's columns): held ones of earlier batches first released."""
    back: HeldBack
    tables: tuple[str, ...]
    """The tables that recorded the state the batch started from."""
    decision: transactions.Release
    _cached: DataFrame

    @property
    def needs_home(self) -> bool:
        """Whether the batch holds changes back while no table records what the sink holds (a batch that then releases
        no change makes its held changes' tables: :func:`homes`)."""
        return not self.tables and self.back.changes > 0

    def held_changes(self) -> DataFrame:
        """The held change records (the stream's columns), without the transaction topic's records."""
        return self._cached.where((F.col(_KIND) == F.lit(_CHANGE)) & F.col(_TX).isin(*sorted(self.decision.held))).drop(*_HELPERS)

    def release(self) -> None:
        self._cached.unpersist(blocking=False)


def homes(
    routed: RoutedCommitter, routing: Routing, values: Sequence[object], batch_id: int, facts: BatchFacts
) -> tuple[list[object], BatchFacts]:
    """A batch that releases no change and holds some back, while no table records what the sink holds: the routing
    values of its held changes (``values``; their columns and keys in ``facts``, by the same inference a released
    change goes through) whose tables are made and committed in the batch's unit without a row, recording what it
    holds (the facts returned: ``held_homes``). A route whose held changes are only truncates of a table that does not
    exist makes no table (as a released one makes none). The caller plans (creates) the tables of the values returned."""
    columns_of = dict(facts.table_columns)
    kept: list[object] = []
    for value in values:
        route = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if not isinstance(route, Route):
            continue  # an invalid route: its changes are dead letters (or fail) when they are released
        columns = columns_of.get(str(route))
        if columns is not None and not columns.names:  # truncates only: an existing table keeps its columns
            try:
                columns_of[str(route)] = seam.arrow_schema(routed.committer(str(route)).table.load().schema())
            except NoSuchTableError:
                continue
        kept.append(value)
    homes = frozenset(str(r) for r in routed.tables.routes(kept, batch_id))
    # nothing is applied: no truncate either
    return kept, replace(
        facts, table_columns=columns_of, truncating=frozenset(), truncated_at={}, truncated_time={}, held_homes=homes
    )


def split(df: DataFrame, options: SinkOptions, *, query_id: str, batch_id: int, known: Sequence[str] = ()) -> Split:
    """The batch (the stream's columns, before parsing) with the records its predecessor held back, split."""
    if OFFSET not in df.columns or "value" not in df.columns:
        raise InvalidOptionError(
            f"option '{CDC_TRANSACTIONS}'='hold' orders the transaction topic's END records by their Kafka offset: the "
            f"stream needs columns 'value' and '{OFFSET}' (Kafka's source gives both; columns: {', '.join(df.columns)}). "
            "Select Kafka's 'offset' with the value"
        )
    tables, start = starting_state(options, query_id=query_id, batch_id=batch_id, known=known)
    io = next(iter(tables.values())).io if tables else None
    rows, memory = held.read(io, start, list(tables.values()))
    if rows is not None and rows.num_rows:
        df = _frame(rows, df).unionByName(df)
    annotated = _annotated(df).persist(StorageLevel.MEMORY_AND_DISK)
    kind, tx = F.col(_KIND), F.col(_TX)
    ends: list[transactions.End] = []
    begins: dict[str, int] = {}
    for r in annotated.where(kind != F.lit(_CHANGE)).select(_KIND, _TX, _TX_COUNT, OFFSET, _TX_TS).collect():
        position = _position(r[3], r[1])
        if r[0] == _END:
            ends.append(transactions.End(r[1], int(r[2] or 0), position, r[4]))
        else:
            begins[r[1]] = min(position, begins.get(r[1], position))
    # a change without total_order counts on its own (as lakesink.cdc.transactions.split_records counts it)
    order = F.col(_TX_ORDER)
    distinct = F.count_distinct(order) + F.sum(F.when(order.isNull(), F.lit(1)).otherwise(F.lit(0)))
    counted = annotated.where((kind == F.lit(_CHANGE)) & tx.isNotNull()).groupBy(_TX).agg(distinct).collect()
    decision = transactions.release(
        ends,
        {r[0]: int(r[1]) for r in counted},
        begins,
        memory=memory,
        now_ms=int(time.time() * 1000),
        wait_ms=int(options.cdc_transaction_wait * 1000),
    )
    held_ids, dropped_ids = sorted(decision.held), sorted(decision.dropped)
    waiting = tx.isin(*held_ids) if held_ids else F.lit(False)
    dropped = tx.isin(*dropped_ids) if dropped_ids else F.lit(False)
    released = annotated.where((kind == F.lit(_CHANGE)) & (tx.isNull() | (~waiting & ~dropped))).drop(*_HELPERS)
    redelivered = annotated.where((kind == F.lit(_CHANGE)) & dropped).count() if dropped_ids else 0
    back_rows = annotated.where(waiting).toArrow()
    changes = back_rows.filter(pc.equal(back_rows.column(_KIND), _CHANGE)) if back_rows.num_rows else back_rows
    oldest = pc.min(changes.column(_TX_TS)).as_py() if changes.num_rows else None
    back = HeldBack(
        rows=back_rows.drop_columns(list(_HELPERS)),
        changes=changes.num_rows,
        oldest_ms=oldest,
        committed_ms=decision.committed_ms,
        waiting_for=decision.waiting_for,
        previous=start,
        memory=decision.memory,
        redelivered=redelivered,
        incomplete=decision.incomplete,
    )
    report(query_id, batch_id, decision, redelivered)
    if back.changes:
        age = f"{time.time() * 1000 - oldest:.0f} ms" if oldest is not None else "unknown"
        log.info(
            "lakesink: query=%s batch=%s cdc-transactions: %s transaction(s) released; %s change(s) held back, waiting "
            "for transaction %s; the oldest held change is %s old",
            query_id,
            batch_id,
            len(decision.released),
            back.changes,
            decision.waiting_for,
            age,
        )
    key = held.property_key(query_id, options.sink_id)
    recorded = tuple(sorted(n for n, t in tables.items() if key in t.properties))
    return Split(released, back, recorded, decision, annotated)


def report(query_id: str, batch_id: int, decision: transactions.Release, redelivered: int) -> None:
    """The log lines of what the batch dropped as redelivered and released as it stood (both entry points)."""
    if redelivered:
        log.info(
            "lakesink: query=%s batch=%s cdc-transactions: %s change(s) of %s transaction(s) released before were "
            "delivered again (a connector restart): dropped",
            query_id,
            batch_id,
            redelivered,
            len(decision.dropped),
        )
    if decision.incomplete:
        log.warning(
            "lakesink: query=%s batch=%s cdc-transactions: transaction(s) %s released as they stand: their changes "
            "did not all come within option cdc-transaction-wait (a compacted topic, a table whose topic is not read, "
            "a lost END; docs/cdc.md)",
            query_id,
            batch_id,
            ", ".join(decision.incomplete),
        )


def _annotated(df: DataFrame) -> DataFrame:
    """Each record's kind (a change, or the transaction topic's BEGIN/END), transaction id, total order, event count
    and time (the value's JSON parsed once)."""
    text = F.col("value").cast("string")
    wrapper = F.from_json(text, "`schema` STRING, payload STRING")
    payload = F.when(wrapper["schema"].isNotNull(), wrapper["payload"]).otherwise(text)
    parsed = df.select(*(F.col(f"`{c}`") for c in df.columns), F.from_json(payload, _META).alias(_PARSED))
    meta = F.col(_PARSED)
    is_meta: Column = meta["status"].isin(transactions.BEGIN, transactions.END) & meta["op"].isNull() & meta["id"].isNotNull()
    kind = F.when(is_meta & (meta["status"] == F.lit(transactions.END)), F.lit(_END))
    kind = kind.when(is_meta, F.lit(_BEGIN)).otherwise(F.lit(_CHANGE))
    return parsed.select(
        *(F.col(f"`{c}`") for c in df.columns),
        kind.alias(_KIND),
        F.when(is_meta, meta["id"]).otherwise(meta["transaction"]["id"]).alias(_TX),
        meta["transaction"]["total_order"].alias(_TX_ORDER),
        meta["event_count"].alias(_TX_COUNT),
        meta["ts_ms"].alias(_TX_TS),
    )


def _position(offset: object, tx: str) -> int:
    if not isinstance(offset, int):
        raise InvalidOptionError(
            f"option '{CDC_TRANSACTIONS}'='hold': the END record of transaction {tx} has no Kafka offset ({offset!r}); "
            "the transaction topic's offsets are its commit order"
        )
    return offset


def _frame(rows: pa.Table, like: DataFrame) -> DataFrame:
    """The held records as a DataFrame of the stream's schema."""
    return like.sparkSession.createDataFrame(rows.select(like.columns).to_pylist(), schema=like.schema)


def starting_state(
    options: SinkOptions, *, query_id: str, batch_id: int, known: Sequence[str]
) -> tuple[dict[str, Table], held.HeldState | None]:
    """The tables holding the sink's held-back record and the state this batch starts from. ``known``: the tables of
    this process's last batch of the query (else every table of the sink's namespaces is read: a new run)."""
    catalog = catalogs.load(options.catalog_name, options.catalog_properties)
    key = held.property_key(query_id, options.sink_id)
    tables: dict[str, Table] = {}
    if known:
        tables = _load(catalog, [tuple(n.split(".")) for n in known])
    if not any(key in t.properties for t in tables.values()):
        tables = _load(catalog, _sink_tables(catalog, options))
    # option history: a history table carries the property as a member of its table's unit, but is no table of the
    # sink's own (an empty batch's marker goes to its table, which brings its history along)
    history = options.history
    if history is not None:
        tables = {n: t for n, t in tables.items() if not history.is_history_name(TableName.parse(n))}
    latest = held.recorded(tables, query_id, options.sink_id)
    return tables, held.starting_state(latest, batch_id, query_id=query_id)


def _load(catalog: Catalog, idents: Sequence[tuple[str, ...]]) -> dict[str, Table]:
    return {".".join(i): t for i, t in seam_commit.load_tables(catalog, idents).items()}


def _sink_tables(catalog: Catalog, options: SinkOptions) -> list[tuple[str, ...]]:
    """Every table a routed sink may have written: of option route-namespaces, else of option namespace, else of every
    namespace of the catalog (read once per run)."""
    assert options.routing is not None
    routing = options.routing
    if routing.allowed_namespaces:
        namespaces: list[tuple[str, ...]] = [tuple(n) for n in routing.allowed_namespaces]
    elif routing.namespace:
        namespaces = [tuple(routing.namespace)]
    else:
        namespaces = [tuple(n) for n in catalog.list_namespaces()]
    out: list[tuple[str, ...]] = []
    for ns in namespaces:
        try:
            out.extend(tuple(i) for i in catalog.list_tables(ns))
        except Exception:
            continue  # a namespace dropped meanwhile: no table
    return out
