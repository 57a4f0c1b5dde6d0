"""How long the ``lakesink`` command line takes to start: ``python -m benchmarks.cli_startup [--reps 10]``.

Each case runs in a fresh interpreter, ``--reps`` times, interleaved (so that a burst of load on a shared machine hits
every case alike); printed: median, min, max and the spread (max - min) of the wall time, in seconds.

- ``python -c pass``: the interpreter alone, the floor no command can go under;
- ``lakesink --help``: the group's help, which imports no command module (goal: under 0.3 s);
- ``lakesink history --help``: a command's own help, which imports its module (pyarrow, pyiceberg, SQLAlchemy).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = "from lakesink.cli import main; main()"

CASES: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "lakesink --help": [sys.executable, "-c", CLI, "--help"],
    "lakesink history --help": [sys.executable, "-c", CLI, "history", "--help"],
}


def measure(reps: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(reps):
        for name, argv in CASES.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="runs of each case (default 10)")
    args = parser.parse_args()
    print(f"{'case':<26} {'median':>7} {'min':>7} {'max':>7} {'spread':>7}  (s, {args.reps} runs, load {os.getloadavg()[0]:.1f})")
    for name, values in measure(args.reps).items():
        lo, hi = min(values), max(values)
        print(f"{name:<26} {statistics.median(values):7.3f} {lo:7.3f} {hi:7.3f} {hi - lo:7.3f}")


if __name__ == "__main__":
    main()
