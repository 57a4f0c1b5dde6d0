"""Driver side, option history: a table's history table (SCD type 2), one more member of the batch's unit.

The batch's changes -- every change, not only the one per key its upsert applies -- come to the commit as one Arrow
table (lakesink.sink.history: the table's columns, the delete flag, the change's order value and its source time). Each
commit attempt, against the history table the attempt read:

1. reads the versions the history holds for the batch's keys: the files whose key bounds may hold one of them and
   that hold a key's latest version (``valid_to`` null: a file without one is skipped by its null count); when a change
   of the batch is not newer than its key's latest version (a late change, or a redelivered one), every version of that
   key (every file whose bounds may hold it);
2. links each key's versions in order (:func:`link`): a version ends where the next begins (``valid_to``), the latest
   one is current unless it is a delete, the operation says whether it inserts, updates or deletes the key. A change
   whose key and order value the history holds already is a redelivery: not added again. A late change takes its
   place among the versions by its order value (the versions around it are re-linked); the table's upsert never
   applies it (a newer change is there), so the current version stays the newest. A delete's version holds what its
   change carries (the key, and whatever values the delete row has: Debezium's ``before`` image is the whole row under
   PostgreSQL's ``REPLICA IDENTITY FULL``, the key alone by default); the values that were deleted are the version it
   ends, always the one before it;
3. commits, as one row delta in the batch's unit with the table's own commit: the new versions, and the stored
   versions whose links changed rewritten (a position delete of the stored row, its new row appended). The snapshot
   carries the batch's replay marker like every member of the unit: a replayed batch is found there and not committed
   again, and the mirror and its history never disagree, not even for one snapshot.

History tables are format 2 (their rewritten versions are position deletes); lakesink creates them so.
"""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import row_delta as seam_row_delta
from lakesink.cdc import binlog, unavailable
from lakesink.cdc.positions import any_gtid_order, gtid_commit_ms
from lakesink.driver.actions import upsert, upsert_order
from lakesink.driver.actions.batch import AppendBatch, Batch, BatchAction, SinkContext
from lakesink.driver.actions.row_delta import delete_target
from lakesink.errors import InvalidOptionError, LakesinkError, UpsertKeyError
from lakesink.executor.messages import TaskIds
from lakesink.executor.position_deletes import PositionDeleteWriter
from lakesink.options import HISTORY, HISTORY_TIME, ORDER_BY, UPSERT_KEY, SinkOptions
from lakesink.options.keys import CDC_ORDER_BY
from lakesink.table.keys import (
    DELETED,
    HELD_COLUMN,
    HISTORY_CHANGE_ORDER,
    HISTORY_COLUMNS,
    HISTORY_DELETE,
    HISTORY_INSERT,
    HISTORY_IS_CURRENT,
    HISTORY_OPERATION,
    HISTORY_UPDATE,
    HISTORY_VALID_FROM,
    HISTORY_VALID_TO,
    MERGE_ON_READ,
    PROPERTY_CDC_BINLOG_EPOCH,
    PROPERTY_HISTORY_COMPLETE,
    PROPERTY_HISTORY_KEY,
    PROPERTY_HISTORY_TABLE_UUID,
    SUMMARY_HISTORY_ADDED,
    SUMMARY_HISTORY_CHANGED,
    SUMMARY_HISTORY_OF,
    SUMMARY_HISTORY_REDELIVERED,
    SUMMARY_HISTORY_SEEDED,
    SUMMARY_UPSERT_MODE,
)
from lakesink.table.keys import (
    ORDER_COLUMN as ORDER,
)
from lakesink.table.keys import UNAVAILABLE_COLUMN as UNAVAILABLE
from lakesink.table.numbering import row_numbers

log = logging.getLogger("lakesink")

#: ``partition_id`` of the files a history commit writes (its versions, its position deletes), in their names.
HISTORY_PARTITION_ID = 99994
_LINKS = (HISTORY_VALID_TO, HISTORY_IS_CURRENT, HISTORY_OPERATION)


@dataclass(frozen=True)
class HistoryChanges:
    """Every change of a batch for one table's history (lakesink.sink.history): the table's columns, :data:`DELETED`,
    :data:`HISTORY_CHANGE_ORDER` and :data:`HISTORY_VALID_FROM`, in the order of the stream."""

    rows: pa.Table
    key: tuple[str, ...]
    """The key columns (the table's upsert key)."""
    of: str
    """The table whose history it is."""
    schema: pa.Schema
    """The history table's columns for the batch's stream (:func:`history_schema`): with option merge-schema, the
    columns the stream adds are planned into the history table and committed with its versions."""
    rereads: bool = False
    """Whether the order values are a change stream's source positions (``cdc_order``), where a MySQL change with a
    GTID can come again at other coordinates (:func:`lakesink.cdc.positions.gtid_commit_ms`)."""
    time_column: str | None = None
    """Option history-time's column (the changes' valid_from): a history seeded from its table's rows takes each row's
    own (:func:`_seeds`)."""


@dataclass(frozen=True)
class Linked:
    """What one attempt commits into the history table."""

    rows: list[dict[str, Any]]
    """The rows to append: the stored versions whose links changed, and the new versions of changes given whole."""
    new: list[tuple[int, Any, bool, str]]
    """The new versions of changes given by their place in the batch (``_index``): (that place, valid_to, is_current,
    operation) -- their other columns are the change's, taken from the batch's Arrow rows as they are."""
    deleted: dict[str, list[int]]
    """The stored rows those replace, by data file path: their positions."""
    added: int
    changed: int
    redelivered: int
    linked_new: pa.Table | None = None
    """New versions linked in Arrow (:func:`link_batch`): ``_index``, valid_to, is_current, operation, as :attr:`new`."""
    relinked: pa.Table | None = None
    """Stored latest versions re-linked in Arrow (:func:`link_batch`), as :attr:`rows` (their places in :attr:`deleted`)."""


def link_batch(
    light: pa.Table,
    stored: Sequence[dict[str, Any]] | pa.Table | None,
    *,
    key: Sequence[str],
    whole: frozenset[tuple[Any, ...]],
    table_name: str = "",
    full: Callable[[dict[str, Any]], dict[str, Any]] = lambda change: change,
    commit_of: Callable[[Any], Any] | None = None,
    by_position: bool = False,
) -> Linked:
    """:func:`link` over a whole batch (``light``: each change's key, order, time, delete flag and ``_index``;
    ``stored``: the stored versions as :func:`link` takes them, or as an Arrow table of those rows): the keys whose
    changes are all newer than their stored latest version and whose order values are distinct are linked in Arrow
    (:func:`_link_in_arrow`); the others -- late or redelivered changes, two changes with one order value -- by
    :func:`link`. Both give the same versions (tests/driver/test_history_link.py compares them)."""
    names = [*key, HISTORY_CHANGE_ORDER]
    if not isinstance(stored, pa.Table):
        stored = pa.Table.from_pylist(list(stored)) if stored else None
    counted = light.group_by(names, use_threads=False).aggregate([("_index", "count")])
    repeated = counted.filter(pc.greater(counted.column("_index_count"), 1)).select(list(key))
    slow = set(whole) | {tuple(r[k] for k in key) for r in repeated.to_pylist()}
    if commit_of is not None:  # a change that may be another's copy read at other coordinates: compared by link
        slow |= _same_commits(light, stored, key, commit_of)
    by_python, in_arrow = light.slice(0, 0), light
    of_slow: list[dict[str, Any]] = []
    latest = stored
    if slow:
        slow_keys = pa.Table.from_pylist([dict(zip(key, k, strict=True)) for k in slow], schema=light.select(list(key)).schema)
        by_python = light.join(slow_keys, list(key), join_type="left semi", use_threads=False)
        in_arrow = light.join(slow_keys, list(key), join_type="left anti", use_threads=False)
        if stored is not None and stored.num_rows:
            of_slow = _with_keys(stored, slow_keys, key).to_pylist()
            latest = _with_keys(stored, slow_keys, key, without=True)
    done = link(
        by_python.to_pylist(),
        of_slow,
        key=key,
        whole=whole,
        table_name=table_name,
        full=full,
        commit_of=commit_of,
        by_position=by_position,
    )
    links, relinked, deleted = _link_in_arrow(in_arrow, latest, key)
    for path, positions in deleted.items():
        done.deleted.setdefault(path, []).extend(positions)
    return Linked(
        rows=done.rows,
        new=done.new,
        deleted=done.deleted,
        added=done.added + links.num_rows,
        changed=done.changed + (relinked.num_rows if relinked is not None else 0),
        redelivered=done.redelivered,
        linked_new=links,
        relinked=relinked,
    )


