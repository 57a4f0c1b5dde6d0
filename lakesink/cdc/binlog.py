"""Binlog coordinates that go back: MySQL without GTIDs and MariaDB (docs/cdc.md, "MySQL without GTIDs, MariaDB:
coordinates that go back").

Their changes are ordered by binlog coordinates ``C = suffix*10^16 + pos*10^6 + row`` (:mod:`lakesink.cdc.positions`).
``RESET MASTER`` (the binlog starts again at ``.000001``), a server restored from a backup or a failover to a server
that numbers its binlog its own way make ``C`` go back, and every later change of a key the table holds would be
older than the held one: dropped as stale, silently. Plain Python, for the driver's order check
(:mod:`lakesink.driver.actions.upsert_order`, option ``cdc-format``), so both entry points:

- **Detection** (per key, against the order value the table holds for it): a change below the held value is a
  redelivery when it is at most ``lakesink.cdc.binlog-redelivery-files`` binlog files back (default 1: Kafka Connect
  re-sends from its last flushed offset, every 60 s by default, and a server rotates its 1 GiB binlog far more
  slowly); further back, the batch fails (:class:`~lakesink.errors.SourceRegressionError`, nothing committed) naming
  the table, the key, both coordinates and the recovery. Per key, because Kafka keeps one key's changes in order
  (one partition) while the tables and partitions of a source are consumed at their own paces.
- **Detection** (per table, against the changes' source times): a break within that reach looks like a redelivery per
  key, but not in time. Each commit records the table's high-water mark ``H`` -- the greatest coordinates any committed
  change carried -- with the driver's wall clock ``W`` when the attempt that raised it was prepared (table property
  ``lakesink.cdc.binlog-high``, :class:`HighWater`). Every change below ``H`` in the same binlog was written before
  ``H``'s change, which was read before ``W``: it was made (``source.ts_ms``: the event's time, at most its write time)
  before ``W``, and so is every redelivered copy of one. A batch whose change made last has coordinates below ``H`` and
  a source time after ``W`` plus the clock-skew allowance (``lakesink.cdc.binlog-clock-skew-seconds``, default 60) was
  made after the binlog went back: the batch fails the same way. ``H`` does not move while the new binlog is below it,
  so the first batch holding a change made more than the allowance after ``W`` fails; changes of a break made within the
  allowance are dropped as stale with a warning, and the recovery's new snapshot brings them back.
- **Recovery**: table property ``lakesink.cdc.binlog-epoch`` ``E`` (the error names the value): every coordinates order
  of the table's later changes becomes ``E*10^22 + C``, above every change committed in a lower epoch; the order file
  keeps the shifted values, so the epoch stays with the table. A change of a lower epoch than a held one (the property
  lowered or removed) fails the same way.

Only values in the coordinates band are looked at (a change ``0 <= v < 10^22``, or ``< 10^28`` with an epoch; a held
value ``< 10^28``): MySQL changes with GTIDs (``ts_ms * 10^22 + C``, ts_ms >= 10^12), LSN/SCN connectors' streamed
changes (>= 10^37) and PostgreSQL's snapshot reads (negative) are never in it; a PostgreSQL streamed LSN is, but never
goes back by 2*10^16; other connectors' snapshot reads (``LSN * 10^12``, ``SCN * 10^17``) are below 10^22 only at
positions no real database has (an SCN below 10^5), and are looked at in the epoch band only on a table given an epoch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from lakesink.cdc import positions
from lakesink.errors import InvalidOptionError, SourceRegressionError
from lakesink.table.keys import (
    PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS,
    PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS_DEFAULT,
    PROPERTY_CDC_BINLOG_EPOCH,
    PROPERTY_CDC_BINLOG_HIGH,
    PROPERTY_CDC_BINLOG_REDELIVERY_FILES,
    PROPERTY_CDC_BINLOG_REDELIVERY_FILES_DEFAULT,
)

EPOCH_STEP = positions.MYSQL_TIME_STEP
"""An epoch's place: above every binlog coordinates value (< 10^22)."""
EPOCH_LIMIT = 10**6
"""Epochs are below it: ``E*10^22 + C < 10^28``, below every GTID change's ``ts_ms*10^22`` (ts_ms >= 10^12)."""
FILE_STEP = positions.MYSQL_FILE_STEP
"""A binlog file's place in coordinates. Binlog files are numbered from ``.000001``: a value below it (file part 0) is
no binlog position but a PostgreSQL LSN (< 10^16: ten petabytes of WAL), whose redeliveries are not reported."""


