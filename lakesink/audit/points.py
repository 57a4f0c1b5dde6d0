"""Points in a table's history (a snapshot id, a timestamp, a batch) and the table as of one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypedDict

import pyarrow as pa
from dateutil.parser import isoparser
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, LiteralPredicate, Not, Or, SetPredicate
from pyiceberg.expressions.literals import StringLiteral
from pyiceberg.expressions.parser import parse
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.types import TimestamptzType

from lakesink.audit.snapshots import ancestry, lakesink_key, match_query_id, opt_int_property, summary_of
from lakesink.errors import AuditError
from lakesink.table.keys import MAIN_BRANCH, SUMMARY_PREVIOUS_BATCH_ID
from lakesink.table.markers import last_committed_batch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from typing_extensions import Unpack


@dataclass(frozen=True)
class Point:
    """A point in a table's history: a snapshot id, a timestamp, or a batch of a streaming query.

    As text (command line, reader options): ``snapshot=<id>``, ``time=<ISO 8601 or epoch ms>``,
    ``batch=<batch id>`` (the table's only query) or ``batch=<query id>:<batch id>``.
    """

    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    batch_id: int | None = None
    query_id: str | None = None

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.snapshot_id, self.timestamp_ms, self.batch_id))
        if given != 1:
            raise AuditError("a point in a table's history is exactly one of a snapshot id, a timestamp or a batch id")
        if self.query_id is not None and self.batch_id is None:
            raise AuditError("a query id names a point only together with a batch id")

    @classmethod
    def parse(cls, text: str) -> Point:
        kind, sep, value = text.strip().partition("=")
        kind = kind.strip().lower()
        try:
            if sep and kind == "snapshot":
                return cls(snapshot_id=int(value))
            if sep and kind in ("time", "timestamp"):
                try:
                    return cls(timestamp_ms=parse_timestamp_ms(value))
                except ValueError as e:
                    raise AuditError(f"{text!r} is not a point in a table's history: {e}") from None
            if sep and kind == "batch":
                query, colon, batch = value.strip().rpartition(":")
                return cls(batch_id=int(batch), query_id=query if colon else None)
        except ValueError:
            pass
        raise AuditError(
            f"{text!r} is not a point in a table's history; use snapshot=<id>, time=<ISO 8601 time or epoch "
            "milliseconds>, batch=<batch id> or batch=<query id>:<batch id>"
        )

    def __str__(self) -> str:
        if self.snapshot_id is not None:
            return f"snapshot {self.snapshot_id}"
        if self.timestamp_ms is not None:
            return f"time {format_ms(self.timestamp_ms)}"
        return f"batch {self.batch_id}" + (f" of query {self.query_id}" if self.query_id else "")


def parse_timestamp_ms(value: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time, extended (``2026-11-23T14:00:00Z``) or basic (``20261123T1400Z``), read
    by python-dateutil's ``isoparser`` with ``T`` or a space between date and time (UTC when it has no offset).

    What could be read two ways is refused (ValueError saying both readings): a number that ISO 8601 also reads as a
    date (``2026``, ``2026327``, ``20261123``), and a number of 9 to 11 digits, which is a time of 1973-5138 in epoch
    *seconds* but of 1970-1973 in epoch milliseconds (``1763906400``)."""
    text = value.strip()
    iso = _isoparse(text)
    digits = text[1:] if text[:1] in "+-" else text
    if digits.isdigit():
        as_ms = format_ms(int(text)) if _MIN_MS <= int(text) <= _MAX_MS else "out of range"
        if iso is not None:
            raise ValueError(
                f"{value!r} is ambiguous: ISO 8601 reads it as {_iso_text(iso)}, epoch milliseconds as {as_ms}; write the "
                f"date with its separators ({iso.strftime('%Y-%m-%d')}) or the time as epoch milliseconds "
                f"({_utc_ms(iso)})"
            )
        if len(digits) in _SECONDS_OR_MS_DIGITS:
            as_s = format_ms(int(text) * 1000) if _MIN_MS <= int(text) * 1000 <= _MAX_MS else "out of range"
            raise ValueError(
                f"{value!r} is ambiguous: epoch milliseconds read it as {as_ms}, epoch seconds as {as_s}; lakesink reads "
                f"epoch milliseconds: write {int(text) * 1000} for the second, or an ISO 8601 time"
            )
        return int(text)
    if iso is None:
        raise ValueError(
            f"{value!r} is not a time: give ISO 8601 (2026-11-23T14:00:00Z, 20261123T1400Z; UTC without an offset) or "
            "epoch milliseconds"
        )
    return _utc_ms(iso)


def _utc_ms(parsed: datetime) -> int:
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp() * 1000)


