"""The audit commands of the ``lakesink`` command line (registered on :data:`lakesink.cli.main.main`).

    lakesink history db.events
    lakesink show db.events --at batch=3
    lakesink diff db.events batch=2 batch=5
    lakesink which db.events --where "id = 42"
    lakesink verify db.events
    lakesink report db.events --html report.html
    lakesink publish db.events --branch audit [--through TIMESTAMP]
    lakesink wait db.events --watermark 2026-11-23T14:00:00Z [--timeout 3600]

Each prints through the :class:`~lakesink.cli.output.Output` the run chose (``lakesink --json``, or the command's own
``--json``); errors are raised, never printed here (:meth:`lakesink.cli.main.LazyGroup.main` renders them).
"""

from __future__ import annotations

import datetime

import click
from pyiceberg.expressions import BooleanExpression

from lakesink.audit import (
    Point,
    VerifyReport,
    diff,
    format_ms,
    history,
    locate,
    parse_timestamp_ms,
    publish,
    read_at,
    verify,
)
from lakesink.audit.completeness import NO_WATERMARK, TableWatermark, wait_for_watermark
from lakesink.audit.routes import verify_query
from lakesink.audit.versions import as_of, history_name, versions_of
from lakesink.cli.common import (
    POINT_HELP,
    branch_option,
    catalog_options,
    check_order_by,
    check_output_file,
    check_row_filter,
    load_catalog,
    load_table,
    parse_order_by,
    parse_point,
    row_filter_option,
    table_value_errors,
)
from lakesink.cli.output import Output, output_option
from lakesink.cli.render import ExitCode
from lakesink.cli.report import write_report
from lakesink.table.keys import MAIN_BRANCH


@click.command("history")
@click.argument("table")
@catalog_options
@click.option("--branch", default=None, help="Only the snapshots in this branch's history; default: every snapshot.")
@output_option(help="Print a JSON list, one object per snapshot.")
def history_command(
    table: str, catalog_name: str | None, catalog_properties: dict[str, str], branch: str | None, output: Output
) -> None:
    """One line per snapshot of TABLE: time, operation, query and batch, rows and files, offsets.

    Snapshots not written by lakesink are marked as another writer's (query and batch empty).
    """
    t = load_table(table, catalog_name, catalog_properties)
    records = history(t, branch)
    output.history(records)


@click.command("show")
@click.argument("table")
@catalog_options
@click.option("--at", "point", metavar="POINT", callback=parse_point, help=f"Read as of this point ({POINT_HELP}); default: now.")
@branch_option
@click.option("--columns", metavar="A,B,...", help="Only these columns.")
@row_filter_option(help='An Iceberg row filter, for example "id > 5 and kind = 2".')
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Rows to print (0: all); only that many rows are read (without --order-by).",
)
@click.option(
    "--order-by",
    "order_by",
    metavar="COL [desc],...",
    callback=parse_order_by,
    help='Print the rows sorted by these columns (for example "ts desc, id"); every matching row is then read. '
    "Default: the order of the table's files.",
)
@output_option(help="Print the rows as a JSON list.")
def show_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    point: Point | None,
    branch: str,
    columns: str | None,
    row_filter: BooleanExpression | None,
    limit: int,
    order_by: list[tuple[str, str]],
    output: Output,
) -> None:
    """Print TABLE's rows as of a point in its history (time travel)."""
    t = load_table(table, catalog_name, catalog_properties)
    check_row_filter(t, row_filter)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    check_order_by(t, order_by)
    read_cols = cols + [c for c, _ in order_by if c not in cols] if cols and order_by else cols
    with table_value_errors():
        # one row more than shown: whether the table has more is known without reading it all (sorted: all are read)
        read_limit = limit + 1 if limit and not order_by else None
        rows = read_at(t, point, branch=branch, columns=read_cols, row_filter=row_filter, limit=read_limit)
    if order_by:
        rows = rows.sort_by(order_by)
        rows = rows.select(cols) if cols else rows
    more = bool(limit) and rows.num_rows > limit
    output.rows(rows.slice(0, limit) if more else rows, None if more else rows.num_rows)


