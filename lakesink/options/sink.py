"""The options of a lakesink write parsed once into a frozen :class:`SinkOptions`: from Spark's option map, from a
plain mapping and from :func:`lakesink.foreach_batch`'s keyword arguments; the options that go together (route-by,
upsert, dead letters, cdc-format, payload) checked together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

from lakesink.errors import InvalidOptionError, did_you_mean
from lakesink.options.declaration import _BY_FIELD, _KEYS, _PREFIXES, OPTIONS, VALID_OPTIONS, _as_text, _shown
from lakesink.options.keys import (
    _SPARK_OWN_OPTIONS,
    ATOMIC,
    CATALOG_PROPERTY_PREFIX,
    CDC_FORMAT,
    CDC_ORDER_BY,
    CDC_PAYLOAD,
    CDC_PREFIX,
    CDC_SOURCE_TIME,
    CDC_TRANSACTIONS,
    CDC_UNAVAILABLE_VALUE,
    DEAD_LETTER_TABLE,
    DELETE_WHEN,
    HISTORY,
    HISTORY_TIME,
    MAX_REJECTED_FRACTION,
    NAMESPACE,
    ORDER_BY,
    PAYLOAD,
    REJECT_WHEN,
    ROUTE_BY,
    ROUTE_NAMESPACES,
    TABLE,
    TABLE_PROPERTY_PREFIX,
    UPSERT_KEY,
)
from lakesink.options.values import (
    Atomic,
    CdcTransactions,
    HistoryTables,
    Maintenance,
    MetricsExport,
    OutputMode,
    Routing,
    TableName,
    UnavailableValue,
    WriterKind,
)
from lakesink.table.keys import CDC_TRANSACTION_WAIT_S_DEFAULT, FORMAT_VERSION, MAIN_BRANCH
from lakesink.table.partitioning import PartitionTerm
from lakesink.table.routes import parse_namespace

__all__ = ["ROUTED", "SinkOptions"]


@dataclass(frozen=True)
class SinkOptions:
    """Every option of a lakesink write, validated."""

    table: TableName
    catalog_name: str | None = None
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    output_mode: OutputMode = OutputMode.APPEND
    checkpoint_location: str | None = None
    create_table: bool = True
    partitioned_by: tuple[PartitionTerm, ...] = ()
    """The partition spec of a table lakesink creates; checked against an existing table's spec."""
    merge_schema: bool = False
    """Add new stream columns and apply allowed widenings to the table, in the batch's own commit."""
    branch: str = MAIN_BRANCH
    """The branch batches commit to (write-audit-publish); created from ``main``'s head when missing."""
    writer: WriterKind = WriterKind.AUTO
    sink_id: str | None = None
    """Tells apart several sinks of one streaming query writing one table (each is exactly-once on its own);
    part of the replay marker's key and of each snapshot's summary. None: the query's one sink of the table."""
    upsert_key: tuple[str, ...] = ()
    """Key columns: each row of a batch replaces the table's row with the same key (docs/upserts.md). Empty: append."""
    delete_when: str | None = None
    """A Spark SQL boolean expression over the batch's columns: rows for which it is true delete their key."""
    order_by: str | None = None
    """A column: among several rows of one key in a batch, the one with the greatest value wins."""
    table_properties: Mapping[str, str] = field(default_factory=dict)
    """Iceberg table properties of a table lakesink creates; an existing table must already have them."""
    format_version: int | None = None
    """The format version of a table lakesink creates (None: 2); checked against an existing table when given."""
    maintenance: Maintenance = Maintenance.AUTO
    event_time: str | None = None
    """A timestamp or date column: each snapshot records the smallest and largest value of the rows it adds, and the
    recorded watermark never passes the newest one committed (docs/auditing.md, completeness)."""
    dead_letter_table: TableName | None = None
    """Rows that cannot or must not be written go to this table, in the batch's own atomic commit (docs/dead-letters.md)."""
    reject_when: str | None = None
    """A boolean expression over the batch's columns: rows for which it is true are dead letters (error ``reject-when``).
    Spark SQL with foreach_batch; with format("lakesink") the subset Iceberg's expression parser reads."""
    max_rejected_fraction: float = 1.0
    """Above this fraction of a batch's rows rejected, the batch fails loudly and nothing is committed."""
    allow_temporary_checkpoint: bool = False
    """:func:`lakesink.foreach_batch` only: accept a query whose checkpoint the next start will not find (a temporary
    one): no exactly-once across restarts, a warning instead of the refusal."""
    routing: Routing | None = None
    """Option ``route-by``: one stream into many tables. ``table`` is then :data:`ROUTED` (no table of its own):
    each table's options are :meth:`for_table`'s."""
    payload: str | None = None
    """Option ``payload`` (with ``route-by``): a JSON string column whose fields are each row's columns in its table;
    the other stream columns are not written (they serve ``delete-when`` and ``order-by``)."""
    cdc_format: str | None = None
    """Option ``cdc-format`` (``debezium``): the sink parses the ``value`` column's change events first (docs/cdc.md)."""
    cdc_transactions: CdcTransactions = CdcTransactions.OFF
    """Option ``cdc-transactions`` (with ``cdc-format``): ``hold`` releases whole source transactions only, in commit
    order, by Debezium's transaction metadata (lakesink.sink.cdc.transactions, lakesink.sink.cdc.staged_transactions;
    docs/cdc.md)."""
    cdc_transaction_wait: float = CDC_TRANSACTION_WAIT_S_DEFAULT
    """Option ``cdc-transaction-wait`` (with ``cdc-transactions=hold``): seconds a held transaction that cannot become
    whole waits before it is released as it stands (lakesink.cdc.transactions.release)."""
    cdc_unavailable_value: UnavailableValue = field(default_factory=UnavailableValue)
    """Option ``cdc-unavailable-value`` (with ``cdc-format``): Debezium's unavailable-value placeholder; a column holding
    it keeps the value the table holds for the key (lakesink.cdc.unavailable; docs/cdc.md)."""
    metrics: MetricsExport = field(default_factory=lambda: MetricsExport())
    """Option ``metrics``: where commit metrics are exported (docs/metrics.md)."""
    history: HistoryTables | None = None
    """Option ``history`` (both entry points, with ``upsert-key`` or ``cdc-format``, one table or every routed table):
    each table's history table (SCD type 2), committed in the batch's unit (lakesink.driver.actions.history;
    docs/history.md)."""
    history_time: str | None = None
    """Option ``history-time``: the column holding each change's source time (the versions' valid_from)."""

    @property
    def upserts(self) -> bool:
        """Whether rows replace the table's rows of their key: option upsert-key, or cdc-format (whose changes carry
        each table's key: lakesink.driver.tables.routed_keys)."""
        return bool(self.upsert_key) or self.cdc_format is not None

    def for_table(self, table: TableName) -> SinkOptions:
        """The options of one table of a routed sink (everything but the routing; the dead-letter table is the routed
        sink's, one for all its tables: lakesink.driver.committers.routed)."""
        return replace(self, table=table, routing=None, dead_letter_table=None)

    def __repr__(self) -> str:  # never print catalog secrets (the declaration's secret options are redacted)
        shown = ", ".join(f"{f.name}={_shown(_BY_FIELD.get(f.name), getattr(self, f.name))!r}" for f in fields(self))
        return f"SinkOptions({shown})"

    __str__ = __repr__

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str], *, overwrite: bool) -> SinkOptions:
        """Parse the options of ``writeStream.format("lakesink")`` (``overwrite`` is Spark's complete mode)."""
        lowered = {k.lower(): v for k, v in options.items()}
        mode = OutputMode.COMPLETE if overwrite else OutputMode.APPEND
        for option in OPTIONS:
            if option.spark_refusal and option.lowered in lowered:  # lakesink.foreach_batch only
                raise InvalidOptionError(f"option '{option.key}' is not used with format('lakesink'){option.spark_refusal}")
        return cls._parse(lowered, mode, case_sensitive=options)

    @classmethod
    def from_mapping(cls, options: Mapping[str, str]) -> SinkOptions:
        """Parse options given as a plain mapping (used by :func:`lakesink.foreach_batch`)."""
        lowered = {k.lower(): v for k, v in options.items()}
        own = {  # lakesink.foreach_batch's own options, parsed first (the others are checked against the mode and writer)
            option.field_name: option.parse(lowered.pop(option.lowered, _as_text(option.default)))
            for option in OPTIONS
            if option.spark_refusal and option.parse is not None and (option.default is not None or option.lowered in lowered)
        }
        parsed = cls._parse(lowered, own["output_mode"], case_sensitive=options, writer=own["writer"], keywords=True)
        return replace(parsed, **own)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, object]) -> SinkOptions:
        """Parse :func:`lakesink.foreach_batch`'s keyword arguments (None: not given), each as its declared option."""
        keywords_known = [option.keyword for option in OPTIONS]
        unknown = sorted(set(keywords) - set(keywords_known))
        if unknown:
            named = ", ".join(f"{k!r}{did_you_mean(k, keywords_known)}" for k in unknown)
            raise TypeError(f"foreach_batch() got unexpected keyword argument(s) {named}")
        options: dict[str, str] = {}
        for option in OPTIONS:
            value = keywords.get(option.keyword)
            if value is None:
                continue
            if option.prefix:  # a mapping: one option per property (names keep their case)
                assert isinstance(value, Mapping)
                options.update({f"{option.key}{k}": str(v) for k, v in value.items()})
            else:
                options[option.key] = _as_text(value)
        return cls.from_mapping(options)

    @classmethod
    def _parse(
        cls,
        lowered: dict[str, str],
        mode: OutputMode,
        *,
        case_sensitive: Mapping[str, str],
        writer: WriterKind = WriterKind.AUTO,
        keywords: bool = False,
    ) -> SinkOptions:
        """``keywords``: the options are foreach_batch's arguments (an error spells them so)."""
        cdc_format = _apply_cdc_format(lowered)
        unknown = sorted(k for k in lowered if k not in _KEYS and not k.startswith(_PREFIXES) and k not in _SPARK_OWN_OPTIONS)
        if unknown:
            raise InvalidOptionError(_unknown("option(s)", unknown, VALID_OPTIONS))
        routing = _parse_routing(lowered, mode, writer)
        if routing is None and (TABLE not in lowered or not lowered[TABLE].strip()):
            if keywords:
                raise InvalidOptionError(
                    "foreach_batch() needs the table (for example lakesink.foreach_batch('db.events')), or route_by= "
                    "(each row goes to the table its column names)"
                )
            raise InvalidOptionError(
                f"option '{TABLE}' is required (for example .option('table', 'db.events')), or option '{ROUTE_BY}' "
                "(each row goes to the table its column names)"
            )
        # Catalog property names keep their original case (pyiceberg property names are case-sensitive),
        # when the caller gave them to us with case (Spark lower-cases them anyway).
        catalog_properties = {
            k[len(CATALOG_PROPERTY_PREFIX) :]: v
            for k, v in case_sensitive.items()
            if k.lower().startswith(CATALOG_PROPERTY_PREFIX)
        }
        empty = sorted(f"{CATALOG_PROPERTY_PREFIX}{k}" for k, v in catalog_properties.items() if not k)
        if empty:
            raise InvalidOptionError(f"option '{CATALOG_PROPERTY_PREFIX}' needs a property name after the dot")
        # table property names are case-sensitive too (Iceberg's are lower-case anyway)
        table_properties = {
            k[len(TABLE_PROPERTY_PREFIX) :]: str(v)
            for k, v in case_sensitive.items()
            if k.lower().startswith(TABLE_PROPERTY_PREFIX)
        }
        if any(not k for k in table_properties):
            raise InvalidOptionError(f"option '{TABLE_PROPERTY_PREFIX}' needs a table property name after the dot")
        if FORMAT_VERSION in table_properties:
            raise InvalidOptionError(
                f"set the format version with option '{FORMAT_VERSION}', not '{TABLE_PROPERTY_PREFIX}{FORMAT_VERSION}'"
            )
        upsert_key, delete_when, order_by = _parse_upsert(lowered, mode, keyed_changes=cdc_format is not None)
        dead_letter_table, reject_when, max_rejected = _parse_dead_letters(lowered, lowered.get(TABLE, ""))
        table = ROUTED if routing is not None else TableName.parse(lowered[TABLE])
        alone = {  # the options parsed on their own, in the declaration's order; an absent one keeps its default
            option.field_name: option.parse(lowered[option.lowered])
            for option in OPTIONS
            if option.parse is not None and not option.spark_refusal and option.lowered in lowered
        }
        if alone.get("cdc_unavailable_value", UnavailableValue()) != UnavailableValue() and cdc_format is None:
            raise InvalidOptionError(
                f"option '{CDC_UNAVAILABLE_VALUE}' is Debezium's unavailable-value placeholder: it needs option "
                "'cdc-format' ('debezium'); drop it, or set cdc_format='debezium' (docs/cdc.md)"
            )
        if alone.get("cdc_transactions") is CdcTransactions.HOLD and cdc_format is None:
            raise InvalidOptionError(
                f"option '{CDC_TRANSACTIONS}' is 'hold', which reads Debezium's transaction metadata: it needs option "
                "'cdc-format' ('debezium'); drop it, or set cdc_format='debezium' (docs/cdc.md)"
            )
        return _checked_history(
            cls(
                table=table,
                routing=routing,
                catalog_properties=catalog_properties,
                output_mode=mode,
                writer=writer,
                upsert_key=upsert_key,
                delete_when=delete_when,
                order_by=order_by,
                table_properties=table_properties,
                dead_letter_table=dead_letter_table,
                reject_when=reject_when,
                max_rejected_fraction=max_rejected,
                **alone,
                payload=_parse_payload(lowered, routing),
                cdc_format=cdc_format,
            )
        )