def _same_commits(
    light: pa.Table, stored: pa.Table | None, key: Sequence[str], commit_of: Callable[[Any], Any]
) -> set[tuple[Any, ...]]:
    """The keys with two changes (of the batch, or one of the batch and the stored latest version) at one commit of
    ``commit_of`` (not None): :func:`link` tells a copy from a change."""
    seen: dict[tuple[Any, ...], set[Any]] = {}
    out: set[tuple[Any, ...]] = set()
    rows = light.select([*key, HISTORY_CHANGE_ORDER]).to_pylist()
    for r in rows:
        commit = commit_of(r[HISTORY_CHANGE_ORDER])
        if commit is None:
            continue
        k = tuple(r[n] for n in key)
        if commit in seen.setdefault(k, set()):
            out.add(k)
        seen[k].add(commit)
    if stored is not None and stored.num_rows and seen:
        for r in stored.select([*key, HISTORY_CHANGE_ORDER]).to_pylist():
            k = tuple(r[n] for n in key)
            if k in seen and commit_of(r[HISTORY_CHANGE_ORDER]) in seen[k]:
                out.add(k)
    return out


def _link_in_arrow(
    changes: pa.Table, latest: pa.Table | None, key: Sequence[str]
) -> tuple[pa.Table, pa.Table | None, dict[str, list[int]]]:
    """:func:`link` for keys whose changes are all newer than their stored latest version (``latest``: those versions'
    rows with ``_path`` and ``_pos``, each key once), each order value once: the changes sorted by key and order, each
    version ending where the next of its key begins, the last current unless a delete, the first an insert unless the
    stored latest is alive (then an update); the stored latest ends where the key's first change begins. Returns (the
    new versions' links by ``_index``, the stored latest versions re-linked, their positions by file)."""
    n = changes.num_rows
    empty = pa.table(
        {
            "_index": pa.array([], pa.int64()),
            HISTORY_VALID_TO: pa.array([], changes.schema.field(HISTORY_VALID_FROM).type),
            HISTORY_IS_CURRENT: pa.array([], pa.bool_()),
            HISTORY_OPERATION: pa.array([], pa.string()),
        }
    )
    if not n:
        return empty, None, {}
    if latest is not None and not latest.num_rows:
        latest = None
    ordered = changes.take(pc.sort_indices(changes, sort_keys=[(k, "ascending") for k in (*key, HISTORY_CHANGE_ORDER)]))
    same_as_next = pa.array([False])
    if n > 1:
        same = _all([pc.equal(ordered.column(k).slice(0, n - 1), ordered.column(k).slice(1)) for k in key])
        same = same.combine_chunks() if isinstance(same, pa.ChunkedArray) else same
        same_as_next = pa.concat_arrays([same, same_as_next])
    same_as_previous = pa.concat_arrays([pa.array([False]), same_as_next.slice(0, n - 1)])
    deleted = pc.fill_null(ordered.column(DELETED), False).combine_chunks()
    starts = ordered.column(HISTORY_VALID_FROM).combine_chunks()
    following = pa.concat_arrays([starts.slice(1), pa.nulls(1, starts.type)])
    valid_to = pc.if_else(same_as_next, following, pa.nulls(n, starts.type))
    is_current = pc.and_(pc.invert(same_as_next), pc.invert(deleted))
    firsts = ordered.filter(pc.invert(same_as_previous)).select([*key, HISTORY_VALID_FROM])
    found: pa.Table | None = None  # the stored latest versions of the batch's keys, each with its key's first change
    alive = pa.repeat(False, n)
    if latest is not None:
        stored_keys = _keys_typed(latest, latest, key)
        typed = _keys_typed(firsts, latest, key).append_column("_first", firsts.column(HISTORY_VALID_FROM))
        # joined on the keys alone (the stored rows' other columns may be of types a join does not carry)
        pairs = stored_keys.append_column("_at", row_numbers(latest.num_rows)).join(
            typed, list(key), join_type="inner", use_threads=False
        )
        found = latest.take(pairs.column("_at")).append_column("_first", pairs.column("_first"))
        # whether each change's key has a stored latest version that is not a delete (by the change's place in order)
        living = stored_keys.filter(pc.fill_null(pc.not_equal(latest.column(HISTORY_OPERATION), HISTORY_DELETE), True))
        rows = _keys_typed(ordered, latest, key).append_column("_row", row_numbers(n))
        hit = rows.join(living, list(key), join_type="left semi", use_threads=False).column("_row")
        alive = pc.is_in(row_numbers(n), value_set=hit.combine_chunks())
    previous_deleted = pa.concat_arrays([pa.array([True]), deleted.slice(0, n - 1)])
    after_delete = pc.if_else(same_as_previous, previous_deleted, pc.invert(alive))
    operation = pc.if_else(
        deleted, pa.scalar(HISTORY_DELETE), pc.if_else(after_delete, pa.scalar(HISTORY_INSERT), pa.scalar(HISTORY_UPDATE))
    )
    links = pa.table(
        {
            "_index": ordered.column("_index"),
            HISTORY_VALID_TO: valid_to,
            HISTORY_IS_CURRENT: is_current,
            HISTORY_OPERATION: operation,
        }
    )
    if found is None or not found.num_rows:
        return links, None, {}
    assert latest is not None
    ends_type = latest.schema.field(HISTORY_VALID_TO).type
    if pa.types.is_null(ends_type):  # rows built from Python values, every valid_to null (the tests')
        ends_type = latest.schema.field(HISTORY_VALID_FROM).type
    ends = found.column("_first").cast(ends_type)
    relinked = found.set_column(found.schema.get_field_index(HISTORY_VALID_TO), HISTORY_VALID_TO, ends)
    relinked = relinked.set_column(
        relinked.schema.get_field_index(HISTORY_IS_CURRENT), HISTORY_IS_CURRENT, pa.repeat(False, relinked.num_rows)
    )
    places = relinked.select(["_path", "_pos"]).group_by("_path", use_threads=False).aggregate([("_pos", "list")])
    deletes = {
        path: list(positions)
        for path, positions in zip(places.column("_path").to_pylist(), places.column("_pos_list").to_pylist(), strict=True)
    }
    return links, relinked.drop_columns(["_path", "_pos", "_first"]), deletes


def _with_keys(rows: pa.Table, keys: pa.Table, key: Sequence[str], *, without: bool = False) -> pa.Table:
    """The rows of ``rows`` whose key is among ``keys`` (``without``: is not), in their order; joined on the key columns
    alone (the rows' other columns may be of types a join does not carry)."""
    if not rows.num_rows:
        return rows
    numbered = _keys_typed(rows, rows, key).append_column("_at", row_numbers(rows.num_rows))
    how = "left anti" if without else "left semi"
    at = numbered.join(_keys_typed(keys, rows, key), list(key), join_type=how, use_threads=False).column("_at")
    at = at.combine_chunks() if isinstance(at, pa.ChunkedArray) else at
    return rows.take(at.take(pc.array_sort_indices(at)))


def _keys_typed(rows: pa.Table, like: pa.Table, key: Sequence[str]) -> pa.Table:
    """``rows``' key columns in ``like``'s types (a join needs one type: string, not large_string)."""
    return pa.table([rows.column(k).cast(like.schema.field(k).type) for k in key], names=list(key))


def _all(arrays: Sequence[Any]) -> Any:
    out = arrays[0]
    for a in arrays[1:]:
        out = pc.and_(out, a)
    return out


