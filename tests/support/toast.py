"""PostgreSQL's unchanged TOAST values as Debezium's PostgreSQL connector sends them, for the tests of option cdc-format.

Under ``REPLICA IDENTITY DEFAULT`` (PostgreSQL's default) an update that leaves a TOASTed column unchanged does not
log its value; the connector sends its ``unavailable.value.placeholder`` (default ``__debezium_unavailable_value``) in
the column's own type, as debezium-connector-postgres' ``UnchangedToastedPlaceholder`` builds it: a string column
the text; a bytea column the bytes (base64 in the JsonConverter's JSON); text[]/json[] a list of the text; bytea[] a
list of the bytes; integer[]/bigint[]/date[] the bytes as Java ints (signed); uuid[] a list of Java's
``UUID.nameUUIDFromBytes(bytes)``. :func:`placeholder` gives it per column type of tests/support/cdc_debezium.py;
:func:`change` one change as cdc_debezium.records takes it, :func:`kafka_records` its Kafka records.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from tests.support import cdc_debezium

DEFAULT = b"__debezium_unavailable_value"


def java_name_uuid(raw: bytes) -> str:
    """Java's ``UUID.nameUUIDFromBytes``: the MD5 of the bytes, version 3, IETF variant (no namespace)."""
    b = bytearray(hashlib.md5(raw, usedforsecurity=False).digest())
    b[6] = (b[6] & 0x0F) | 0x30
    b[8] = (b[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(b)))


def placeholder(iceberg: str, raw: bytes = DEFAULT) -> Any:
    """The placeholder as a value of a column of type ``iceberg`` (before cdc_debezium.value encodes it for JSON)."""
    text = raw.decode("utf-8", errors="replace")
    if iceberg in ("string", "json"):
        return text
    if iceberg == "binary":
        return raw
    if iceberg == "list<string>":
        return [text]
    if iceberg == "list<binary>":
        return [raw]
    if iceberg in ("list<int>", "list<long>"):
        return [b - 256 if b > 127 else b for b in raw]
    if iceberg == "list<uuid>":
        return [java_name_uuid(raw)]
    raise AssertionError(f"a {iceberg} column is not TOASTed")


def change(
    table: str,
    op: str,
    lsn: int,
    row: Mapping[str, Any] | None,
    types: Mapping[str, str],
    key: Sequence[str],
    *,
    before: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A change as tests/support/cdc_debezium.records takes it (a delete's ``row`` is its before image: under REPLICA
    IDENTITY DEFAULT, the key columns only)."""
    image = dict(row) if row is not None else None
    return {
        "table": table,
        "op": op,
        "lsn": lsn,
        "txid": 700 + lsn,
        "commit_ts": "2026-11-27T10:00:00+00:00",
        "types": dict(types),
        "before": image if op == "d" else (dict(before) if before is not None else None),
        "after": None if op in ("d", "t") else image,
        "key": None if op == "t" or image is None else {k: image[k] for k in key},
    }


def kafka_records(changes: Sequence[dict[str, Any]], key: Sequence[str], *, schemas: bool) -> list[dict[str, Any]]:
    """The changes' Kafka records (topic, key, value as JSON text), with or without ``schemas.enable``."""
    return [r for c in changes for r in cdc_debezium.records(c, "shop", tuple(key), schemas=schemas)]
