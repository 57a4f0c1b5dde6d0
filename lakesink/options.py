"""Sink options: parsed once into a frozen, typed :class:`SinkOptions`.

The same options reach lakesink from ``writeStream.option(...)`` (keys arrive lower-cased from
Spark) and from keyword arguments of :func:`lakesink.foreach_batch`. Each option is declared once, in
:data:`OPTIONS`; adding one is: its key constant, its :class:`Option` row, its :class:`SinkOptions` field (and its
parser when it goes with others), foreach_batch's keyword, and the rows of docs/options.md -- tests/test_options.py
fails until the signature and the docs agree with the declaration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any, TypeVar

from lakesink.errors import InvalidOptionError
from lakesink.redaction import redact_properties
from lakesink.table import partitioning
from lakesink.table.keys import FORMAT_VERSION, MAIN_BRANCH
from lakesink.table.partitioning import PARTITIONED_BY as PARTITIONED_BY
from lakesink.table.partitioning import PartitionTerm
from lakesink.table.routes import parse_namespace

TABLE = "table"
CATALOG = "catalog"
CATALOG_PROPERTY_PREFIX = "catalog."
CHECKPOINT_LOCATION = "checkpointLocation"
CREATE_TABLE = "create-table"
OUTPUT_MODE = "output-mode"
MERGE_SCHEMA = "merge-schema"
BRANCH = "branch"
WRITER = "writer"
SINK_ID = "sink-id"
UPSERT_KEY = "upsert-key"
DELETE_WHEN = "delete-when"
ORDER_BY = "order-by"
TABLE_PROPERTY_PREFIX = "table-property."
MAINTENANCE = "maintenance"
EVENT_TIME = "event-time"
DEAD_LETTER_TABLE = "dead-letter-table"
REJECT_WHEN = "reject-when"
MAX_REJECTED_FRACTION = "max-rejected-fraction"
ROUTE_BY = "route-by"
NAMESPACE = "namespace"
ROUTE_NAMESPACES = "route-namespaces"
ATOMIC = "atomic"
PAYLOAD = "payload"
CDC_FORMAT = "cdc-format"
"""``debezium``: the stream's ``value`` column holds Debezium change events; the sink routes, upserts and deletes by
them (docs/cdc.md). Implies ``route-by``, ``payload``, ``delete-when`` and ``order-by`` over the parsed columns."""
#: The columns option cdc-format adds to the batch (lakesink.cdc.debezium.parse with this prefix) and the payload column
CDC_PREFIX = "cdc_"
CDC_PAYLOAD = "cdc_payload"
CDC_CONNECT_SCHEMA = "cdc_connect_schema"
CDC_VALUE = "cdc_value"
"""Option cdc-format with dead-letter-table: the record's ``value`` as it came (a dead letter's row holds it)."""
"""Option cdc-format: the column with each record's Kafka Connect schema (``schemas.enable``; null without), which
types its fields (lakesink.cdc.connect)."""
"""With route-by: a string column holding a JSON object whose fields are the row's columns in its routed table
(docs/cdc.md)."""
METRICS = "metrics"
"""Commit metrics exported beyond the log, the Spark listener and a REST catalog's metrics endpoint: ``off`` (default) or
``prometheus:[<host>:]<port>`` (docs/metrics.md)."""
ALLOW_TEMPORARY_CHECKPOINT = "allow-temporary-checkpoint"
"""foreach_batch only: run on a checkpoint that the next start of the query will not find (docs/options.md)."""
#: Iceberg table format versions lakesink creates tables with (pyiceberg 0.12 writes v3 too).
FORMAT_VERSIONS = (1, 2, 3)
DEFAULT_FORMAT_VERSION = 2

#: Options Spark itself may pass to a sink; accepted and ignored.
_SPARK_OWN_OPTIONS = frozenset({"path", "queryname"})

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


class OutputMode(enum.Enum):
    """How a batch changes the table."""

    APPEND = "append"
    """Each non-empty batch adds its rows in one fast-append snapshot."""
    COMPLETE = "complete"
    """Each batch replaces the table's contents in one overwrite snapshot."""
    UPDATE = "update"
    """Spark's update mode (:func:`lakesink.foreach_batch` with ``upsert_key`` only): each batch's rows replace
    the table's rows of the same key (docs/upserts.md)."""

    @classmethod
    def parse(cls, value: str) -> OutputMode:
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise InvalidOptionError(
                f"output mode {value!r} is not supported by lakesink; supported modes: "
                f"{', '.join(m.value for m in cls)} ('update' needs option '{UPSERT_KEY}', docs/upserts.md)"
            ) from None