def _property(properties: Mapping[str, str], name: str, default: int, low: int, high: int, table_name: str) -> int:
    text = properties.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        value = low - 1
    if not low <= value < high:
        raise InvalidOptionError(
            f"table {table_name}: table property {name!r} is {text!r}, expected an integer from {low} to {high - 1} "
            "(docs/cdc.md, 'MySQL without GTIDs, MariaDB: coordinates that go back')"
        )
    return value


def describe(value: int) -> str:
    """Binlog coordinates as a person reads them (``file .000003 pos 4521 row 0``, its epoch when not 0)."""
    epoch, coordinates = divmod(value, EPOCH_STEP)
    suffix, rest = divmod(coordinates, FILE_STEP)
    pos, row = divmod(rest, positions.MYSQL_POS_STEP)
    text = f"file .{suffix:06d} pos {pos} row {row}"
    return f"{text} (epoch {epoch})" if epoch else text


@dataclass(frozen=True)
class Epoch:
    """A table's binlog epoch and redelivery reach (its table properties)."""

    table_name: str
    epoch: int = 0
    redelivery_files: int = PROPERTY_CDC_BINLOG_REDELIVERY_FILES_DEFAULT

    @classmethod
    def of(cls, properties: Mapping[str, str], table_name: str) -> Epoch:
        return cls(
            table_name,
            _property(properties, PROPERTY_CDC_BINLOG_EPOCH, 0, 0, EPOCH_LIMIT, table_name),
            _property(
                properties, PROPERTY_CDC_BINLOG_REDELIVERY_FILES, PROPERTY_CDC_BINLOG_REDELIVERY_FILES_DEFAULT, 0, 10**6,
                table_name,
            ),
        )  # fmt: skip

    def shift(self, orders: Sequence[Decimal | None]) -> list[Decimal | None] | None:
        """The orders with the epoch added to every binlog coordinates value (``0 <= v < 10^22``); None: unchanged."""
        if not self.epoch:
            return None
        step = self.epoch * EPOCH_STEP
        return [v + step if v is not None and 0 <= v < EPOCH_STEP else v for v in orders]

    def _below(self, change: int, held: int) -> bool:
        """Both values binlog coordinates (this table's band) and the change below the held value."""
        band = EPOCH_STEP * (EPOCH_LIMIT if self.epoch else 1)  # what this table's changes can be
        return 0 <= change < band and 0 <= held < EPOCH_STEP * EPOCH_LIMIT and change < held

    def _problem(self, change: int, held: int) -> str | None:
        """Why a change below the held value is no redelivery; None when it is one."""
        (held_epoch, held_at), (epoch, at) = divmod(held, EPOCH_STEP), divmod(change, EPOCH_STEP)
        if held_epoch > epoch:
            return (
                f"the table holds a change of binlog epoch {held_epoch} for the key, and its table property "
                f"{PROPERTY_CDC_BINLOG_EPOCH!r} is {self.epoch}: it was lowered or removed, and every later change of "
                f"a key the table holds would be dropped as stale. Set it back to {held_epoch} or higher"
            )
        back = held_at // FILE_STEP - at // FILE_STEP
        if back <= self.redelivery_files:
            return None
        return (
            f"that is {back} binlog files back, further than a Kafka Connect redelivery goes (table property "
            f"{PROPERTY_CDC_BINLOG_REDELIVERY_FILES!r}: {self.redelivery_files}). The source's binlog went back -- "
            "RESET MASTER, a server restored from a backup, a failover to a server without GTIDs -- and every later "
            "change of a key the table holds would be dropped as stale. Recover: set table property "
            f"{PROPERTY_CDC_BINLOG_EPOCH!r} to {max(self.epoch, held_epoch) + 1} on this table and on every table of "
            "the source (the error names each in turn), then restart: every later change is ordered above everything "
            "committed; have Debezium take a new snapshot (it needs one anyway: its offset names a binlog position "
            "that is gone), so that the tables get the source's rows again. Or enable GTIDs (gtid_mode=ON, MySQL "
            "8.0.1+), whose changes are ordered by their commit time. Not a break but changes the table already has "
            "re-read (a stream started again from older Kafka offsets, a new checkpoint) or a redelivery that truly "
            f"reaches further back: do not raise the epoch (they would overwrite newer rows); raise "
            f"{PROPERTY_CDC_BINLOG_REDELIVERY_FILES!r} until they are read, then set it back"
        )

    def check(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        order: str,
        held: str,
        keys: Sequence[str],
        batch_id: int,
        what: str = "which the table holds for the key",
    ) -> list[Mapping[str, Any]]:
        """``rows``: the changes below the held order of their key (``order``, ``held`` and the key columns; ``what``
        the held order is): raises SourceRegressionError for the first that is not a redelivery; returns the binlog
        changes taken for redeliveries (for :func:`redeliveries_warning`)."""
        redelivered: list[Mapping[str, Any]] = []
        for row in rows:
            change, was = row[order], row[held]
            if change is None or was is None or not self._below(int(change), int(was)):
                continue
            problem = self._problem(int(change), int(was))
            if problem is None:
                if int(change) % EPOCH_STEP >= FILE_STEP:  # a binlog position, not a PostgreSQL LSN (see FILE_STEP)
                    redelivered.append(row)
                continue
            key = ", ".join(f"{k}={row[k]!r}" for k in keys)
            raise SourceRegressionError(
                f"batch {batch_id}: table {self.table_name}: a change of key ({key}) at binlog {describe(int(change))} "
                f"is below binlog {describe(int(was))}, {what}: {problem}. Nothing was "
                "committed (docs/cdc.md, 'MySQL without GTIDs, MariaDB: coordinates that go back')"
            )
        return redelivered

    def redeliveries_warning(
        self,
        rows: Sequence[Mapping[str, Any]],
        *,
        order: str,
        held: str,
        keys: Sequence[str],
        batch_id: int,
        what: str = "the binlog coordinates the table holds for their keys",
    ) -> str:
        """The warning for binlog changes dropped as redeliveries (:meth:`check`'s result, not empty): a break of the
        source's binlog within the redelivery reach looks the same, so it must not pass unseen."""
        first = rows[0]
        key = ", ".join(f"{k}={first[k]!r}" for k in keys)
        return (
            f"lakesink: batch {batch_id}: table {self.table_name}: {len(rows)} change(s) below {what} were taken for "
            "Kafka Connect redeliveries (at most "
            f"{self.redelivery_files} binlog file(s) back, table property {PROPERTY_CDC_BINLOG_REDELIVERY_FILES!r}) "
            f"and dropped as stale; the first: key ({key}) at binlog {describe(int(first[order]))}, below "
            f"{describe(int(first[held]))}. After a connector restart that is expected. If the source's binlog went "
            "back instead (RESET MASTER, a restored server, a failover without GTIDs) these are new changes, lost: "
            f"stop the query, set table property {PROPERTY_CDC_BINLOG_EPOCH!r} to {self.epoch + 1} on every table of "
            "the source, have Debezium take a new snapshot, and restart (docs/cdc.md, 'MySQL without GTIDs, MariaDB: "
            "coordinates that go back')"
        )