def _checked_history(options: SinkOptions) -> SinkOptions:
    """Options ``history`` and ``history-time``: what they need and what they cannot go with (docs/history.md)."""
    history = options.history
    if history is None:
        if options.history_time is not None:
            raise InvalidOptionError(
                f"option '{HISTORY_TIME}' names the change time of a history table: it needs option '{HISTORY}' "
                "(history='on'); drop it, or add history='on' (docs/history.md)"
            )
        return options
    if not options.upserts:
        raise InvalidOptionError(
            f"option '{HISTORY}' keeps every version of each key: it needs option '{UPSERT_KEY}' (the key whose versions "
            "the history table holds; upsert_key= in foreach_batch) (docs/history.md)"
        )
    if options.output_mode is OutputMode.COMPLETE:
        raise InvalidOptionError(f"option '{HISTORY}' cannot be used with output mode 'complete' (option '{UPSERT_KEY}')")
    # with option dead-letter-table the writing tasks sort the rows first and take the history's changes from the
    # rows that fit: a dead letter is never a version (lakesink.executor.task_writer.TaskWriter.finish)
    if options.history_time is None and options.cdc_format is not None:
        # a change stream's own time: Debezium's source.ts_ms (lakesink.cdc.debezium.parse's source_time)
        options = replace(options, history_time=CDC_SOURCE_TIME)
    if options.history_time is None:
        raise InvalidOptionError(
            f"option '{HISTORY}' needs option '{HISTORY_TIME}': the column holding each change's time at its source "
            "(a timestamp; it becomes the version's valid_from), for example history_time='updated_at' (docs/history.md)"
        )
    letters = options.dead_letter_table
    if options.routing is not None:  # each routed table's history table is named when the table is opened
        if letters is not None and history.is_history_name(letters):
            raise InvalidOptionError(
                f"option '{DEAD_LETTER_TABLE}' ({letters}) is named as option '{HISTORY}' ({history}) names history "
                "tables: a routed table's history could be the dead-letter table. Nothing was written; name the "
                "dead-letter table outside the pattern, or give option 'history' a pattern such as "
                "'audit.{table}_versions' (docs/history.md)"
            )
        return options
    of = history.of(options.table)  # a pattern giving no table name, or the table itself: InvalidOptionError
    if letters is not None and of == letters:
        raise InvalidOptionError(
            f"option '{DEAD_LETTER_TABLE}' ({letters}) is the history table option '{HISTORY}' ({history}) gives "
            f"table {options.table}; nothing was written: name them apart (docs/history.md)"
        )
    return options


