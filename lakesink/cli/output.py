"""The output of the ``lakesink`` command line: one object renders what a command found, for people or as JSON.

pyiceberg's ``cli/output.py`` is the model: :class:`Output` has one method per kind of result, :class:`ConsoleOutput`
writes text (tables and progress drawn by rich, progress on stderr), :class:`JsonOutput` writes JSON (and no
progress). The format is chosen once per run, by ``lakesink --json <command>`` or the command's own ``--json``
(:func:`output_option`, :class:`~lakesink.cli.render.Session`); errors go through the same object
(:class:`~lakesink.cli.render.Renderer`, called by :meth:`lakesink.cli.main.LazyGroup.main`): the commands call it and
never branch on the format themselves.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol, TypeVar

import click
import pyarrow as pa

from lakesink.audit import OTHER, Diff, PublishResult, SnapshotRecord, VerifyReport, format_ms
from lakesink.audit.completeness import WaitResult
from lakesink.audit.key_diff import keyed_changes
from lakesink.audit.routes import QueryReport
from lakesink.cli.common import format_duration
from lakesink.cli.render import JsonRenderer, Renderer, Session, TextRenderer, text_table
from lakesink.maintenance import compaction, expiry, manifest_rewrite, position_deletes
from lakesink.maintenance.orphans import OrphanFile, OrphanReport
from lakesink.maintenance.routine import ForgetReport, MaintenanceReport
from lakesink.sink.checkpoint_cleanup import CheckpointCleanReport

F = TypeVar("F", bound=Callable[..., Any])


class _Result(Protocol):
    """A command's result that knows its JSON form (the reports of lakesink.audit, .maintenance, checkpoint-clean)."""

    def to_dict(self) -> dict[str, Any]: ...


class Output(Renderer):
    """What a command prints; one method per kind of result (errors, remarks and progress: :class:`Renderer`)."""

    @abstractmethod
    def history(self, records: Sequence[SnapshotRecord]) -> None: ...

    @abstractmethod
    def rows(self, shown: pa.Table, total: int | None) -> None:
        """``show``: the rows read (``shown`` of ``total``; None: more than shown, not all read)."""

    @abstractmethod
    def diff(self, d: Diff, key: Sequence[str], limit: int) -> None:
        """``diff``: rows added and removed (paired by ``key``, the identifier fields, when there is one)."""

    @abstractmethod
    def located(self, rows: pa.Table) -> None:
        """``which``: who wrote the rows."""

    @abstractmethod
    def verified(self, report: VerifyReport) -> None: ...

    @abstractmethod
    def verified_query(self, report: QueryReport) -> None: ...

    @abstractmethod
    def published(self, result: PublishResult, branch: str) -> None: ...

    @abstractmethod
    def waited(self, result: WaitResult) -> None: ...

    @abstractmethod
    def report_written(self, path: str, result: VerifyReport) -> None:
        """``report``: the page written, and the verify result shown on top of it."""

    @abstractmethod
    def orphans(self, report: OrphanReport) -> None: ...

    @abstractmethod
    def compaction(self, report: compaction.CompactionReport) -> None: ...

    @abstractmethod
    def position_deletes(self, report: position_deletes.PositionDeleteRewriteReport) -> None: ...

    @abstractmethod
    def expiry(self, report: expiry.ExpiryReport) -> None: ...

    @abstractmethod
    def manifests(self, report: manifest_rewrite.ManifestRewriteReport) -> None: ...

    @abstractmethod
    def maintenance(self, report: MaintenanceReport) -> None: ...

    @abstractmethod
    def forgotten(self, report: ForgetReport) -> None: ...

    @abstractmethod
    def checkpoint_cleaned(self, report: CheckpointCleanReport) -> None: ...