_E = TypeVar("_E", bound=enum.Enum)


def _parse_choice(kind: type[_E], option: str, value: str) -> _E:
    """An option whose value is one of an enum's values (any case); the error names the valid ones."""
    try:
        return kind(value.strip().lower())
    except ValueError:
        raise InvalidOptionError(
            f"option '{option}' must be one of {', '.join(repr(k.value) for k in kind)}, got {value!r}"
        ) from None


class WriterKind(enum.Enum):
    """Which code writes a batch's Parquet files (:func:`lakesink.foreach_batch` only; see docs/write-paths.md)."""

    AUTO = "auto"
    """A small batch on the driver (DRIVER); else Spark's own Parquet writer when the table allows it (no lists or
    maps, ...), else Arrow."""
    SPARK = "spark"
    """Spark's own Parquet writer, in the JVM (the fast path); a table it cannot write is an error."""
    ARROW = "arrow"
    """Rows move to Python workers (``mapInArrow``) and are written with pyarrow."""
    DRIVER = "driver"
    """Rows are collected to the driver as Arrow (``DataFrame.toArrow()``) and written there with pyarrow: the
    fastest for small batches (``auto`` picks it after a batch of at most 10,000 rows; lakesink.sink.driver_write)."""

    @classmethod
    def parse(cls, value: str) -> WriterKind:
        return _parse_choice(cls, WRITER, value)


class Maintenance(enum.Enum):
    """Whether the sink keeps its table healthy while it streams (docs/maintenance.md)."""

    AUTO = "auto"
    """Between batches: compact small files, rewrite manifests, expire snapshots as the table's properties ask."""
    OFF = "off"
    """The sink only commits batches; maintenance is the user's (``lakesink maintain``)."""

    @classmethod
    def parse(cls, value: str) -> Maintenance:
        return _parse_choice(cls, MAINTENANCE, value)


class Atomic(enum.Enum):
    """Option ``atomic`` (with ``route-by``): how the tables of one batch are committed (docs/routing.md)."""

    AUTO = "auto"
    """All tables of a batch in one atomic catalog commit where the catalog can (SQL catalogs; REST catalogs
    serving transactions/commit), each table on its own elsewhere (said in the log once)."""
    REQUIRED = "required"
    """As auto, and a catalog that cannot commit several tables atomically fails the query at start."""
    OFF = "off"
    """Each table on its own (each exactly once; a batch's missing tables are completed on replay)."""

    @classmethod
    def parse(cls, value: str) -> Atomic:
        return _parse_choice(cls, ATOMIC, value)


@dataclass(frozen=True)
class Routing:
    """Option ``route-by``: each row goes to the table its routing column names; the column is not written."""

    column: str
    namespace: tuple[str, ...] = ()
    """Option ``namespace``: the namespace of routing values that have none (empty: every value must name one)."""
    atomic: Atomic = Atomic.AUTO
    allowed_namespaces: tuple[tuple[str, ...], ...] = ()
    """Option ``route-namespaces``: the namespaces a routed table may be in (empty: any namespace of the catalog); a
    routing value naming a table elsewhere is an invalid route."""


