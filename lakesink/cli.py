"""The ``lakesink`` command line: maintenance of the tables lakesink writes.

One click group, one sub-command per task::

    lakesink history db.events
    lakesink remove-orphan-files db.events --older-than 3d --dry-run

Tables are found the way the sink finds them (:func:`lakesink.catalogs.load`): ``--catalog NAME``
names a catalog of pyiceberg's configuration, ``--catalog-property KEY=VALUE`` (repeatable) gives
``load_catalog`` properties on top of it, and with neither the embedded default catalog under
``$LAKESINK_HOME`` is used. Output is for humans unless ``--json`` is given. Exit status: 0 on
success, 1 when the command failed (a clear message on stderr), 2 for a usage error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import click
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from lakesink import catalogs
from lakesink.audit import OTHER, SnapshotRecord, history
from lakesink.errors import InvalidOptionError, LakesinkError
from lakesink.maintenance import DEFAULT_OLDER_THAN, OrphanFile, OrphanReport, remove_orphan_files
from lakesink.options import TableName
from lakesink.redaction import redact_secrets_in

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


def _duration_option(ctx: click.Context, param: click.Parameter, value: str) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


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


def load_table(table: str, catalog_name: str | None, catalog_properties: dict[str, str]) -> Table:
    """The table, loaded the way the sink loads it; a click error with a clear message otherwise."""
    try:
        name = TableName.parse(table)
    except InvalidOptionError:
        raise click.BadParameter(f"{table!r} is not '<namespace>.<table>' (for example db.events)", param_hint="TABLE") from None
    try:
        catalog = catalogs.load(catalog_name, catalog_properties)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    try:
        return catalog.load_table(name.identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        raise click.ClickException(f"table {name} does not exist in catalog {catalog.name!r}") from None
    except Exception as e:
        raise click.ClickException(f"cannot load table {name}: {_redacted(e, catalog_name, catalog_properties)}") from None


def _redacted(e: BaseException, catalog_name: str | None, catalog_properties: dict[str, str]) -> str:
    _, props = catalogs.resolve_catalog_properties(catalog_name, catalog_properties)
    return redact_secrets_in(f"{type(e).__name__}: {e}", props)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lakesink")
def main() -> None:
    """Maintenance of the Iceberg tables lakesink writes."""


@main.command("history")
@click.argument("table")
@catalog_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per snapshot.")
def history_command(table: str, catalog_name: str | None, catalog_properties: dict[str, str], as_json: bool) -> None:
    """One line per snapshot of TABLE: time, operation, query and batch, rows and files, offsets.

    Snapshots not written by lakesink are marked as another writer's (query and batch empty).
    """
    records = history(load_table(table, catalog_name, catalog_properties))
    click.echo(json.dumps([r.to_dict() for r in records], indent=2) if as_json else human_history(records))


def human_history(records: Sequence[SnapshotRecord]) -> str:
    """The history as a text table for a terminal."""
    header = (
        "committed (UTC)",
        "snapshot",
        "operation",
        "query",
        "batch",
        "+rows",
        "-rows",
        "+files",
        "-files",
        "+bytes",
        "source offsets",
    )
    rows = []
    for r in records:
        offsets = r.source_offsets or ""
        rows.append(
            (
                datetime.fromtimestamp(r.timestamp_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                str(r.snapshot_id) + ("" if r.on_main else " (not on main)"),
                r.operation or "",
                r.query_id[:8] if r.query_id else f"({OTHER})",
                "" if r.batch_id is None else str(r.batch_id),
                str(r.added_records),
                str(r.deleted_records),
                str(r.added_files),
                str(r.deleted_files),
                _size(r.added_bytes),
                offsets if len(offsets) <= 40 else offsets[:37] + "...",
            )
        )
    if not rows:
        return "no snapshots"
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    right = {4, 5, 6, 7, 8, 9}

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([fmt(header), *(fmt(row) for row in rows)])


@main.command("remove-orphan-files")
@click.argument("table")
@catalog_options
@click.option(
    "--older-than",
    metavar="DURATION",
    default=format_duration(DEFAULT_OLDER_THAN),
    show_default=True,
    callback=_duration_option,
    help="Only remove files last modified longer ago than this (3d, 12h, 90m, 1d12h, 0).",
)
@click.option("--dry-run", is_flag=True, help="Remove nothing; list what would be removed.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def remove_orphan_files_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    older_than: timedelta,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove the files under TABLE's location that no snapshot references.

    TABLE is <namespace>.<table>. Files a commit in flight may still reference are kept (see
    docs/maintenance.md). Exit status 1 when a file could not be removed.
    """
    t = load_table(table, catalog_name, catalog_properties)
    try:
        report = remove_orphan_files(t, older_than=older_than, dry_run=dry_run)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    except OSError as e:  # the storage failed while the files were listed
        raise click.ClickException(
            f"cannot list the files of {table}: {_redacted(e, catalog_name, catalog_properties)}"
        ) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else human_report(report))
    if report.failed:
        raise click.ClickException(f"{len(report.failed)} orphan file(s) could not be removed (listed above)")


def human_report(report: OrphanReport) -> str:
    """The report as text for a terminal."""
    verb = "would remove" if report.dry_run else "removed"
    lines = [
        f"table {report.table}{' (dry run: nothing removed)' if report.dry_run else ''}",
        f"location {report.location}",
        f"listed {report.listed} file(s), {report.referenced} referenced by the table"
        + (f" ({report.skipped_hidden} hidden file(s) not considered)" if report.skipped_hidden else ""),
        f"{verb} {len(report.removed)} orphan file(s), {_size(report.removed_bytes)}"
        f" (last modified before {report.cutoff:%Y-%m-%d %H:%M:%S} UTC)",
    ]
    lines += _files(report.removed, with_reason=False)
    if report.kept_too_young:
        lines.append(
            f"kept {len(report.kept_too_young)} orphan file(s), {_size(report.kept_too_young_bytes)}, "
            f"modified less than {format_duration(report.older_than)} ago"
        )
        lines += _files(report.kept_too_young, with_reason=False)
    if report.kept_in_flight:
        lines.append(
            f"kept {len(report.kept_in_flight)} orphan file(s), {_size(report.kept_in_flight_bytes)}, "
            "that a commit in flight may still reference"
        )
        lines += _files(report.kept_in_flight, with_reason=True)
    if report.skipped:
        lines.append(f"skipped {len(report.skipped)} file(s)")
        lines += _files(report.skipped, with_reason=True)
    if report.failed:
        lines.append(f"FAILED to remove {len(report.failed)} file(s)")
        lines += _files(report.failed, with_reason=True)
    return "\n".join(lines)


def _files(files: Sequence[OrphanFile], *, with_reason: bool) -> list[str]:
    out = []
    for f in files:
        modified = f"{f.modified:%Y-%m-%d %H:%M:%S}" if f.modified else "?"
        line = f"  {f.kind:<13} {modified}  {_size(f.size_in_bytes):>9}  {f.path}"
        out.append(f"{line}\n      {f.reason}" if with_reason and f.reason else line)
    return out


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
