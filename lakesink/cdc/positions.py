"""What orders a Debezium connector's changes: one ``decimal(38,0)`` per change, per-key monotonic (docs/cdc.md, "Sources").

Plain Python (format("lakesink")'s parser, :mod:`lakesink.cdc.envelope`, calls :func:`order` per record); the Spark SQL
twin in :mod:`lakesink.cdc.debezium` builds the same value from the same constants, and tests/cdc/test_debezium.py and
tests/cdc/test_sources.py hold the two equal. The value is compared across batches against the values the tables'
order files hold ("greater or equal wins", lakesink.driver.actions.upsert_order), so a packing, once written, stays.

Packings (``10^k`` written ``Ek``; every part is bounded, a value outside its bound is a loud error, never a wrap):

- **PostgreSQL** (and a record with ``source.lsn``): a streamed change's WAL position, as it is; a snapshot read
  (op ``r``) ``lsn - E37`` (``lsn`` < E20: a 64-bit WAL position), below every streamed change. A snapshot reads at the
  replication slot's consistent point, and a transaction that was open then commits after it with changes logged
  BEFORE that point: streamed after the snapshot, their LSNs are below the snapshot read's although they are the newer
  state (Debezium's snapshot reads carry the consistent point's LSN). Snapshot reads among themselves keep the LSN's
  order (a later re-snapshot wins over an earlier one).
- **MySQL, MariaDB** binlog coordinates ``C = suffix*E16 + pos*E6 + row`` (``file``'s numeric suffix < E6, ``pos`` <
  E10, ``row`` < E6). A MySQL change streamed with a GTID (``gtid`` set, op not ``r``) adds its transaction's commit
  time: ``ts_ms*E22 + C``. With ``gtid_mode=ON`` on MySQL 8.0.1+ Debezium sets ``source.ts_ms`` from the GTID event's
  ``original_commit_timestamp``: the commit time on the server that first committed the transaction, the same on every
  replica, so the order survives a failover to a replica whose binlog numbers differ; two changes of one key commit in
  order (the row's lock is held to the commit), so their commit times do not go back unless the clock does; equal
  milliseconds fall back on ``C`` (one server). A snapshot read and a change without a GTID keep ``C`` alone (their
  ``ts_ms`` is a read time or a statement's start, in seconds: not an order); MariaDB's ``ts_ms`` is always the event
  header's second. ``C`` alone can go back (``RESET MASTER``, a failover without GTIDs): the driver detects it per key
  and adds a table's binlog epoch to ``C`` (:mod:`lakesink.cdc.binlog`).
- **SQL Server, Db2** (hex LSNs ``00000027:00000758:0003``, read as one hexadecimal number, < 16^20): a streamed change
  ``E37 + change_lsn*E12 + event_serial_no``; a snapshot read ``commit_lsn*E12`` (below every streamed change).
- **Informix** (decimal LSNs): a streamed change ``E37 + change_lsn*E12``; a snapshot read ``commit_lsn*E12``.
- **Oracle**: a streamed change ``E37 + commit_scn*E17 + within``, ``within`` the change's ``txSeq`` (its place in its
  transaction) where the record has one, else ``E17 - 1 - (commit_scn - scn)``; without ``commit_scn`` (XStream) the
  ``scn`` stands for it and ``within`` is ``txSeq`` or 0; a snapshot read ``scn*E17``.
- **Vitess** with ``transaction.metadata.factory=...VitessOrderedTransactionMetadataFactory``: ``E37 +
  transaction_epoch*E33 + transaction_rank*E10 + total_order`` (the comparison Debezium's documentation gives).
- **MongoDB, Spanner, Cassandra, Vitess without ordered metadata, another connector without ``lsn`` or ``file``**:
  refused (:func:`order` raises), naming the connector and the fix.
- A record without ``source.connector`` and without a position: null (one change per key per batch, as without
  ``order-by``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lakesink.errors import SchemaMismatchError

E = {k: 10**k for k in (6, 10, 12, 16, 17, 22, 33, 34, 37)}
MYSQL_FILE_STEP, MYSQL_POS_STEP = E[16], E[6]
MYSQL_TIME_STEP = E[22]
"""A GTID change's commit time (ms) above its coordinates (< E22)."""
GTID_BAND = E[34]
"""The lowest order value of a MySQL change streamed with a GTID (``ts_ms >= 10^12``): the band [E34, E37) holds those
alone (binlog epochs < E28, LSNs < E20, the LSN/SCN connectors' streamed changes >= E37)."""
STREAMED = E[37]
"""The band of a streamed change of an LSN/SCN connector: above every snapshot read (< E37)."""
SNAPSHOT_BELOW = E[37]
"""PostgreSQL: subtracted from a snapshot read's LSN (< E20), so that it is below every streamed change (>= 0)."""
LSN_STEP = E[12]
ORACLE_STEP = E[17]
VITESS_EPOCH_STEP, VITESS_RANK_STEP = E[33], E[10]

