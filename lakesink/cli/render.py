"""What every output of the ``lakesink`` command line shares, and what the group needs before any command is imported.

- the choice of format, made once per run (:class:`Session`, the click context's ``obj``): ``lakesink --json
  <command>`` or the command's own ``--json`` (an alias);
- the exit codes (:class:`ExitCode`) and the JSON error object (:class:`Failure`, :data:`JSON_VERSION`);
- :class:`Renderer`: errors, remarks and progress, as text (:class:`TextRenderer`) or JSON (:class:`JsonRenderer`);
  :mod:`lakesink.cli.output` adds one method per kind of result;
- :func:`text_table`: a text table drawn by rich.

Nothing here imports pyarrow or pyiceberg, and rich only when a table or a progress bar is drawn: an error of the group
(``lakesink nosuch``) is rendered without loading what the commands need (``tests/cli/test_startup.py``).
"""

from __future__ import annotations

import io
import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import IO, Any, ClassVar

import click

from lakesink.errors import LakesinkError

JSON_VERSION = 1
"""The version of the JSON error object (``{"version": 1, "error": {...}}``); a change of its shape is a new version."""


class ExitCode(IntEnum):
    """The exit status of every command (docs/cli.md lists them; tests/cli/test_output.py holds the two equal)."""

    OK = 0
    """The command did what it was asked."""
    FAILED = 1
    """An error (the JSON error object under ``--json``), or a failure the command found and reported: a violation
    (``verify``, ``publish``), a file that could not be removed, a checkpoint that Spark would still refuse."""
    USAGE = 2
    """The command line is wrong: an unknown command or option, a missing or invalid argument."""
    WAIT_TIMED_OUT = 3
    """``lakesink wait``: the timeout passed before the watermark was reached."""
    WAIT_NO_WATERMARK = 4
    """``lakesink wait``: the table has no watermark to wait for (no query wrote the branch yet, or one writes it
    without a watermark)."""


class CommandFailed(click.ClickException):
    """A command ran and found a failure it reported above (files not removed, a checkpoint still blocked)."""

    exit_code = ExitCode.FAILED


USAGE_ERROR = "UsageError"
COMMAND_FAILED = "CommandFailed"
ABORTED = "Aborted"


@dataclass(frozen=True)
class Failure:
    """Why a command stopped: ``type`` is the name of the :mod:`lakesink.errors` class, or :data:`USAGE_ERROR`,
    :data:`COMMAND_FAILED`, :data:`ABORTED`."""

    type: str
    message: str
    exit_code: int

    @classmethod
    def of(cls, e: BaseException) -> Failure:
        """The one conversion of an exception into what a command prints (:meth:`LazyGroup.main` calls it)."""
        if isinstance(e, LakesinkError):
            return cls(type(e).__name__, str(e), ExitCode.FAILED)
        if isinstance(e, click.UsageError):
            return cls(USAGE_ERROR, e.format_message(), e.exit_code)
        if isinstance(e, click.ClickException):
            return cls(COMMAND_FAILED, e.format_message(), e.exit_code)
        if isinstance(e, click.Abort):
            return cls(ABORTED, "aborted", ExitCode.FAILED)
        raise TypeError(f"not an error of the command line: {type(e).__name__}")  # a programming error: its traceback

    def to_dict(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "error": {"type": self.type, "message": self.message, "exit_code": self.exit_code}}


class Renderer(ABC):
    """How a command's errors, remarks and progress are written; chosen once per run (:class:`Session`)."""

    json: ClassVar[bool]
    show_progress: bool | None
    """Progress bars of the audit functions: None lets them decide (a terminal), False never."""

    @abstractmethod
    def error(self, failure: Failure, cause: BaseException) -> None:
        """Why the command stopped (its exit status follows)."""

    def note(self, text: str) -> None:
        """A remark for people, on stderr (stdout holds the result)."""
        click.echo(text, err=True)

    @abstractmethod
    def progress(self, what: str, done: int, total: int) -> None:
        """A step of a long command (``maintain``, ``compact``, ``rewrite-manifests``)."""

    @abstractmethod
    def close(self) -> None:
        """The command is over: stop what is still drawn (called when its context closes, error or not)."""