@click.command("history-of")
@click.argument("table")
@catalog_options
@click.option(
    "--key",
    "keys",
    metavar="COLUMN=VALUE",
    multiple=True,
    help="The row's key (repeat for a key of several columns), for example --key id=7.",
)
@click.option(
    "--history",
    "history_table",
    metavar="TABLE",
    help="The history table (default: TABLE__history, as option history=on names it).",
)
@click.option(
    "--as-of",
    "as_of_time",
    metavar="TIME",
    help="Instead of a key's versions: TABLE's rows as they were at this source time (ISO 8601 or epoch ms), from the "
    "history table alone.",
)
@click.option("--limit", type=click.IntRange(min=0), default=0, show_default=True, help="Rows to print (0: all).")
@output_option(help="Print the versions as a JSON list.")
def history_of_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    keys: tuple[str, ...],
    history_table: str | None,
    as_of_time: str | None,
    limit: int,
    output: Output,
) -> None:
    """Every version of TABLE's row with --key (oldest first), from its history table (option history)."""
    name = history_table or history_name(table)
    key: dict[str, str] = {}
    for item in keys:
        column, sep, value = item.partition("=")
        if not sep or not column.strip():
            raise click.BadParameter(f"{item!r} is not COLUMN=VALUE (for example id=7)", param_hint="--key")
        key[column.strip()] = value
    if as_of_time is not None and key:
        raise click.UsageError("give --key (a row's versions) or --as-of (the table at a time), not both")
    if as_of_time is None and not key:
        raise click.UsageError("give --key COLUMN=VALUE (the row whose versions to print), or --as-of TIME")
    t = load_table(name, catalog_name, catalog_properties)
    with table_value_errors():
        if as_of_time is not None:
            try:
                ms = parse_timestamp_ms(as_of_time)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="--as-of") from None
            when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
            rows = as_of(t, when, name=name)
        else:
            rows = versions_of(t, key, name=name)
    more = bool(limit) and rows.num_rows > limit
    output.rows(rows.slice(0, limit) if more else rows, None if more else rows.num_rows)


@click.command("diff")
@click.argument("table")
@click.argument("start", metavar="FROM", callback=parse_point)
@click.argument("end", metavar="TO", callback=parse_point)
@catalog_options
@branch_option
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Rows to print per side (0: all).")
@output_option(help="Print a JSON object with the added and removed rows.")
def diff_command(
    table: str,
    start: Point,
    end: Point,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    limit: int,
    output: Output,
) -> None:
    """Rows added and removed between two points of TABLE's history.

    FROM and TO: snapshot=<id>, time=<ISO 8601 or epoch ms>, batch=<batch id> or batch=<query id>:<batch id>.
    Computed from the two snapshots' manifests: only the data files that differ are read.
    """
    t = load_table(table, catalog_name, catalog_properties)
    d = diff(t, start, end, branch=branch, show_progress=output.show_progress)
    output.diff(d, sorted(t.schema().identifier_field_names()), limit)


@click.command("which")
@click.argument("table")
@catalog_options
@row_filter_option(help='The rows to trace, as an Iceberg row filter ("id = 42").')
@click.option("--file", "file_path", metavar="PATH", help="A data file to trace (its full path, as in the manifests).")
@click.option("--at", "point", metavar="POINT", callback=parse_point, help=f"As of this point ({POINT_HELP}).")
@branch_option
@output_option(help="Print a JSON list.")
def which_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    row_filter: BooleanExpression | None,
    file_path: str | None,
    point: Point | None,
    branch: str,
    output: Output,
) -> None:
    """Which snapshot, streaming query and batch wrote the rows matching --where (or the file --file)."""
    if (row_filter is None) == (file_path is None):
        raise click.UsageError("give exactly one of --where or --file")
    t = load_table(table, catalog_name, catalog_properties)
    check_row_filter(t, row_filter)
    with table_value_errors():
        rows = locate(t, row_filter=row_filter, file_path=file_path, point=point, branch=branch)
    output.located(rows)


@click.command("verify")
@click.argument("table", required=False)
@catalog_options
@branch_option
@click.option("--no-files", is_flag=True, help="Do not check that every data file exists with its recorded size.")
@click.option(
    "--query",
    "query_id",
    metavar="ID",
    help="Instead of TABLE: read every table of the catalog and check that each batch of this streaming query (option "
    "route-by) is in all the tables it wrote.",
)
@click.option(
    "--namespace", "namespaces", metavar="NS", multiple=True, help="With --query: only the tables of this namespace (repeatable)."
)
@output_option(help="Print the report as JSON.")
def verify_command(
    table: str | None,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    no_files: bool,
    query_id: str | None,
    namespaces: tuple[str, ...],
    output: Output,
) -> None:
    """Check TABLE's exactly-once invariants; exit status 1 on any violation.

    Each (query id, batch id) in at most one snapshot; no gaps in a query's batch ids (recorded empty batches
    accounted for); every data file present with its recorded size; summaries consistent with the manifests; a batch
    that wrote several tables (option route-by) in every one of them. With --query ID instead of TABLE: every batch of
    that query in all the tables it wrote, across the catalog.
    """
    if (table is None) == (query_id is None):
        raise click.UsageError("give TABLE, or --query ID (every table of the catalog), not both")
    if query_id is not None:
        catalog = load_catalog(catalog_name, catalog_properties)
        query_report = verify_query(catalog, query_id, [tuple(ns.split(".")) for ns in namespaces] or None)
        output.verified_query(query_report)
        if not query_report.ok:
            raise click.exceptions.Exit(ExitCode.FAILED)
        return
    assert table is not None
    t = load_table(table, catalog_name, catalog_properties)
    report = verify(t, branch=branch, check_files=not no_files, show_progress=output.show_progress)
    output.verified(report)
    if not report.ok:
        raise click.exceptions.Exit(ExitCode.FAILED)


