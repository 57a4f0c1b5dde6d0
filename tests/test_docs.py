"""The documentation's code runs: every runnable Python block of every page in docs/.

Convention for fenced code blocks in ``docs/*.md``:

- ```` ```python ````: runnable. The blocks of one page are concatenated in order into one script,
  which runs in a fresh interpreter (this one, ``sys.executable``) with
  cwd = a temporary folder, ``LAKESINK_HOME=<tmp>/lakehouse``, ``PYSPARK_PYTHON`` and
  ``PYSPARK_DRIVER_PYTHON`` = ``sys.executable`` without the installed pyspark's ``pyspark.zip`` on
  Spark's workers' path (tests/jobs/jvm.py, ``worker_python``: the same files, their cached bytecode),
  ``HOME=<tmp>/home`` (no ``~/.pyiceberg.yaml`` of the machine leaks in), no ``PYICEBERG_*`` or
  ``LAKESINK_*`` variables inherited, and a copy of the repository's ``catalog/`` folder in the
  working folder (pages are written as if run from a checkout). The script must exit with status 0
  by itself. Its Spark driver JVM gets the options of the tests' short-lived jobs
  (``PYSPARK_SUBMIT_ARGS``, tests/jobs/jvm.py: the quick JIT only, the serial GC; what the page does
  is the same, its start-up costs less CPU).
- ```` ```python no-run ````: a fragment shown for reading only; never executed.
- any other info string (``bash``, ``text``, ``yaml``, ``json``): never executed.

A block whose info string starts with another spelling of Python (``py``, ``python3``, ``pycon``,
``python run``, ...) fails :func:`test_python_blocks_follow_the_convention`, so that a block meant to
run cannot silently escape execution. (Blocks without an info string are not inspected.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.jobs import jvm
from tests.support.timeouts import guard

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUNNABLE = "python"
NO_RUN = "python no-run"
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?:#[^)]*)?\)")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def blocks(page: Path) -> list[tuple[str, int, str]]:
    """``(info string, first line number, code)`` of every fenced block of a Markdown page."""
    out: list[tuple[str, int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m["fence"], m["info"].strip(), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i])
            i += 1
        out.append((info, start, "\n".join(body) + "\n"))
        i += 1
    return out


def script_of(page: Path) -> str:
    parts = [f"# {page.name}, block at line {line}\n{code}" for info, line, code in blocks(page) if info == RUNNABLE]
    return "\n".join(parts)


def runnable_pages() -> list[Path]:
    return [p for p in pages() if script_of(p)]


def test_docs_exist() -> None:
    names = {p.name for p in pages()}
    assert {"README.md", "quickstart.md", "protocol.md", "options.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_python_blocks_follow_the_convention(page: Path) -> None:
    for info, line, _ in blocks(page):
        first = info.split()[0].lower() if info else ""
        if first in ("python", "py", "python3", "pycon", "ipython"):
            assert info in (RUNNABLE, NO_RUN), (
                f"{page.name}:{line}: Python block with info string {info!r}; use {RUNNABLE!r} or {NO_RUN!r}"
            )


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_runnable_blocks_compile(page: Path) -> None:
    script = script_of(page)
    if script:
        compile(script, str(page), "exec")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for m in _LINK.finditer(text):
        target = m["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link to {target}"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_", "LAKESINK_", "PYSPARK_"))}
    (tmp_path / "home").mkdir()
    env.update(
        HOME=str(tmp_path / "home"),
        LAKESINK_HOME=str(tmp_path / "lakehouse"),
        **jvm.python_env(),
        PYSPARK_SUBMIT_ARGS=jvm.submit_args(),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: p.name)
def test_page_runs(page: Path, tmp_path: Path) -> None:
    script = tmp_path / f"{page.stem}_blocks.py"
    script.write_text(script_of(page), encoding="utf-8")
    shutil.copytree(ROOT / "catalog", tmp_path / "catalog")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=guard(280),
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, (
        f"{page.name}: the runnable blocks exited with {proc.returncode} after {elapsed:.0f} s\n"
        f"--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    )