class TextRenderer(Renderer):
    """For people: click's error text on stderr; progress through rich on stderr, a bar rewritten in place on a
    terminal, elsewhere (a log file, a pipe) only the last step as a plain line (no carriage return)."""

    json = False
    show_progress = None

    def __init__(self) -> None:
        self._progress: Any = None  # rich.progress.Progress, imported when drawn
        self._what = ""

    def error(self, failure: Failure, cause: BaseException) -> None:
        self.close()
        if isinstance(cause, click.ClickException):
            cause.show()  # a usage error with its usage line and hint, as click writes it
        else:
            click.echo(f"Error: {failure.message}" if failure.type != ABORTED else "Aborted!", err=True)

    def progress(self, what: str, done: int, total: int) -> None:
        if self._progress is None or what != self._what:
            self.close()
            self._start(what, done, total)
        self._progress.update(self._progress.task_ids[0], completed=done, total=total)
        if done >= total:
            self.close()
        elif self._progress.console.is_terminal:
            self._progress.refresh()

    def _start(self, what: str, done: int, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = rich_console(sys.stderr)
        columns: list[Any] = [TextColumn("{task.description}:"), MofNCompleteColumn()]
        if console.is_terminal:
            columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        self._progress = Progress(*columns, console=console, auto_refresh=False, transient=False)
        self._progress.add_task(what, total=total, completed=done)
        self._progress.start()
        self._what = what

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class JsonRenderer(Renderer):
    """For programs: no progress; an error is one line of JSON on stderr (:meth:`Failure.to_dict`), so that stdout
    holds only the result (one JSON document, or nothing) even when a command reports and then fails."""

    json = True
    show_progress = False

    def error(self, failure: Failure, cause: BaseException) -> None:
        click.echo(json.dumps(failure.to_dict()), err=True)

    def progress(self, what: str, done: int, total: int) -> None:
        pass  # no progress in JSON

    def close(self) -> None:
        pass  # nothing drawn


@dataclass
class Session:
    """What one run of the command line chose (the click context's ``obj``): JSON or text, and the renderer every
    output of the run is (the command's :class:`~lakesink.cli.output.Output` once the command has chosen it)."""

    json: bool = False
    renderer: Renderer | None = None

    def current(self) -> Renderer:
        """The renderer of the run: the command's output, else a light one of the chosen format."""
        if self.renderer is None or self.renderer.json != self.json:
            self.renderer = JsonRenderer() if self.json else TextRenderer()
        return self.renderer


def asks_json(args: Sequence[str]) -> bool:
    """Whether the command line holds ``--json`` (before ``--``): the format of an error found while the command line
    is parsed, before click has read the flag."""
    options = args[: list(args).index("--")] if "--" in args else args
    return "--json" in options


def rich_console(file: IO[str], *, width: int | None = None) -> Any:
    """A rich console writing to ``file``; a terminal only when ``file`` is one (not rich's environment guesses)."""
    from rich.console import Console

    terminal = bool(getattr(file, "isatty", lambda: False)())
    return Console(file=file, force_terminal=terminal, width=width, highlight=False, markup=False, emoji=False)


def text_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    right: Collection[int] = (),
    show_header: bool = True,
    indent: int = 0,
) -> str:
    """Columns two spaces apart, as wide as their widest cell (its width on screen: a CJK character takes two), never
    folded (a long line is the terminal's or the pager's to wrap); lines without trailing blanks, ``indent`` spaces
    before each."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, show_header=show_header)
    for i, name in enumerate(header):
        table.add_column(Text(name), justify="right" if i in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    buffer = io.StringIO()
    measure = rich_console(buffer, width=1_000_000)
    width = measure.measure(table).maximum
    rich_console(buffer, width=max(width, 1)).print(table, crop=False)
    return "\n".join(" " * indent + line.rstrip() for line in buffer.getvalue().splitlines())
