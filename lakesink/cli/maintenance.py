"""The table maintenance commands of the ``lakesink`` command line (registered on :data:`lakesink.cli.main.main`).

    lakesink maintain TABLE            compact, expire snapshots, then remove orphans older than 3 days
    lakesink compact TABLE             bin-pack small data files into a replace snapshot
    lakesink rewrite-position-deletes TABLE  merge small position delete files, drop dangling deletes
    lakesink expire-snapshots TABLE    expire snapshots as the table's history.expire.* properties say
    lakesink rewrite-manifests TABLE   merge the head's small manifests into manifests of the target size
    lakesink forget-query TABLE QUERY  remove a retired query's replay marker
    lakesink remove-orphan-files TABLE remove the files no snapshot references (--older-than 3d, --dry-run)
    lakesink checkpoint-clean CHECKPOINT  remove the temp files Spark abandoned in a streaming checkpoint

Each takes ``--dry-run``; for people, progress goes to stderr and a summary to stdout, both through the
:class:`~lakesink.cli.output.Output` the run chose (``lakesink --json``, or the command's ``--json``). A failure the
command found after reporting is a :class:`~lakesink.cli.render.CommandFailed` (exit status 1); errors are raised,
never printed here (:meth:`lakesink.cli.main.LazyGroup.main` renders them).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import click

from lakesink.cli.common import catalog_options, duration_option, load_table, redacted
from lakesink.cli.output import Output, output_option
from lakesink.cli.render import CommandFailed
from lakesink.maintenance import compaction, expiry, manifest_rewrite, position_deletes, routine
from lakesink.maintenance.orphans import OTHER_WRITERS_OLDER_THAN, remove_orphan_files
from lakesink.sink.checkpoint_cleanup import DEFAULT_OLDER_THAN as CHECKPOINT_QUIET_TIME
from lakesink.sink.checkpoint_cleanup import clean_checkpoint
from lakesink.table.keys import MAIN_BRANCH, ORPHAN_OLDER_THAN_DEFAULT

_dry_run = click.option("--dry-run", is_flag=True, help="Change nothing; report what would be done.")
_remove_nothing = click.option("--dry-run", is_flag=True, help="Remove nothing; list what would be removed.")
_json_output = output_option(help="Print the report as JSON.")


@click.command("compact")
@click.argument("table")
@catalog_options
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose head is compacted.")
@click.option("--target-file-size", type=int, help="Bytes (default: the table's write.target-file-size-bytes).")
@click.option("--min-input-files", type=int, help="Files of a partition needed to compact it (default 5).")
@_dry_run
@_json_output
def compact_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    target_file_size: int | None,
    min_input_files: int | None,
    dry_run: bool,
    output: Output,
) -> None:
    """Bin-pack TABLE's small data files per partition into one replace snapshot (rows unchanged)."""
    t = load_table(table, catalog_name, catalog_properties)
    report = compaction.compact(
        t,
        branch=branch,
        target_file_size=target_file_size,
        min_input_files=min_input_files,
        dry_run=dry_run,
        progress=lambda d, n: output.progress("rewriting", d, n),
    )
    output.compaction(report)


@click.command("rewrite-position-deletes")
@click.argument("table")
@catalog_options
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose head's delete files are rewritten.")
@click.option("--target-file-size", type=int, help="Bytes (default: the table's write.delete.target-file-size-bytes).")
@click.option(
    "--min-input-files",
    type=int,
    help="Small delete files of a partition needed to rewrite them (default: the table's "
    "write.lakesink.rewrite-position-deletes.min-input-files, 5).",
)
@_dry_run
@_json_output
def rewrite_position_deletes_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    target_file_size: int | None,
    min_input_files: int | None,
    dry_run: bool,
    output: Output,
) -> None:
    """Merge TABLE's small position delete files per partition and drop dangling deletes, in one replace snapshot
    (data files and rows unchanged)."""
    t = load_table(table, catalog_name, catalog_properties)
    output.progress("rewriting position deletes", 0, 1)
    report = position_deletes.rewrite_position_deletes(
        t, branch=branch, target_file_size=target_file_size, min_input_files=min_input_files, dry_run=dry_run
    )
    output.progress("rewriting position deletes", 1, 1)
    output.position_deletes(report)


@click.command("expire-snapshots")
@click.argument("table")
@catalog_options
@duration_option(
    "--older-than",
    "Expire snapshots older than this (5d, 12h, ...); default: the table's history.expire.max-snapshot-age-ms.",
)
@click.option("--retain-last", type=int, help="Keep at least this many snapshots per branch (default: the table's).")
@_dry_run
@_json_output
def expire_snapshots_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    older_than: timedelta | None,
    retain_last: int | None,
    dry_run: bool,
    output: Output,
) -> None:
    """Expire TABLE's old snapshots and delete the files only they referenced.

    Branch and tag heads are never expired; replay markers are never touched.
    """
    t = load_table(table, catalog_name, catalog_properties)
    stamp = datetime.now(timezone.utc) - older_than if older_than is not None else None
    report = expiry.expire_snapshots(t, older_than=stamp, retain_last=retain_last, dry_run=dry_run)
    output.expiry(report)
    if report.failed_deletes:
        raise CommandFailed(f"{len(report.failed_deletes)} file(s) could not be deleted")


