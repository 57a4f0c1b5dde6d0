"""The command line starts without its heavy dependencies: ``lakesink --help`` imports no command module (the time
itself is measured by benchmarks/cli_startup.py, not asserted here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from lakesink.cli import main
from lakesink.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent.parent
HEAVY = ("pyarrow", "pandas", "sqlalchemy", "pyiceberg", "pyspark", "numpy", "rich")


def _modules_after(code: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_importing_the_cli_and_its_help_load_no_heavy_module() -> None:
    assert _modules_after("import lakesink.cli") == []
    help_run = "from lakesink.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert _modules_after(help_run) == []


def test_an_error_of_the_group_is_rendered_without_heavy_modules() -> None:
    """``lakesink --json nosuch``: the JSON error object, from the light half of the output (lakesink.cli.render)."""
    run = "from lakesink.cli import main\ntry:\n    main(['--json', 'nosuch'])\nexcept SystemExit as e:\n    assert e.code == 2"
    assert _modules_after(run) == []


def test_the_lazy_help_lists_what_the_imported_commands_say() -> None:
    eager = click.Group("main", help=main.help, context_settings=main.context_settings, params=main.params)
    for name in COMMANDS:
        command = main.get_command(click.Context(main), name)
        assert isinstance(command, click.Command) and command.name == name
        eager.add_command(command)
    lazy_help = CliRunner().invoke(main, ["--help"]).output
    assert lazy_help == CliRunner().invoke(eager, ["--help"]).output
    assert all(name in lazy_help for name in COMMANDS)


def test_a_command_runs_through_the_lazy_group(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["checkpoint-clean", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(main, ["no-such-command"]).exit_code == 2