class ConsoleOutput(TextRenderer, Output):
    """Text for people: tables drawn by rich; progress on stderr (:class:`TextRenderer`)."""

    def history(self, records: Sequence[SnapshotRecord]) -> None:
        click.echo(human_history(records))

    def rows(self, shown: pa.Table, total: int | None) -> None:
        click.echo(human_rows(shown))
        if total is None:
            click.echo(f"(first {shown.num_rows} row(s) shown; the table has more: --limit 0 for all)")
        else:
            click.echo(f"({total} row(s))")

    def diff(self, d: Diff, key: Sequence[str], limit: int) -> None:
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

    def located(self, rows: pa.Table) -> None:
        click.echo(human_rows(rows))

    def verified(self, report: VerifyReport) -> None:
        click.echo(report.human())

    def verified_query(self, report: QueryReport) -> None:
        click.echo(report.human())

    def published(self, result: PublishResult, branch: str) -> None:
        click.echo(
            f"main moved from snapshot {result.main_before} to {result.main_after} (head of {branch})"
            + (f", through watermark {format_ms(result.through_ms)}" if result.through_ms is not None else "")
            + (" -- FORCED despite the problems found" if result.forced else "; verify: OK")
        )

    def waited(self, result: WaitResult) -> None:
        mark = result.watermark
        if mark.watermark_ms is None:
            click.echo(
                f"NO WATERMARK: branch {mark.branch} is complete through no time, so not through "
                f"{format_ms(result.target_ms)}: {mark.why_none()}"
            )
        else:
            click.echo(
                f"{'reached' if result.reached else 'TIMED OUT'}: watermark of branch {mark.branch} is "
                f"{format_ms(mark.watermark_ms)}, {'at or past' if result.reached else 'before'} {format_ms(result.target_ms)}"
            )
        for q in mark.queries:
            click.echo(
                f"  query {q.query_id}{f' sink {q.sink_id}' if q.sink_id else ''}: "
                f"{format_ms(q.watermark_ms) if q.watermark_ms is not None else 'no watermark'} (batch {q.batch_id})"
            )

    def orphans(self, report: OrphanReport) -> None:
        click.echo(human_report(report))

    def compaction(self, report: compaction.CompactionReport) -> None:
        click.echo(human_compaction(report))

    def position_deletes(self, report: position_deletes.PositionDeleteRewriteReport) -> None:
        click.echo(human_position_deletes(report))

    def expiry(self, report: expiry.ExpiryReport) -> None:
        click.echo(human_expiry(report))

    def manifests(self, report: manifest_rewrite.ManifestRewriteReport) -> None:
        click.echo(human_manifests(report))

    def maintenance(self, report: MaintenanceReport) -> None:
        click.echo(human_compaction(report.compaction))
        if report.position_deletes is not None:
            click.echo(human_position_deletes(report.position_deletes))
        click.echo(human_expiry(report.expiry))
        if report.manifests is not None:
            click.echo(human_manifests(report.manifests))
        if report.orphans is not None:
            o = report.orphans
            click.echo(
                f"orphan files: {len(o['removed'])} {'would be ' if report.dry_run else ''}removed, "
                f"{len(o['kept_too_young'])} kept (too young), {len(o['kept_in_flight'])} kept (commit in flight)"
            )

    def forgotten(self, report: ForgetReport) -> None:
        verb = "would remove" if report.dry_run else "removed"
        click.echo(f"{verb} {report.key} (last batch {report.marker['batch_id']}) from {report.table}")
        click.echo(f"risk: {report.risk}")

    def checkpoint_cleaned(self, report: CheckpointCleanReport) -> None:
        click.echo(report.human())

    def report_written(self, path: str, result: VerifyReport) -> None:
        click.echo(f"wrote {path} (verify: {'OK' if result.ok else f'{len(result.violations)} violation(s)'})")


