"""Routing values (option ``route-by``): the table a row's routing column names, validated, never interpolated.

Runs anywhere (executors split rows by it; the driver checks the tables of a batch with it). A routing value comes
from the data, so it is untrusted: it is parsed into a typed :class:`Route` (namespace levels and a table name made
of a safe set of characters) or an :class:`InvalidRoute` saying why not. A route never reaches a path or a SQL
statement as text: pyiceberg's catalogs bind identifiers as parameters, and a table's location is made from the
validated parts only.

:func:`parse_route` is the one switch point of a routing value: a batch with an invalid route fails
(:class:`lakesink.errors.RoutingError`, naming the value and the batch), or, with option ``dead-letter-table``, its
rows are dead letters of error ``invalid-route`` (lakesink.executor.routed_writer).

A routing value's bytes need not be UTF-8 (a Kafka key cast to a string): :func:`routing_value` hands such a value on
as its bytes, which :func:`parse_route` finds invalid. The names are bounded by what every catalog and filesystem
takes: a new table's namespace becomes one folder, ``<namespace>.db`` (at most 255 bytes, a file name's limit), and
pyiceberg's SQL catalog keeps the dotted namespace and the table name in columns of 255 characters.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from lakesink.errors import RoutingError

#: A namespace level or a table name: letters, digits and '_' (and '-' after the first character), 1 to 128 of them.
#: Nothing that a path or a SQL statement could read as a separator, a quote, a wildcard or a parent folder.
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
_MAX_LEVELS = 8
#: The dotted namespace: its folder ``<namespace>.db`` is one path segment (255 bytes at most on every common
#: filesystem), and pyiceberg's SQL catalog holds it in a column of 255 characters (enforced on PostgreSQL).
MAX_NAMESPACE_CHARS = 255 - len(".db")


@dataclass(frozen=True)
class TableIdentifier:
    """A table's namespace levels and name: its catalog identifier, written dotted (``db.events``). The base of a
    routing value's :class:`Route` and of option ``table``'s :class:`lakesink.options.TableName`."""

    namespace: tuple[str, ...]
    name: str
    identifier: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """The catalog identifier: the namespace levels, then the name (made once: every commit of the table uses it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "identifier", (*self.namespace, self.name))

    def __str__(self) -> str:
        return ".".join(self.identifier)


@dataclass(frozen=True, order=True)
class Route(TableIdentifier):
    """A valid routing value: the table it names (``namespace`` levels and ``name``)."""


