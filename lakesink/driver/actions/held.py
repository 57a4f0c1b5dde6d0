"""Driver side, option cdc-transactions=hold: the changes a batch held back, recorded in the batch's own commit.

A batch releases the source transactions it holds whole (lakesink.cdc.transactions) and holds back the rest: the
Kafka records themselves (the stream's columns, as they came), written as one Parquet file next to the metadata of
the first table of the batch's unit, and named in a table property of every table of the unit
(:data:`~lakesink.table.keys.PROPERTY_CDC_HELD_PREFIX` ``<query id>[.<sink id>]``), set in the same atomic commit as
the batch's rows: what the committed snapshots leave out is exactly what the property names, whatever crashes when.
The next batch reads the records back first (:func:`starting_state`, :func:`read_rows`). The property also keeps the
state the batch started from (``previous``): a replay of the batch (Spark replays a batch whose commit landed before
its commit log) starts from that, decides the same, and is found committed.

Not here: which records are held (lakesink.sink.cdc.transactions, with Spark), the unit (lakesink.driver.committers.routed).
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakesink.cdc.transactions import Memory
from lakesink.errors import CommitOutcomeUnknownError, LakesinkError
from lakesink.table import state_files, storage
from lakesink.table.keys import (
    PROPERTY_CDC_HELD_PREFIX,
    SUMMARY_CDC_COMMITTED_MS,
    SUMMARY_CDC_HELD_CHANGES,
    SUMMARY_CDC_HELD_FILE,
    SUMMARY_CDC_HELD_OLDEST_MS,
    SUMMARY_CDC_REDELIVERED,
    SUMMARY_CDC_RELEASED_INCOMPLETE,
)

log = logging.getLogger("lakesink")

HELD_FILE_PREFIX = "lakesink-held-"
RELEASED_METADATA = b"lakesink.cdc.released"
"""Key of the held file's Parquet metadata: the ids of the last transactions released whole (JSON), whose redelivered
records the next batch drops (lakesink.cdc.transactions.Memory)."""


def property_key(query_id: str, sink_id: str | None = None) -> str:
    """The table property holding one sink's held-back changes."""
    return f"{PROPERTY_CDC_HELD_PREFIX}{query_id}" + (f".{sink_id}" if sink_id else "")