def in_band(order: int) -> bool:
    """Binlog coordinates (before an epoch is added): file part at least 1 (binlog files start at ``.000001``; a
    PostgreSQL LSN has file part 0) and below 10^22 (a GTID change's commit time is above)."""
    return FILE_STEP <= order < EPOCH_STEP


@dataclass(frozen=True)
class Seen:
    """What a batch's changes of one table tell the binlog check (the executors' inference finds it, per routing value,
    lakesink.executor.payload.Found): the greatest order of any change, and the source time (``source.ts_ms``) and
    order of the change made last (the greater order between equal times)."""

    highest: Decimal | None = None
    latest: tuple[int, Decimal] | None = None

    def join(self, other: Seen) -> Seen:
        highs = [h for h in (self.highest, other.highest) if h is not None]
        lasts = [t for t in (self.latest, other.latest) if t is not None]
        return Seen(max(highs) if highs else None, max(lasts) if lasts else None)

    def add(self, orders: Sequence[Decimal | None], times_ms: Sequence[int | None]) -> Seen:
        """With ``orders`` and their changes' source times (ms) taken in."""
        known = [o for o in orders if o is not None]
        timed = [(t, o) for o, t in zip(orders, times_ms, strict=True) if o is not None and t is not None]
        return self.join(Seen(max(known) if known else None, max(timed) if timed else None))