def link(
    changes: Sequence[dict[str, Any]],
    stored: Sequence[dict[str, Any]],
    *,
    key: Sequence[str],
    whole: frozenset[tuple[Any, ...]],
    table_name: str = "",
    full: Callable[[dict[str, Any]], dict[str, Any]] = lambda change: change,
    commit_of: Callable[[Any], Any] | None = None,
    by_position: bool = False,
) -> Linked:
    """The versions to write (the module's step 2). ``changes``: the batch's changes (rows with :data:`DELETED`, the
    order and the time); ``stored``: the history's versions of their keys, each with ``_path``/``_pos`` (where it is);
    ``whole``: the keys whose every version is in ``stored`` (else only their latest). Pure: no I/O. Two changes of a
    key with one order value are one change delivered twice when they say the same (kept once), else UpsertKeyError.
    A change may be given by its key, order, time, delete flag and place in the batch (``_index``) only: ``full`` gives
    its whole row where its values are compared (a redelivery), and its version comes back in :attr:`Linked.new`.
    ``commit_of`` (a change stream's source positions): a change next to a version of its key (in order) at the same
    commit that says the same is that change read again at other coordinates (a MySQL failover), kept once.
    ``by_position`` (a change stream's order values: one value is one change of the source): a change at a version's
    order value that says the same values is that change again whatever time it carries -- the version may be a seed,
    dated by the history (:func:`_seeds`), the change by its source."""
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in stored:
        by_key.setdefault(tuple(row[k] for k in key), []).append(row)
    new_by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for change in changes:
        new_by_key.setdefault(tuple(change[k] for k in key), []).append(change)
    rows: list[dict[str, Any]] = []
    new: list[tuple[int, Any, bool, str]] = []
    deleted: dict[str, list[int]] = {}
    added = changed = redelivered = 0
    for k, news in new_by_key.items():
        old = sorted(by_key.get(k, ()), key=lambda r: r[HISTORY_CHANGE_ORDER])
        held = {r[HISTORY_CHANGE_ORDER]: r for r in old}
        fresh: dict[Any, dict[str, Any]] = {}
        for change in news:
            order = change[HISTORY_CHANGE_ORDER]
            there = held.get(order, fresh.get(order))
            if there is None and commit_of is not None:
                there = _read_again(full(change), [*old, *fresh.values()], commit_of, full)
                if there is not None:
                    redelivered += 1  # the same change read at other coordinates: its version is there
                    continue
            if there is not None:
                ignore = (HISTORY_VALID_FROM,) if by_position else ()
                if not _same_change(full(change), full(there) if DELETED in there else there, ignore=ignore):
                    where = "one in the history, one in this batch" if order in held else "both in this batch"
                    raise UpsertKeyError(
                        f"history of {table_name}: two different changes of key "
                        f"({', '.join(f'{n}={v!r}' for n, v in zip(key, k, strict=True))}) have the same order value "
                        f"{order!r} ({where}); "
                        + (
                            _binlog_reused(int(order))
                            if by_position and order is not None and binlog.in_band(int(order) % binlog.EPOCH_STEP)
                            else "the history cannot order them, and a redelivery is the same change. Nothing was "
                            "committed; order the changes by a value unique per change of a key (option order-by)"
                        )
                    )
                redelivered += 1  # the same change again (a redelivery): its version is there
                continue
            fresh[order] = change
        if not fresh:
            continue
        chain: list[tuple[dict[str, Any], bool]] = [(r, False) for r in old]
        chain.extend((dict(c), True) for c in fresh.values())
        chain.sort(key=lambda item: item[0][HISTORY_CHANGE_ORDER])
        complete = k in whole
        first = 0 if complete else 1 if old else 0  # without the whole chain, the stored latest keeps its operation
        for i, (row, is_new) in enumerate(chain):
            nxt = chain[i + 1][0] if i + 1 < len(chain) else None
            if is_new:
                is_delete = bool(row.pop(DELETED))
                row[HISTORY_OPERATION] = HISTORY_DELETE if is_delete else None
            is_delete = row[HISTORY_OPERATION] == HISTORY_DELETE
            linked = dict(row)
            linked[HISTORY_VALID_TO] = nxt[HISTORY_VALID_FROM] if nxt is not None else None
            linked[HISTORY_IS_CURRENT] = nxt is None and not is_delete
            if i >= first and not is_delete:
                previous = chain[i - 1][0] if i > 0 else None
                after_delete = previous is None or previous[HISTORY_OPERATION] == HISTORY_DELETE
                linked[HISTORY_OPERATION] = HISTORY_INSERT if after_delete else HISTORY_UPDATE
            chain[i] = (linked, is_new)
            if is_new:
                if "_index" in linked:
                    new.append(
                        (linked["_index"], linked[HISTORY_VALID_TO], linked[HISTORY_IS_CURRENT], linked[HISTORY_OPERATION])
                    )
                else:
                    rows.append(_without_place(linked))
                added += 1
            elif any(linked.get(n) != row.get(n) for n in _LINKS):
                deleted.setdefault(row["_path"], []).append(row["_pos"])
                rows.append(_without_place(linked))
                changed += 1
    return Linked(rows=rows, new=new, deleted=deleted, added=added, changed=changed, redelivered=redelivered)


def _in_epoch(changes: HistoryChanges, epoch: binlog.Epoch) -> HistoryChanges:
    """A change stream's changes with the table's binlog epoch added to their binlog coordinates orders
    (lakesink.cdc.binlog): the history orders a break's changes after every earlier version of their keys, and keeps
    the orders the table's order file keeps."""
    rows = changes.rows
    shifted = epoch.shift(rows.column(HISTORY_CHANGE_ORDER).to_pylist())
    if shifted is None:
        return changes
    at = rows.column_names.index(HISTORY_CHANGE_ORDER)
    return replace(changes, rows=rows.set_column(at, rows.field(at), pa.array(shifted, rows.field(at).type)))


def _binlog_reused(order: int) -> str:
    """Why two different changes of one key at one binlog position (option cdc-format's order) are no redelivery."""
    return (
        f"that is binlog {binlog.describe(order)}, and one binlog position holds one change of a row: the source's binlog "
        "went back and its new changes reuse old coordinates (RESET MASTER, a server restored from a backup, a failover "
        "to a server without GTIDs). Nothing was committed. Recover: set table property "
        f"{PROPERTY_CDC_BINLOG_EPOCH!r} to {order // binlog.EPOCH_STEP + 1} on this table and on every table of the "
        "source, have Debezium take a new snapshot, and restart. Or the source wrote the transaction with "
        "binlog_transaction_compression, whose changes share one position (docs/cdc.md, 'MySQL without GTIDs, MariaDB: "
        "coordinates that go back')"
    )


def _same_change(change: dict[str, Any], version: dict[str, Any], *, ignore: Sequence[str] = ()) -> bool:
    """Whether ``change`` (of the batch) says what ``version`` (stored, or another change of the batch) says: the same
    delete flag, time and values (but the columns ``ignore``)."""
    deleted = version[DELETED] if DELETED in version else version.get(HISTORY_OPERATION) == HISTORY_DELETE
    if bool(change[DELETED]) != bool(deleted):
        return False
    return all(_equal(change[n], version.get(n)) for n in change if n not in (DELETED, *_LINKS, *ignore))


def _read_again(
    change: dict[str, Any],
    versions: Sequence[dict[str, Any]],
    commit_of: Callable[[Any], Any],
    full: Callable[[dict[str, Any]], dict[str, Any]],
) -> dict[str, Any] | None:
    """The version of ``versions`` (one key's, stored or of the batch) that ``change`` is a copy of, read at other
    coordinates: its neighbour in order, at the same commit, saying the same but for the order value and the time (a
    seeded version's time is the history's own: :func:`_seeds`); else None."""
    order = change[HISTORY_CHANGE_ORDER]
    commit = commit_of(order)
    if commit is None:
        return None
    below = [v for v in versions if v[HISTORY_CHANGE_ORDER] < order]
    above = [v for v in versions if v[HISTORY_CHANGE_ORDER] > order]
    neighbours = [
        *([max(below, key=lambda v: v[HISTORY_CHANGE_ORDER])] if below else []),
        *([min(above, key=lambda v: v[HISTORY_CHANGE_ORDER])] if above else []),
    ]
    for v in neighbours:
        if commit_of(v[HISTORY_CHANGE_ORDER]) != commit:
            continue
        if _same_change(change, full(v) if DELETED in v else v, ignore=(HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM)):
            return v
    return None


