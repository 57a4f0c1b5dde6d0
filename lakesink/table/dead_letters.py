"""The dead-letter table's model: its columns and the error kinds of the rows in it (anywhere: executors build the
rows, the driver creates and checks the table, the audit commands count them). docs/dead-letters.md.

Columns (lakesink creates the table with them; a table with more columns is fine, lakesink leaves them null):

- ``error``: the kind, one of :data:`ERROR_KINDS`;
- ``column``: the column (dotted path for a nested field) the error is about, null when it is about the whole row;
- ``message``: what is wrong, for a person;
- ``row``: the whole original row as JSON (as the stream delivered it), to repair and replay;
- ``table``: the table the row was meant for (a routed sink's ``invalid-route``: the raw routing value, null when
  the value was null);
- ``query_id``, ``batch_id``: the streaming query and micro-batch that rejected it (as in the snapshot summaries);
- ``rejected_at``: when the executor rejected it (UTC).
"""

from __future__ import annotations

import pyarrow as pa

ERROR = "error"
COLUMN = "column"
MESSAGE = "message"
ROW = "row"
TABLE = "table"
QUERY_ID = "query_id"
BATCH_ID = "batch_id"
REJECTED_AT = "rejected_at"

SCHEMA = pa.schema(
    [
        pa.field(ERROR, pa.string(), nullable=False),
        pa.field(COLUMN, pa.string()),
        pa.field(MESSAGE, pa.string(), nullable=False),
        pa.field(ROW, pa.string(), nullable=False),
        pa.field(TABLE, pa.string()),
        pa.field(QUERY_ID, pa.string(), nullable=False),
        pa.field(BATCH_ID, pa.int64(), nullable=False),
        pa.field(REJECTED_AT, pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
"""The columns lakesink writes (Arrow; the Iceberg table gets them with these types, NOT NULL as here)."""

REJECT_WHEN = "reject-when"
"""The row matched option ``reject-when``."""
REQUIRED_NULL = "required-null"
"""A null in a required (NOT NULL) column or nested field of the table; ``column`` names it."""
NULL_UPSERT_KEY = "null-upsert-key"
"""With option ``upsert-key``: a null in a key column; ``column`` names it."""
NOT_UTF8 = "not-utf8"
"""A string column (or nested string field) holds bytes that are not UTF-8 (an Iceberg string is UTF-8 text); ``column``
names the stream's column."""
INVALID_ROUTE = "invalid-route"
"""Option ``route-by``: the row's routing value names no valid table (null, empty, an invalid name); ``column`` is the
routing column, ``table`` the raw value."""
PAYLOAD_VALUE = "payload-value"
"""Option ``payload``: a payload field's value does not fit its table's column exactly (a string in a long column, a
number beyond an int, more digits than a decimal column holds, an integer in a temporal column, text that is no
date, a value its Connect schema cannot decode...); ``column`` names the column, ``table`` the row's table, ``row`` is
the stream's row as it came (the payload as its JSON text)."""
UNAVAILABLE_VALUE = "unavailable-value"
"""Option ``cdc-format``: a change holds Debezium's unavailable-value placeholder (an unchanged PostgreSQL TOAST value)
and there is no value to keep (the table holds no row of its key, the batch gave none before, or the batch deleted the
key just before); ``column`` names the first such column, ``table`` the change's table, ``row`` the Kafka record as it
came. Found at the commit: the batch is written again with such changes taken out (lakesink.sink.commit)."""
ERROR_KINDS = (REJECT_WHEN, REQUIRED_NULL, NULL_UPSERT_KEY, INVALID_ROUTE, PAYLOAD_VALUE, UNAVAILABLE_VALUE)

from lakesink.table.keys import REJECT_COLUMN as REJECT_COLUMN  # noqa: E402 (re-exported beside the error kinds)