def _unknown(what: str, unknown: Sequence[str], valid: Sequence[str]) -> str:
    """The error of unknown options: each with the nearest valid name ("did you mean"); the valid options listed
    unless every unknown one has its nearest name (the list is long: docs/options.md holds it)."""
    hints = {k: did_you_mean(k, valid) for k in unknown}
    named = ", ".join(f"{k!r}{hint}" for k, hint in hints.items())
    if all(hints.values()):
        return f"unknown {what} {named}; every option is in docs/options.md"
    return f"unknown {what} {named}; valid options: {', '.join(valid)}"


ROUTED = TableName(namespace=("<route-by>",), name="<route-by>")
"""The ``table`` of a routed sink's options: no table (a name no routing value can take; lakesink.driver.tables.sink_table refuses
to open it)."""


def _parse_routing(lowered: Mapping[str, str], mode: OutputMode, writer: WriterKind) -> Routing | None:
    """Options ``route-by``, ``namespace`` and ``atomic``, and what cannot go with them."""
    column = lowered.get(ROUTE_BY, "").strip()
    if not column:
        if ROUTE_BY in lowered:
            raise InvalidOptionError(f"option '{ROUTE_BY}' must name the stream's column that holds each row's table")
        given = [k for k in (NAMESPACE, ROUTE_NAMESPACES, ATOMIC) if k in lowered]
        if given:
            raise InvalidOptionError(
                f"option(s) {', '.join(repr(k) for k in given)} need option '{ROUTE_BY}' (one stream into many tables)"
            )
        return None
    if lowered.get(TABLE, "").strip():
        raise InvalidOptionError(
            f"give option '{TABLE}' or option '{ROUTE_BY}', not both: with '{ROUTE_BY}' each row goes to the table "
            f"its column {column!r} names (option '{NAMESPACE}' supplies the namespace of values that have none)"
        )
    if mode is OutputMode.COMPLETE:
        raise InvalidOptionError(
            f"option '{ROUTE_BY}' cannot be used with output mode 'complete': each batch would replace every table "
            "it routes to, and leave the tables it routes no row to as they were; use output mode 'append'"
        )
    if writer is WriterKind.SPARK and lowered.get(PAYLOAD, "").strip():
        # lakesink.sink.spark.routed: the rows never pass through Python workers (upserts: resolved by Spark,
        # lakesink.sink.upsert_batch.resolve_routed)
        raise InvalidOptionError(
            f"option '{ROUTE_BY}' with writer='spark' cannot be used with option '{PAYLOAD}' (nor 'cdc-format', which "
            "sets it): a payload's columns are inferred per table from the batch's JSON, Debezium's Kafka Connect types "
            "decoded, and each row expanded into its table's columns by lakesink's Python code in Python workers "
            "(lakesink.executor.payload), which Spark's writer never runs; use writer='auto' or 'arrow' (docs/routing.md)"
        )
    namespace: tuple[str, ...] = ()
    if lowered.get(NAMESPACE, "").strip():
        parsed = parse_namespace(lowered[NAMESPACE].strip())
        if isinstance(parsed, str):
            raise InvalidOptionError(f"option '{NAMESPACE}' is {lowered[NAMESPACE]!r}: {parsed} (for example 'db')")
        namespace = parsed
    allowed = _parse_route_namespaces(lowered)
    if allowed and namespace and namespace not in allowed:
        raise InvalidOptionError(
            f"option '{NAMESPACE}' {'.'.join(namespace)!r} is not one of option '{ROUTE_NAMESPACES}' "
            f"({', '.join('.'.join(n) for n in allowed)}): every routing value without a namespace would be an invalid "
            "route; add it to the list or change it"
        )
    return Routing(column, namespace, Atomic.parse(lowered.get(ATOMIC, Atomic.AUTO.value)), allowed)