def _equal(a: Any, b: Any) -> bool:
    """``a == b``, a NaN equal to a NaN (a redelivered double column holding NaN is the same change)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _without_place(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("_path", "_pos")}


class HistoryBatch(AppendBatch):
    """A batch's versions committed into its table's history table (the module's description), one member of the
    batch's unit beside the table's own action (lakesink.driver.committers.table)."""

    def __init__(
        self,
        context: SinkContext,
        table: Table,
        batch: Batch,
        changes: HistoryChanges,
        truncate: Truncate | None = None,
        *,
        mirror: BatchAction | None = None,
    ):
        super().__init__(context, table, batch)
        self.changes = changes
        self.truncate = truncate
        self.mirror = mirror
        """The history's table's member of the unit (:func:`table_before`, :func:`_check_owner`)."""
        self.complete: bool | None = None
        """Whether the history started with its table (:func:`_complete`), as the attempt read it."""
        self.linked: Linked | None = None

    def properties(self, snapshot_id: int) -> dict[str, str]:
        """The replay marker and whose versions the history holds: its table's uuid, the key (:func:`_check_owner`),
        whether it started with its table (:func:`_complete`)."""
        owner = {PROPERTY_HISTORY_KEY: ",".join(self.changes.key)}
        if self.mirror is not None:
            owner[PROPERTY_HISTORY_TABLE_UUID] = str(self.mirror.table.metadata.table_uuid)
        if self.complete is not None:
            owner[PROPERTY_HISTORY_COMPLETE] = str(self.complete).lower()
        return {**super().properties(snapshot_id), **owner}

    def _table_before(
        self, new: pa.Table, stored: pa.Table | None, key: Sequence[str]
    ) -> tuple[TableBefore | None, frozenset[int]]:
        """A history that did not start with its table (:func:`_complete`): its table before the batch for the changes
        of keys the history holds no version of (:func:`table_before`), and those of them older than the table's row
        (no versions)."""
        if self.mirror is None or self.complete:
            return None, frozenset()
        versioned = {tuple(r[k] for k in key) for r in stored.select(list(key)).to_pylist()} if stored is not None else set()
        asked = [i for i, r in enumerate(new.select(list(key)).to_pylist()) if tuple(r[k] for k in key) not in versioned]
        if not asked:
            return None, frozenset()
        marks = self.changes.rows.column(UNAVAILABLE) if UNAVAILABLE in self.changes.rows.column_names else None
        rows_for = [marks is not None and marks[i].is_valid for i in asked]  # TOAST fills need the table's rows
        found = table_before(self.mirror, new.select([*key, HISTORY_CHANGE_ORDER]).take(pa.array(asked, pa.int64())), rows_for)
        if found is None:
            return None, frozenset()
        return found, frozenset(i for i, older in zip(asked, found.older, strict=True) if older)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        c, batch, changes = self.context, self.batch, self.changes
        _check_owner(table, c.name, changes, self.mirror)
        if table.metadata.format_version != 2:
            raise LakesinkError(
                f"history table {c.name} is format version {table.metadata.format_version}; lakesink writes history "
                "tables as format 2 (a version a later change ends is rewritten as a position delete and a new row). "
                f"Nothing was committed; drop {c.name} (lakesink creates it again, format 2) or name another with "
                "option 'history'"
            )
        plan = c.write_plan(table, batch.query_id, changes.schema)
        schema = plan.schema
        schema_changes = tuple(plan.schema_changes) if plan.schema_changes else ()
        truncate = self.truncate
        epoch = binlog.Epoch.of(self.mirror.table.properties, changes.of) if changes.rereads and self.mirror else None
        if epoch is not None and epoch.epoch:  # the orders as the table compares them (its order file holds the same)
            changes = _in_epoch(changes, epoch)
            if truncate is not None:
                truncate = replace(truncate, order=(epoch.shift([truncate.order]) or [truncate.order])[0])
        if truncate is not None:
            changes = _with_truncate(table, c.branch, changes, truncate)
        new = _new_rows(changes, schema)
        key = list(changes.key)
        stored, whole, read = _stored(table, c.branch, c.name, schema, new, key)
        self.complete = _complete(table, c.branch, self.mirror)
        before_batch, left_out = self._table_before(new, stored, key)
        new = _kept_values(new, changes, stored, key, before_batch, left_out)
        if left_out:  # re-sent from before the history started: the table does not apply them, no version either
            log.info(
                "lakesink: history %s: %d change(s) of keys it holds no version of are older than its table's rows "
                "(re-sent from before the history started): not versions",
                c.name,
                len(left_out),
            )
            new = new.filter(pc.invert(pc.is_in(row_numbers(new.num_rows), value_set=pa.array(sorted(left_out), pa.int64()))))
        seeds = None
        if self.complete is False and self.mirror is not None and _holds_no_version(table, c.branch):
            seeds = _seeds(self.mirror, changes, new, key, _plain(seam.arrow_schema(schema)))
        if seeds is not None:  # the table's live rows are its first versions: it holds one of every key now
            new = pa.concat_tables([new, seeds.of_batch_keys])
            self.complete = seeds.complete
            log.info(
                "lakesink: history %s started after %s held rows: its first versions are the table's %d live row(s)",
                c.name,
                changes.of,
                seeds.count,
            )
        light = new.select([*key, HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM, DELETED])
        light = light.append_column("_index", row_numbers(new.num_rows))
        linked = link_batch(
            light,
            stored,
            key=key,
            whole=whole,
            table_name=changes.of,
            full=lambda change: {**new.slice(change["_index"], 1).to_pylist()[0], DELETED: change[DELETED]},
            commit_of=gtid_commit_ms if changes.rereads and any_gtid_order(new.column(HISTORY_CHANGE_ORDER)) else None,
            by_position=changes.rereads,
        )
        self.linked = linked
        commit = batch.commit_name()
        ids = TaskIds(
            query_id=batch.query_id, batch_id=batch.batch_id, partition_id=HISTORY_PARTITION_ID, task_attempt_id=attempt
        )
        data_files: list[DataFile] = []
        owned: list[str] = []
        parts = []
        if linked.rows or linked.new or any(t is not None and t.num_rows for t in (linked.linked_new, linked.relinked)):
            parts.append(_versions(new, linked, _plain(seam.arrow_schema(schema))))
        if seeds is not None and seeds.others.num_rows:
            parts.append(seeds.others)
        if parts:
            writer = upsert.rewrite_writer(plan, batch_id=batch.batch_id, partition_id=HISTORY_PARTITION_ID, attempt=attempt)
            data_files = upsert.written_copies(writer, [b for part in parts for b in part.to_batches()], plan)
            owned.extend(f.file_path for f in data_files)
        delete_files: list[DataFile] = []
        if linked.deleted:
            deletes = PositionDeleteWriter(ids, {c.name: delete_target(table, branch=c.branch, candidates=read)})
            for path, positions in linked.deleted.items():
                deletes.add(c.name, [path] * len(positions), pa.array(positions, pa.int64()))
            for result in deletes.finish():
                for f in result.files:
                    owned.append(f.path)
                    delete_files.append(
                        seam_row_delta.delete_file(
                            path=f.path,
                            size_in_bytes=f.size_in_bytes,
                            statistics=f.statistics,
                            spec_id=f.spec_id,
                            partition=f.partition,
                        )
                    )
        return seam_row_delta.prepare_row_delta(
            table,
            data_files=data_files,
            delete_files=delete_files,
            summary={
                **self.attempt_summary(table, attempt),
                SUMMARY_UPSERT_MODE: MERGE_ON_READ,
                SUMMARY_HISTORY_OF: changes.of,
                SUMMARY_HISTORY_ADDED: str(linked.added),
                SUMMARY_HISTORY_CHANGED: str(linked.changed),
                SUMMARY_HISTORY_REDELIVERED: str(linked.redelivered),
                **({SUMMARY_HISTORY_SEEDED: str(seeds.count)} if seeds is not None else {}),
            },
            properties=self.properties,
            branch=c.branch,
            schema_changes=schema_changes,
            manifest_merge=c.settings(table).manifest_merge,
            commit=commit,
            owned=owned,
        )


def _complete(history: Table, branch: str, mirror: BatchAction | None) -> bool | None:
    """Whether the history holds a version of every key its table ever held -- it started with its table (property
    :data:`PROPERTY_HISTORY_COMPLETE`, set by its first commit with versions: its table held no row then), or its
    first commit took the table's live rows when the table held no deleted key's order value (:func:`_seeds`) -- so
    that a change of a key it holds no version of is a new key's, whose table holds no row of it. None without
    ``mirror``."""
    recorded = history.properties.get(PROPERTY_HISTORY_COMPLETE)
    if recorded is not None or mirror is None:
        return recorded == "true" if recorded is not None else None
    if not _holds_no_version(history, branch):
        return False  # versions written before the property was: not known to have started with its table
    at_plan = mirror.table.metadata.snapshot_by_name(mirror.context.branch)  # the table before the batch
    return at_plan is None or _records(at_plan) == 0


def _holds_no_version(history: Table, branch: str) -> bool:
    """Whether ``history`` holds no version yet (no snapshot on ``branch``, or none with a record)."""
    head = history.metadata.snapshot_by_name(branch)
    return head is None or _records(head) == 0


@dataclass(frozen=True)
class Seeds:
    """A history's first versions taken from its table's live rows (the history started after the table held rows)."""

    of_batch_keys: pa.Table
    """The rows of the keys the batch changes, as the batch's changes are given (its ``new`` columns, not deleted): linked
    with the batch's changes, each its key's first version."""
    others: pa.Table
    """The other rows' versions, in the history table's columns: each its key's current version, an insert."""
    count: int
    complete: bool
    """Whether a key the history then holds no version of is a new key's (:func:`_complete`): the table held no order
    value of a deleted key (no order file). Else a change of such a key may be older than its delete, which left it no
    version: the table's order values are read for those changes each batch, as for a history not seeded."""


def _seeds(mirror: BatchAction, changes: HistoryChanges, new: pa.Table, key: Sequence[str], target: pa.Schema) -> Seeds | None:
    """A history's first commit when its table already holds rows: each live row of the table before the batch (as the
    attempt reads it, the unit's swap checking it did not move) becomes a version -- an insert, dated by the row's own
    history-time column (else the time the row was known to be there: the table's snapshot time, or the batch's first
    change's time when earlier -- a change stream's source times trail its commits), ordered by the row's
    order-by column (a change stream: the source position its order file holds for the key; else the batch id before
    this one's), current unless the batch changes its key. Its changes of that key then follow it (:func:`link_batch`);
    those older than the row were left out already (:func:`table_before`).

    None -- the history stays incomplete, each unversioned key getting its first version when it next changes -- when
    the rows' order values are not the table's to give: a change stream's table whose binlog epoch is above 0 (its
    order file holds positions shifted by it) or with a live row whose key has no position there, an order-by column
    the table does not keep or holds null in some row, or the table holding the batch already (a catalog committing
    one table after the other, replayed: the rows before the batch are gone from its head)."""
    c = mirror.context
    table = seam_commit.reload(mirror.table)
    if mirror.landed(table) is not None:
        return None
    if changes.rereads and binlog.Epoch.of(table.properties, changes.of).epoch:
        return None  # its order file holds source positions shifted by the binlog epoch, not the changes' own
    snapshot = table.metadata.snapshot_by_name(c.branch)
    if snapshot is None:
        return None
    names = {f.name.lower(): f.name for f in table.schema().fields}
    order_column = None
    if c.order_by is not None and not changes.rereads:
        order_column = names.get(c.order_by.lower())
        if order_column is None:
            return None
    rows = seam.with_small_types(table.scan(snapshot_id=snapshot.snapshot_id).to_arrow())
    n = rows.num_rows
    if not n:
        return None
    order_type = new.schema.field(HISTORY_CHANGE_ORDER).type
    if changes.rereads:  # a change stream: each live key's source position, as the order file holds it
        order = _positions(table, c.branch, changes.of, rows, [names.get(k.lower(), k) for k in key])
        if order is None:
            return None
        order = order.cast(order_type)
    elif order_column is not None:
        order = rows.column(order_column)
        if order.null_count:
            return None
        order = order.cast(order_type)
    else:
        order = pa.repeat(pa.scalar(mirror.batch.batch_id - 1, pa.int64()), n).cast(order_type)
    time_type = new.schema.field(HISTORY_VALID_FROM).type
    at = datetime.datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=datetime.timezone.utc)
    known = pa.scalar(
        at.date() if pa.types.is_date(time_type) else at if getattr(time_type, "tz", None) else at.replace(tzinfo=None), time_type
    )
    first = pc.min(new.column(HISTORY_VALID_FROM)) if new.num_rows else None
    if first is not None and first.is_valid and pc.less(first, known).as_py():
        known = first  # the rows were there when the batch's first change happened (its source time is behind the commit)
    time_column = names.get(changes.time_column.lower()) if changes.time_column is not None else None
    time = rows.column(time_column).cast(time_type).fill_null(known) if time_column is not None else pa.repeat(known, n)
    columns = []
    for f in new.schema:
        if f.name == DELETED:
            columns.append(pa.repeat(False, n))
        elif f.name == HISTORY_VALID_FROM:
            columns.append(time)
        elif f.name == HISTORY_CHANGE_ORDER:
            columns.append(order)
        else:
            found = names.get(f.name.lower())
            columns.append(rows.column(found).cast(f.type) if found is not None else pa.nulls(n, f.type))
    seeded = pa.Table.from_arrays(columns, schema=new.schema)
    batch_keys = new.select(list(key))
    mine = _with_keys(seeded, batch_keys, key)
    theirs = _with_keys(seeded, batch_keys, key, without=True)
    m = theirs.num_rows
    versions = {n: theirs.column(n) for n in theirs.column_names if n != DELETED}
    versions[HISTORY_VALID_TO] = pa.nulls(m, target.field(HISTORY_VALID_TO).type)
    versions[HISTORY_IS_CURRENT] = pa.repeat(True, m)
    versions[HISTORY_OPERATION] = pa.repeat(HISTORY_INSERT, m)
    others = pa.Table.from_arrays([versions[f.name].cast(f.type) for f in target], schema=target)
    tombstones = c.order_by is not None and upsert_order.order_file(table, c.branch) is not None
    return Seeds(of_batch_keys=mine, others=others, count=n, complete=not tombstones)


