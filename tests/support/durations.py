"""Per-test durations of a test run, per folder, and the order in which ``make test`` hands out its test files.

As a pytest plugin (tests/conftest.py loads it): the process that reports (the only process of a serial run, the
controller of a pytest-xdist run, which receives every worker's reports) writes each test's setup, call and
teardown seconds, outcome and worker to ``.pytest-durations/<UTC start>.json`` and a copy ``last.json``, beside
the run's wall time. ``PYTEST_DURATIONS_DIR`` moves the folder; an empty value turns the file off.

As a script (``make durations``): ``python -m tests.support.durations [run.json]`` prints the seconds per test folder
(tests/sink, tests/driver, ...), per worker, and the slowest files; ``--save-order`` writes the files' seconds to
tests/file_seconds.json, which :func:`slow_files_first` reads: with ``--dist loadfile`` a worker takes whole files,
so a slow file handed out last would keep one worker busy while the other idles; the slowest go first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_DIR = "PYTEST_DURATIONS_DIR"
DEFAULT_DIR = REPO / ".pytest-durations"
FILE_SECONDS = REPO / "tests" / "file_seconds.json"
FLUSH_EVERY_S = 60.0


def _folder() -> Path | None:
    value = os.environ.get(ENV_DIR)
    if value == "":
        return None
    return Path(value) if value else DEFAULT_DIR


class DurationsRecorder:
    def __init__(self, config: pytest.Config):
        self.config = config
        self.started = time.time()
        self.tests: dict[str, dict[str, Any]] = {}
        self.flushed = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.setdefault(report.nodeid, {"setup": 0.0, "call": 0.0, "teardown": 0.0, "outcome": "passed"})
        entry[report.when] = round(entry[report.when] + report.duration, 3)
        if report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
        node = getattr(report, "node", None)  # pytest-xdist: the worker that ran the test
        if node is not None:
            entry["worker"] = node.gateway.id
        if time.monotonic() - self.flushed > FLUSH_EVERY_S:  # a run that is killed still leaves what it measured
            self.flushed = time.monotonic()
            self.write(None)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.write(int(exitstatus))

    def write(self, exitstatus: int | None) -> None:
        """The run's file (``exitstatus`` None: the run is still going, written so far)."""
        folder = _folder()
        if folder is None or not self.tests:
            return
        finished = time.time()
        doc = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_s": round(finished - self.started, 1),
            "workers": getattr(self.config.option, "numprocesses", None) or 0,
            "dist": getattr(self.config.option, "dist", "no"),
            "args": list(self.config.invocation_params.args),
            "load_at_end": list(os.getloadavg()),
            "exitstatus": exitstatus,
            "tests": self.tests,
        }
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{doc['started']}.json".replace(":", "")
        for target in (path, folder / "last.json"):  # whole files only: make durations may read while a run writes
            partial = target.with_name(target.name + ".partial")
            partial.write_text(json.dumps(doc, indent=1), encoding="utf-8")
            os.replace(partial, target)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller writes the file
        return
    config.pluginmanager.register(DurationsRecorder(config), "lakesink-durations")


def slow_files_first(files: list[str]) -> list[str]:
    """``files`` (paths relative to the repository), the slowest first by tests/file_seconds.json; unknown files
    after them, in their order."""
    try:
        seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return files
    return sorted(files, key=lambda f: -seconds.get(f, 0.0))  # a test's own unit (f = "file::test"): after them


# --- the report -----------------------------------------------------------------------------------------------------


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _folder_of(nodeid: str) -> str:
    parts = _file_of(nodeid).split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def report(doc: dict[str, Any], top_files: int = 15) -> str:
    tests: dict[str, dict[str, Any]] = doc["tests"]
    per_folder: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    per_file: dict[str, float] = defaultdict(float)
    per_worker: dict[str, float] = defaultdict(float)
    for nodeid, t in tests.items():
        s = t["setup"] + t["call"] + t["teardown"]
        folder = _folder_of(nodeid)
        per_folder[folder][0] += 1
        per_folder[folder][1] += s
        per_file[_file_of(nodeid)] += s
        per_worker[t.get("worker", "main")] += s
    total = sum(v[1] for v in per_folder.values())
    failed = sorted(n for n, t in tests.items() if t["outcome"] in ("failed", "error"))
    unfinished = " (UNFINISHED: written while it ran)" if doc.get("exitstatus") is None else ""
    lines = [
        f"run started {doc['started']}{unfinished}, wall {doc['wall_s'] / 60:.1f} min, {len(tests)} tests, "
        f"workers {doc.get('workers') or 1} ({doc.get('dist')}), test time {total / 60:.1f} min, "
        f"load at the end {' '.join(f'{x:.1f}' for x in doc.get('load_at_end', []))}",
        "",
        "| folder | tests | minutes | share |",
        "|---|---:|---:|---:|",
    ]
    for folder, (n, s) in sorted(per_folder.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {folder} | {int(n)} | {s / 60:.1f} | {100 * s / total:.0f}% |")
    lines += ["", "per worker (minutes busy): " + ", ".join(f"{w} {s / 60:.1f}" for w, s in sorted(per_worker.items()))]
    lines += ["", f"the {top_files} slowest files (minutes):"]
    for f, s in sorted(per_file.items(), key=lambda kv: -kv[1])[:top_files]:
        lines.append(f"  {s / 60:6.1f}  {f}")
    if failed:
        lines += ["", f"{len(failed)} failed:"] + [f"  {n}" for n in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path, help="a run's JSON file (default: the last run's)")
    parser.add_argument("--save-order", action="store_true", help=f"write the files' seconds to {FILE_SECONDS}")
    args = parser.parse_args(argv)
    path = args.run or (_folder() or DEFAULT_DIR) / "last.json"
    if not path.exists():
        print(f"no durations file {path}: run make test first", file=sys.stderr)
        return 1
    doc = json.loads(path.read_text(encoding="utf-8"))
    print(report(doc))
    if args.save_order:
        per_file: dict[str, float] = defaultdict(float)
        for nodeid, t in doc["tests"].items():
            per_file[_file_of(nodeid)] += t["setup"] + t["call"] + t["teardown"]
        slow = {f: round(s) for f, s in sorted(per_file.items(), key=lambda kv: -kv[1]) if s >= 30}
        FILE_SECONDS.write_text(json.dumps(slow, indent=1) + "\n", encoding="utf-8")
        print(f"\nwrote {len(slow)} files of 30 s or more to {FILE_SECONDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