@click.command("rewrite-manifests")
@click.argument("table")
@catalog_options
@click.option("--branch", default=MAIN_BRANCH, show_default=True, help="The branch whose head's manifests are rewritten.")
@click.option("--target-size", type=int, help="Bytes (default: the table's commit.manifest.target-size-bytes).")
@_dry_run
@_json_output
def rewrite_manifests_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    branch: str,
    target_size: int | None,
    dry_run: bool,
    output: Output,
) -> None:
    """Merge TABLE's small data manifests, clustered by partition, into one replace snapshot (files unchanged)."""
    t = load_table(table, catalog_name, catalog_properties)
    output.progress("rewriting manifests", 0, 1)
    report = manifest_rewrite.rewrite_manifests(t, branch=branch, target_size_bytes=target_size, dry_run=dry_run)
    output.progress("rewriting manifests", 1, 1)
    output.manifests(report)


@click.command("maintain")
@click.argument("table")
@catalog_options
@duration_option(
    "--orphans-older-than",
    "Remove orphan files last modified longer ago than this.",
    ORPHAN_OLDER_THAN_DEFAULT,
)
@click.option("--no-orphans", is_flag=True, help="Skip the orphan file clean-up.")
@_dry_run
@_json_output
def maintain_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    orphans_older_than: timedelta,
    no_orphans: bool,
    dry_run: bool,
    output: Output,
) -> None:
    """Compact TABLE, rewrite its small position delete files, expire its snapshots (as its properties say), rewrite
    its manifests when due, then remove orphan files at a safe age."""
    t = load_table(table, catalog_name, catalog_properties)
    report = routine.maintain(
        t, dry_run=dry_run, orphans_older_than=None if no_orphans else orphans_older_than, progress=output.progress
    )
    output.maintenance(report)


@click.command("forget-query")
@click.argument("table")
@click.argument("query_id", metavar="QUERY_ID")
@catalog_options
@click.option("--sink-id", help="The sink id, for a query with several sinks writing TABLE.")
@_dry_run
@_json_output
def forget_query_command(
    table: str,
    query_id: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    sink_id: str | None,
    dry_run: bool,
    output: Output,
) -> None:
    """Remove the replay marker of a retired query QUERY_ID from TABLE.

    Only for a query whose checkpoint is gone for good: a query restarted from that checkpoint could commit
    its replayed batches again once their snapshots are expired.
    """
    t = load_table(table, catalog_name, catalog_properties)
    report = routine.forget_query(t, query_id, sink_id=sink_id, dry_run=dry_run)
    output.forgotten(report)


@click.command("remove-orphan-files")
@click.argument("table")
@catalog_options
@duration_option(
    "--older-than",
    "Only remove files last modified longer ago than this (3d, 12h, 90m, 1d12h, 0).",
    ORPHAN_OLDER_THAN_DEFAULT,
)
@duration_option(
    "--other-writers-older-than",
    "Files lakesink did not name (other writers' files, whose commit may still come) only when last modified "
    "longer ago than this, and than --older-than. Lower it only while no other writer writes the table.",
    OTHER_WRITERS_OLDER_THAN,
)
@_remove_nothing
@_json_output
def remove_orphan_files_command(
    table: str,
    catalog_name: str | None,
    catalog_properties: dict[str, str],
    older_than: timedelta,
    other_writers_older_than: timedelta,
    dry_run: bool,
    output: Output,
) -> None:
    """Remove the files under TABLE's location that no snapshot references.

    TABLE is <namespace>.<table>. Files a commit in flight may still reference are kept (see
    docs/maintenance.md). Exit status 1 when a file could not be removed.
    """
    t = load_table(table, catalog_name, catalog_properties)
    try:
        report = remove_orphan_files(t, older_than=older_than, other_writers_older_than=other_writers_older_than, dry_run=dry_run)
    except OSError as e:  # the storage failed while the files were listed
        raise CommandFailed(f"cannot list the files of {table}: {redacted(e, catalog_name, catalog_properties)}") from None
    output.orphans(report)
    if report.failed:
        raise CommandFailed(f"{len(report.failed)} orphan file(s) could not be removed (listed above)")


@click.command("checkpoint-clean")
@click.argument("checkpoint")
@duration_option(
    "--older-than",
    "Act only when no file of the checkpoint changed for this long (3d, 12h, 90m, 0); 0 when you know "
    "that no process runs the query any more.",
    CHECKPOINT_QUIET_TIME,
)
@_remove_nothing
@_json_output
def checkpoint_clean_command(checkpoint: str, older_than: timedelta, dry_run: bool, output: Output) -> None:
    """Remove the temp files Spark abandoned in the streaming checkpoint CHECKPOINT (a path or URL).

    A query killed while Spark wrote its first offset-log entry cannot restart
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... offsets should be empty on batch 0) until they are
    gone. Only Spark's temp files (.<name>.<uuid>.tmp and their .crc) are removed. Refused, with nothing
    removed, when any file of the checkpoint changed within --older-than: the query may be running.
    Exit status 1 when refused, when a removal failed, or when Spark would still refuse the restart.
    """
    report = clean_checkpoint(checkpoint, older_than=older_than, dry_run=dry_run, force_hint="run it with --older-than 0")
    output.checkpoint_cleaned(report)
    if not report.ok:
        problems = [f"{len(report.failed)} temp file(s) could not be removed"] if report.failed else []
        if report.still_blocking:
            problems.append(f"{len(report.still_blocking)} other file(s) still make Spark refuse the restart")
        raise CommandFailed("; ".join(problems) + " (listed above)")
