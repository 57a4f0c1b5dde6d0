"""The ``lakesink`` command line: maintenance of the tables lakesink writes.

One click group, one sub-command per task::

    lakesink history db.events
    lakesink show db.events --at batch=3
    lakesink diff db.events batch=2 batch=5
    lakesink which db.events --where "id = 42"
    lakesink verify db.events
    lakesink report db.events --html report.html
    lakesink publish db.events --branch audit
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
import pyarrow as pa
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from lakesink import catalogs
from lakesink.audit import (
    OTHER,
    Point,
    SnapshotRecord,
    VerifyReport,
    diff,
    format_ms,
    history,
    locate,
    publish,
    read_at,
    verify,
)
from lakesink.errors import AuditError, InvalidOptionError, LakesinkError
from lakesink.keyed import keyed_changes
from lakesink.maintenance import DEFAULT_OLDER_THAN, OTHER_WRITERS_OLDER_THAN, OrphanFile, OrphanReport, remove_orphan_files
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
        "ins/upd/del",
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
                r.query_id[:8] if r.query_id else f"({r.writer or OTHER})",
                "" if r.batch_id is None else str(r.batch_id),
                str(r.added_records),
                str(r.deleted_records),
                str(r.added_files),
                str(r.deleted_files),
                _size(r.added_bytes),
                "/".join(map(str, r.upserted)) if r.upserted else "",
                offsets if len(offsets) <= 40 else offsets[:37] + "...",
            )
        )
    if not rows:
        return "no snapshots"
    if records[0].parent_id is None and (records[0].sequence_number or 0) > 1:
        rows.insert(0, ("(older snapshots expired)", "", "", "", "", "", "", "", "", "", "", ""))
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    right = {4, 5, 6, 7, 8, 9}

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([fmt(header), *(fmt(row) for row in rows)])


def _point(ctx: click.Context, param: click.Parameter, value: str | None) -> Point | None:
    if value is None:
        return None
    try:
        return Point.parse(value)
    except AuditError as e:
        raise click.BadParameter(str(e)) from None


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=_json_default)


_POINT_HELP = "snapshot=<id>, time=<ISO 8601 or epoch ms>, batch=<batch id> or batch=<query id>:<batch id>"
_branch_option = click.option("--branch", default="main", show_default=True, help="The branch whose history is read.")


@main.command("show")
@click.argument("table")
@catalog_options
@click.option("--at", "point", metavar="POINT", callback=_point, help=f"Read as of this point ({_POINT_HELP}); default: now.")
@_branch_option
@click.option("--columns", metavar="A,B,...", help="Only these columns.")
@click.option("--where", "row_filter", metavar="EXPR", help='An Iceberg row filter, for example "id > 5 and kind = 2".')
@click.option("--limit", type=int, default=20, show_default=True, help="Rows to print (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON list.")
def show_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    point: Point | None,
    branch: str,
    columns: str | None,
    row_filter: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Print TABLE's rows as of a point in its history (time travel)."""
    t = load_table(table, catalog_name, catalog_properties)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    try:
        rows = read_at(t, point, branch=branch, columns=cols, row_filter=row_filter)
    except (LakesinkError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    shown = rows if limit <= 0 else rows.slice(0, limit)
    if as_json:
        click.echo(_dumps(shown.to_pylist()))
        return
    click.echo(human_rows(shown))
    click.echo(f"({rows.num_rows} row(s){f', first {shown.num_rows} shown' if shown.num_rows < rows.num_rows else ''})")


@main.command("diff")
@click.argument("table")
@click.argument("start", metavar="FROM", callback=_point)
@click.argument("end", metavar="TO", callback=_point)
@catalog_options
@_branch_option
@click.option("--limit", type=int, default=20, show_default=True, help="Rows to print per side (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object with the added and removed rows.")
def diff_command(
    table: str,
    start: Point,
    end: Point,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    limit: int,
    as_json: bool,
) -> None:
    """Rows added and removed between two points of TABLE's history.

    FROM and TO: snapshot=<id>, time=<ISO 8601 or epoch ms>, batch=<batch id> or batch=<query id>:<batch id>.
    Computed from the two snapshots' manifests: only the data files that differ are read.
    """
    t = load_table(table, catalog_name, catalog_properties)
    try:
        d = diff(t, start, end, branch=branch, show_progress=None if not as_json else False)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    key = sorted(t.schema().identifier_field_names())
    if as_json:
        out = d.to_dict()
        if key:
            out["by_key"] = keyed_changes(d.added, d.removed, key).to_dict()
        click.echo(_dumps(out))
        return
    click.echo(
        f"from snapshot {d.start} to {d.end} ({d.method}): +{d.added.num_rows} row(s) in {len(d.added_files)} file(s), "
        f"-{d.removed.num_rows} row(s) in {len(d.removed_files)} file(s)"
    )
    if key:  # a keyed table (upserts): a row removed and one added with the same key are one update
        changes = keyed_changes(d.added, d.removed, key)
        click.echo(
            f"by key ({', '.join(key)}): {len(changes.inserted)} inserted, {len(changes.updated)} updated, "
            f"{len(changes.deleted)} deleted"
        )
        updates = changes.updated if limit <= 0 else changes.updated[:limit]
        for before, after in updates:
            click.echo(f"~ {before} -> {after}")
        inserted, deleted = pa.Table.from_pylist(changes.inserted), pa.Table.from_pylist(changes.deleted)
    else:
        inserted, deleted = d.added, d.removed
    for sign, rows in (("+", inserted), ("-", deleted)):
        if rows.num_rows:
            shown = rows if limit <= 0 else rows.slice(0, limit)
            click.echo("\n".join(f"{sign} {line}" for line in human_rows(shown).splitlines()))


@main.command("which")
@click.argument("table")
@catalog_options
@click.option("--where", "row_filter", metavar="EXPR", help='The rows to trace, as an Iceberg row filter ("id = 42").')
@click.option("--file", "file_path", metavar="PATH", help="A data file to trace (its full path, as in the manifests).")
@click.option("--at", "point", metavar="POINT", callback=_point, help=f"As of this point ({_POINT_HELP}).")
@_branch_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def which_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    row_filter: str | None,
    file_path: str | None,
    point: Point | None,
    branch: str,
    as_json: bool,
) -> None:
    """Which snapshot, streaming query and batch wrote the rows matching --where (or the file --file)."""
    if (row_filter is None) == (file_path is None):
        raise click.UsageError("give exactly one of --where or --file")
    t = load_table(table, catalog_name, catalog_properties)
    try:
        rows = locate(t, row_filter=row_filter, file_path=file_path, point=point, branch=branch)
    except (LakesinkError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(_dumps(rows.to_pylist()) if as_json else human_rows(rows))


@main.command("verify")
@click.argument("table")
@catalog_options
@_branch_option
@click.option("--no-files", is_flag=True, help="Do not check that every data file exists with its recorded size.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_command(
    table: str, catalog_name: str | None, catalog_properties: dict[str, str], branch: str, no_files: bool, as_json: bool
) -> None:
    """Check TABLE's exactly-once invariants; exit status 1 on any violation.

    Each (query id, batch id) in at most one snapshot; no gaps in a query's batch ids (recorded empty batches
    accounted for); every data file present with its recorded size; summaries consistent with the manifests.
    """
    t = load_table(table, catalog_name, catalog_properties)
    report = verify(t, branch=branch, check_files=not no_files, show_progress=False if as_json else None)
    click.echo(_dumps(report.to_dict()) if as_json else report.human())
    if not report.ok:
        raise click.exceptions.Exit(1)


@main.command("report")
@click.argument("table")
@catalog_options
@_branch_option
@click.option(
    "--html", "html_path", metavar="FILE", required=True, type=click.Path(dir_okay=False), help="Where to write the page."
)
def report_command(table: str, catalog_name: str | None, catalog_properties: dict[str, str], branch: str, html_path: str) -> None:
    """Write a self-contained HTML page about TABLE: verify result, batches, latency, files, writers."""
    from lakesink.report import write_report

    t = load_table(table, catalog_name, catalog_properties)
    try:
        result: VerifyReport = write_report(t, html_path, branch=branch)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {html_path} (verify: {'OK' if result.ok else f'{len(result.violations)} violation(s)'})")


@main.command("publish")
@click.argument("table")
@catalog_options
@click.option("--branch", required=True, help="The audited branch to publish.")
@click.option("--force", is_flag=True, help="Publish even when verify fails or main is not an ancestor of the branch.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def publish_command(
    table: str, catalog_name: str | None, catalog_properties: dict[str, str], branch: str, force: bool, as_json: bool
) -> None:
    """Fast-forward TABLE's main branch to --branch after verify passes on it (write-audit-publish)."""
    t = load_table(table, catalog_name, catalog_properties)
    try:
        result = publish(t, branch=branch, force=force, show_progress=False if as_json else None)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(_dumps(result.to_dict()))
    else:
        click.echo(
            f"main moved from snapshot {result.main_before} to {result.main_after} (head of {branch})"
            + (" -- FORCED despite the problems found" if result.forced else "; verify: OK")
        )


def human_rows(rows: Any) -> str:
    """An Arrow table as a text table (timestamps in UTC)."""
    names = list(rows.column_names)
    if not names:
        return ""
    cells = [[_cell(v) for v in row.values()] for row in rows.to_pylist()]
    widths = [max(len(n), *(len(r[i]) for r in cells)) if cells else len(n) for i, n in enumerate(names)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return format_ms(int(value.timestamp() * 1000))
        return value.isoformat(sep=" ")
    return str(value)


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
@click.option(
    "--other-writers-older-than",
    metavar="DURATION",
    default=format_duration(OTHER_WRITERS_OLDER_THAN),
    show_default=True,
    callback=_duration_option,
    help="Files lakesink did not name (other writers' files, whose commit may still come) only when last modified "
    "longer ago than this, and than --older-than. Lower it only while no other writer writes the table.",
)
@click.option("--dry-run", is_flag=True, help="Remove nothing; list what would be removed.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def remove_orphan_files_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    older_than: timedelta,
    other_writers_older_than: timedelta,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove the files under TABLE's location that no snapshot references.

    TABLE is <namespace>.<table>. Files a commit in flight may still reference are kept (see
    docs/maintenance.md). Exit status 1 when a file could not be removed.
    """
    t = load_table(table, catalog_name, catalog_properties)
    try:
        report = remove_orphan_files(t, older_than=older_than, other_writers_older_than=other_writers_older_than, dry_run=dry_run)
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
            + (
                f" (files lakesink did not name: less than {format_duration(report.other_writers_older_than)})"
                if report.other_writers_older_than > report.older_than
                else ""
            )
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


# the table maintenance commands (maintain, compact, expire-snapshots, forget-query) register themselves on main
from lakesink import maintenance_cli as _maintenance_cli  # noqa: E402,F401
