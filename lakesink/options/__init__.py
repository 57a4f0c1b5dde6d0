"""Sink options: parsed once into a frozen, typed :class:`SinkOptions`.

The same options reach lakesink from ``writeStream.option(...)`` (keys arrive lower-cased from
Spark) and from keyword arguments of :func:`lakesink.foreach_batch`. Each option is declared once, in
:data:`OPTIONS`; adding one is: its key constant, its :class:`Option` row, its :class:`SinkOptions` field (and its
parser when it goes with others), foreach_batch's keyword, and the rows of docs/options.md -- tests/test_options.py
fails until the signature and the docs agree with the declaration.

By subject: :mod:`~lakesink.options.keys` (the option names), :mod:`~lakesink.options.values` (typed values and
the parsers of one value), :mod:`~lakesink.options.declaration` (:data:`OPTIONS`), :mod:`~lakesink.options.sink`
(:class:`SinkOptions`), :mod:`~lakesink.options.read` (:class:`ReadOptions`); every name is importable from here.
"""

from __future__ import annotations

from lakesink.options.declaration import OPTIONS, VALID_OPTIONS, Entry, Option
from lakesink.options.keys import (
    ALLOW_TEMPORARY_CHECKPOINT,
    ATOMIC,
    BRANCH,
    CATALOG,
    CATALOG_PROPERTY_PREFIX,
    CDC_CONNECT_SCHEMA,
    CDC_FORMAT,
    CDC_PAYLOAD,
    CDC_PREFIX,
    CHECKPOINT_LOCATION,
    CREATE_TABLE,
    DEAD_LETTER_TABLE,
    DEFAULT_FORMAT_VERSION,
    DELETE_WHEN,
    EVENT_TIME,
    FORMAT_VERSIONS,
    MAINTENANCE,
    MAX_REJECTED_FRACTION,
    MERGE_SCHEMA,
    METRICS,
    NAMESPACE,
    ORDER_BY,
    OUTPUT_MODE,
    PARTITIONED_BY,
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
from lakesink.options.read import AS_OF_BATCH, AS_OF_TIMESTAMP, COLUMNS, PUSHDOWN, READ_VALID_OPTIONS, SNAPSHOT_ID, ReadOptions
from lakesink.options.sink import ROUTED, SinkOptions
from lakesink.options.values import Atomic, Maintenance, MetricsExport, OutputMode, Routing, TableName, WriterKind

__all__ = [
    "ALLOW_TEMPORARY_CHECKPOINT",
    "AS_OF_BATCH",
    "AS_OF_TIMESTAMP",
    "ATOMIC",
    "Atomic",
    "BRANCH",
    "CATALOG",
    "CATALOG_PROPERTY_PREFIX",
    "CDC_CONNECT_SCHEMA",
    "CDC_FORMAT",
    "CDC_PAYLOAD",
    "CDC_PREFIX",
    "CHECKPOINT_LOCATION",
    "COLUMNS",
    "CREATE_TABLE",
    "DEAD_LETTER_TABLE",
    "DEFAULT_FORMAT_VERSION",
    "DELETE_WHEN",
    "EVENT_TIME",
    "Entry",
    "FORMAT_VERSIONS",
    "MAINTENANCE",
    "MAX_REJECTED_FRACTION",
    "MERGE_SCHEMA",
    "METRICS",
    "Maintenance",
    "MetricsExport",
    "NAMESPACE",
    "OPTIONS",
    "ORDER_BY",
    "OUTPUT_MODE",
    "Option",
    "OutputMode",
    "PARTITIONED_BY",
    "PAYLOAD",
    "PUSHDOWN",
    "READ_VALID_OPTIONS",
    "REJECT_WHEN",
    "ROUTED",
    "ROUTE_BY",
    "ROUTE_NAMESPACES",
    "ReadOptions",
    "Routing",
    "SINK_ID",
    "SNAPSHOT_ID",
    "SinkOptions",
    "TABLE",
    "TABLE_PROPERTY_PREFIX",
    "TableName",
    "UPSERT_KEY",
    "VALID_OPTIONS",
    "WRITER",
    "WriterKind",
]
