"""What every command of the ``lakesink`` command line shares: the catalog and table options, durations, points.

Tables are found the way the sink finds them (:func:`lakesink.driver.catalogs.load`): ``--catalog NAME`` names a
catalog of pyiceberg's configuration, ``--catalog-property KEY=VALUE`` (repeatable) gives ``load_catalog``
properties on top of it, and with neither the embedded default catalog under ``$LAKESINK_HOME`` is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar

import click
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    LiteralPredicate,
    Not,
    Or,
    Reference,
    SetPredicate,
    UnboundPredicate,
)
from pyiceberg.table import Table
from pyiceberg.types import StringType

from lakesink._pyiceberg import io as seam
from lakesink.audit import Point
from lakesink.audit.points import utc_by_default
from lakesink.driver import catalogs
from lakesink.errors import PROGRAMMING_ERRORS, AuditError, CatalogError, InvalidOptionError, did_you_mean
from lakesink.options import TableName
from lakesink.redaction import redact_secrets_in
from lakesink.table.keys import MAIN_BRANCH

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([wdhms])")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[wdhms])+")


def parse_duration(text: str) -> timedelta:
    """``3d``, ``12h``, ``90m``, ``45s``, ``2w``, combinations such as ``1d12h``, or ``0``."""
    value = text.strip().lower()
    if value == "0":
        return timedelta(0)
    if not _DURATION.fullmatch(value):
        raise ValueError(
            f"{text!r} is not a duration: use a number and a unit, w (weeks), d (days), h (hours), m (minutes) or "
            "s (seconds), for example 3d, 12h, 90m or 1d12h (or 0)"
        )
    return timedelta(seconds=sum(float(n) * _UNITS[unit] for n, unit in _DURATION_PART.findall(value)))


def format_duration(d: timedelta) -> str:
    """The shortest spelling of ``d`` that :func:`parse_duration` reads back (whole seconds)."""
    seconds = int(d.total_seconds())
    if seconds == 0:
        return "0s"
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2 on; the floor (8.1) is not
    """A duration option's value (3d, 12h, 90m, 1d12h, 0) as a timedelta; a bad one is click's usage error."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def duration_option(flag: str, help: str, default: timedelta | None = None) -> Callable[[F], F]:
    """A ``--flag DURATION`` option (no default: None when not given)."""
    if default is None:
        return click.option(flag, metavar="DURATION", type=Duration(), help=help)
    return click.option(flag, metavar="DURATION", type=Duration(), default=format_duration(default), show_default=True, help=help)


