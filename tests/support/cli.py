"""Running the ``lakesink`` command line in tests."""

from __future__ import annotations

from click.testing import CliRunner


def stderr_apart() -> CliRunner:
    """A runner keeping stderr apart from stdout: click 8.2+ always does; click 8.1 (the declared floor, make
    test-floor) only with ``mix_stderr=False``, which 8.2 removed."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return CliRunner()
