"""The options of ``spark.read.format("lakesink")``, parsed once into a frozen :class:`ReadOptions`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lakesink.errors import InvalidOptionError, did_you_mean
from lakesink.options.keys import (
    _SPARK_OWN_OPTIONS,
    BRANCH,
    CATALOG,
    CATALOG_PROPERTY_PREFIX,
    TABLE,
)
from lakesink.options.values import (
    TableName,
    _parse_bool,
    _parse_branch,
)
from lakesink.redaction import redact_properties
from lakesink.table.keys import MAIN_BRANCH

__all__ = ["AS_OF_BATCH", "AS_OF_TIMESTAMP", "COLUMNS", "PUSHDOWN", "READ_VALID_OPTIONS", "SNAPSHOT_ID", "ReadOptions"]

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
            named = ", ".join(f"{k!r}{did_you_mean(k, READ_VALID_OPTIONS)}" for k in unknown)
            raise InvalidOptionError(f"unknown read option(s) {named}; valid options: {', '.join(READ_VALID_OPTIONS)}")
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