@click.command("report")
@click.argument("table")
@catalog_options
@branch_option
@click.option(
    "--html", "html_path", metavar="FILE", required=True, type=click.Path(dir_okay=False), help="Where to write the page."
)
@output_option(help="Print the page's path and the verify result shown on it as JSON.")
def report_command(
    table: str, catalog_name: str | None, catalog_properties: dict[str, str], branch: str, html_path: str, output: Output
) -> None:
    """Write a self-contained HTML page about TABLE: verify result, batches, latency, files, writers."""
    check_output_file(html_path, "--html")  # before the report is built
    t = load_table(table, catalog_name, catalog_properties)
    result: VerifyReport = write_report(t, html_path, branch=branch, show_progress=output.show_progress)
    output.report_written(html_path, result)


@click.command("publish")
@click.argument("table")
@catalog_options
@click.option("--branch", required=True, help="The audited branch to publish.")
@click.option("--force", is_flag=True, help="Publish even when verify fails or main is not an ancestor of the branch.")
@click.option(
    "--through",
    "through",
    metavar="TIMESTAMP",
    help="Publish only through this event time: main goes to the oldest snapshot of the branch whose watermark is at "
    "or past it (ISO 8601, UTC without an offset, or epoch ms).",
)
@output_option(help="Print the result as JSON.")
def publish_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    force: bool,
    through: str | None,
    output: Output,
) -> None:
    """Fast-forward TABLE's main branch to --branch after verify passes on it (write-audit-publish)."""
    through_ms = _timestamp("--through", through) if through is not None else None
    t = load_table(table, catalog_name, catalog_properties)
    result = publish(t, branch=branch, force=force, show_progress=output.show_progress, through_ms=through_ms)
    output.published(result, branch)


WAIT_TIMEOUT_EXIT = ExitCode.WAIT_TIMED_OUT
"""The exit status of ``lakesink wait`` when the timeout passed before the watermark was reached."""
WAIT_NO_WATERMARK_EXIT = ExitCode.WAIT_NO_WATERMARK
"""The exit status of ``lakesink wait`` when the table has no watermark to wait for (no query wrote the branch yet, or
one writes it without a watermark): at once without ``--timeout``, else when the timeout passed."""


def _timestamp(option: str, value: str) -> int:
    try:
        return parse_timestamp_ms(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint=option) from None


@click.command("wait")
@click.argument("table")
@catalog_options
@click.option(
    "--watermark", "watermark", metavar="TIMESTAMP", required=True, help="The event time to wait for (ISO 8601 or epoch ms)."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="Give up after this many seconds (exit status 3; 4 if the table still has no watermark). Default: no limit "
    "while the table has a watermark; a table without one is answered at once (exit status 4).",
)
@click.option("--interval", type=click.FloatRange(min=0.01), default=5.0, show_default=True, help="Seconds between reads.")
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="Whose watermark: this branch's.")
@click.option("--query", "queries", metavar="QUERY_ID", multiple=True, help="Only these queries' watermarks (repeatable).")
@output_option(help="Print the result as JSON.")
def wait_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    watermark: str,
    timeout: float | None,
    interval: float,
    branch: str,
    queries: tuple[str, ...],
    output: Output,
) -> None:
    """Wait until TABLE is complete through --watermark: exit 0 as soon as the watermark its lakesink queries recorded
    on --branch (the smallest of theirs; none while one of them records none) is at or past it; exit 3 when --timeout
    passes first; exit 4 when the table has no watermark (at once without --timeout)."""
    target = _timestamp("--watermark", watermark)
    t = load_table(table, catalog_name, catalog_properties)
    told: list[bool] = []

    def waiting(mark: TableWatermark) -> None:  # said once, a remark on stderr (stdout holds the result, maybe JSON)
        if not told:
            told.append(True)
            now = format_ms(mark.watermark_ms) if mark.watermark_ms is not None else f"none ({mark.why_none()})"
            limit = f"for up to {timeout:g} s" if timeout is not None else "with no time limit"
            output.note(
                f"waiting {limit} for table {table} (branch {branch}) to be complete through {format_ms(target)}: "
                f"its watermark is {now}; reading it every {interval:g} s"
            )

    result = wait_for_watermark(
        t, target, timeout_s=timeout, poll_s=interval, branch=branch, queries=queries or None, on_wait=waiting
    )
    output.waited(result)
    if result.outcome == NO_WATERMARK:
        raise click.exceptions.Exit(WAIT_NO_WATERMARK_EXIT)
    if not result.reached:
        raise click.exceptions.Exit(WAIT_TIMEOUT_EXIT)
