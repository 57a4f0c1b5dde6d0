"""The typed values of the options (enums, a table's name, routing, metrics) and the parsers of one value each:
each names the option and its valid values in its error."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TypeVar

from lakesink.errors import InvalidOptionError
from lakesink.options.keys import (
    ATOMIC,
    BRANCH,
    CATALOG,
    CDC_TRANSACTION_WAIT,
    CDC_TRANSACTIONS,
    CDC_UNAVAILABLE_VALUE,
    CDC_UNAVAILABLE_VALUE_DEFAULT,
    DEFAULT_FORMAT_VERSION,
    FORMAT_VERSIONS,
    HISTORY,
    MAINTENANCE,
    METRICS,
    SINK_ID,
    TABLE,
    UPSERT_KEY,
    WRITER,
)
from lakesink.table import partitioning
from lakesink.table.keys import FORMAT_VERSION, HISTORY_SUFFIX
from lakesink.table.partitioning import PartitionTerm
from lakesink.table.routes import TableIdentifier

__all__ = [
    "Atomic",
    "CdcTransactions",
    "Maintenance",
    "MetricsExport",
    "OutputMode",
    "Routing",
    "TableName",
    "UnavailableValue",
    "WriterKind",
]

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


class CdcTransactions(enum.Enum):
    """Option ``cdc-transactions`` (with ``cdc-format``): what the sink does with Debezium's transaction metadata
    (docs/cdc.md, "A source transaction split across micro-batches")."""

    OFF = "off"
    """No transaction metadata is read: a transaction-metadata record in the stream fails the batch."""
    HOLD = "hold"
    """Each batch releases, in commit order, the longest prefix of the source transactions it holds whole, and holds
    back every change after the first incomplete one, in its own commit, for the next batch."""

    @classmethod
    def parse(cls, value: str) -> CdcTransactions:
        return _parse_choice(cls, CDC_TRANSACTIONS, value)


@dataclass(frozen=True)
class UnavailableValue:
    """Option ``cdc-unavailable-value``: the connector's ``unavailable.value.placeholder`` as given, and its bytes
    (``hex:<octets>`` as Debezium reads it, else the text's UTF-8 bytes; lakesink.cdc.unavailable)."""

    given: str = CDC_UNAVAILABLE_VALUE_DEFAULT
    raw: bytes = CDC_UNAVAILABLE_VALUE_DEFAULT.encode()

    @classmethod
    def parse(cls, value: str) -> UnavailableValue:
        if value.startswith("hex:"):
            try:
                raw = bytes.fromhex(value[4:])
            except ValueError:
                raw = b""
            if not raw:
                raise InvalidOptionError(
                    f"option '{CDC_UNAVAILABLE_VALUE}' is {value!r}: after 'hex:' Debezium reads hexadecimal octets "
                    "(e.g. 'hex:DEADBEEF'); give the connector's unavailable.value.placeholder as it is configured"
                )
            return cls(value, raw)
        if not value:
            raise InvalidOptionError(
                f"option '{CDC_UNAVAILABLE_VALUE}' is empty; give the connector's unavailable.value.placeholder "
                f"(Debezium's default: {CDC_UNAVAILABLE_VALUE_DEFAULT!r})"
            )
        return cls(value, value.encode())

    def __str__(self) -> str:
        return self.given


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
class TableName(TableIdentifier):
    """A table identifier: a namespace of one or more levels and a table name."""

    @classmethod
    def parse(cls, value: str) -> TableName:
        parts = tuple(p.strip() for p in value.split("."))
        if len(parts) < 2 or any(not p for p in parts):
            raise InvalidOptionError(f"option '{TABLE}' must be '<namespace>.<table>' (for example 'db.events'), got {value!r}")
        return cls(namespace=parts[:-1], name=parts[-1])


@dataclass(frozen=True)
class HistoryTables:
    """Option ``history``: each table the sink upserts gets a history table (SCD type 2, docs/history.md) -- ``on``:
    ``<namespace>.<table>__history`` beside it; or a pattern with ``{table}`` (and ``{namespace}``), for example
    ``audit.{table}_versions`` or ``{namespace}.{table}_scd``; ``off`` (the default): none."""

    pattern: str

    def __str__(self) -> str:
        return self.pattern

    @classmethod
    def parse(cls, value: str) -> HistoryTables | None:
        text = value.strip()
        if text.lower() in ("", "off", "false"):
            return None
        if text.lower() in ("on", "true"):
            return cls("{namespace}.{table}" + HISTORY_SUFFIX)
        bad = text.replace("{namespace}", "").replace("{table}", "")
        if "{table}" not in text or "{" in bad or "}" in bad:
            raise InvalidOptionError(
                f"option '{HISTORY}' must be 'on', 'off' or a table name pattern holding '{{table}}' (and optionally "
                f"'{{namespace}}'), for example 'audit.{{table}}_versions'; got {value!r}"
            )
        return cls(text if "." in text.replace("{namespace}", "") else "{namespace}." + text)

    def of(self, table: TableIdentifier) -> TableName:
        """The history table of ``table``."""
        name = self.pattern.replace("{namespace}", ".".join(table.namespace)).replace("{table}", table.name)
        try:
            found = TableName.parse(name)
        except InvalidOptionError:
            raise InvalidOptionError(
                f"option '{HISTORY}' ({self.pattern}) gives table {'.'.join((*table.namespace, table.name))} the history "
                f"table {name!r}, which is not '<namespace>.<table>'"
            ) from None
        if found == TableName(namespace=tuple(table.namespace), name=table.name):
            raise InvalidOptionError(f"option '{HISTORY}' ({self.pattern}) names the table itself as its history table")
        return found

    def is_history_name(self, table: TableIdentifier) -> bool:
        """Whether ``table`` is named as the pattern names a history table (a routed sink refuses to mirror into it:
        a source table ``orders__history`` beside ``orders`` would be both a mirror and ``orders``' history)."""
        parts = re.split(r"(\{namespace\}|\{table\})", self.pattern)
        wanted = "".join("(.+)" if p == "{namespace}" else "([^.]+)" if p == "{table}" else re.escape(p) for p in parts)
        return re.fullmatch(wanted, ".".join((*table.namespace, table.name))) is not None


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


def _parse_cdc_transaction_wait(value: str) -> float:
    """Option cdc-transaction-wait: seconds, a number >= 0."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise InvalidOptionError(
            f"option '{CDC_TRANSACTION_WAIT}' is the seconds a held transaction that cannot become whole waits before it "
            f"is released as it stands: a number >= 0 (default 600), got {value!r}"
        )
    return seconds


def _parse_catalog(value: str) -> str:
    if not value.strip():
        raise InvalidOptionError(f"option '{CATALOG}' must not be empty")
    return value.strip()


def _parse_partitioned_by(value: str) -> tuple[PartitionTerm, ...]:
    return partitioning.parse(value) if value.strip() else ()


def _terms_text(terms: tuple[PartitionTerm, ...]) -> str:
    return ", ".join(map(str, terms))
