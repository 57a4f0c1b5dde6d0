"""Option history's linking of a key's versions (lakesink.driver.actions.history.link), without Spark or a catalog:
the order of versions by order value, late changes re-linking stored versions, redeliveries, deletes, conflicts."""

from __future__ import annotations

import datetime
import math
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from lakesink.cdc.positions import any_gtid_order, gtid_commit_ms
from lakesink.driver.actions.history import link, link_batch
from lakesink.errors import UpsertKeyError
from lakesink.table.keys import DELETED

T = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)


def change(key: int, order: int, value: Any = "x", *, deleted: bool = False) -> dict[str, Any]:
    return {
        "id": key,
        "value": value,
        "valid_from": T + datetime.timedelta(minutes=order),
        "change_order": order,
        DELETED: deleted,
    }


def stored(
    key: int, order: int, nxt: int | None, operation: str, *, current: bool, path: str = "f", pos: int = 0, value: Any = "x"
) -> dict[str, Any]:
    return {
        "id": key,
        "value": value,
        "valid_from": T + datetime.timedelta(minutes=order),
        "valid_to": T + datetime.timedelta(minutes=nxt) if nxt is not None else None,
        "is_current": current,
        "operation": operation,
        "change_order": order,
        "_path": path,
        "_pos": pos,
    }


