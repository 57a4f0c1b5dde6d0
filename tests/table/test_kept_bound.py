"""How much a process keeps between batches (lakesink.table.kept): by default enough for the lookups of a stream of ten
tables of a million rows each to find every file they read the batch before; ``$LAKESINK_KEPT_BYTES`` sets it, and a
value that is not a number of bytes is an error naming the variable."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from lakesink.table import kept
from lakesink.table.keys import ENV_KEPT_BYTES

#: A merge-on-read lookup's kept columns of a data file of 500,000 rows: a long key and a long order-by column.
FILE_COLUMNS_BYTES = 500_000 * 16


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    kept._kept.clear()


def test_every_file_of_ten_tables_of_a_million_rows_is_kept_for_the_next_batch() -> None:
    """Each batch reads every table's files in turn (two files of 500,000 rows a table). When the bound holds less than
    all of them, a least-recently-used store drops each file just before it is read again and the next batch finds
    none (the bound was 128 MiB: every batch of the cdc-scale benchmark at 1,000,000 rows read all 20 files again)."""
    files = [(f"t{t:03d}", part) for t in range(10) for part in range(2)]
    made: list[tuple[str, int]] = []

    def read(f: tuple[str, int]) -> tuple[str, int]:
        made.append(f)
        return f

    def batch() -> None:
        for f in files:
            kept.keep(("columns", *f), functools.partial(read, f), lambda _: FILE_COLUMNS_BYTES)

    batch()
    assert len(made) == len(files)
    made.clear()
    batch()
    batch()
    assert made == []


def _bound_under(value: str) -> subprocess.CompletedProcess[str]:
    code = "from lakesink.table import kept; print(kept.KEPT_BYTES); kept.hold(('k',), 1, 0); print(len(kept._kept))"
    env = {**os.environ, ENV_KEPT_BYTES: value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_the_variable_sets_the_bound_and_zero_keeps_nothing() -> None:
    assert _bound_under("1048576").stdout.split() == ["1048576", "1"]
    assert _bound_under("0").stdout.split() == ["0", "0"]
    assert _bound_under("").stdout.split()[0] == str(kept.KEPT_BYTES)


@pytest.mark.parametrize("value", ["512MiB", "-1", "1e9", "lots", "\u0663", "1_000"])
def test_a_value_that_is_not_a_number_of_bytes_names_the_variable(value: str) -> None:
    run = _bound_under(value)
    assert run.returncode != 0
    assert f"{ENV_KEPT_BYTES}={value!r}" in run.stderr
    assert "whole number of bytes" in run.stderr