def _positions(table: Table, branch: str, of: str, rows: pa.Table, key: Sequence[str]) -> pa.ChunkedArray | None:
    """Option cdc-format: the source position the order file holds for each of ``rows``' keys, in their order; None when
    the table has no order file or some live row's key has no position there (a row another writer added)."""
    held = upsert_order.live_orders(table, branch, of, list(key))
    if held is None:
        return None
    held = upsert._cast_like(held, rows.select(list(key)).schema)
    numbered = rows.select(list(key)).append_column("_row", row_numbers(rows.num_rows))
    joined = numbered.join(held, list(key), join_type="left outer", use_threads=False).sort_by("_row")
    order = joined.column(HELD_COLUMN)
    if joined.num_rows != rows.num_rows or order.null_count:
        return None
    return order


def _records(snapshot: Any) -> int | None:
    summary = snapshot.summary
    value = summary.get("total-records") if summary is not None else None
    return int(value) if value is not None else None


def _check_owner(history: Table, name: str, changes: HistoryChanges, mirror: BatchAction | None) -> None:
    """The history table holds versions of this very table, keyed as the batch's changes are (its properties
    :data:`PROPERTY_HISTORY_TABLE_UUID`, :data:`PROPERTY_HISTORY_KEY`, recorded by its first commit); else a loud error:
    linked to another table's or another key's versions, the new table's rows would close versions they never were."""
    props = history.properties
    uuid = props.get(PROPERTY_HISTORY_TABLE_UUID)
    mine = str(mirror.table.metadata.table_uuid) if mirror is not None else None
    way_out = (
        f"Nothing was committed in either table. Drop {name} (lakesink creates it again; copy it first to keep the old "
        "versions: a renamed history keeps its location, which the new one would take), or name another history "
        "table with option 'history' (docs/history.md)"
    )
    if uuid is not None and mine is not None and uuid != mine:
        raise LakesinkError(
            f"history table {name} holds the versions of table {changes.of} with uuid {uuid}, but {changes.of} is now "
            f"another table (uuid {mine}): it was dropped and created again, and its history was left. {way_out}"
        )
    key = props.get(PROPERTY_HISTORY_KEY)
    if key is not None and [k.lower() for k in key.split(",")] != [k.lower() for k in changes.key]:
        raise LakesinkError(
            f"history table {name} holds versions of {changes.of} keyed by ({key}), but this query upserts it by "
            f"({', '.join(changes.key)}) (option upsert-key, or the source's key): its versions cannot be linked to the "
            f"new key's. {way_out}"
        )