#: significant digits each part may have (its bound): decimal parts in decimal digits, LSNs in hex digits
DIGITS = {
    "suffix": 6, "pos": 10, "row": 6, "ts_ms": 16, "lsn_hex": 20, "serial": 12, "informix_lsn": 25,
    "scn": 20, "within": 17, "epoch": 4, "rank": 23, "total_order": 10, "snapshot_lsn": 20,
}  # fmt: skip

BINLOG = ("mysql", "mariadb")
LSN_HEX = ("sqlserver", "db2")
ORDERED = ("postgresql", *BINLOG, *LSN_HEX, "informix", "oracle", "vitess")
"""Connectors whose changes lakesink orders (docs/cdc.md, "Sources")."""
REFUSED = {
    "mongodb": (
        "MongoDB's change events are documents, not rows: 'after' is extended JSON text ({\"$oid\": ...}, "
        "{\"$numberLong\": ...}) and an update may carry only 'updateDescription'. Flatten them with Debezium's "
        "ExtractNewDocumentState transform (add.fields=op,source.ts_ms,source.ord) and write them with options payload, "
        "upsert-key, delete-when and order-by (the BSON timestamp: source.ts_ms, then source.ord) instead of cdc-format"
    ),
    "spanner": (
        "Spanner's records carry the commit time in milliseconds (source.ts_ms), which two commits of one row can share. "
        "Flatten them (ExtractNewRecordState, add.fields=source.ts_us,source.sequence) and write them with options "
        "payload, upsert-key, delete-when and order-by instead of cdc-format"
    ),
    "cassandra": (
        "Cassandra's commit-log records carry no position that orders two changes of one row. Write them with options "
        "payload, upsert-key, delete-when and an order-by column of your own instead of cdc-format"
    ),
}
VITESS_FIX = (
    "set the connector's transaction.metadata.factory=io.debezium.connector.vitess.pipeline.txmetadata."
    "VitessOrderedTransactionMetadataFactory (its records then carry transaction.transaction_epoch, transaction_rank "
    "and total_order, which order them)"
)

_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]+")
_SUFFIX = re.compile(r"\.([0-9]+)$")