def chain(rows: list[dict[str, Any]]) -> list[tuple[Any, str, bool, int | None]]:
    out = []
    for r in sorted(rows, key=lambda r: r["change_order"]):
        to = r["valid_to"]
        out.append((r["change_order"], r["operation"], r["is_current"], int((to - T).total_seconds() // 60) if to else None))
    return out


def test_a_keys_changes_in_one_batch_are_versions_each_closed_by_the_next() -> None:
    done = link([change(1, 3), change(1, 1), change(1, 2, deleted=True), change(1, 4)], [], key=["id"], whole=frozenset())
    assert chain(done.rows) == [
        (1, "insert", False, 2),
        (2, "delete", False, 3),
        (3, "insert", False, 4),
        (4, "update", True, None),
    ]
    assert (done.added, done.changed, done.redelivered, done.deleted) == (4, 0, 0, {})


def test_a_newer_change_closes_the_stored_latest_version_only() -> None:
    latest = stored(1, 5, None, "update", current=True, path="a", pos=7)
    done = link([change(1, 9)], [latest], key=["id"], whole=frozenset())
    # the stored latest keeps its operation (its predecessor was not read), gets valid_to and is no longer current
    assert chain(done.rows) == [(5, "update", False, 9), (9, "update", True, None)]
    assert done.deleted == {"a": [7]} and done.changed == 1 and done.added == 1


def test_a_late_change_takes_its_place_and_re_links_the_versions_around_it() -> None:
    versions = [
        stored(1, 1, 5, "insert", current=False, path="a", pos=0),
        stored(1, 5, None, "update", current=True, path="b", pos=3),
    ]
    done = link([change(1, 3, deleted=True)], versions, key=["id"], whole=frozenset({(1,)}))
    # 1 now ends at 3 (the late delete), the delete ends at 5, and 5 -- after a delete -- is an insert, still current
    assert chain(done.rows) == [(1, "insert", False, 3), (3, "delete", False, 5), (5, "insert", True, None)]
    assert done.deleted == {"a": [0], "b": [3]} and done.changed == 2 and done.added == 1


def test_a_late_change_older_than_every_version_becomes_the_first() -> None:
    versions = [stored(1, 5, None, "insert", current=True, path="b", pos=1)]
    done = link([change(1, 2)], versions, key=["id"], whole=frozenset({(1,)}))
    assert chain(done.rows) == [(2, "insert", False, 5), (5, "update", True, None)]


def test_a_redelivered_change_is_kept_once_and_a_different_change_with_its_order_is_an_error() -> None:
    versions = [stored(1, 5, None, "insert", current=True, value=math.nan)]
    again = change(1, 5, value=math.nan)
    done = link([again, dict(again)], versions, key=["id"], whole=frozenset({(1,)}))
    assert (done.rows, done.redelivered) == ([], 2)
    with pytest.raises(UpsertKeyError, match=r"key \(id=1\) have the same order value 5 \(one in the history"):
        link([change(1, 5, value="other")], versions, key=["id"], whole=frozenset({(1,)}), table_name="db.t")
    with pytest.raises(UpsertKeyError, match="both in this batch"):
        link([change(2, 1), change(2, 1, deleted=True)], [], key=["id"], whole=frozenset())


def test_by_source_position_a_change_at_a_seeds_position_is_that_change_again_whatever_its_time() -> None:
    """A change stream's order values are source positions (one value, one change): a seeded version (dated by the
    history, lakesink.driver.actions.history._seeds) and that change re-sent with its own source time are one change;
    other values at its position are still an error. Without ``by_position`` (an order-by column) the time counts."""
    seed = stored(1, 5, None, "insert", current=True)
    seed["valid_from"] = T + datetime.timedelta(days=1)  # the seeding's time, not the source's
    again = change(1, 5)
    done = link([again], [seed], key=["id"], whole=frozenset({(1,)}), by_position=True)
    assert (done.rows, done.new, done.redelivered) == ([], [], 1)
    with pytest.raises(UpsertKeyError, match="same order value 5"):
        link([change(1, 5, value="other")], [seed], key=["id"], whole=frozenset({(1,)}), by_position=True)
    with pytest.raises(UpsertKeyError, match="same order value 5"):
        link([again], [seed], key=["id"], whole=frozenset({(1,)}))


def test_unchanged_stored_versions_are_not_rewritten() -> None:
    versions = [
        stored(1, 1, 5, "insert", current=False, path="a", pos=0),
        stored(1, 5, None, "update", current=True, path="b", pos=3),
    ]
    done = link([change(1, 9)], versions, key=["id"], whole=frozenset({(1,)}))
    assert done.deleted == {"b": [3]} and done.changed == 1


def _outcome(done: Any, changes: list[dict[str, Any]]) -> tuple[dict[Any, Any], dict[Any, Any], int, int, int]:
    """What a linking gives, whichever path: each new version's links by (key, order), each stored version's new links
    by (key, order), the counts."""
    by_index = {c["_index"]: c for c in changes}
    new: dict[Any, Any] = {}
    for index, valid_to, current, operation in done.new:
        new[(by_index[index]["id"], by_index[index]["change_order"])] = (valid_to, current, operation)
    if done.linked_new is not None:
        for row in done.linked_new.to_pylist():
            c = by_index[row["_index"]]
            new[(c["id"], c["change_order"])] = (row["valid_to"], row["is_current"], row["operation"])
    stored = [*done.rows, *(done.relinked.to_pylist() if done.relinked is not None else [])]
    relinked = {(r["id"], r["change_order"]): (r["valid_to"], r["is_current"], r["operation"]) for r in stored}
    return new, relinked, done.added, done.changed, done.redelivered


@pytest.mark.parametrize("seed", range(40))
def test_the_batch_linking_in_arrow_gives_what_the_python_linking_gives(seed: int) -> None:
    """link_batch (keys without late or repeated changes linked in Arrow) against link (every key in Python) on random
    batches: stored latest versions alive or deleted, several changes per key, deletes, late changes and redeliveries."""
    rng = random.Random(seed)
    versions = []
    for k in range(8):
        if rng.random() < 0.6:
            operation = rng.choice(["insert", "update", "delete"])
            versions.append(stored(k, 10 + k, None, operation, current=operation != "delete", path=f"f{k % 3}", pos=k))
    changes = []
    for i in range(rng.randrange(1, 30)):
        k = rng.randrange(8)
        order = rng.randrange(20, 60) if rng.random() < 0.85 else rng.randrange(0, 10)  # some late (older) changes
        changes.append({**change(k, order, deleted=rng.random() < 0.2), "_index": i})
    first: dict[Any, dict[str, Any]] = {}
    for c in changes:  # one change per (key, order): a repeated order is a redelivery of it
        c[DELETED] = first.setdefault((c["id"], c["change_order"]), c)[DELETED]
    latest = {r["id"]: r["change_order"] for r in versions}
    whole = frozenset((c["id"],) for c in changes if c["id"] in latest and c["change_order"] <= latest[c["id"]])
    light = pa.Table.from_pylist([{k: c[k] for k in ("id", "change_order", "valid_from", DELETED, "_index")} for c in changes])
    full = {c["_index"]: {k: v for k, v in c.items() if k != "_index"} for c in changes}
    in_arrow = link_batch(light, versions, key=["id"], whole=whole, full=lambda c: {**full[c["_index"]], DELETED: c[DELETED]})
    in_python = link(
        [dict(c) for c in changes], versions, key=["id"], whole=whole, full=lambda c: {**full[c["_index"]], DELETED: c[DELETED]}
    )
    assert _outcome(in_arrow, changes) == _outcome(in_python, changes)
    assert {p: sorted(v) for p, v in in_arrow.deleted.items()} == {p: sorted(v) for p, v in in_python.deleted.items()}


# --- a change stream's MySQL change read again at other coordinates (a GTID failover) ---------------------------------

COMMIT_MS = 1_700_000_000_000


def gtid(coordinates: int, value: Any = "x", *, ms: int = COMMIT_MS, deleted: bool = False) -> dict[str, Any]:
    """A change of key 1 as a MySQL change with a GTID orders it: its commit time (ms) above its binlog coordinates."""
    return {
        "id": 1,
        "value": value,
        "valid_from": T + datetime.timedelta(milliseconds=ms - COMMIT_MS),
        "change_order": Decimal(ms * 10**22 + coordinates),  # decimal(38,0), as cdc_order
        DELETED: deleted,
    }


def as_stored(c: dict[str, Any], nxt: dict[str, Any] | None, operation: str, pos: int) -> dict[str, Any]:
    row = {k: v for k, v in c.items() if k != DELETED}
    return {
        **row,
        "valid_to": nxt["valid_from"] if nxt else None,
        "is_current": nxt is None and operation != "delete",
        "operation": operation,
        "_path": "f",
        "_pos": pos,
    }


def test_a_gtid_change_read_again_at_other_coordinates_is_one_version() -> None:
    """A failover's new primary re-sends a transaction it replicated at its own coordinates (lower or higher), with its
    GTID's commit time: next to the version it copies, saying the same, it is that version (counted as redelivered);
    without the change stream's order (commit_of None) it is a version of its own, as before."""
    first = gtid(300_000_000, "a", ms=COMMIT_MS - 5)
    original = gtid(500_000_000, "b")
    versions = [as_stored(first, original, "insert", 0), as_stored(original, None, "update", 1)]
    for coordinates in (100_000_000, 900_000_000):  # below and above the original's
        copy = gtid(coordinates, "b")
        for linker in (link, link_batch):
            kw: dict[str, Any] = {"key": ["id"], "whole": frozenset({(1,)}), "commit_of": gtid_commit_ms}
            if linker is link_batch:  # its changes carry their place; the whole row is the change without it
                kw["full"] = lambda c: {k: v for k, v in c.items() if k != "_index"}
            changes = [{**copy, "_index": 0}] if linker is link_batch else [copy]
            given = pa.Table.from_pylist(changes) if linker is link_batch else changes
            done = linker(given, versions, **kw)
            assert (done.added, done.changed, done.redelivered, done.rows, done.deleted) == (0, 0, 1, [], {}), (
                linker.__name__,
                coordinates,
            )
        if coordinates > 500_000_000:  # newer than the stored latest: not a late change, yet compared, not linked in Arrow
            light = pa.Table.from_pylist([{**copy, "_index": 0}])
            done = link_batch(
                light,
                versions[-1:],
                key=["id"],
                whole=frozenset(),
                commit_of=gtid_commit_ms,
                full=lambda c: {k: v for k, v in c.items() if k != "_index"},
            )
            assert (done.added, done.changed, done.redelivered) == (0, 0, 1)
        plain = link([copy], versions, key=["id"], whole=frozenset({(1,)}))
        assert plain.added == 1 and plain.redelivered == 0
    # both in one batch, the copy first
    done = link([gtid(100, "b"), gtid(900, "b")], [], key=["id"], whole=frozenset(), commit_of=gtid_commit_ms)
    assert (done.added, done.redelivered) == (1, 1)
    assert chain(done.rows) == [(Decimal(COMMIT_MS * 10**22 + 100), "insert", True, None)]


def test_a_gtid_change_read_again_next_to_a_seeded_version_is_that_version() -> None:
    """A history seeded from its table (lakesink.driver.actions.history._seeds: the version's time is the history's,
    not the source's): a failover's copy of the row's last change, at other coordinates with its own commit time, is
    still that version."""
    seed = as_stored(gtid(500_000_000, "b"), None, "insert", 0)
    seed["valid_from"] = T + datetime.timedelta(days=2)
    copy = gtid(900_000_000, "b")
    done = link([copy], [seed], key=["id"], whole=frozenset({(1,)}), commit_of=gtid_commit_ms, by_position=True)
    assert (done.added, done.changed, done.redelivered, done.rows) == (0, 0, 1, [])


def test_changes_at_one_commit_that_differ_or_are_not_neighbours_stay_versions() -> None:
    """One transaction (one commit time) changing a row b -> c -> b: the last is a change (its neighbour says c), and
    so is a change to another value, and a delete of a row holding the same values."""
    b1, c, b2 = gtid(100, "b"), gtid(200, "c"), gtid(300, "b")
    done = link([b1, c, b2], [], key=["id"], whole=frozenset(), commit_of=gtid_commit_ms)
    assert (done.added, done.redelivered) == (3, 0)
    gone = link([b1, gtid(200, "b", deleted=True)], [], key=["id"], whole=frozenset(), commit_of=gtid_commit_ms)
    assert (gone.added, gone.redelivered) == (2, 0)
    other = link([b1, gtid(900, "b", ms=COMMIT_MS + 1)], [], key=["id"], whole=frozenset(), commit_of=gtid_commit_ms)
    assert (other.added, other.redelivered) == (2, 0)  # another commit time: another change


def test_only_a_batch_holding_gtid_orders_looks_for_copies() -> None:
    """The copy check runs for a batch holding a MySQL GTID change's order value (lakesink.cdc.positions: the band
    [10^34, 10^37)), not for a PostgreSQL LSN, a SQL Server LSN (10^37 and above) or a binlog epoch's coordinates."""
    decimal = pa.decimal128(38, 0)
    mysql = Decimal(COMMIT_MS * 10**22 + 5)
    assert any_gtid_order(pa.chunked_array([pa.array([Decimal(7), mysql], decimal)]))
    others = [Decimal(7), Decimal(10**37 + 3), Decimal(3 * 10**22 + 16 * 10**16)]
    assert not any_gtid_order(pa.chunked_array([pa.array(others, decimal)]))
    assert not any_gtid_order(pa.array([], decimal)) and not any_gtid_order(pa.array([5], pa.int64()))