def _apply_cdc_format(lowered: dict[str, str]) -> str | None:
    """Option ``cdc-format``: the options it implies set in ``lowered`` (the columns lakesink.cdc.debezium.parse adds
    with prefix ``cdc_``, and the payload column the sink makes from ``after``, else ``before``)."""
    if CDC_FORMAT not in lowered:
        return None
    value = lowered.pop(CDC_FORMAT).strip().lower()
    if value != "debezium":
        raise InvalidOptionError(f"option '{CDC_FORMAT}' is {value!r}; the one format lakesink reads is 'debezium'")
    given = [k for k in (ROUTE_BY, PAYLOAD, DELETE_WHEN, ORDER_BY, TABLE) if lowered.get(k, "").strip()]
    if given:
        raise InvalidOptionError(
            f"option '{CDC_FORMAT}' sets option(s) {', '.join(repr(k) for k in given)} itself (the table from the event's "
            f"source, deletes from op 'd', the order from the source position); drop them, or drop '{CDC_FORMAT}' and "
            "call lakesink.cdc.debezium.parse before the sink (docs/cdc.md)"
        )
    lowered[ROUTE_BY] = f"{CDC_PREFIX}route"
    lowered[PAYLOAD] = CDC_PAYLOAD
    lowered[DELETE_WHEN] = f"{CDC_PREFIX}op = 'd'"
    lowered[ORDER_BY] = CDC_ORDER_BY
    return value