def text(value: Any) -> str | None:
    """A JSON value as Spark's from_json reads it into a string field: a string as itself, a number as its JSON text."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def refusal(connector: str | None, route: str, what: str) -> str:
    """The message of a record whose order cannot be made (the Spark parser's raise_error gives the same)."""
    return (
        f"lakesink.cdc: a change of table {route!r} from Debezium connector {connector or '<none>'!r} has no order lakesink "
        f"can trust: {what}. Nothing was committed"
    )


def _fits(value: str | None, digits: int) -> bool:
    return value is not None and _DIGITS.fullmatch(value) is not None and len(value.lstrip("0")) <= digits


def _number(source: Mapping[str, Any], name: str, digits: int, connector: str | None, route: str) -> int:
    value = text(source.get(name))
    if not _fits(value, digits):
        raise SchemaMismatchError(refusal(connector, route, f"source.{name} is {value!r}, expected an integer below 10^{digits}"))
    return int(str(value))


def _hex_lsn(source: Mapping[str, Any], name: str, connector: str, route: str) -> int | None:
    value = text(source.get(name))
    if value is None or value == "NULL":
        return None
    digits = value.replace(":", "")
    if _HEX.fullmatch(digits) is None or len(digits.lstrip("0")) > DIGITS["lsn_hex"]:
        raise SchemaMismatchError(
            refusal(
                connector, route,
                f"source.{name} is {value!r}, expected a hexadecimal LSN ('00000027:00000758:0003') below 16^{DIGITS['lsn_hex']}",
            )
        )  # fmt: skip
    return int(digits, 16)


def order(source: Mapping[str, Any], op: str, transaction: Mapping[str, Any] | None, route: str) -> int | None:
    """The order of one change (module docstring), None for a record that has none; raises SchemaMismatchError for a
    record whose order cannot be made (a refused connector, a position outside its bound)."""
    connector = text(source.get("connector"))
    if connector in REFUSED:
        raise SchemaMismatchError(refusal(connector, route, REFUSED[connector]))
    if connector == "vitess":
        return _vitess(transaction or {}, op, route)
    if connector in LSN_HEX:
        return _lsn_hex(source, op, connector, route)
    if connector == "informix":
        return _informix(source, op, route)
    if connector == "oracle":
        return _oracle(source, op, route)
    if connector == "postgresql" or (connector not in ORDERED and source.get("lsn") is not None):
        return _lsn(source, op, connector, route)
    if connector in BINLOG or source.get("file") is not None:
        return _binlog(source, op, connector, route)
    if connector is None:
        return None
    raise SchemaMismatchError(
        refusal(
            connector, route,
            f"lakesink orders the changes of {', '.join(ORDERED)} (docs/cdc.md, 'Sources'), and this record's source has "
            "neither 'lsn' nor binlog 'file'/'pos'. Write the stream with options payload, upsert-key, delete-when and an "
            "order-by column of your own instead of cdc-format",
        )
    )  # fmt: skip


def _lsn(source: Mapping[str, Any], op: str, connector: str | None, route: str) -> int | None:
    value = text(source.get("lsn"))
    if op == "r":
        return _number(source, "lsn", DIGITS["snapshot_lsn"], connector, route) - SNAPSHOT_BELOW
    if _fits(value, 38):
        return int(str(value))
    raise SchemaMismatchError(refusal(connector, route, f"source.lsn is {value!r}, expected an integer below 10^38"))


def _binlog(source: Mapping[str, Any], op: str, connector: str | None, route: str) -> int:
    file = text(source.get("file"))
    match = _SUFFIX.search(file) if file is not None else None
    if match is None or len(match.group(1).lstrip("0")) > DIGITS["suffix"]:
        raise SchemaMismatchError(
            refusal(
                connector, route,
                f"source.file is {file!r}, expected a binlog file name with a numeric suffix below 10^{DIGITS['suffix']} "
                "('mysql-bin.000003')",
            )
        )  # fmt: skip
    pos = _number(source, "pos", DIGITS["pos"], connector, route)
    row = _number(source, "row", DIGITS["row"], connector, route) if source.get("row") is not None else 0
    coordinates = int(match.group(1)) * MYSQL_FILE_STEP + pos * MYSQL_POS_STEP + row
    gtid = text(source.get("gtid"))
    if connector != "mysql" or not gtid or op == "r":
        return coordinates
    return _number(source, "ts_ms", DIGITS["ts_ms"], connector, route) * MYSQL_TIME_STEP + coordinates


def _lsn_hex(source: Mapping[str, Any], op: str, connector: str, route: str) -> int:
    change = _hex_lsn(source, "change_lsn", connector, route)
    commit = _hex_lsn(source, "commit_lsn", connector, route)
    if op == "r":
        position = commit if commit is not None else change
        if position is None:
            raise SchemaMismatchError(refusal(connector, route, "a snapshot read with neither commit_lsn nor change_lsn"))
        return position * LSN_STEP
    if change is None:
        raise SchemaMismatchError(refusal(connector, route, f"a change (op {op!r}) without source.change_lsn"))
    serial = (
        _number(source, "event_serial_no", DIGITS["serial"], connector, route) if source.get("event_serial_no") is not None else 0
    )
    return STREAMED + change * LSN_STEP + serial


def _informix(source: Mapping[str, Any], op: str, route: str) -> int:
    name = "commit_lsn" if op == "r" else "change_lsn"
    value = _number(source, name, DIGITS["informix_lsn"], "informix", route)
    return value * LSN_STEP if op == "r" else STREAMED + value * LSN_STEP


def _oracle(source: Mapping[str, Any], op: str, route: str) -> int:
    scn = _number(source, "scn", DIGITS["scn"], "oracle", route)
    if op == "r":
        return scn * ORACLE_STEP
    sequence = source.get("txSeq")
    within = _number(source, "txSeq", DIGITS["within"], "oracle", route) if sequence is not None else None
    if source.get("commit_scn") is None:
        return STREAMED + scn * ORACLE_STEP + (within or 0)
    commit = _number(source, "commit_scn", DIGITS["scn"], "oracle", route)
    if within is None:
        if not 0 <= commit - scn < ORACLE_STEP - 1:
            raise SchemaMismatchError(
                refusal("oracle", route, f"source.scn {scn} is not within 10^17 below its commit_scn {commit}")
            )
        within = ORACLE_STEP - 1 - (commit - scn)
    return STREAMED + commit * ORACLE_STEP + within


def _vitess(transaction: Mapping[str, Any], op: str, route: str) -> int:
    if transaction.get("transaction_rank") is None:
        if op == "r":
            return 0
        raise SchemaMismatchError(refusal("vitess", route, f"the record has no transaction.transaction_rank: {VITESS_FIX}"))
    epoch = _number(transaction, "transaction_epoch", DIGITS["epoch"], "vitess", route)
    rank = _number(transaction, "transaction_rank", DIGITS["rank"], "vitess", route)
    total = _number(transaction, "total_order", DIGITS["total_order"], "vitess", route)
    return STREAMED + epoch * VITESS_EPOCH_STEP + rank * VITESS_RANK_STEP + total


def gtid_commit_ms(order: Any) -> int | None:
    """The commit time (ms) in the order value of a MySQL change streamed with a GTID (``ts_ms*E22 + C``), None for any
    other order value. Two changes of a row at one such commit time that say the same are one change read twice: a
    failover's new primary re-sends the transactions it replicated at its own (other) binlog coordinates, keeping their
    GTIDs and commit times (lakesink.driver.actions.history keeps them as one version)."""
    if order is None:
        return None
    value = int(order)
    return value // MYSQL_TIME_STEP if GTID_BAND <= value < STREAMED else None


def any_gtid_order(orders: pa.Array | pa.ChunkedArray) -> bool:
    """Whether any of ``orders`` (``cdc_order`` values, decimal) is a MySQL GTID change's (:func:`gtid_commit_ms` not
    None): computed by Arrow, so that a batch of other sources' changes costs no conversion to Python."""
    if not len(orders) or not pa.types.is_decimal(orders.type):
        return False
    low, high = pa.scalar(Decimal(GTID_BAND), orders.type), pa.scalar(Decimal(STREAMED), orders.type)
    return bool(pc.any(pc.and_(pc.greater_equal(orders, low), pc.less(orders, high))).as_py())


def as_decimal(value: int | None) -> Decimal | None:
    return None if value is None else Decimal(value)
