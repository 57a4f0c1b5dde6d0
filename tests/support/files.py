"""Helpers of the tests that write files through a plan (plain functions; fixtures are in tests/support/fixtures.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lakesink.executor.messages import WritePlan

MakePlan = Callable[..., WritePlan]


def local_path(url: str) -> str:
    """The local path of a ``file://`` URL (pyiceberg's FileIO gives data file locations as URLs)."""
    return url[len("file://") :] if url.startswith("file://") else url


def local_file(url: str) -> Path:
    """The local file of a ``file://`` URL, as a Path."""
    return Path(local_path(url))


def data_files_on_disk(plan: WritePlan) -> list[str]:
    """Every file under the table's data folder (empty when the folder does not exist)."""
    folder = Path(local_path(plan.location)) / "data"
    if not folder.exists():
        return []
    return sorted(str(p) for p in folder.rglob("*") if p.is_file())