def _parse_payload(lowered: Mapping[str, str], routing: Routing | None) -> str | None:
    """Option ``payload``: a column name, with ``route-by`` only."""
    if PAYLOAD not in lowered:
        return None
    column = lowered[PAYLOAD].strip()
    if not column:
        raise InvalidOptionError(f"option '{PAYLOAD}' must name the stream's string column that holds each row's JSON object")
    if routing is None:
        raise InvalidOptionError(
            f"option '{PAYLOAD}' needs option '{ROUTE_BY}': the payload's fields are the columns of the table each row "
            "is routed to (one table without route-by: parse the JSON with from_json before the sink)"
        )
    if column == routing.column:
        raise InvalidOptionError(f"option '{PAYLOAD}' and option '{ROUTE_BY}' name the same column {column!r}")
    return column


def _parse_route_namespaces(lowered: Mapping[str, str]) -> tuple[tuple[str, ...], ...]:
    """Option ``route-namespaces``: a comma-separated list of namespaces (``db``, ``a.b``); absent: any namespace."""
    if ROUTE_NAMESPACES not in lowered:
        return ()
    raw = lowered[ROUTE_NAMESPACES]
    items = [i.strip() for i in raw.split(",")]
    if not any(items) or not all(items):
        raise InvalidOptionError(
            f"option '{ROUTE_NAMESPACES}' is {raw!r}: give a comma-separated list of the namespaces routed tables may "
            "be in (for example 'sales,sales.eu'), without empty items"
        )
    allowed: list[tuple[str, ...]] = []
    for item in items:
        parsed = parse_namespace(item)
        if isinstance(parsed, str):
            raise InvalidOptionError(f"option '{ROUTE_NAMESPACES}' is {raw!r}: {item!r}: {parsed} (for example 'db')")
        if parsed not in allowed:
            allowed.append(parsed)
    return tuple(allowed)