#: Numbers of these many digits are epoch seconds of 1973-5138 as much as epoch milliseconds of 1970-1973: refused.
_SECONDS_OR_MS_DIGITS = range(9, 12)
_MIN_MS = int(datetime(1, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
_MAX_MS = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp() * 1000)


#: ISO 8601 separates a date from its time with ``T`` (RFC 3339 also with a space). dateutil's ``isoparse`` takes any
#: character there, digits too: it read the epoch milliseconds 1796012530438 as 1796-01-25, separator ``3``, 04:38.
_ISO_PARSERS = (isoparser(sep="T"), isoparser(sep=" "))


def _isoparse(text: str) -> datetime | None:
    for parser in _ISO_PARSERS:
        try:
            parsed: datetime = parser.isoparse(text)
        except (ValueError, OverflowError):
            continue
        return parsed
    return None


def _iso_text(parsed: datetime) -> str:
    return parsed.isoformat() + ("" if parsed.tzinfo else " (UTC)")


def format_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def query_ids(table: Table, branch: str = MAIN_BRANCH) -> list[str]:
    """The streaming queries that committed to ``branch``, in order of their first batch."""
    seen: dict[str, None] = {}
    for s in ancestry(table, branch):
        key = lakesink_key(s)
        if key is not None:
            seen.setdefault(key[0], None)
    return list(seen)


def the_query(table: Table, query_id: str | None, branch: str = MAIN_BRANCH) -> str:
    """``query_id`` (or the one query of the branch whose id starts with it), or the table's only query when it is
    None."""
    queries = query_ids(table, branch)
    if query_id is not None:
        return match_query_id(query_id, queries) or query_id
    if len(queries) == 1:
        return queries[0]
    if not queries:
        raise AuditError(f"branch {branch!r} of the table has no batch written by lakesink")
    raise AuditError(
        f"the table has batches of {len(queries)} queries, give the query id (batch=<query id>:<batch id>): {', '.join(queries)}"
    )


def resolve(table: Table, point: Point, *, branch: str = MAIN_BRANCH) -> Snapshot:
    """The snapshot that holds the table's state at ``point`` (in the history of ``branch``).

    - a snapshot id: that snapshot (any branch);
    - a timestamp: the branch's last snapshot committed at or before it;
    - a batch: the snapshot that committed it; for an *empty* batch (recorded, no snapshot of its own), the
      table as the query left it: the parent of the query's next snapshot, or the branch head.
    """
    if point.snapshot_id is not None:
        snapshot = table.metadata.snapshot_by_id(point.snapshot_id)
        if snapshot is None:
            raise AuditError(f"snapshot {point.snapshot_id} is not in the table's metadata (never existed, or expired)")
        return snapshot
    snapshots = ancestry(table, branch)
    if not snapshots:
        raise AuditError(f"branch {branch!r} has no snapshot")
    if point.timestamp_ms is not None:
        before = [s for s in snapshots if s.timestamp_ms <= point.timestamp_ms]
        if not before:
            raise AuditError(
                f"the table has no snapshot on {branch!r} at or before {format_ms(point.timestamp_ms)} "
                f"(its first is from {format_ms(snapshots[0].timestamp_ms)})"
            )
        return before[-1]
    assert point.batch_id is not None
    query_id = the_query(table, point.query_id, branch)
    mine = [(i, s, key[1]) for i, s in enumerate(snapshots) if (key := lakesink_key(s)) is not None and key[0] == query_id]
    for _, s, batch in mine:
        if batch == point.batch_id:
            return s
    expired = AuditError(
        f"batch {point.batch_id} of query {query_id} is older than the oldest snapshot kept in the history of "
        f"branch {branch!r} (snapshot {snapshots[0].snapshot_id}): the snapshots it could be read at were expired"
    )
    if _accounted_empty(table, query_id, point.batch_id, [s for _, s, _ in mine], branch):
        later = [i for i, _, batch in mine if batch > point.batch_id]
        if later and later[0] == 0:
            raise expired
        return snapshots[later[0] - 1] if later else snapshots[-1]
    start = snapshots[0]
    if start.parent_snapshot_id is None and (start.sequence_number or 0) > 1 and mine and point.batch_id < mine[0][2]:
        raise expired
    raise AuditError(f"batch {point.batch_id} of query {query_id} is not in the history of branch {branch!r}")


def _accounted_empty(table: Table, query_id: str, batch_id: int, mine: Sequence[Snapshot], branch: str) -> bool:
    """Whether ``batch_id`` was processed as an empty batch (a later batch or the marker records it).

    The first later batch of the query records the previous batch it processed: ids after the query's batch
    before it, up to that previous one, were empty. When that later batch is the first one kept and the history
    before it was expired, only the previous batch itself can be read (as the query left the table before its
    next batch); earlier ids may have had snapshots of their own, now expired.
    """
    for i, s in enumerate(mine):
        key = lakesink_key(s)
        if key is None or key[1] <= batch_id:
            continue
        previous = opt_int_property(summary_of(s), SUMMARY_PREVIOUS_BATCH_ID)
        if previous is None or previous < batch_id:
            return False
        if i > 0:
            before = lakesink_key(mine[i - 1])
            return before is not None and batch_id > before[1]
        start = ancestry(table, branch)[0]
        start_expired = start.parent_snapshot_id is None and (start.sequence_number or 0) > 1
        return batch_id == previous or not start_expired
    marker = last_committed_batch(table.properties, query_id)
    earlier = [k[1] for s in mine if (k := lakesink_key(s)) is not None and k[1] < batch_id]
    return marker is not None and marker.branch == branch and marker.batch_id >= batch_id and bool(earlier or marker.empty)


_NO_OFFSET = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?")


def utc_by_default(row_filter: str | BooleanExpression, schema: Schema) -> BooleanExpression:
    """The row filter, with a time compared to a ``timestamptz`` column read as UTC when it has no zone offset
    (``ts >= '2026-11-23T00:00:00'``, as ``time=`` points read it; pyiceberg refuses it: "Missing zone offset")."""
    expr = parse(row_filter) if isinstance(row_filter, str) else row_filter

    def zoned(term: Any, value: Any) -> Any:
        if not (isinstance(value, StringLiteral) and _NO_OFFSET.fullmatch(value.value)):
            return value
        try:
            field = schema.find_field(term.name, case_sensitive=False)
        except (ValueError, AttributeError):
            return value  # binding reports the unknown column
        if not isinstance(field.field_type, TimestamptzType):
            return value
        return StringLiteral(datetime.fromisoformat(value.value).replace(tzinfo=timezone.utc).isoformat())

    def visit(e: BooleanExpression) -> BooleanExpression:
        if isinstance(e, (And, Or)):
            return type(e)(visit(e.left), visit(e.right))
        if isinstance(e, Not):
            return Not(visit(e.child))
        if isinstance(e, LiteralPredicate):
            return type(e)(e.term, zoned(e.term, e.literal))
        if isinstance(e, SetPredicate):
            return type(e)(e.term, {zoned(e.term, v) for v in e.literals})
        return e

    return visit(expr)


class ScanOptions(TypedDict, total=False):
    """The keyword arguments :func:`read_at` and :func:`dataframe_at` pass on to :func:`scan_at` (its defaults)."""

    branch: str
    columns: Sequence[str] | None
    row_filter: str | BooleanExpression | None
    limit: int | None


def scan_at(
    table: Table,
    point: Point | None = None,
    *,
    branch: str = MAIN_BRANCH,
    columns: Sequence[str] | None = None,
    row_filter: str | BooleanExpression | None = None,
    limit: int | None = None,
) -> Any:
    """pyiceberg's scan of the table at ``point`` (the branch head when None); ``limit``: at most that many rows
    (the scan stops reading files once it has them)."""
    snapshot = resolve(table, point, branch=branch) if point is not None else table.metadata.snapshot_by_name(branch)
    if snapshot is None:
        raise AuditError(f"branch {branch!r} has no snapshot")
    return table.scan(
        snapshot_id=snapshot.snapshot_id,
        selected_fields=tuple(columns) if columns else ("*",),
        row_filter=utc_by_default(row_filter, table.schema()) if row_filter is not None else AlwaysTrue(),
        limit=limit,
    )


def read_at(table: Table, point: Point | None = None, **options: Unpack[ScanOptions]) -> pa.Table:
    """The table's rows at ``point`` as Arrow (columns, an Iceberg row filter such as ``"id > 5"`` and a limit on the
    rows read optional: :class:`ScanOptions`, as :func:`scan_at` takes them)."""
    return scan_at(table, point, **options).to_arrow()


def dataframe_at(spark: SparkSession, table: Table, point: Point | None = None, **options: Unpack[ScanOptions]) -> DataFrame:
    """:func:`read_at` as a Spark DataFrame (for large tables prefer ``spark.read.format("lakesink")``)."""
    return spark.createDataFrame(read_at(table, point, **options))
