"""Option history's linking of a key's versions (lakesink.driver.actions.history.link), without Spark or a catalog:
the order of versions by order value, late changes re-linking stored versions, redeliveries, deletes, conflicts."""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest

from lakesink.driver.actions.history import link
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


def chain(rows: list[dict[str, Any]]) -> list[tuple[int, str, bool, int | None]]:
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


def test_unchanged_stored_versions_are_not_rewritten() -> None:
    versions = [
        stored(1, 1, 5, "insert", current=False, path="a", pos=0),
        stored(1, 5, None, "update", current=True, path="b", pos=3),
    ]
    done = link([change(1, 9)], versions, key=["id"], whole=frozenset({(1,)}))
    assert done.deleted == {"b": [3]} and done.changed == 1