def _versions(new: pa.Table, linked: Linked, schema: pa.Schema) -> pa.Table:
    """The rows an attempt appends, in the history table's columns (``schema``): the new versions taken from the
    batch's rows ``new`` as they are, with their links; the stored versions re-linked."""
    parts = []
    if linked.linked_new is not None and linked.linked_new.num_rows:
        links = linked.linked_new
        taken = new.take(links.column("_index"))
        columns = {n: taken.column(n) for n in taken.column_names}
        columns[HISTORY_VALID_TO] = links.column(HISTORY_VALID_TO).cast(schema.field(HISTORY_VALID_TO).type)
        columns[HISTORY_IS_CURRENT] = links.column(HISTORY_IS_CURRENT)
        columns[HISTORY_OPERATION] = links.column(HISTORY_OPERATION)
        parts.append(pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema))
    if linked.new:
        at = pa.array([n[0] for n in linked.new], pa.int64())
        taken = new.take(at)
        columns = {n: taken.column(n) for n in taken.column_names}
        columns[HISTORY_VALID_TO] = pa.array([n[1] for n in linked.new], schema.field(HISTORY_VALID_TO).type)
        columns[HISTORY_IS_CURRENT] = pa.array([n[2] for n in linked.new], pa.bool_())
        columns[HISTORY_OPERATION] = pa.array([n[3] for n in linked.new], pa.string())
        parts.append(pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema))
    if linked.relinked is not None and linked.relinked.num_rows:
        relinked = linked.relinked
        kept = [
            relinked.column(f.name).cast(f.type) if f.name in relinked.column_names else pa.nulls(relinked.num_rows, f.type)
            for f in schema
        ]
        parts.append(pa.Table.from_arrays(kept, schema=schema))
    if linked.rows:
        parts.append(pa.Table.from_pylist(linked.rows, schema=schema))
    return pa.concat_tables(parts)