class JsonOutput(JsonRenderer, Output):
    """JSON on stdout (indented, times in ISO 8601, bytes in hex); no progress; errors: :class:`JsonRenderer`."""

    def history(self, records: Sequence[SnapshotRecord]) -> None:
        _echo([{**r.to_dict(), "source_offsets": _json_value(r.source_offsets)} for r in records])

    def rows(self, shown: pa.Table, total: int | None) -> None:
        _echo(shown.to_pylist())

    def diff(self, d: Diff, key: Sequence[str], limit: int) -> None:
        out = d.to_dict()
        if key:
            out["by_key"] = keyed_changes(d.added, d.removed, key).to_dict()
        _echo(out)

    def located(self, rows: pa.Table) -> None:
        _echo(rows.to_pylist())

    def published(self, result: PublishResult, branch: str) -> None:
        _echo(result.to_dict())

    def waited(self, result: WaitResult) -> None:
        _echo(result.to_dict())

    def _result(self, report: _Result) -> None:
        """A command's result as its own ``to_dict()``: the JSON of every report named below."""
        _echo(report.to_dict())

    verified = verified_query = _result  # audit
    orphans = compaction = position_deletes = expiry = manifests = maintenance = forgotten = checkpoint_cleaned = _result

    def report_written(self, path: str, result: VerifyReport) -> None:
        _echo({"html": path, "verify": result.to_dict()})