@dataclass(frozen=True)
class InvalidRoute:
    """A routing value that names no table lakesink may write, and why."""

    value: object
    reason: str

    def describe(self) -> str:
        shown = repr(self.value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        return f"{shown} ({self.reason})"

    @property
    def text(self) -> str | None:
        """The raw value as a dead letter's ``table`` holds it: the string; bytes that are not UTF-8 with each bad
        byte as ``\\xHH`` (the row's JSON keeps them exactly); None for a null (or a value of another type)."""
        if isinstance(self.value, bytes):
            return self.value.decode("utf-8", "backslashreplace")
        return self.value if isinstance(self.value, str) else None


def parse_namespace(value: str) -> tuple[str, ...] | str:
    """A dotted namespace (option ``namespace``) as its levels, or the reason it is not one."""
    parts = tuple(value.split("."))
    bad = [p for p in parts if not _PART.fullmatch(p)]
    if bad or not parts:
        return f"each level must be 1 to 128 letters, digits, '_' or '-' (not first), got {bad[0]!r}" if bad else "it is empty"
    if len(parts) > _MAX_LEVELS:
        return f"at most {_MAX_LEVELS} levels"
    if len(value) > MAX_NAMESPACE_CHARS:
        return _too_long(value)
    return parts


def _too_long(namespace: str) -> str:
    return (
        f"the namespace is {len(namespace)} characters, at most {MAX_NAMESPACE_CHARS} (dots included): its folder "
        f"'<namespace>.db' is one path segment (255 bytes at most), and SQL catalogs keep it in 255 characters"
    )


def routing_value(raw: bytes | None) -> str | bytes | None:
    """A routing column's value from its bytes: the string, or the bytes themselves when they are not UTF-8
    (:func:`parse_route` finds them invalid, and a dead letter keeps them exactly)."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


def parse_route(
    value: object, default_namespace: tuple[str, ...] = (), allowed: tuple[tuple[str, ...], ...] = ()
) -> Route | InvalidRoute:
    """The table ``value`` (a routing column's value) names: ``ns.table`` (or ``a.b.table``), or ``table`` in
    ``default_namespace`` (option ``namespace``); else an :class:`InvalidRoute` with the reason. ``allowed`` (option
    ``route-namespaces``): the namespaces a route may name (compared exactly, case included); empty: any."""
    if isinstance(value, bytes | bytearray):  # a string's bytes (routing_value): its text, if they are UTF-8
        value = routing_value(bytes(value))
    route = _parse_route(value, default_namespace)
    if allowed and isinstance(route, Route) and route.namespace not in allowed:
        return InvalidRoute(
            value,
            f"namespace {'.'.join(route.namespace)!r} is not one of option 'route-namespaces' "
            f"({', '.join('.'.join(n) for n in allowed)})",
        )
    return route


def route_of(
    value: object, namespace: tuple[str, ...], column: str, batch_id: int, allowed: tuple[tuple[str, ...], ...] = ()
) -> Route:
    """The table a routing value names, or RoutingError naming the value and the batch."""
    route = parse_route(value, namespace, allowed)
    if isinstance(route, InvalidRoute):
        raise RoutingError(
            f"batch {batch_id}: routing column {column!r} holds {route.describe()}; nothing was committed. Every row "
            "must name the table it goes to"
        )
    return route


def routed_table(
    value: object, namespace: tuple[str, ...], dead_letter_table: str | None, allowed: tuple[tuple[str, ...], ...] = ()
) -> Route | InvalidRoute:
    """:func:`parse_route`; with option dead-letter-table, a value naming the dead-letter table (in any case) is no
    valid route either (the batch's rows never go into it as rows of a table)."""
    route = parse_route(value, namespace, allowed)
    if dead_letter_table is not None and isinstance(route, Route) and str(route).lower() == dead_letter_table.lower():
        return InvalidRoute(value, "it names the dead-letter table")
    return route


def _parse_route(value: object, default_namespace: tuple[str, ...]) -> Route | InvalidRoute:
    if value is None:
        return InvalidRoute(value, "null: every row needs a table name")
    if isinstance(value, bytes):  # bytes that are not UTF-8 (parse_route decoded the others)
        return InvalidRoute(value, f"not valid UTF-8: {_utf8_error(value)}")
    if not isinstance(value, str):
        return InvalidRoute(value, f"a {type(value).__name__}, not a string")
    if not value:
        return InvalidRoute(value, "empty: every row needs a table name")
    parts = value.split(".")
    for p in parts:
        if not _PART.fullmatch(p):
            return InvalidRoute(
                value,
                "a table name is 'table' or 'namespace.table', each part 1 to 128 letters, digits, '_' or '-' "
                f"(not first); {p!r} is not",
            )
    if len(parts) > _MAX_LEVELS + 1:
        return InvalidRoute(value, f"at most {_MAX_LEVELS} namespace levels")
    if len(parts) == 1:
        if not default_namespace:
            return InvalidRoute(value, "no namespace: write 'namespace.table', or set option 'namespace'")
        return Route(default_namespace, parts[0])
    namespace = value.rpartition(".")[0]
    if len(namespace) > MAX_NAMESPACE_CHARS:
        return InvalidRoute(value, _too_long(namespace))
    return Route(tuple(parts[:-1]), parts[-1])


def _utf8_error(raw: bytes) -> str:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"byte 0x{raw[e.start]:02X} at offset {e.start} ({e.reason})"
    return "valid"  # pragma: no cover (only called on bytes that are not UTF-8)


def batch_routes(
    values: Iterable[object],
    namespace: tuple[str, ...],
    column: str,
    batch_id: int,
    allowed: tuple[tuple[str, ...], ...] = (),
    dead_letter_table: str | None = None,
) -> list[Route]:
    """The tables a batch's routing values name, sorted: RoutingError naming the bad values (sorted by their repr, so
    the message is the same whatever order Spark returned the distinct values in), or two
    that differ only in case; with option dead-letter-table, values that name no valid table are left out (their rows
    are dead letters: :func:`routed_table`)."""
    if dead_letter_table is None:
        parsed = [parse_route(v, namespace, allowed) for v in values]
        bad = sorted((r for r in parsed if isinstance(r, InvalidRoute)), key=lambda r: repr(r.value))
        if bad:  # every bad value, in one order whatever order the distinct values came in
            more = f" (and {len(bad) - 1} more: {', '.join(r.describe() for r in bad[1:4])})" if len(bad) > 1 else ""
            raise RoutingError(
                f"batch {batch_id}: routing column {column!r} holds {bad[0].describe()}{more}; nothing was committed. "
                "Every row must name the table it goes to"
            )
        routes = sorted({r for r in parsed if isinstance(r, Route)})
    else:
        found = (routed_table(v, namespace, dead_letter_table, allowed) for v in values)
        routes = sorted({r for r in found if not isinstance(r, InvalidRoute)})
    clashes = case_collisions(routes)
    if clashes:
        a, b = clashes[0]
        raise RoutingError(
            f"batch {batch_id}: routing values name tables {a} and {b}, which differ only in case: one table on a "
            "case-insensitive catalog (Glue, Hive), where one batch would commit twice into it. Nothing was "
            "committed; use one spelling per table"
        )
    return routes


def case_collisions(routes: Iterable[Route]) -> list[tuple[Route, Route]]:
    """Pairs of routes that differ only in case: one table on a case-insensitive catalog (Glue, Hive), so a batch
    with both would commit two snapshots of one batch into one table (and the second, found "already committed",
    would drop its rows)."""
    seen: dict[tuple[str, ...], Route] = {}
    out = []
    for r in sorted(set(routes)):
        key = tuple(p.lower() for p in r.identifier)
        if key in seen:
            out.append((seen[key], r))
        else:
            seen[key] = r
    return out


def tables_digest(tables: Iterable[str]) -> str:
    """The digest of a batch's set of tables (``lakesink.batch-tables-digest``): the first 16 hex digits of the
    SHA-256 of the sorted table names, one a line. Any table's snapshot of the batch carries it, so that a reader of
    the catalog can tell whether it found the batch in every table the batch wrote."""
    return hashlib.sha256("\n".join(sorted(set(tables))).encode("utf-8")).hexdigest()[:16]