def _plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` without field ids in its metadata and every field nullable (rows built from Python values)."""
    return pa.schema([pa.field(f.name, f.type, nullable=True) for f in schema])


def _new_rows(changes: HistoryChanges, schema: Schema) -> pa.Table:
    """The batch's changes with the history table's column names (its schema may spell a column in another case),
    the columns the stream does not have null-filled."""
    rows = changes.rows
    names = {n.lower(): n for n in rows.column_names}
    target = _plain(seam.arrow_schema(schema))
    columns, fields = [], []
    for f in target:
        if f.name in (HISTORY_VALID_TO, HISTORY_IS_CURRENT, HISTORY_OPERATION):
            continue
        found = names.get(f.name.lower())
        column = rows.column(found) if found is not None else pa.nulls(rows.num_rows, f.type)
        columns.append(column.cast(f.type) if column.type != f.type else column)
        fields.append(pa.field(f.name, f.type))
    columns.append(rows.column(DELETED))
    fields.append(pa.field(DELETED, pa.bool_()))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


@dataclass(frozen=True)
class Truncate:
    """Option cdc-format: the batch's truncate of the table (Debezium's op ``t``), at its source position and time."""

    order: Any
    time: Any


def _with_truncate(table: Table, branch: str, changes: HistoryChanges, truncate: Truncate) -> HistoryChanges:
    """The batch's changes with the truncate's: a delete, at the truncate's position and time, of every key alive just
    before it -- its current version older than the truncate, or its latest change of the batch before the truncate
    (kept as a version, never applied to the table: lakesink.sink.cdc.truncates) not a delete. The versions it ends
    end then, and a key's next change is an insert. A key whose current version is newer than the truncate (a truncate
    replayed from an older position) keeps its versions, as the table's upsert leaves its row."""
    key = list(changes.key)
    order_type = changes.rows.schema.field(HISTORY_CHANGE_ORDER).type
    alive: dict[tuple[Any, ...], tuple[Any, bool]] = {}  # key -> (order, deleted) of its latest change before it
    snapshot = table.metadata.snapshot_by_name(branch)
    if snapshot is not None:
        names = {f.name.lower(): f.name for f in table.schema().fields}
        stored_key = [names.get(k.lower(), k) for k in key]
        current = table.scan(
            row_filter=f"{HISTORY_IS_CURRENT} = true",
            selected_fields=(*stored_key, HISTORY_CHANGE_ORDER),
            snapshot_id=snapshot.snapshot_id,
        ).to_arrow()
        for r in current.to_pylist():
            if r[HISTORY_CHANGE_ORDER] is not None and r[HISTORY_CHANGE_ORDER] < truncate.order:
                alive[tuple(r[k] for k in stored_key)] = (r[HISTORY_CHANGE_ORDER], False)
    rows = changes.rows
    for r in rows.select([*key, HISTORY_CHANGE_ORDER, DELETED]).to_pylist():
        k, order = tuple(r[n] for n in key), r[HISTORY_CHANGE_ORDER]
        if order is not None and order < truncate.order and (k not in alive or order > alive[k][0]):
            alive[k] = (order, bool(r[DELETED]))
    ended = [k for k, (_, deleted) in alive.items() if not deleted]
    if not ended:
        return changes
    n = len(ended)
    columns = []
    for f in rows.schema:
        if f.name in key:
            columns.append(pa.array([k[key.index(f.name)] for k in ended], f.type))
        elif f.name == DELETED:
            columns.append(pa.array([True] * n, pa.bool_()))
        elif f.name == HISTORY_CHANGE_ORDER:
            columns.append(pa.array([truncate.order] * n, order_type))
        elif f.name == HISTORY_VALID_FROM:
            columns.append(pa.array([truncate.time] * n, pa.timestamp("us", tz="UTC")).cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    deletes = pa.Table.from_arrays(columns, schema=rows.schema)
    return replace(changes, rows=pa.concat_tables([deletes, rows]))


def no_changes(history: Table, key: Sequence[str], of: str) -> HistoryChanges:
    """No change of the table in the batch (a batch that only truncates it), in the history table's columns."""
    schema = _plain(seam.arrow_schema(history.schema()))
    names = {n.lower(): n for n in schema.names}
    rows = pa.schema([f for f in schema if f.name not in _LINKS]).append(pa.field(DELETED, pa.bool_()))
    return HistoryChanges(rows=rows.empty_table(), key=tuple(names.get(k.lower(), k) for k in key), of=of, schema=schema)


@dataclass(frozen=True)
class TableBefore:
    """The history's table as it is before the batch, for the changes of keys the history holds no version of
    (:func:`table_before`)."""

    rows: dict[tuple[Any, ...], dict[str, Any]]
    """Its row of each such key whose change it applies (by the batch's key values)."""
    older: tuple[bool, ...]
    """Per change asked: older than the order value the table holds for its key (the table does not apply it)."""


def _kept_values(
    new: pa.Table,
    changes: HistoryChanges,
    stored: pa.Table | None,
    key: Sequence[str],
    before_batch: TableBefore | None,
    left_out: frozenset[int],
) -> pa.Table:
    """Option cdc-format: each column of a change still holding Debezium's unavailable-value placeholder (an unchanged
    TOAST value; the task filled those with an earlier change of the key: lakesink.executor.upsert_task.history_rows)
    takes the value of the version before it -- the one the table's upsert keeps the value of. A key the history holds
    no version of (its history started after the row was written) takes the table's row before the batch
    (``before_batch``). Nothing to take (no row, a delete before it, a late change of a key the history holds):
    lakesink.cdc.unavailable's UnavailableValueError. The changes ``left_out`` (no versions) are not looked at."""
    if UNAVAILABLE not in changes.rows.column_names or changes.rows.column(UNAVAILABLE).null_count == new.num_rows:
        return new
    marks = changes.rows.column(UNAVAILABLE).to_pylist()
    at = [i for i, m in enumerate(marks) if m and i not in left_out]
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    if stored is not None and stored.num_rows and at:  # the stored versions of the marked changes' keys, as rows
        marked = new.select(list(key)).take(pa.array(at, pa.int64()))
        for row in _with_keys(stored, marked, key).to_pylist():
            by_key.setdefault(tuple(row[k] for k in key), []).append(row)
    keys = [tuple(r[n] for n in key) for r in new.select(list(key)).take(pa.array(at, pa.int64())).to_pylist()]
    orders = new.column(HISTORY_CHANGE_ORDER).take(pa.array(at, pa.int64())).to_pylist()
    held = before_batch.rows if before_batch is not None else {}
    values: dict[str, list[Any]] = {}
    for i, k, order in zip(at, keys, orders, strict=True):
        columns = unavailable.decoded_marks(marks[i])
        earlier = [r for r in by_key.get(k, ()) if r[HISTORY_CHANGE_ORDER] < order]
        before = max(earlier, key=lambda r: r[HISTORY_CHANGE_ORDER]) if earlier else None
        if before is None and k not in by_key and unavailable.DELETED_BEFORE not in columns:
            before = held.get(k)  # the table's row of a key whose history started after it was written
        if before is None or before.get(HISTORY_OPERATION) == HISTORY_DELETE or unavailable.DELETED_BEFORE in columns:
            shown = ", ".join(f"{n}={v!r}" for n, v in zip(key, k, strict=True))
            if before is not None or unavailable.DELETED_BEFORE in columns:
                why = "the version before it is a delete"
            elif k in by_key:
                why = "the history holds no earlier version of that key (the change is late)"
            elif before_batch is None:
                why = "the history holds no version of that key (nor, since it started with its table, the table a row)"
            else:
                why = "the history holds no version of that key, and its table holds no row of it"
            raise unavailable.unfillable(changes.of, next(c for c in columns if c != unavailable.DELETED_BEFORE), shown, why)
        for n in columns:
            name = next((f for f in new.column_names if f.lower() == n.lower()), None)
            if name is None:
                continue
            if name not in values:
                values[name] = new.column(name).to_pylist()
            values[name][i] = next((v for c, v in before.items() if c.lower() == name.lower()), None)
    out = new
    for n, filled in values.items():
        index = out.schema.get_field_index(n)
        out = out.set_column(index, out.schema.field(index), pa.array(filled, out.schema.field(index).type))
    return out


def table_before(mirror: BatchAction, changes: pa.Table, rows_for: Sequence[bool]) -> TableBefore | None:
    """The history's table (``mirror``: its member of the batch's unit) read now, before the batch lands there, for
    ``changes`` (key columns, the change's order value): its row of each key whose change it would apply, and which
    changes are older than the order value it holds for their key (lakesink.driver.actions.upsert_order's rule: the
    order file's value, else a live row's order-by column). None when the table already holds the batch (a catalog
    that commits one table after the other: the row before the batch is gone from its head). The table's data files are
    read for the keys of the changes ``rows_for`` says (their placeholders take its values), and for every key when
    the table keeps live rows' order values in its order-by column."""
    table = seam_commit.reload(mirror.table)
    if mirror.landed(table) is not None:
        return None
    return _before(mirror.context, table, changes, rows_for, mirror.batch.batch_id)


def _before(c: SinkContext, table: Table, changes: pa.Table, rows_for: Sequence[bool], batch_id: int) -> TableBefore:
    """:func:`table_before` against ``table`` as read."""
    n = changes.num_rows
    if table.metadata.snapshot_by_name(c.branch) is None or not n:
        return TableBefore({}, (False,) * n)
    schema = table.schema()
    batch_names = [name for name in changes.column_names if name != HISTORY_CHANGE_ORDER]
    asked = changes.select(batch_names).append_column(DELETED, pa.repeat(False, n))
    if c.order_by is not None:
        asked = asked.append_column(ORDER, changes.column(HISTORY_CHANGE_ORDER))
    keys = upsert.BatchKeys(c.name, schema, asked)
    if keys.table.num_rows != n:  # a key the table's type cannot hold (never in it): compared one by one below
        return TableBefore({}, (False,) * n) if not keys.table.num_rows else _one_by_one(c, table, changes, rows_for, batch_id)
    older = [False] * n
    table_column = None
    if c.order_by is not None:
        keys, check, stale = upsert_order.older_than_held(
            table, schema, keys, order_by=c.order_by, branch=c.branch, batch_id=batch_id, warn=False
        )  # the table's own check logs the redeliveries it takes
        older, table_column = [bool(v) for v in stale.to_pylist()], check.table_column
    names = [f.name for f in keys.fields]
    wanted = keys if table_column is not None else upsert.BatchKeys(c.name, schema, keys.table.filter(pa.array(rows_for)))
    has_deletes, live = seam.branch_data_files(table, c.branch) if wanted.table.num_rows else (False, [])
    specs = table.specs()
    gone = upsert._deleted_positions(table, c.branch, c.name) if has_deletes else {}
    rows_of: dict[tuple[Any, ...], dict[str, Any]] = {}
    for f in live:
        if not wanted.may_hold(f, specs, schema):
            continue
        rows = seam.with_small_types(seam.read_data_file(table, f, schema))
        if f.file_path in gone:
            rows = rows.filter(
                pc.invert(pc.is_in(row_numbers(rows.num_rows), value_set=pa.array(sorted(gone[f.file_path]), pa.int64())))
            )
        file_keys = upsert._cast_like(rows.select(names), keys.table.select(names).schema)
        numbered = file_keys.append_column("_row", row_numbers(rows.num_rows))
        at = numbered.join(wanted.table.select(names), names, join_type="left semi").column("_row")
        for k, row in zip(file_keys.take(at).to_pylist(), rows.take(at).to_pylist(), strict=True):
            rows_of[tuple(k[name] for name in names)] = row
    table_keys = [tuple(r[name] for name in names) for r in keys.table.select(names).to_pylist()]
    orders = keys.table.column(ORDER).to_pylist() if ORDER in keys.table.column_names else [None] * n
    batch_keys = [tuple(r[name] for name in batch_names) for r in changes.select(batch_names).to_pylist()]
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for i, (k, order) in enumerate(zip(table_keys, orders, strict=True)):
        row = rows_of.get(k)
        if row is None:
            continue
        held = row.get(table_column) if table_column is not None else None
        if held is not None and order is not None and _greater(held, order):  # a live row's own order value
            older[i] = True
        if not older[i]:
            found[batch_keys[i]] = row
    return TableBefore(found, tuple(older))


def _greater(held: Any, order: Any) -> bool:
    """A live row's order value above a change's (as upsert_order orders them: an aware and a naive timestamp in UTC)."""
    if isinstance(held, datetime.datetime) and isinstance(order, datetime.datetime):
        held, order = (v if v.tzinfo else v.replace(tzinfo=datetime.timezone.utc) for v in (held, order))
    return bool(held > order)


def _one_by_one(c: SinkContext, table: Table, changes: pa.Table, rows_for: Sequence[bool], batch_id: int) -> TableBefore:
    """:func:`_before` of ``changes`` one at a time, on the same read (some key does not fit the table's type: not in
    it)."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    older: list[bool] = []
    for i in range(changes.num_rows):
        one = _before(c, table, changes.slice(i, 1), rows_for[i : i + 1], batch_id)
        rows.update(one.rows)
        older.append(one.older[0])
    return TableBefore(rows, tuple(older))


def _stored(
    table: Table, branch: str, name: str, schema: Schema, new: pa.Table, key: list[str]
) -> tuple[pa.Table | None, frozenset[tuple[Any, ...]], list[DataFile]]:
    """The stored versions of the batch's keys (the module's step 1) as one Arrow table (None: the history holds no
    file), each with its place (``_path``, ``_pos``); the keys whose every version is among them; the data files read."""
    head = table.metadata.snapshot_by_name(branch)
    if head is None:
        return None, frozenset(), []
    has_deletes, live = seam.branch_data_files(table, branch)
    if not live:
        return None, frozenset(), []
    key_names = [schema.find_field(k, case_sensitive=False).name for k in key]
    keys_table = new.select(key_names).append_column(DELETED, pa.repeat(False, new.num_rows))
    keys = upsert.BatchKeys(name, schema, keys_table)
    specs = table.specs()
    candidates = [f for f in live if keys.may_hold(f, specs, schema)]
    valid_to_id = schema.find_field(HISTORY_VALID_TO).field_id
    gone = upsert._deleted_positions(table, branch, name) if has_deletes else {}
    read: dict[str, pa.Table] = {}

    def rows_of(f: DataFile) -> pa.Table:
        if f.file_path not in read:
            rows = seam.with_small_types(seam.read_data_file(table, f, schema))
            rows = rows.append_column("_pos", row_numbers(rows.num_rows))
            if f.file_path in gone:
                at = pa.array(sorted(gone[f.file_path]), pa.int64())
                rows = rows.filter(pc.invert(pc.is_in(rows.column("_pos"), value_set=at)))
            read[f.file_path] = rows
        return read[f.file_path]

    def of_keys(f: DataFile, wanted: pa.Table, *, latest: bool) -> pa.Table:
        rows = rows_of(f)
        if latest:
            rows = rows.filter(pc.is_null(rows.column(HISTORY_VALID_TO)))
        rows = _with_keys(rows, wanted, key_names)
        return rows.append_column("_path", pa.repeat(pa.scalar(f.file_path, pa.string()), rows.num_rows))

    wanted = new.select(key_names).group_by(key_names, use_threads=False).aggregate([])
    latest_parts = []
    for f in candidates:
        nulls = (f.null_value_counts or {}).get(valid_to_id)
        if nulls == 0:
            continue  # every version in it is closed: no latest version there
        latest_parts.append(of_keys(f, wanted, latest=True))
    latest = pa.concat_tables(latest_parts, promote_options="permissive") if latest_parts else None
    late: frozenset[tuple[Any, ...]] = frozenset()
    if latest is not None and latest.num_rows:
        keys_of_latest = latest.select(key_names)
        twice = keys_of_latest.group_by(key_names, use_threads=False).aggregate([([], "count_all")])
        twice = twice.filter(pc.greater(twice.column("count_all"), 1))
        if twice.num_rows:
            k = tuple(twice.slice(0, 1).to_pylist()[0][n] for n in key_names)
            raise LakesinkError(
                f"history table {name} holds two latest versions (valid_to null) of key "
                f"({', '.join(f'{n}={v!r}' for n, v in zip(key_names, k, strict=True))}): it was changed by another "
                "writer. Nothing was committed; repair the history table (one latest version per key)"
            )
        # a change not newer than its key's latest version (late, or redelivered): every version of its key is read
        stored_order = keys_of_latest.append_column("_latest", latest.column(HISTORY_CHANGE_ORDER))
        order = new.column(HISTORY_CHANGE_ORDER).cast(latest.schema.field(HISTORY_CHANGE_ORDER).type)
        changes = _keys_typed(new, latest, key_names).append_column("_order", order)
        paired = changes.join(stored_order, key_names, join_type="inner", use_threads=False)
        older = paired.filter(pc.less_equal(paired.column("_order"), paired.column("_latest")))
        late = frozenset(
            tuple(r[n] for n in key_names)
            for r in older.select(key_names).group_by(key_names, use_threads=False).aggregate([]).to_pylist()
        )
    if not late:
        return latest, frozenset(), [f for f in candidates if f.file_path in read]
    late_keys = pa.Table.from_pylist([dict(zip(key_names, k, strict=True)) for k in late], schema=new.select(key_names).schema)
    parts = [of_keys(f, late_keys, latest=False) for f in candidates]
    assert latest is not None
    parts.append(_with_keys(latest, late_keys, key_names, without=True))
    return pa.concat_tables(parts, promote_options="permissive"), late, [f for f in candidates if f.file_path in read]


def checked_changes(rows: pa.Table, keys: Sequence[str], options: SinkOptions, *, batch_id: int, table: str) -> HistoryChanges:
    """The batch's changes for the history of ``table`` (``rows``: the stream's columns, :data:`DELETED`, the order value
    and the time), an UpsertKeyError before anything is committed when a key, an order value or a time is null (or an
    order value NaN): the history orders and dates every change by them."""
    for column, option, what in (
        *((k, UPSERT_KEY, f"key column {k!r}") for k in keys),
        (HISTORY_CHANGE_ORDER, ORDER_BY, f"'{ORDER_BY}' column {options.order_by!r}"),
        (HISTORY_VALID_FROM, HISTORY_TIME, f"'{HISTORY_TIME}' column {options.history_time!r}"),
    ):
        nulls = rows.column(column).null_count
        if nulls:
            raise UpsertKeyError(
                f"batch {batch_id} has {nulls} change(s) whose {what} is null; the history of {table} orders and dates "
                f"every change by option '{option}'. Nothing was committed; filter or fill those rows before the sink"
            )
    order = rows.column(HISTORY_CHANGE_ORDER)
    if pa.types.is_floating(order.type) and pc.any(pc.is_nan(order)).as_py():
        raise UpsertKeyError(
            f"batch {batch_id} has a change whose '{ORDER_BY}' value is NaN; the history of {table} cannot order it. "
            "Nothing was committed"
        )
    stream = pa.schema([f for f in rows.schema if f.name not in (DELETED, HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM, UNAVAILABLE)])
    assert options.history_time is not None
    # the time and order the changes carry (a change stream's are stream columns the table does not take)
    carried = [pa.field(options.history_time, rows.schema.field(HISTORY_VALID_FROM).type)]
    if options.order_by is not None:
        carried.append(pa.field(options.order_by, rows.schema.field(HISTORY_CHANGE_ORDER).type))
    schema = history_schema(stream, options, outside=pa.schema(carried))
    return HistoryChanges(
        rows=rows,
        key=tuple(keys),
        of=table,
        schema=schema,
        rereads=options.order_by == CDC_ORDER_BY,
        time_column=options.history_time,
    )


def changes_of_tasks(results: Sequence[Any], options: SinkOptions, *, batch_id: int, table: str) -> HistoryChanges | None:
    """format("lakesink"): the changes the tasks returned for the history (TaskResult.history), joined; None when no
    task returned any (an empty batch)."""
    parts = [pa.ipc.open_stream(r.history).read_all() for r in results if getattr(r, "history", None)]
    if not parts:
        return None
    rows = pa.concat_tables(parts, promote_options="permissive")
    by_name = {n.lower(): n for n in rows.column_names}
    keys = [by_name.get(k.lower(), k) for k in options.upsert_key]
    return checked_changes(rows, keys, options, batch_id=batch_id, table=table)


def history_options(options: SinkOptions) -> SinkOptions:
    """The options of the sink that writes ``options``' history table: same catalog, branch and sink id (the history
    table holds this sink's replay markers as the table does), created when missing as format 2, with the table's
    merge-schema (a column the batch adds reaches the history in the same commit) and maintenance, no key."""
    assert options.history is not None
    return SinkOptions(
        table=options.history.of(options.table),
        catalog_name=options.catalog_name,
        catalog_properties=options.catalog_properties,
        checkpoint_location=options.checkpoint_location,
        branch=options.branch,
        sink_id=options.sink_id,
        create_table=options.create_table,
        merge_schema=options.merge_schema,
        format_version=2,
        maintenance=options.maintenance,
    )


def history_schema(stream: pa.Schema, options: SinkOptions, *, outside: pa.Schema | None = None) -> pa.Schema:
    """The history table's columns for a stream of ``stream``'s columns: the table's, then valid_from and valid_to (the
    type of option history-time's column), is_current, operation and change_order (option order-by's column's type, else
    the batch id's: long). ``outside``: stream columns the table does not take (a routed sink's payload tables: the
    change stream's order and time) where option history-time and order-by may be found too."""
    assert options.history_time is not None
    by_name = {f.name.lower(): f for f in (outside or ())}
    by_name.update({f.name.lower(): f for f in stream})
    time = by_name.get(options.history_time.lower())
    if time is None:
        raise InvalidOptionError(
            f"option '{HISTORY_TIME}' names column {options.history_time!r}, which the stream does not have (columns: "
            f"{', '.join(stream.names)}{''.join(', ' + n for n in (outside.names if outside is not None else ()))})"
        )
    if not (pa.types.is_timestamp(time.type) or pa.types.is_date(time.type)):
        raise InvalidOptionError(
            f"option '{HISTORY_TIME}' names column {time.name!r} of type {time.type}: it must be a timestamp or a date "
            "(each change's time at its source, the versions' valid_from)"
        )
    order_type: pa.DataType = pa.int64()
    if options.order_by is not None:
        found = by_name.get(options.order_by.lower())
        if found is not None:
            order_type = found.type
    taken = [f.name for f in stream if f.name.lower() in {c.lower() for c in HISTORY_COLUMNS}]
    if taken:
        raise InvalidOptionError(
            f"option '{HISTORY}': the stream has column(s) {', '.join(repr(t) for t in taken)}, which the history table "
            f"adds ({', '.join(HISTORY_COLUMNS)}); rename them before the sink (docs/history.md)"
        )
    return pa.schema(
        [
            *stream,
            pa.field(HISTORY_VALID_FROM, time.type),
            pa.field(HISTORY_VALID_TO, time.type),
            pa.field(HISTORY_IS_CURRENT, pa.bool_()),
            pa.field(HISTORY_OPERATION, pa.string()),
            pa.field(HISTORY_CHANGE_ORDER, order_type),
        ]
    )
