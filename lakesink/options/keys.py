"""The sink's and the reader's option keys (the names users write), and the values they share."""

from __future__ import annotations

from lakesink.table.partitioning import PARTITIONED_BY as PARTITIONED_BY

__all__ = [
    "ALLOW_TEMPORARY_CHECKPOINT",
    "ATOMIC",
    "BRANCH",
    "CATALOG",
    "CATALOG_PROPERTY_PREFIX",
    "CDC_CONNECT_SCHEMA",
    "CDC_VALUE",
    "CDC_FORMAT",
    "CDC_PAYLOAD",
    "CDC_ORDER_BY",
    "CDC_SOURCE_TIME",
    "CDC_PREFIX",
    "CDC_TRANSACTIONS",
    "CDC_TRANSACTION_WAIT",
    "CDC_UNAVAILABLE_VALUE",
    "CDC_UNAVAILABLE_VALUE_DEFAULT",
    "CHECKPOINT_LOCATION",
    "CREATE_TABLE",
    "DEAD_LETTER_TABLE",
    "DEFAULT_FORMAT_VERSION",
    "DELETE_WHEN",
    "EVENT_TIME",
    "FORMAT_VERSIONS",
    "HISTORY",
    "HISTORY_TIME",
    "MAINTENANCE",
    "MAX_REJECTED_FRACTION",
    "MERGE_SCHEMA",
    "METRICS",
    "NAMESPACE",
    "ORDER_BY",
    "OUTPUT_MODE",
    "PARTITIONED_BY",
    "PAYLOAD",
    "REJECT_WHEN",
    "ROUTE_BY",
    "ROUTE_NAMESPACES",
    "SINK_ID",
    "TABLE",
    "TABLE_PROPERTY_PREFIX",
    "UPSERT_KEY",
    "WRITER",
]

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
HISTORY = "history"
HISTORY_TIME = "history-time"
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
CDC_ORDER_BY = f"{CDC_PREFIX}order"
"""Option cdc-format: the option order-by it sets (the source position lakesink.cdc.positions packs)."""
CDC_SOURCE_TIME = f"{CDC_PREFIX}source_time"
"""Option cdc-format: the column holding each change's time at its source (Debezium's ``source.ts_ms``, a timestamp;
lakesink.cdc.debezium.parse's ``source_time``): option history-time's default with option history."""
CDC_PAYLOAD = "cdc_payload"
CDC_CONNECT_SCHEMA = "cdc_connect_schema"
"""Option cdc-format: the column with each record's Kafka Connect schema (``schemas.enable``; null without), which
types its fields (lakesink.cdc.connect)."""
CDC_VALUE = "cdc_value"
"""Option cdc-format with dead-letter-table: the record's ``value`` as it came (a dead letter's row holds it)."""
CDC_UNAVAILABLE_VALUE = "cdc-unavailable-value"
"""With cdc-format: the connector's ``unavailable.value.placeholder`` (``hex:<octets>`` for bytes, as Debezium reads it):
a column holding it keeps the value the table holds for the key (PostgreSQL's unchanged TOAST values; docs/cdc.md)."""
CDC_UNAVAILABLE_VALUE_DEFAULT = "__debezium_unavailable_value"
"""Debezium's default ``unavailable.value.placeholder``."""
CDC_TRANSACTIONS = "cdc-transactions"
"""With cdc-format: ``hold`` (read Debezium's transaction metadata and hold back every change after the first source
transaction a batch does not hold whole) or ``off`` (default; a transaction-metadata record fails the batch)."""
CDC_TRANSACTION_WAIT = "cdc-transaction-wait"
"""With cdc-transactions=hold: seconds a held transaction that cannot become whole (its END at hand and changes
missing, or changes without their BEGIN and END) waits before it is released as it stands (docs/cdc.md)."""
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