@dataclass(frozen=True)
class HeldState:
    """What a committed batch held back, as its unit's tables record it."""

    batch_id: int
    file: str | None
    """The Parquet file of the held records (None: nothing held)."""
    changes: int = 0
    oldest_ms: int | None = None
    committed_ms: int | None = None
    waiting_for: str | None = None
    previous: HeldState | None = None
    """The state the batch started from (a replay of it starts from there)."""
    since: Mapping[str, int] | None = None
    """Per held transaction that may never be whole: when a batch first held it (lakesink.cdc.transactions.Memory)."""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "batch": self.batch_id,
            "file": self.file,
            "changes": self.changes,
            "oldest-ms": self.oldest_ms,
            "committed-ms": self.committed_ms,
            "waiting-for": self.waiting_for,
        }
        if self.since:
            out["since"] = dict(self.since)
        if self.previous is not None:
            out["previous"] = self.previous.as_dict()
        return out

    def to_property(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> HeldState:
        def num(v: object) -> int | None:
            return int(v) if isinstance(v, int) else None

        file, waiting, previous, since = d.get("file"), d.get("waiting-for"), d.get("previous"), d.get("since")
        return cls(
            batch_id=int(str(d["batch"])),
            file=file if isinstance(file, str) else None,
            changes=num(d.get("changes")) or 0,
            oldest_ms=num(d.get("oldest-ms")),
            committed_ms=num(d.get("committed-ms")),
            waiting_for=waiting if isinstance(waiting, str) else None,
            previous=cls.from_dict(previous) if isinstance(previous, Mapping) else None,
            since={str(k): v for k, v in since.items() if isinstance(v, int)} if isinstance(since, Mapping) else None,
        )

    @classmethod
    def from_property(cls, text: str, *, table: str) -> HeldState:
        try:
            return cls.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as e:
            raise LakesinkError(
                f"table {table}: its property {PROPERTY_CDC_HELD_PREFIX}... (the changes a batch held back, option "
                f"cdc-transactions) is not what lakesink writes ({e}): {text[:200]!r}. Restore it from the table's "
                "metadata log; removing it would lose the held changes"
            ) from None

    def files(self) -> list[str]:
        """The held files this record names (its own and the previous batch's): the orphan clean-up keeps them."""
        own = [self.file] if self.file else []
        return own + (self.previous.files() if self.previous is not None else [])


@dataclass(frozen=True)
class HeldBack:
    """What this batch holds back, to be recorded in its unit (lakesink.driver.committers.routed)."""

    rows: pa.Table
    """The held records: the stream's columns, as they came."""
    changes: int
    oldest_ms: int | None
    committed_ms: int | None
    waiting_for: str | None
    previous: HeldState | None
    """The state the batch started from."""
    memory: Memory = field(default_factory=Memory)
    """What the batches up to this one released, and since when the held transactions that may never be whole wait."""
    redelivered: int = 0
    """Change records the batch dropped: of transactions an earlier batch released."""
    incomplete: tuple[str, ...] = ()
    """Transactions the batch released as they stood, after waiting (option cdc-transaction-wait)."""

    def state(self, batch_id: int, file: str | None) -> HeldState:
        previous = None if self.previous is None else HeldState(**{**self.previous.__dict__, "previous": None})
        since = dict(self.memory.since) or None
        return HeldState(batch_id, file, self.changes, self.oldest_ms, self.committed, self.waiting_for, previous, since)

    @property
    def needs_file(self) -> bool:
        """Whether the batch writes a held file: records held back, or transactions released to remember."""
        return bool(self.rows.num_rows or self.memory.released)

    @property
    def committed(self) -> int | None:
        """The last released transaction's commit time: this batch's, else the one the state it started from had."""
        if self.committed_ms is not None:
            return self.committed_ms
        return self.previous.committed_ms if self.previous is not None else None

    def summary(self, file: str | None) -> dict[str, str]:
        """What every table's snapshot of the batch records about it (the metrics to alert on)."""
        out = {SUMMARY_CDC_HELD_CHANGES: str(self.changes), SUMMARY_CDC_HELD_FILE: file or ""}
        if self.oldest_ms is not None:
            out[SUMMARY_CDC_HELD_OLDEST_MS] = str(self.oldest_ms)
        if self.committed is not None:
            out[SUMMARY_CDC_COMMITTED_MS] = str(self.committed)
        if self.redelivered:
            out[SUMMARY_CDC_REDELIVERED] = str(self.redelivered)
        if self.incomplete:
            out[SUMMARY_CDC_RELEASED_INCOMPLETE] = str(len(self.incomplete))
        return out


def recorded(tables: Mapping[str, Table], query_id: str, sink_id: str | None) -> HeldState | None:
    """The latest batch's record among ``tables`` (the one of the greatest batch id), None when none has one."""
    key = property_key(query_id, sink_id)
    found = [HeldState.from_property(t.properties[key], table=name) for name, t in tables.items() if key in t.properties]
    return max(found, key=lambda s: s.batch_id, default=None)


def starting_state(latest: HeldState | None, batch_id: int, *, query_id: str) -> HeldState | None:
    """The state batch ``batch_id`` starts from: the latest batch's before it, or, when the latest is this batch (a
    replay of a batch whose commit landed), the one it started from."""
    if latest is None or latest.batch_id < batch_id:
        return latest
    if latest.batch_id == batch_id:
        return latest.previous
    raise LakesinkError(
        f"query {query_id}: batch {batch_id} runs, but its tables record the held-back changes of batch {latest.batch_id} "
        "(option cdc-transactions): the query's checkpoint is older than its tables (restored, or another query with "
        "the same id). Nothing was committed; restore the checkpoint that goes with the tables"
    )


def read_rows(io: FileIO, state: HeldState | None) -> pa.Table | None:
    """The records ``state`` held back (None: none)."""
    return read(io, state)[0]


def read(io: FileIO | None, state: HeldState | None, tables: Sequence[Table] = ()) -> tuple[pa.Table | None, Memory]:
    """The records ``state`` held back (None: none) and what the batches up to it released (its file's metadata, and
    its ``since``). A held file that is gone is read from its copy in a state file of ``tables`` (the tables that
    record the state: lakesink.table.state_files)."""
    since = dict(state.since or {}) if state is not None else {}
    if state is None or not state.file or io is None:
        return None, Memory(since=since)
    rows = _read_held(io, state, tables)
    text = (rows.schema.metadata or {}).get(RELEASED_METADATA)
    released = tuple(str(i) for i in json.loads(text)) if text else ()
    return rows.replace_schema_metadata(None), Memory(released=released, since=since)


def _read_held(io: FileIO, state: HeldState, tables: Sequence[Table]) -> pa.Table:
    assert state.file is not None
    try:
        return state_files.read_parquet(io, tables, state.file)
    except FileNotFoundError:
        raise LakesinkError(
            f"the file of the changes batch {state.batch_id} held back (option cdc-transactions), {state.file}, is "
            "missing, and no state file (a Puffin file the metadata of the tables recording it lists, "
            "lakesink-*-99996.puffin) holds a copy of it: the next batch would lose them. Nothing was committed. Restore "
            "the file from a backup of the table's metadata folder, or roll the tables back to the snapshots whose state "
            "files hold it (docs/cdc.md)"
        ) from None


def write_rows(table: Table, *, query_id: str, batch_id: int, rows: pa.Table, released: tuple[str, ...] = ()) -> str:
    """The held records (and the ids of the transactions released, in the file's metadata) written next to
    ``table``'s metadata, under a new name (an attempt's file never replaces another's); the path."""
    name = f"{HELD_FILE_PREFIX}{query_id}-{batch_id}-{uuid.uuid4().hex}.parquet"
    path = posixpath.join(posixpath.dirname(table.metadata_location), name)
    if released:
        rows = rows.replace_schema_metadata({**(rows.schema.metadata or {}), RELEASED_METADATA: json.dumps(list(released))})
    state_files.write_parquet(table.io, path, rows)
    return path


def held_files(properties: Mapping[str, str]) -> Iterable[str]:
    """The held files a table's properties name (the orphan clean-up keeps them); unreadable records name none."""
    for key, value in properties.items():
        if key.startswith(PROPERTY_CDC_HELD_PREFIX):
            try:
                yield from HeldState.from_dict(json.loads(value)).files()
            except (ValueError, KeyError, TypeError):
                continue


class Attempt:
    """One commit call's held file: written next to the metadata of the unit's first table (once), named by the
    property every table of the unit sets, and deleted when the call's commit did not land -- settled by reading that
    table (a failure after the swap keeps the file the landed commit names). ``back`` None: nothing to record."""

    def __init__(self, back: HeldBack | None, *, query_id: str, batch_id: int, sink_id: str | None):
        self.back, self.query_id, self.batch_id, self.sink_id = back, query_id, batch_id, sink_id
        self.path: str | None = None
        self.properties: dict[str, str] = {}
        self._first: tuple[Callable[[], Table], FileIO, str] | None = None

    def record(self, table: Table, reload: Callable[[], Table], name: str) -> dict[str, str]:
        """The table properties of the unit's tables (the held file written with the first); ``reload`` reads
        ``table`` fresh when the attempt is settled."""
        if self.back is None or self._first is not None:
            return self.properties
        if self.back.needs_file:
            self.path = write_rows(
                table, query_id=self.query_id, batch_id=self.batch_id, rows=self.back.rows, released=self.back.memory.released
            )
        self._first = (reload, table.io, name)
        state = self.back.state(self.batch_id, self.path)
        self.properties = {property_key(self.query_id, self.sink_id): state.to_property()}
        return self.properties

    def summary(self) -> dict[str, str]:
        return self.back.summary(self.path) if self.back is not None else {}

    @contextmanager
    def settling(self) -> Iterator[None]:
        """The unit's commit: when it raised, the held file is deleted unless the table names it (an unknown outcome
        keeps it: a catalog may still apply the commit)."""
        try:
            yield
        except CommitOutcomeUnknownError:
            raise
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        """The held file deleted unless the table it was written for names it."""
        if self.path is None or self._first is None:
            return
        reload, io, name = self._first
        try:
            named = set(held_files(reload().properties))
        except Exception:
            log.warning("lakesink: cannot read table %s to settle held file %s; kept (orphan clean-up)", name, self.path)
            return
        if self.path in named:
            return
        try:
            storage.delete_file(io, self.path)
        except Exception:
            log.warning("lakesink: could not delete held file %s of a commit that did not land (orphan clean-up)", self.path)