def _parse_properties(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item.split('=', 1)[0]!r} is not KEY=VALUE (for example uri=sqlite:///catalog.db)")
        props[key.strip()] = value
    return props


def catalog_options(command: F) -> F:
    """``--catalog`` and ``--catalog-property``: the same catalog resolution as the sink's options."""
    command = click.option(
        "--catalog-property",
        "catalog_properties",
        metavar="KEY=VALUE",
        multiple=True,
        callback=_parse_properties,
        help="A property for pyiceberg's load_catalog (type, uri, warehouse, ...); repeatable.",
    )(command)
    command = click.option(
        "--catalog",
        "catalog_name",
        metavar="NAME",
        help="A catalog defined in pyiceberg's configuration (.pyiceberg.yaml, PYICEBERG_CATALOG__* variables). "
        "With neither option: the embedded default catalog under $LAKESINK_HOME.",
    )(command)
    return command


def load_catalog(catalog_name: str | None, catalog_properties: dict[str, str]) -> Catalog:
    """The catalog of a command; it must exist (a command never creates one: a missing SQLite catalog file is an
    error naming the file, and for the embedded default where its folder comes from)."""
    return catalogs.load(catalog_name, catalog_properties, create=False)


def load_table(table: str, catalog_name: str | None, catalog_properties: dict[str, str]) -> Table:
    """The table, loaded the way the sink loads it; a :class:`~lakesink.errors.CatalogError` naming the table and
    the catalog otherwise (a malformed name is a usage error)."""
    try:
        name = TableName.parse(table)
    except InvalidOptionError:
        raise click.BadParameter(f"{table!r} is not '<namespace>.<table>' (for example db.events)", param_hint="TABLE") from None
    catalog = load_catalog(catalog_name, catalog_properties)
    try:
        return catalog.load_table(name.identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        _, props = catalogs.resolve_catalog_properties(catalog_name, catalog_properties)
        where = catalogs.location(catalog.name, props)
        found = _what_exists(catalog, name)
        raise CatalogError(f"table {name} does not exist in catalog {catalog.name!r} ({where}){found}") from None
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise CatalogError(f"cannot load table {name}: {redacted(e, catalog_name, catalog_properties)}") from None


_LISTED = 20
"""At most this many names are listed after "does not exist"."""


def _what_exists(catalog: Catalog, name: TableName) -> str:
    """What the catalog holds where ``name`` was looked for: the namespace's tables, or, when the namespace does not
    exist, the catalog's namespaces (the nearest name first, as a "did you mean"); empty when the listing fails."""
    namespace = ".".join(name.namespace)
    try:
        try:
            tables = sorted(".".join(t) for t in catalog.list_tables(name.namespace))
        except NoSuchNamespaceError:
            tables = None
        if tables is None or not tables and not _namespace_exists(catalog, name.namespace):
            namespaces = sorted(".".join(n) for n in catalog.list_namespaces())
            listed = _listing(namespaces)
            held = f"; the catalog's namespaces: {listed}" if namespaces else "; it has no namespace (no table yet)"
            return f": namespace {namespace!r} does not exist{did_you_mean(namespace, namespaces)}{held}"
    except PROGRAMMING_ERRORS:
        raise
    except Exception:
        return ""  # the error stays the table's; a catalog that cannot list adds nothing
    if not tables:
        return f"; namespace {namespace!r} has no table"
    return f"{did_you_mean(str(name), tables)}; the tables of namespace {namespace!r}: {_listing(tables)}"


def _namespace_exists(catalog: Catalog, namespace: tuple[str, ...]) -> bool:
    try:
        catalog.load_namespace_properties(namespace)
    except NoSuchNamespaceError:
        return False
    return True


def _listing(names: Sequence[str]) -> str:
    more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
    return ", ".join(names[:_LISTED]) + more


def redacted(e: BaseException, catalog_name: str | None, catalog_properties: dict[str, str]) -> str:
    _, props = catalogs.resolve_catalog_properties(catalog_name, catalog_properties)
    return redact_secrets_in(f"{type(e).__name__}: {e}", props)


@contextmanager
def table_value_errors() -> Iterator[None]:
    """pyiceberg's ValueError while a command reads a table (a column or value the table does not have) as an
    AuditError: the command line's message, not a traceback."""
    try:
        yield
    except ValueError as e:
        raise AuditError(str(e)) from e


def parse_point(ctx: click.Context, param: click.Parameter, value: str | None) -> Point | None:
    if value is None:
        return None
    try:
        return Point.parse(value)
    except AuditError as e:
        raise click.BadParameter(str(e)) from None


def parse_row_filter(ctx: click.Context, param: click.Parameter, value: str | None) -> BooleanExpression | None:
    """``--where``: an Iceberg row filter, read before anything else is (a syntax error is a usage error, not a
    parser's traceback)."""
    if value is None:
        return None
    try:
        return seam.parse_row_filter(value)
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        column = getattr(e, "col", None)
        where = f" at character {column}" if isinstance(column, int) else ""
        raise click.BadParameter(
            f"{value!r} is not an Iceberg row filter{where}: write comparisons (=, !=, <, <=, >, >=, in, not in, is null, "
            'is not null, like) of a column with a value, joined by and/or/not, for example "id > 5 and kind = 2" '
            "or \"ts >= '2026-11-23T00:00:00+00:00'\""
        ) from None


def check_row_filter(table: Table, row_filter: BooleanExpression | None) -> None:
    """``--where`` against the table it reads, before the read: each column it names must be one of the table's (as
    the scan binds them: the case as written) and each value convertible to that column's type -- else an
    :class:`~lakesink.errors.AuditError` naming the column, its type, the value and the table's columns (pyiceberg
    raises a TypeError for a value of another kind: a traceback, not a message)."""
    if row_filter is None:
        return
    schema = table.schema()
    columns = schema.column_names
    name = ".".join(table.name()[-2:])
    for predicate in _predicates(utc_by_default(row_filter, schema)):  # a time without offset: UTC, as the read takes it
        if not isinstance(predicate.term, Reference):
            continue
        column = predicate.term.name
        try:
            field = schema.find_field(column, case_sensitive=True)
        except ValueError:
            raise AuditError(
                f"--where names column {column!r}, which table {name} does not have{did_you_mean(column, columns)}; "
                f"its columns: {', '.join(columns)}"
            ) from None
        literals = [predicate.literal] if isinstance(predicate, LiteralPredicate) else []
        literals += sorted(predicate.literals, key=str) if isinstance(predicate, SetPredicate) else []
        for literal in literals:
            try:
                literal.to(field.field_type)
            except (TypeError, ValueError):  # pyiceberg: TypeError for another kind, ValueError for a bad text
                given = literal.value
                hint = f" (quote it: '{given}')" if not isinstance(given, str) and field.field_type == StringType() else ""
                raise AuditError(
                    f"--where: column {column!r} of table {name} holds {field.field_type} values; {given!r} is not one{hint}"
                ) from None


def _predicates(expression: BooleanExpression) -> Iterator[UnboundPredicate]:
    if isinstance(expression, (And, Or)):
        yield from _predicates(expression.left)
        yield from _predicates(expression.right)
    elif isinstance(expression, Not):
        yield from _predicates(expression.child)
    elif isinstance(expression, UnboundPredicate):
        yield expression


def parse_order_by(ctx: click.Context, param: click.Parameter, value: str | None) -> list[tuple[str, str]]:
    """``--order-by "ts desc, id"``: (column, ``ascending`` or ``descending``) pairs, as pyarrow's ``sort_by`` takes
    them."""
    if value is None:
        return []
    keys: list[tuple[str, str]] = []
    for item in value.split(","):
        words = item.split()
        if not words or len(words) > 2 or (len(words) == 2 and words[1].lower() not in ("asc", "desc")):
            raise click.BadParameter(
                f"{value!r}: give columns separated by commas, each optionally followed by asc or desc (for example "
                '"ts desc, id")'
            )
        keys.append((words[0], "descending" if words[-1].lower() == "desc" and len(words) == 2 else "ascending"))
    return keys


def check_order_by(table: Table, order_by: Sequence[tuple[str, str]]) -> None:
    """``--order-by``'s columns must be the table's top-level columns (an AuditError naming them otherwise)."""
    columns = [f.name for f in table.schema().fields]
    for column, _ in order_by:
        if column not in columns:
            raise AuditError(
                f"--order-by names column {column!r}, which table {'.'.join(table.name()[-2:])} does not have"
                f"{did_you_mean(column, columns)}; its columns: {', '.join(columns)}"
            )


def row_filter_option(help: str) -> Callable[[F], F]:
    """A ``--where EXPR`` option: an Iceberg row filter, parsed by :func:`parse_row_filter` (the command's
    ``row_filter`` argument; None when not given)."""
    return click.option("--where", "row_filter", metavar="EXPR", callback=parse_row_filter, help=help)


def check_output_file(path: str, option: str) -> None:
    """A file a command will write: its folder must exist and be writable (checked before the work that produces it;
    click's ``Path(dir_okay=False)`` refuses a folder)."""
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise click.BadParameter(
            f"cannot write {path!r}: the folder {folder} does not exist (create it first)", param_hint=option
        )
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"cannot write {path!r}: the folder {folder} is not writable", param_hint=option)


POINT_HELP = "snapshot=<id>, time=<ISO 8601 or epoch ms>, batch=<batch id> or batch=<query id>:<batch id>"
branch_option = click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose history is read.")