def _parse_upsert(
    lowered: Mapping[str, str], mode: OutputMode, *, keyed_changes: bool = False
) -> tuple[tuple[str, ...], str | None, str | None]:
    """``upsert-key`` (comma-separated columns), ``delete-when`` and ``order-by``, checked against the output mode.
    ``keyed_changes`` (option cdc-format): the changes carry each table's key, upsert-key may be left out."""
    key = tuple(c.strip() for c in lowered.get(UPSERT_KEY, "").split(",") if c.strip())
    if UPSERT_KEY in lowered and (not key or len(set(key)) != len(key)):
        raise InvalidOptionError(
            f"option '{UPSERT_KEY}' must name one or more distinct columns, comma-separated (for example 'id' or "
            f"'tenant,id'), got {lowered[UPSERT_KEY]!r}"
        )
    delete_when = lowered.get(DELETE_WHEN, "").strip() or None
    order_by = lowered.get(ORDER_BY, "").strip() or None
    if not key and not keyed_changes:
        given = [k for k in (DELETE_WHEN, ORDER_BY) if lowered.get(k, "").strip()]
        if given:
            raise InvalidOptionError(
                f"option(s) {', '.join(repr(k) for k in given)} need option '{UPSERT_KEY}' (the columns that identify a row)"
            )
        if mode is OutputMode.UPDATE:
            raise InvalidOptionError(
                f"output mode 'update' needs option '{UPSERT_KEY}' (foreach_batch(..., upsert_key='id')): each batch's "
                "rows then replace the table's rows of the same key (docs/upserts.md)"
            )
    elif mode is OutputMode.COMPLETE:
        raise InvalidOptionError(
            f"option '{UPSERT_KEY}' cannot be used with output mode 'complete' (each batch replaces the whole table); "
            "use output mode 'update' or 'append'"
        )
    return key, delete_when, order_by


