"""The table maintenance commands of the ``lakesink`` command line (registered on :data:`lakesink.cli.main`).

    lakesink maintain TABLE            compact, expire snapshots, then remove orphans older than 3 days
    lakesink compact TABLE             bin-pack small data files into a replace snapshot
    lakesink expire-snapshots TABLE    expire snapshots as the table's history.expire.* properties say
    lakesink rewrite-manifests TABLE   merge the head's small manifests into manifests of the target size
    lakesink forget-query TABLE QUERY  remove a retired query's replay marker

Each takes ``--dry-run`` and ``--json``; for people, progress goes to stderr and a summary to stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import click

from lakesink.cli.audit import _duration_option, catalog_options, format_duration, load_table, main
from lakesink.errors import LakesinkError
from lakesink.maintenance import compaction, expiry, manifest_rewrite, routine
from lakesink.table.keys import MAIN_BRANCH

_dry_run = click.option("--dry-run", is_flag=True, help="Change nothing; report what would be done.")
_json = click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")


def _progress(as_json: bool) -> Callable[[str, int, int], None]:
    """A progress line on stderr for people (nothing with --json)."""

    def show(what: str, done: int, total: int) -> None:
        if not as_json:
            click.echo(f"\r{what}: {done}/{total}", err=True, nl=done >= total)

    return show


def human_compaction(r: compaction.CompactionReport) -> str:
    lines = [f"compaction of {r.table} (branch {r.branch}): {r.status}"]
    if r.groups:
        verb = "would rewrite" if r.dry_run else "rewrote"
        lines.append(f"{verb} {r.rewritten_files} file(s), {r.rewritten_bytes} B, in {len(r.groups)} group(s)")
        for g in r.groups:
            lines.append(f"  {g.partition or '(unpartitioned)'}: {len(g.files)} file(s), {g.input_bytes} B, {g.records} row(s)")
    if r.snapshot_id is not None:
        lines.append(f"into {len(r.added_files)} file(s), {r.added_bytes} B: replace snapshot {r.snapshot_id}")
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


@main.command("compact")
@click.argument("table")
@catalog_options
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose head is compacted.")
@click.option("--target-file-size", type=int, help="Bytes (default: the table's write.target-file-size-bytes).")
@click.option("--min-input-files", type=int, help="Files of a partition needed to compact it (default 5).")
@_dry_run
@_json
def compact_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    target_file_size: int | None,
    min_input_files: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Bin-pack TABLE's small data files per partition into one replace snapshot (rows unchanged)."""
    t = load_table(table, catalog_name, catalog_properties)
    show = _progress(as_json)
    try:
        report = compaction.compact(
            t,
            branch=branch,
            target_file_size=target_file_size,
            min_input_files=min_input_files,
            dry_run=dry_run,
            progress=lambda d, n: show("rewriting", d, n),
        )
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else human_compaction(report))


@main.command("expire-snapshots")
@click.argument("table")
@catalog_options
@click.option(
    "--older-than",
    metavar="DURATION",
    callback=lambda ctx, p, v: None if v is None else _duration_option(ctx, p, v),
    help="Expire snapshots older than this (5d, 12h, ...); default: the table's history.expire.max-snapshot-age-ms.",
)
@click.option("--retain-last", type=int, help="Keep at least this many snapshots per branch (default: the table's).")
@_dry_run
@_json
def expire_snapshots_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    older_than: timedelta | None,
    retain_last: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Expire TABLE's old snapshots and delete the files only they referenced.

    Branch and tag heads are never expired; replay markers are never touched.
    """
    t = load_table(table, catalog_name, catalog_properties)
    stamp = datetime.now(timezone.utc) - older_than if older_than is not None else None
    try:
        report = expiry.expire_snapshots(t, older_than=stamp, retain_last=retain_last, dry_run=dry_run)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else human_expiry(report))
    if report.failed_deletes:
        raise click.ClickException(f"{len(report.failed_deletes)} file(s) could not be deleted")


@main.command("rewrite-manifests")
@click.argument("table")
@catalog_options
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose head's manifests are rewritten.")
@click.option("--target-size", type=int, help="Bytes (default: the table's commit.manifest.target-size-bytes).")
@_dry_run
@_json
def rewrite_manifests_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    target_size: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Merge TABLE's small data manifests, clustered by partition, into one replace snapshot (files unchanged)."""
    t = load_table(table, catalog_name, catalog_properties)
    show = _progress(as_json)
    try:
        show("rewriting manifests", 0, 1)
        report = manifest_rewrite.rewrite_manifests(t, branch=branch, target_size_bytes=target_size, dry_run=dry_run)
        show("rewriting manifests", 1, 1)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else human_manifests(report))


@main.command("maintain")
@click.argument("table")
@catalog_options
@click.option(
    "--orphans-older-than",
    metavar="DURATION",
    default=format_duration(routine.SAFE_ORPHAN_AGE),
    show_default=True,
    callback=_duration_option,
    help="Remove orphan files last modified longer ago than this.",
)
@click.option("--no-orphans", is_flag=True, help="Skip the orphan file clean-up.")
@_dry_run
@_json
def maintain_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    orphans_older_than: timedelta,
    no_orphans: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Compact TABLE, expire its snapshots (as its properties say), rewrite its manifests when due, then remove
    orphan files at a safe age."""
    t = load_table(table, catalog_name, catalog_properties)
    try:
        report = routine.maintain(
            t, dry_run=dry_run, orphans_older_than=None if no_orphans else orphans_older_than, progress=_progress(as_json)
        )
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, default=str))
        return
    click.echo(human_compaction(report.compaction))
    click.echo(human_expiry(report.expiry))
    if report.manifests is not None:
        click.echo(human_manifests(report.manifests))
    if report.orphans is not None:
        o = report.orphans
        click.echo(
            f"orphan files: {len(o['removed'])} {'would be ' if dry_run else ''}removed, "
            f"{len(o['kept_too_young'])} kept (too young), {len(o['kept_in_flight'])} kept (commit in flight)"
        )


@main.command("forget-query")
@click.argument("table")
@click.argument("query_id", metavar="QUERY_ID")
@catalog_options
@click.option("--sink-id", help="The sink id, for a query with several sinks writing TABLE.")
@_dry_run
@_json
def forget_query_command(
    table: str,
    query_id: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    sink_id: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove the replay marker of a retired query QUERY_ID from TABLE.

    Only for a query whose checkpoint is gone for good: a query restarted from that checkpoint could commit
    its replayed batches again once their snapshots are expired.
    """
    t = load_table(table, catalog_name, catalog_properties)
    try:
        report = routine.forget_query(t, query_id, sink_id=sink_id, dry_run=dry_run)
    except LakesinkError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {report.key} (last batch {report.marker['batch_id']}) from {report.table}")
    click.echo(f"risk: {report.risk}")