def _json_value(text: str | None) -> Any:
    """A JSON document recorded as a string (a snapshot's ``lakesink.source-offsets``), as the value it holds; the
    string itself when it is not JSON."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def output_option(help: str) -> Callable[[F], F]:
    """The command's ``--json`` flag, an alias of ``lakesink --json``: the one place the command's output is made,
    of the format the run chose (:class:`~lakesink.cli.render.Session`). The command gets an ``output``; it is the
    renderer of the run's errors too, and stops its progress when the command's context closes."""

    def choose(ctx: click.Context, param: click.Parameter, json_flag: bool) -> Output:
        session = ctx.find_object(Session)
        if session is None:  # the command run without the group
            session = ctx.obj = Session()
        session.json = session.json or json_flag
        output: Output = JsonOutput() if session.json else ConsoleOutput()
        session.renderer = output
        ctx.call_on_close(output.close)
        return output

    return click.option("--json", "output", is_flag=True, is_eager=True, callback=choose, help=help)


def _echo(value: Any) -> None:
    click.echo(_dumps(value))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=_json_default)


def human_history(records: Sequence[SnapshotRecord]) -> str:
    """The history as a text table for a terminal; a line ``(<query> restarted)`` before the first batch of a new run
    of a query (its run id changed: the query was restarted from its checkpoint)."""
    header: tuple[str, ...] = (
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
    rows: list[tuple[str, ...]] = []
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
    if any(r.dead_letters is not None for r in records):  # option dead-letter-table: the rows each batch rejected
        header = (*header[:10], "dead letters", *header[10:])
        rows = [
            (*row[:10], "" if r.dead_letters is None else f"{r.dead_letters} -> {r.dead_letter_table}", *row[10:])
            for row, r in zip(rows, records, strict=True)
        ]
    blank = [""] * (len(header) - 1)
    lines: list[tuple[str, ...]] = []
    if records[0].parent_id is None and (records[0].sequence_number or 0) > 1:
        lines.append(("(older snapshots expired)", *blank))
    for row, r in zip(rows, records, strict=True):
        if r.restarted:  # a new run of the query (a restart): a batch it replayed and skipped left no snapshot
            lines.append((f"({(r.query_id or '')[:8]} restarted)", *blank))
        lines.append(row)
    return text_table(header, lines, right={4, 5, 6, 7, 8, 9})


def human_rows(rows: Any) -> str:
    """An Arrow table as a text table (timestamps in UTC)."""
    names = list(rows.column_names)
    if not names:
        return ""
    return text_table(names, [[_cell(v) for v in row.values()] for row in rows.to_pylist()])


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return format_ms(int(value.timestamp() * 1000))
        return value.isoformat(sep=" ")
    return str(value)


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
    """One line per file (kind, last modified, size, path), its reason on the line below, under the path."""
    rows: list[tuple[str, ...]] = []
    for f in files:
        rows.append((f.kind, f"{f.modified:%Y-%m-%d %H:%M:%S}" if f.modified else "?", _size(f.size_in_bytes), f.path))
        if with_reason and f.reason:
            rows.append(("", "", "", f"    {f.reason}"))
    if not rows:
        return []
    return text_table(("kind", "modified", "size", "path"), rows, right={2}, show_header=False, indent=2).splitlines()


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def human_compaction(r: compaction.CompactionReport) -> str:
    lines = [f"compaction of {r.table} (branch {r.branch}): {r.status}"]
    if r.groups:
        verb = "would rewrite" if r.dry_run else "rewrote"
        lines.append(f"{verb} {r.rewritten_files} file(s), {_size(r.rewritten_bytes)}, in {len(r.groups)} group(s)")
        for g in r.groups:
            lines.append(
                f"  {g.partition or '(unpartitioned)'}: {len(g.files)} file(s), {_size(g.input_bytes)}, {g.records} row(s)"
            )
    if r.snapshot_id is not None:
        lines.append(f"into {len(r.added_files)} file(s), {_size(r.added_bytes)}: replace snapshot {r.snapshot_id}")
    return "\n".join(lines)


def human_position_deletes(r: position_deletes.PositionDeleteRewriteReport) -> str:
    lines = [f"position delete rewrite of {r.table} (branch {r.branch}): {r.status}"]
    if r.groups:
        verb = "would rewrite" if r.dry_run else "rewrote"
        lines.append(f"{verb} {r.rewritten_files} delete file(s), {_size(r.rewritten_bytes)}, in {len(r.groups)} group(s)")
        for g in r.groups:
            kept = f", {g.kept} kept" if g.kept is not None else ""
            where = g.partition or "(unpartitioned)"
            lines.append(f"  {where}: {len(g.files)} file(s), {_size(g.input_bytes)}, {g.positions} position(s){kept}")
    if r.dangling_files:
        verb = "would remove" if r.dry_run else "removed"
        lines.append(f"{verb} {len(r.dangling_files)} dangling delete file(s) (no live data file they can apply to)")
    if r.snapshot_id is not None:
        lines.append(f"into {len(r.added_files)} file(s), {_size(r.added_bytes)}: replace snapshot {r.snapshot_id}")
    return "\n".join(lines)


def human_expiry(r: expiry.ExpiryReport) -> str:
    age = format_duration(timedelta(milliseconds=r.max_snapshot_age_ms))
    lines = [
        f"snapshot expiry of {r.table}: {r.status} (max snapshot age {age}, at least {r.min_snapshots_to_keep} "
        "per branch; the heads of kept branches and tags always kept)"
    ]
    if r.expired_snapshot_ids:
        verb = "would expire" if r.dry_run else "expired"
        lines.append(f"{verb} {len(r.expired_snapshot_ids)} snapshot(s), {r.kept_snapshots} kept")
        lines.append(f"{'would delete' if r.dry_run else 'deleted'} {len(r.deleted_files)} file(s) only they referenced")
    if r.removed_refs:
        verb = "would remove" if r.dry_run else "removed"
        lines.append(f"{verb} {len(r.removed_refs)} ref(s): {', '.join(r.removed_refs)} (older than their max ref age)")
    for why in r.protected_refs:
        lines.append(f"warning: {why}")
    if r.failed_deletes:
        lines.append(f"could not delete {len(r.failed_deletes)} file(s) (an orphan clean-up collects them)")
    return "\n".join(lines)


def human_manifests(r: manifest_rewrite.ManifestRewriteReport) -> str:
    lines = [f"manifest rewrite of {r.table} (branch {r.branch}): {r.status}"]
    if r.status == "dry run":
        lines.append(f"would rewrite {r.manifests_before} data manifest(s) into {r.manifests_after} ({r.entries} entries)")
    elif r.snapshot_id is not None:
        lines.append(
            f"rewrote {r.manifests_before} data manifest(s) into {r.manifests_after} ({r.entries} entries, each keeping "
            f"its snapshot and sequence numbers): replace snapshot {r.snapshot_id}"
        )
    return "\n".join(lines)
