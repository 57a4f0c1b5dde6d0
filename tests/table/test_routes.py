"""Routing values (lakesink.table.routes.parse_route, the one switch point of option route-by): what may become a
table, and why a value may not (issue 30: bytes that are not UTF-8, names too long for a folder or a SQL catalog)."""

from __future__ import annotations

import itertools

import pytest

from lakesink.errors import RoutingError
from lakesink.table.routes import (
    MAX_NAMESPACE_CHARS,
    InvalidRoute,
    Route,
    batch_routes,
    parse_namespace,
    parse_route,
    routing_value,
)


@pytest.mark.parametrize("raw", [b"\xff", b"orders\xfe", b"db.\xc3(", b"\xed\xa0\x80"])  # the last: a UTF-16 surrogate
def test_bytes_that_are_not_utf8_are_an_invalid_route_that_keeps_them(raw: bytes) -> None:
    value = routing_value(raw)
    assert value == raw  # not decoded (nor replaced): the dead letter keeps the exact bytes
    route = parse_route(value, ("db",))
    assert isinstance(route, InvalidRoute) and route.value == raw
    assert route.reason.startswith("not valid UTF-8: byte 0x")
    assert route.text == raw.decode("utf-8", "backslashreplace")  # the dead letter's `table`: bad bytes as \xHH


def test_bytes_that_are_utf8_are_the_string_they_hold() -> None:
    assert routing_value(b"db.orders") == "db.orders"
    assert routing_value(None) is None
    assert parse_route(b"orders", ("db",)) == parse_route("orders", ("db",)) == Route(("db",), "orders")


def test_a_namespace_too_long_for_one_folder_or_a_sql_catalog_column_is_an_invalid_route() -> None:
    """Two levels of 128 characters passed validation, then became a 260-byte folder ``<namespace>.db``."""
    a, b = "a" * 128, "b" * 128
    route = parse_route(f"{a}.{b}.t")
    assert isinstance(route, InvalidRoute) and "at most 252" in route.reason
    # the longest namespace that fits: its folder is 255 bytes, its name 252 characters (SQL catalogs keep 255)
    longest = f"{a}.{'b' * (MAX_NAMESPACE_CHARS - 129)}"
    assert len(longest) == MAX_NAMESPACE_CHARS and len(longest + ".db") == 255
    assert parse_route(f"{longest}.{'t' * 128}") == Route(tuple(longest.split(".")), "t" * 128)
    assert isinstance(parse_route(f"{longest}x.t"), InvalidRoute)
    # a table name alone in a namespace of option `namespace` that is too long cannot happen: the option is refused
    assert isinstance(parse_namespace(f"{a}.{b}"), str) and parse_namespace(longest) == tuple(longest.split("."))


def test_a_batch_with_several_bad_routing_values_names_them_all_in_one_order_whatever_order_they_came_in() -> None:
    """The routing values of a foreach batch come from a Spark distinct, in no fixed order: the RoutingError must not
    depend on it (CI once saw 0xFE named where a test expected 0xFF). Before: the first bad value met was named alone."""
    values = ["t0", b"\xff", b"t0\xfe", None]
    messages = set()
    for order in itertools.permutations(values):
        with pytest.raises(RoutingError) as info:
            batch_routes(order, ("db",), "route", 3)
        messages.add(str(info.value))
    assert len(messages) == 1
    (message,) = messages
    assert "byte 0xFF at offset 0" in message and "byte 0xFE at offset 2" in message and "null" in message
    assert "and 2 more" in message and message.startswith("batch 3: routing column 'route' holds ")