@dataclass(frozen=True)
class TableName:
    """A table identifier: a namespace of one or more levels and a table name."""

    namespace: tuple[str, ...]
    name: str

    @classmethod
    def parse(cls, value: str) -> TableName:
        parts = tuple(p.strip() for p in value.split("."))
        if len(parts) < 2 or any(not p for p in parts):
            raise InvalidOptionError(f"option '{TABLE}' must be '<namespace>.<table>' (for example 'db.events'), got {value!r}")
        return cls(namespace=parts[:-1], name=parts[-1])

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.name)

    def __str__(self) -> str:
        return ".".join(self.identifier)


@dataclass(frozen=True)
class MetricsExport:
    """Option ``metrics``: ``off`` (the default) or ``prometheus:[<host>:]<port>`` (host default 127.0.0.1)."""

    prometheus: tuple[str, int] | None = None

    def __str__(self) -> str:
        return "off" if self.prometheus is None else f"prometheus:{self.prometheus[0]}:{self.prometheus[1]}"

    @classmethod
    def parse(cls, value: str) -> MetricsExport:
        text = value.strip()
        if text.lower() in ("", "off"):
            return cls()
        kind, _, address = text.partition(":")
        host, _, port = address.rpartition(":")
        if kind.lower() == "prometheus" and port.isdigit() and int(port) < 65536:
            return cls(prometheus=(host.strip("[]") or "127.0.0.1", int(port)))
        raise InvalidOptionError(
            f"option '{METRICS}={value}' is not valid: use 'off' or 'prometheus:<port>' / 'prometheus:<host>:<port>' "
            "(for example metrics=prometheus:9108)"
        )


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
    metrics: MetricsExport = field(default_factory=lambda: MetricsExport())
    """Option ``metrics``: where commit metrics are exported (docs/metrics.md)."""

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
            if option.spark_refusal and option.parse is not None
        }
        parsed = cls._parse(lowered, own["output_mode"], case_sensitive=options, writer=own["writer"])
        return replace(parsed, **own)

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, object]) -> SinkOptions:
        """Parse :func:`lakesink.foreach_batch`'s keyword arguments (None: not given), each as its declared option."""
        unknown = sorted(set(keywords) - {option.keyword for option in OPTIONS})
        if unknown:
            raise TypeError(f"foreach_batch() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
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
    ) -> SinkOptions:
        cdc_format = _apply_cdc_format(lowered)
        unknown = sorted(k for k in lowered if k not in _KEYS and not k.startswith(_PREFIXES) and k not in _SPARK_OWN_OPTIONS)
        if unknown:
            raise InvalidOptionError(
                f"unknown option(s) {', '.join(repr(k) for k in unknown)}; valid options: {', '.join(VALID_OPTIONS)}"
            )
        routing = _parse_routing(lowered, mode, writer)
        if routing is None and (TABLE not in lowered or not lowered[TABLE].strip()):
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
        return cls(
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
    if UPSERT_KEY in lowered and lowered.get(DEAD_LETTER_TABLE, "").strip() and PAYLOAD not in lowered:
        raise InvalidOptionError(
            f"option '{ROUTE_BY}' with option '{UPSERT_KEY}' cannot be used with option '{DEAD_LETTER_TABLE}' yet "
            f"without option '{PAYLOAD}' (a routed upsert of the stream's own columns does not sort rows into dead "
            "letters); drop one of them, or write the change stream of each table through its own sink (docs/routing.md)"
        )
    if writer is WriterKind.DRIVER:
        raise InvalidOptionError(
            f"option '{ROUTE_BY}' writes through Spark's executors (Python workers, or Spark's own Parquet writer); "
            f"writer={writer.value!r} cannot be used with it: use writer='auto', 'arrow' or 'spark'"
        )
    if writer is WriterKind.SPARK:
        # lakesink.sink.spark_routed: one Spark write job, the rows never pass through Python workers
        needs_workers = [k for k in (UPSERT_KEY, PAYLOAD) if lowered.get(k, "").strip()]
        if needs_workers:
            raise InvalidOptionError(
                f"option '{ROUTE_BY}' with writer='spark' cannot be used with option(s) "
                f"{', '.join(repr(k) for k in needs_workers)} yet: a routed upsert resolves and a payload expands each "
                "table's rows in Python workers (the Arrow path); use writer='auto' or 'arrow' (docs/routing.md)"
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
    lowered[ORDER_BY] = f"{CDC_PREFIX}order"
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


def _parse_column(option: str, value: str) -> str:
    column = value.strip()
    if not column or "," in column:
        raise InvalidOptionError(f"option '{option}' must name one column (for example 'ts'), got {value!r}")
    return column


def _parse_format_version(value: str) -> int:
    try:
        version = int(str(value).strip())
    except ValueError:
        version = -1
    if version not in FORMAT_VERSIONS:
        raise InvalidOptionError(
            f"option '{FORMAT_VERSION}' must be one of {', '.join(map(str, FORMAT_VERSIONS))} (default "
            f"{DEFAULT_FORMAT_VERSION}), got {value!r}"
        )
    return version


def _parse_branch(value: str) -> str:
    branch = value.strip()
    if not branch or any(c.isspace() for c in branch):
        raise InvalidOptionError(f"option '{BRANCH}' must be a branch name without spaces (for example 'audit'), got {value!r}")
    return branch


_SINK_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _parse_sink_id(value: str) -> str:
    sink_id = value.strip()
    if not sink_id or len(sink_id) > 64 or not set(sink_id) <= _SINK_ID_CHARS:
        raise InvalidOptionError(
            f"option '{SINK_ID}' must be 1 to 64 characters of letters, digits, '_' and '-' (for example 'audit'), got {value!r}"
        )
    return sink_id


def _parse_bool(key: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise InvalidOptionError(f"option '{key}' must be 'true' or 'false', got {value!r}")


def _parse_catalog(value: str) -> str:
    if not value.strip():
        raise InvalidOptionError(f"option '{CATALOG}' must not be empty")
    return value.strip()


def _parse_partitioned_by(value: str) -> tuple[PartitionTerm, ...]:
    return partitioning.parse(value) if value.strip() else ()


def _terms_text(terms: tuple[PartitionTerm, ...]) -> str:
    return ", ".join(map(str, terms))


# --- the declaration: one entry per option ----------------------------------------------------------


class Entry(enum.Flag):
    """The entry points that take an option."""

    SPARK = enum.auto()
    """``writeStream.format("lakesink").option(...)`` (:meth:`SinkOptions.from_spark_options`)."""
    FOREACH = enum.auto()
    """:func:`lakesink.foreach_batch`'s keyword arguments (:meth:`SinkOptions.from_keywords`, ``from_mapping``)."""
    BOTH = SPARK | FOREACH


@dataclass(frozen=True)
class Option:
    """One option of a lakesink write, declared once (:data:`OPTIONS`).

    From the declaration come the parser's list of known options and its unknown-option error (:data:`VALID_OPTIONS`),
    the values parsed on their own, the redacted ``repr`` of :class:`SinkOptions`, the refusals of ``format("lakesink")``,
    and how :func:`lakesink.foreach_batch`'s keyword arguments become options; tests hold foreach_batch's signature and
    docs/options.md's tables equal to it (tests/test_options.py).
    """

    key: str
    """The option's name as documented (``checkpointLocation``); a family's prefix (``catalog.``) with ``prefix``.
    Matched in any case (Spark lower-cases option names)."""
    keyword: str
    """:func:`lakesink.foreach_batch`'s keyword argument."""
    default: object
    """foreach_batch's default: None when not giving the option differs from giving any value (the option is then
    absent, and :class:`SinkOptions` keeps its field's default)."""
    doc: str
    """One line: what the option is (the comments of docs/options.md's list of foreach_batch's arguments)."""
    absent: str = ""
    """What holds when the option is not given, as docs/options.md's ``default`` column says it."""
    required: str = "no"
    """docs/options.md's ``required`` column."""
    entries: Entry = Entry.BOTH
    spark_refusal: str = ""
    """foreach_batch only: the end of the error with which ``format("lakesink")`` refuses the option."""
    parse: Callable[[str], Any] | None = None
    """The parser of the option's value alone; None: parsed together with the options it goes with (``_parse_upsert``,
    ``_parse_dead_letters``, ``_parse_routing``, the prefixed families, ``table``)."""
    field: str = ""
    """The :class:`SinkOptions` field the option fills (default: ``keyword``)."""
    prefix: bool = False
    """A family of options, ``<key><property>``, given to foreach_batch as a mapping."""
    secret: bool = False
    """Values may hold credentials: the ``repr`` shows them redacted (:func:`lakesink.redaction.redact_properties`)."""
    show: Callable[[Any], object] | None = None
    """How the ``repr`` shows the field (default: an enum's value, a table's name, a mapping as a dict)."""

    @property
    def lowered(self) -> str:
        return self.key.lower()

    @property
    def field_name(self) -> str:
        return self.field or self.keyword

    @property
    def shown(self) -> str:
        """The name in the list of valid options (``catalog.<property>`` for a family)."""
        return f"{self.key}<property>" if self.prefix else self.key


# fmt: off
OPTIONS: tuple[Option, ...] = (
    Option(TABLE, "table", None, '"<namespace>.<table>" (or route_by), as the option `table`', required="yes"),
    Option(CATALOG, "catalog", None, "as the option `catalog`", "the embedded default", parse=_parse_catalog,
           field="catalog_name"),
    Option(CATALOG_PROPERTY_PREFIX, "catalog_properties", None,
           "dict, as the options `catalog.<property>` (property names keep their case)", prefix=True, secret=True),
    Option(OUTPUT_MODE, "output_mode", OutputMode.APPEND.value,
           '"append", "complete" or "update": the mode the query was started with', parse=OutputMode.parse,
           entries=Entry.FOREACH, spark_refusal=": set the mode with .outputMode('append') or .outputMode('complete')"),
    Option(CHECKPOINT_LOCATION, "checkpoint_location", None, "the query's checkpoint, to record source offsets",
           required="yes", parse=lambda v: v or None),
    Option(CREATE_TABLE, "create_table", True, "as the option `create-table`", "`true`",
           parse=partial(_parse_bool, CREATE_TABLE)),
    Option(PARTITIONED_BY, "partitioned_by", None, 'as the option `partitioned-by`, e.g. "days(ts), bucket(16, id)"',
           "unpartitioned", parse=_parse_partitioned_by, show=_terms_text),
    Option(MERGE_SCHEMA, "merge_schema", False, "as the option `merge-schema`", "`false`",
           parse=partial(_parse_bool, MERGE_SCHEMA)),
    Option(BRANCH, "branch", MAIN_BRANCH, "as the option `branch`", f"`{MAIN_BRANCH}`", parse=_parse_branch),
    Option(WRITER, "writer", WriterKind.AUTO.value, '"auto", "spark", "arrow" or "driver": who writes the Parquet files',
           parse=WriterKind.parse, entries=Entry.FOREACH,
           spark_refusal=", which always writes through Python workers (the Arrow path); use "
                         "lakesink.foreach_batch(..., writer='spark') for Spark's own Parquet writer"),
    Option(SINK_ID, "sink_id", None, "as the option `sink-id`: several sinks of one query writing this table", "none",
           parse=_parse_sink_id),
    Option(UPSERT_KEY, "upsert_key", None, "as the option `upsert-key`: a column or a list of columns (docs/upserts.md)"),
    Option(DELETE_WHEN, "delete_when", None, "as the option `delete-when` (Spark SQL here)"),
    Option(ORDER_BY, "order_by", None, "as the option `order-by`"),
    Option(TABLE_PROPERTY_PREFIX, "table_properties", None, "dict, as the options `table-property.<property>`",
           "the bounded defaults", prefix=True),
    Option(FORMAT_VERSION, "format_version", None, "as the option `format-version` (default 2)",
           f"`{DEFAULT_FORMAT_VERSION}`", parse=_parse_format_version),
    Option(MAINTENANCE, "maintenance", Maintenance.AUTO.value, 'as the option `maintenance`: "auto" or "off"', "`auto`",
           parse=Maintenance.parse),
    Option(EVENT_TIME, "event_time", None, "as the option `event-time`: a timestamp column (docs/auditing.md)", "none",
           parse=partial(_parse_column, EVENT_TIME)),
    Option(DEAD_LETTER_TABLE, "dead_letter_table", None, "as the option `dead-letter-table` (docs/dead-letters.md)",
           "none"),
    Option(REJECT_WHEN, "reject_when", None, "as the option `reject-when` (Spark SQL here)", "none"),
    Option(MAX_REJECTED_FRACTION, "max_rejected_fraction", None, "as the option `max-rejected-fraction` (None: 1)", "`1`"),
    Option(ALLOW_TEMPORARY_CHECKPOINT, "allow_temporary_checkpoint", False,
           "run a query whose checkpoint its next start will not find (warning)",
           parse=partial(_parse_bool, ALLOW_TEMPORARY_CHECKPOINT), entries=Entry.FOREACH,
           spark_refusal=", which always needs option 'checkpointLocation'"),
    Option(ROUTE_BY, "route_by", None, "as the option `route-by`: one stream into many tables (docs/routing.md)",
           required="instead of `table`", field="routing"),
    Option(NAMESPACE, "namespace", None, "as the option `namespace` (with route_by)", field="routing"),
    Option(ROUTE_NAMESPACES, "route_namespaces", None, "as the option `route-namespaces`, or a list of namespaces",
           "any namespace", field="routing"),
    Option(ATOMIC, "atomic", None, 'as the option `atomic`: "auto", "required" or "off"', "`auto`", field="routing"),
    Option(PAYLOAD, "payload", None, "as the option `payload`: a JSON column, each row's columns in its table (docs/cdc.md)"),
    Option(CDC_FORMAT, "cdc_format", None, 'as the option `cdc-format`: "debezium" (docs/cdc.md)'),
    Option(METRICS, "metrics", None, 'as the option `metrics`: "off" or "prometheus:[<host>:]<port>" (docs/metrics.md)',
           "`off`", parse=MetricsExport.parse, show=str),
)
# fmt: on
"""Every option of a lakesink write, in the order the documentation and the list of valid options give them."""

VALID_OPTIONS = tuple(o.shown for o in OPTIONS if Entry.SPARK in o.entries)
"""The options the unknown-option error lists (foreach_batch's own are named by its signature)."""
_KEYS = frozenset(o.lowered for o in OPTIONS if o.entries is Entry.BOTH and not o.prefix)
_PREFIXES = tuple(o.lowered for o in OPTIONS if o.prefix)
_BY_FIELD = {o.field_name: o for o in OPTIONS if o.field_name != "routing"}


def _shown(option: Option | None, value: object) -> object:
    """A :class:`SinkOptions` field as its ``repr`` shows it (secrets redacted)."""
    if option is not None and option.secret:
        assert isinstance(value, Mapping)
        return redact_properties(value)
    if option is not None and option.show is not None:
        return option.show(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, TableName):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _as_text(value: object) -> str:
    """A keyword argument of foreach_batch as option text: booleans ``true``/``false``, lists comma-separated."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return ",".join(map(str, value))
    return str(value)


# --- spark.read.format("lakesink") ------------------------------------------------------------------

SNAPSHOT_ID = "snapshot-id"
AS_OF_TIMESTAMP = "as-of-timestamp"
AS_OF_BATCH = "as-of-batch"
COLUMNS = "columns"
PUSHDOWN = "pushdown"
READ_VALID_OPTIONS = (
    TABLE,
    CATALOG,
    f"{CATALOG_PROPERTY_PREFIX}<property>",
    BRANCH,
    SNAPSHOT_ID,
    AS_OF_TIMESTAMP,
    AS_OF_BATCH,
    COLUMNS,
    PUSHDOWN,
)


@dataclass(frozen=True)
class ReadOptions:
    """Every option of ``spark.read.format("lakesink")``, validated (at most one of the time-travel options)."""

    table: TableName
    catalog_name: str | None = None
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    branch: str = MAIN_BRANCH
    snapshot_id: int | None = None
    as_of_timestamp: str | None = None
    """Epoch milliseconds or an ISO 8601 time (UTC without an offset)."""
    as_of_batch: str | None = None
    """``<batch id>`` (the table's only query) or ``<query id>:<batch id>``."""
    columns: tuple[str, ...] | None = None
    pushdown: bool = False
    """Take Spark's filters to skip files (off by default: pyspark 4.x reuses a pushed-down plan, see reader.py)."""

    def __repr__(self) -> str:  # never print catalog secrets
        return (
            f"ReadOptions(table={str(self.table)!r}, catalog_name={self.catalog_name!r}, "
            f"catalog_properties={redact_properties(self.catalog_properties)!r}, branch={self.branch!r}, "
            f"snapshot_id={self.snapshot_id!r}, as_of_timestamp={self.as_of_timestamp!r}, as_of_batch={self.as_of_batch!r}, "
            f"columns={self.columns!r}, pushdown={self.pushdown!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> ReadOptions:
        lowered = {k.lower(): v for k, v in options.items()}
        known = {k for k in READ_VALID_OPTIONS if not k.endswith("<property>")}
        unknown = sorted(
            k for k in lowered if k not in known and not k.startswith(CATALOG_PROPERTY_PREFIX) and k not in _SPARK_OWN_OPTIONS
        )
        if unknown:
            raise InvalidOptionError(
                f"unknown read option(s) {', '.join(repr(k) for k in unknown)}; valid options: {', '.join(READ_VALID_OPTIONS)}"
            )
        if TABLE not in lowered or not lowered[TABLE].strip():
            raise InvalidOptionError(f"option '{TABLE}' is required (for example .option('table', 'db.events'))")
        travel = [k for k in (SNAPSHOT_ID, AS_OF_TIMESTAMP, AS_OF_BATCH) if lowered.get(k, "").strip()]
        if len(travel) > 1:
            raise InvalidOptionError(
                f"give at most one of the options {SNAPSHOT_ID}, {AS_OF_TIMESTAMP}, {AS_OF_BATCH}; got {travel}"
            )
        snapshot_id = None
        if lowered.get(SNAPSHOT_ID, "").strip():
            try:
                snapshot_id = int(lowered[SNAPSHOT_ID])
            except ValueError:
                raise InvalidOptionError(
                    f"option '{SNAPSHOT_ID}' must be a snapshot id (an integer), got {lowered[SNAPSHOT_ID]!r}"
                ) from None
        columns = tuple(c.strip() for c in lowered[COLUMNS].split(",") if c.strip()) if lowered.get(COLUMNS) else None
        catalog_properties = {
            k[len(CATALOG_PROPERTY_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(CATALOG_PROPERTY_PREFIX)
        }
        catalog_name = lowered.get(CATALOG)
        return cls(
            table=TableName.parse(lowered[TABLE]),
            catalog_name=catalog_name.strip() if catalog_name and catalog_name.strip() else None,
            catalog_properties=catalog_properties,
            branch=_parse_branch(lowered.get(BRANCH, MAIN_BRANCH)),
            snapshot_id=snapshot_id,
            as_of_timestamp=lowered.get(AS_OF_TIMESTAMP, "").strip() or None,
            as_of_batch=lowered.get(AS_OF_BATCH, "").strip() or None,
            columns=columns or None,
            pushdown=_parse_bool(PUSHDOWN, lowered.get(PUSHDOWN, "false")),
        )
