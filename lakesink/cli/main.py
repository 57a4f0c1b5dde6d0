"""The ``lakesink`` command line: one click group, one sub-command per task.

    lakesink history | history-of | show | diff | which | verify | report | publish | wait   (lakesink.cli.audit)
    lakesink maintain | compact | rewrite-position-deletes | expire-snapshots | rewrite-manifests |
             forget-query | remove-orphan-files | checkpoint-clean        (lakesink.cli.maintenance)

Tables are found the way the sink finds them (:mod:`lakesink.cli.common`). Output is for humans unless ``lakesink
--json <command>`` (or the command's own ``--json``) is given: chosen once per run (:mod:`lakesink.cli.render`,
:mod:`lakesink.cli.output`). Every error goes through that output: :meth:`LazyGroup.main` is the one place that turns
a :class:`~lakesink.errors.LakesinkError` or a usage error into text or a JSON error object and an exit status
(:class:`~lakesink.cli.render.ExitCode`, docs/cli.md): a command raises, it never prints its own errors. A new
command is a function in the module of its kind, listed in :data:`COMMANDS`.

The modules of the commands are imported when a command is run (or its own ``--help`` asked), not when the group
is: they load pyarrow, pyiceberg, SQLAlchemy (about 2 s), which ``lakesink --help`` does not need
(``benchmarks/cli_startup.py`` measures it; ``tests/cli/test_startup.py`` checks what importing this module loads).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from lakesink.cli.render import Failure, Session, asks_json
from lakesink.errors import LakesinkError


@dataclass(frozen=True)
class LazyCommand:
    """A command of the group, imported when it is used: its module, its function's name and what ``lakesink --help``
    lists (tests/cli/test_startup.py checks that the list is the one a group of the imported commands prints)."""

    module: str
    attribute: str
    help: str
    """The first paragraph of the command's docstring, which click shortens to fit the list."""


_AUDIT = "lakesink.cli.audit"
_MAINTENANCE = "lakesink.cli.maintenance"

COMMANDS: dict[str, LazyCommand] = {
    "checkpoint-clean": LazyCommand(
        _MAINTENANCE,
        "checkpoint_clean_command",
        "Remove the temp files Spark abandoned in the streaming checkpoint CHECKPOINT (a path or URL).",
    ),
    "compact": LazyCommand(
        _MAINTENANCE,
        "compact_command",
        "Bin-pack TABLE's small data files per partition into one replace snapshot (rows unchanged).",
    ),
    "diff": LazyCommand(_AUDIT, "diff_command", "Rows added and removed between two points of TABLE's history."),
    "expire-snapshots": LazyCommand(
        _MAINTENANCE, "expire_snapshots_command", "Expire TABLE's old snapshots and delete the files only they referenced."
    ),
    "forget-query": LazyCommand(
        _MAINTENANCE, "forget_query_command", "Remove the replay marker of a retired query QUERY_ID from TABLE."
    ),
    "history": LazyCommand(
        _AUDIT, "history_command", "One line per snapshot of TABLE: time, operation, query and batch, rows and files, offsets."
    ),
    "history-of": LazyCommand(
        _AUDIT, "history_of_command", "Every version of TABLE's row with --key (oldest first), from its history table."
    ),
    "maintain": LazyCommand(
        _MAINTENANCE,
        "maintain_command",
        "Compact TABLE, rewrite its small position delete files, expire its snapshots (as its properties say), rewrite "
        "its manifests when due, then remove orphan files at a safe age.",
    ),
    "publish": LazyCommand(
        _AUDIT, "publish_command", "Fast-forward TABLE's main branch to --branch after verify passes on it (write-audit-publish)."
    ),
    "remove-orphan-files": LazyCommand(
        _MAINTENANCE, "remove_orphan_files_command", "Remove the files under TABLE's location that no snapshot references."
    ),
    "report": LazyCommand(
        _AUDIT, "report_command", "Write a self-contained HTML page about TABLE: verify result, batches, latency, files, writers."
    ),
    "rewrite-manifests": LazyCommand(
        _MAINTENANCE,
        "rewrite_manifests_command",
        "Merge TABLE's small data manifests, clustered by partition, into one replace snapshot (files unchanged).",
    ),
    "rewrite-position-deletes": LazyCommand(
        _MAINTENANCE,
        "rewrite_position_deletes_command",
        "Merge TABLE's small position delete files per partition and drop dangling deletes, in one replace snapshot "
        "(data files and rows unchanged).",
    ),
    "show": LazyCommand(_AUDIT, "show_command", "Print TABLE's rows as of a point in its history (time travel)."),
    "verify": LazyCommand(_AUDIT, "verify_command", "Check TABLE's exactly-once invariants; exit status 1 on any violation."),
    "wait": LazyCommand(
        _AUDIT,
        "wait_command",
        "Wait until TABLE is complete through --watermark: exit 0 as soon as the watermark its lakesink queries "
        "recorded on --branch (the smallest of theirs) is at or past it; exit 3 when --timeout passes first.",
    ),
    "which": LazyCommand(
        _AUDIT, "which_command", "Which snapshot, streaming query and batch wrote the rows matching --where (or the file --file)."
    ),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported at their first use (:data:`COMMANDS`), and the one place where what
    went wrong becomes output (:meth:`main`)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; in standalone mode (the ``lakesink`` script, click's test runner) an error of the
        command line or of lakesink is rendered by the run's output (text, or the JSON error object under ``--json``)
        and the process exits with its :class:`~lakesink.cli.render.ExitCode`. A programming error keeps its
        traceback."""
        argv = list(sys.argv[1:] if args is None else args)
        session = Session()
        if not standalone_mode:
            return super().main(argv, prog_name, complete_var, False, obj=session, **extra)
        try:
            status = super().main(argv, prog_name, complete_var, False, obj=session, **extra)
        except (LakesinkError, click.ClickException, click.Abort) as e:
            _fail(session, Failure.of(e), e, argv)
        sys.exit(status if isinstance(status, int) else 0)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        lazy = COMMANDS.get(cmd_name)
        if lazy is None:
            return None
        command = getattr(importlib.import_module(lazy.module), lazy.attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The list of ``lakesink --help``, from :data:`COMMANDS` (no command module imported)."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)  # as click.Group.format_commands
        rows = [(name, click.Command(name, help=lazy.help).get_short_help_str(limit)) for name, lazy in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _fail(session: Session, failure: Failure, cause: BaseException, argv: Sequence[str]) -> NoReturn:
    if isinstance(cause, click.UsageError) and asks_json(argv):
        session.json = True  # found while the command line was parsed, before click read --json
    session.current().error(failure, cause)
    sys.exit(failure.exit_code)


def _choose_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Session).json = True


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--json",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_choose_json,
    help="Print what the command found as JSON on stdout, and an error as one JSON object on stderr "
    '({"version": 1, "error": {"type", "message", "exit_code"}}). Each command\'s own --json is an alias.',
)
@click.version_option(package_name="lakesink")
def main() -> None:
    """Audit and maintain the Iceberg tables lakesink writes.

    Audit (docs/auditing.md): which batch of which query wrote a row (history, which), the table as of any batch or
    time (show, diff), the exactly-once invariants (verify, report), write-audit-publish and completeness (publish,
    wait); a history table's versions of a row (history-of, docs/history.md). Maintenance (docs/maintenance.md):
    maintain, compact, rewrite-position-deletes, expire-snapshots, rewrite-manifests, forget-query, remove-orphan-files,
    checkpoint-clean.
    """