@dataclass(frozen=True)
class HighWater:
    """A table's binlog high-water mark (table property :data:`PROPERTY_CDC_BINLOG_HIGH`) and clock-skew allowance: the
    per-table check of a batch's changes against it, and the property its commit sets (the module's description)."""

    table_name: str
    epoch: Epoch
    high: int | None
    at_ms: int | None
    skew_ms: int

    @classmethod
    def of(cls, properties: Mapping[str, str], table_name: str) -> HighWater:
        skew = _property(
            properties, PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS, PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS_DEFAULT, 0, 10**7,
            table_name,
        )  # fmt: skip
        text = properties.get(PROPERTY_CDC_BINLOG_HIGH)
        high = at = None
        if text is not None:
            try:
                coordinates, word, when = text.split()
                if word != "at":
                    raise ValueError(text)
                high, at = int(coordinates), int(when)
            except ValueError:
                raise InvalidOptionError(
                    f"table {table_name}: table property {PROPERTY_CDC_BINLOG_HIGH!r} is {text!r}, expected "
                    "'<binlog coordinates> at <milliseconds>', as lakesink sets it. Remove it (the next batch sets it "
                    "again; until then a binlog that goes back is detected per key only) -- docs/cdc.md, 'MySQL without "
                    "GTIDs, MariaDB: coordinates that go back'"
                ) from None
        return cls(table_name, Epoch.of(properties, table_name), high, at, skew * 1000)

    def _shifted(self, order: Decimal) -> int | None:
        """``order`` as the table compares it (its epoch added), None when it is no binlog coordinates value."""
        value = int(order)
        return value + self.epoch.epoch * EPOCH_STEP if in_band(value) else None

    def check(self, seen: Seen | None, *, batch_id: int, now_ms: int) -> dict[str, str]:
        """The batch's changes of the table (``seen``) against the high-water mark: a SourceRegressionError when the
        change made last is below it and was made after it was raised (plus the allowance); else the table property
        the batch's commit sets (the batch's greatest coordinates and ``now_ms`` when they raise the mark; {})."""
        if seen is None:
            return {}
        if seen.latest is not None and self.high is not None and self.at_ms is not None:
            made_ms, order = seen.latest
            value = self._shifted(order)
            if value is not None and value < self.high and made_ms > self.at_ms + self.skew_ms:
                raise SourceRegressionError(self._went_back(value, made_ms, batch_id))
        highest = self._shifted(seen.highest) if seen.highest is not None else None
        if highest is None or (self.high is not None and highest <= self.high):
            return {}
        return {PROPERTY_CDC_BINLOG_HIGH: f"{highest} at {now_ms}"}

    def _went_back(self, value: int, made_ms: int, batch_id: int) -> str:
        assert self.high is not None and self.at_ms is not None
        held_epoch = self.high // EPOCH_STEP
        return (
            f"batch {batch_id}: table {self.table_name}: its latest change, made at {_utc(made_ms)} (source.ts_ms), is "
            f"at binlog {describe(value)}, below binlog {describe(self.high)}, the greatest coordinates a committed "
            f"batch of the table carried, which was read before {_utc(self.at_ms)} (table property "
            f"{PROPERTY_CDC_BINLOG_HIGH!r}): every change below it was made before then, so this one, made "
            f"{(made_ms - self.at_ms) / 1000:.0f} s later (more than the clock-skew allowance, table property "
            f"{PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS!r}: {self.skew_ms // 1000} s), comes from a binlog that went "
            "back -- RESET MASTER, a server restored from a backup, a failover to a server without GTIDs -- and its "
            "updates and deletes of keys the table holds would be dropped as stale. Nothing was committed. Recover: "
            f"set table property {PROPERTY_CDC_BINLOG_EPOCH!r} to {max(self.epoch.epoch, held_epoch) + 1} on this "
            "table and on every table of the source, have Debezium take a new snapshot (changes of the break dropped "
            "before this batch come back with it), then restart. Or enable GTIDs (gtid_mode=ON, MySQL 8.0.1+). Not a "
            "break but a source clock running ahead of the driver's by more than the allowance: raise "
            f"{PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS!r} (docs/cdc.md, 'MySQL without GTIDs, MariaDB: coordinates that "
            "go back')"
        )


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