def _parse_dead_letters(lowered: Mapping[str, str], table: str) -> tuple[TableName | None, str | None, float]:
    """``dead-letter-table``, ``reject-when`` and ``max-rejected-fraction`` (the last two need the first)."""
    raw = lowered.get(DEAD_LETTER_TABLE, "").strip()
    reject_when = lowered.get(REJECT_WHEN, "").strip() or None
    if REJECT_WHEN in lowered and reject_when is None:
        raise InvalidOptionError(f"option '{REJECT_WHEN}' must be a boolean expression (for example \"amount < 0\"), got ''")
    fraction = 1.0
    if MAX_REJECTED_FRACTION in lowered:
        text = lowered[MAX_REJECTED_FRACTION].strip()
        try:
            fraction = float(text)
        except ValueError:
            fraction = -1.0
        if not 0.0 <= fraction <= 1.0 or fraction != fraction:
            raise InvalidOptionError(
                f"option '{MAX_REJECTED_FRACTION}' must be a number from 0 to 1 (0.01: fail a batch when more than 1% of "
                f"its rows are dead letters; default 1: never), got {lowered[MAX_REJECTED_FRACTION]!r}"
            )
    if not raw:
        given = [k for k in (REJECT_WHEN, MAX_REJECTED_FRACTION) if k in lowered]
        if given or DEAD_LETTER_TABLE in lowered:
            raise InvalidOptionError(
                f"option(s) {', '.join(repr(k) for k in given or [DEAD_LETTER_TABLE])} need option '{DEAD_LETTER_TABLE}' "
                "(for example 'db.events_dead_letters'): the table rejected rows go to"
            )
        return None, None, fraction
    try:
        name = TableName.parse(raw)
    except InvalidOptionError:
        raise InvalidOptionError(
            f"option '{DEAD_LETTER_TABLE}' must be '<namespace>.<table>' (for example 'db.events_dead_letters'), got {raw!r}"
        ) from None
    if table.strip() and str(name) == str(TableName.parse(table)):
        raise InvalidOptionError(f"option '{DEAD_LETTER_TABLE}' must name another table than option '{TABLE}', got {raw!r}")
    return name, reject_when, fraction
