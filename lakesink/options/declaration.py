"""The declaration of every option of a lakesink write: one :class:`Option` row each in :data:`OPTIONS`, from which
the parser's known options, the unknown-option error, the redacted ``repr``, the refusals of ``format("lakesink")`` and
:func:`lakesink.foreach_batch`'s keyword arguments and defaults come (tests/test_options.py holds foreach_batch's
signature and docs/options.md's tables equal to it)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from lakesink.options.keys import (
    ALLOW_TEMPORARY_CHECKPOINT,
    ATOMIC,
    BRANCH,
    CATALOG,
    CATALOG_PROPERTY_PREFIX,
    CDC_FORMAT,
    CDC_TRANSACTION_WAIT,
    CDC_TRANSACTIONS,
    CDC_UNAVAILABLE_VALUE,
    CDC_UNAVAILABLE_VALUE_DEFAULT,
    CHECKPOINT_LOCATION,
    CREATE_TABLE,
    DEAD_LETTER_TABLE,
    DEFAULT_FORMAT_VERSION,
    DELETE_WHEN,
    EVENT_TIME,
    HISTORY,
    HISTORY_TIME,
    MAINTENANCE,
    MAX_REJECTED_FRACTION,
    MERGE_SCHEMA,
    METRICS,
    NAMESPACE,
    ORDER_BY,
    OUTPUT_MODE,
    PAYLOAD,
    REJECT_WHEN,
    ROUTE_BY,
    ROUTE_NAMESPACES,
    SINK_ID,
    TABLE,
    TABLE_PROPERTY_PREFIX,
    UPSERT_KEY,
    WRITER,
)
from lakesink.options.values import (
    CdcTransactions,
    HistoryTables,
    Maintenance,
    MetricsExport,
    OutputMode,
    TableName,
    UnavailableValue,
    WriterKind,
    _parse_bool,
    _parse_branch,
    _parse_catalog,
    _parse_cdc_transaction_wait,
    _parse_column,
    _parse_format_version,
    _parse_partitioned_by,
    _parse_sink_id,
    _terms_text,
)
from lakesink.redaction import redact_properties
from lakesink.table.keys import FORMAT_VERSION, MAIN_BRANCH
from lakesink.table.partitioning import PARTITIONED_BY

__all__ = ["OPTIONS", "VALID_OPTIONS", "Entry", "Option"]


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
    Option(CDC_TRANSACTIONS, "cdc_transactions", CdcTransactions.OFF.value,
           '"off" or "hold": with cdc_format, source transactions held back until whole (docs/cdc.md)',
           "`off`", parse=CdcTransactions.parse),
    Option(CDC_TRANSACTION_WAIT, "cdc_transaction_wait", None,
           "seconds a held transaction that cannot become whole waits before its release as it stands (docs/cdc.md)",
           "`600`", parse=_parse_cdc_transaction_wait),
    Option(CDC_UNAVAILABLE_VALUE, "cdc_unavailable_value", CDC_UNAVAILABLE_VALUE_DEFAULT,
           "with cdc_format: the connector's unavailable.value.placeholder, whose columns keep the table's value "
           "(docs/cdc.md)", f"`{CDC_UNAVAILABLE_VALUE_DEFAULT}`", parse=UnavailableValue.parse, show=str),
    Option(METRICS, "metrics", None, 'as the option `metrics`: "off" or "prometheus:[<host>:]<port>" (docs/metrics.md)',
           "`off`", parse=MetricsExport.parse, show=str),
    Option(HISTORY, "history", None,
           'as the option `history`: "on", or a pattern such as "audit.{table}_versions" (docs/history.md)', "`off`",
           parse=HistoryTables.parse, show=lambda v: str(v) if v is not None else None),
    Option(HISTORY_TIME, "history_time", None,
           "as the option `history-time`: the column holding each change's source time (docs/history.md)",
           "none (`cdc_source_time` with `cdc-format`)",
           parse=partial(_parse_column, HISTORY_TIME)),
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
