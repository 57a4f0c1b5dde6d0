"""The CPU seconds of one run of the soak's job (tests/soak/job.py), in all and per kind of process.

``python -m tests.jobs.worker_cpu --entry format --reps 3``: each repetition writes fresh input (``--files`` files of
``--rows`` rows, ``--max-files`` per micro-batch), runs the job once to its end (trigger availableNow, as a soak's
last run does) and reports:

- ``total``: the CPU seconds (user + system) of the job's whole process tree, from a cgroup of its own (cgroup v1
  ``cpuacct``, when this process may make one), else from the rusage of the children this process waited for (which
  misses the Python workers Spark's daemon reaps after its own end);
- per kind of process, from a hook that every Python process of the job loads (a ``sitecustomize`` module first on
  the job's ``PYTHONPATH``, which Spark hands on to its Python workers): at its exit (``atexit``, and ``os._exit``,
  which Spark's daemon and workers leave by), each process appends its own rusage, its ``sys.modules`` count and the
  heavy packages it loaded to a log. The kinds: ``driver`` (the job's Python), ``daemon`` (Spark's
  ``pyspark.daemon``, before it forks workers), ``executor worker`` (``pyspark.worker``: the tasks' ``write()``),
  ``planner`` (``pyspark.sql.worker.write_into_data_source``: ``streamWriter()`` at the query's start),
  ``commit runner`` (``pyspark.sql.worker.python_streaming_sink_runner``: ``commit()`` / ``abort()``), and ``jvm``
  (the total less the Python processes: the JVM, and any process that did not log).

The numbers depend little on the machine's load (CPU seconds, not wall time); pair before/after runs to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.helpers import write_json_input
from tests.support.soak import job_env

REPO = Path(__file__).resolve().parents[2]
CGROUP_ROOT = Path("/sys/fs/cgroup/cpuacct")
ENV_LOG = "LAKESINK_WORKER_CPU_LOG"
# the packages a process's log names when it loaded them
HEAVY = (
    "pandas", "pydantic", "strictyaml", "sqlalchemy", "pyiceberg.table", "pyiceberg.catalog", "pyiceberg.io.pyarrow",
    "pyarrow.dataset", "lakesink.driver", "lakesink.sink.datasource", "lakesink._pyiceberg.io", "lakesink.executor",
)  # fmt: skip

# the process kinds by the worker module Spark's daemon runs (its argument: one daemon per worker module)
KINDS = {
    "pyspark.worker": "executor worker",
    "pyspark.sql.worker.write_into_data_source": "planner",
    "pyspark.sql.worker.python_streaming_sink_runner": "commit runner",
}

_HOOK = textwrap.dedent(
    """
    import atexit, json, os, resource, sys
    _log = os.environ.get(%(env)r)
    _done = set()

    def _record():
        if not _log or os.getpid() in _done:
            return
        _done.add(os.getpid())
        ru = resource.getrusage(resource.RUSAGE_SELF)
        mods = sys.modules
        line = {"pid": os.getpid(), "cpu": ru.ru_utime + ru.ru_stime, "modules": len(mods),
                "heavy": sorted(h for h in %(heavy)r if h in mods)}
        with open(os.path.join(_log, "%%d.json" %% os.getpid()), "a") as f:
            f.write(json.dumps(line) + "\\n")

    if _log:
        _real_exit = os._exit

        def _exit(code, _real=_real_exit):
            try:
                _record()
            finally:
                _real(code)

        os._exit = _exit
        atexit.register(_record)
        os.register_at_fork(after_in_child=_done.clear)

        # Spark's daemon ends its workers with SIGHUP (their handler: the default, which each worker sets): record first
        import signal
        _real_signal = signal.signal

        def _on_hup(number, frame):
            _record()
            _real_signal(signal.SIGHUP, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGHUP)

        def _signal(number, handler, _real=_real_signal):
            if number == signal.SIGHUP and handler == signal.SIG_DFL:
                handler = _on_hup
            return _real(number, handler)

        signal.signal = _signal
    """
)


def _cgroup() -> Path | None:
    if not (CGROUP_ROOT / "cpuacct.usage").exists():
        return None
    path = CGROUP_ROOT / f"lakesink-worker-cpu-{os.getpid()}-{time.monotonic_ns()}"
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def _kind(cmdline: list[str], ppid_is_daemon: bool) -> str:
    """The kind of a process of the job, from its command line (a forked worker has its daemon's) and its parent's."""
    if _is_daemon(cmdline):
        kind = KINDS.get(cmdline[-1], cmdline[-1].rsplit(".", 1)[-1])
        return kind if ppid_is_daemon else f"daemon ({kind})"
    if "tests.soak.job" in cmdline:
        return "driver"
    if cmdline and os.path.basename(cmdline[0]) == "java":
        return "jvm"
    return "other"


def _is_daemon(cmdline: list[str]) -> bool:
    return "pyspark.daemon" in cmdline or any(a.endswith("daemon.py") for a in cmdline)


class _Poller(threading.Thread):
    """Every 0.1 s: the CPU seconds so far of every process in the job's cgroup (the last reading of a process is its
    CPU, less at most 0.1 s: Spark SIGKILLs some of its workers, which then log nothing)."""

    def __init__(self, group: Path):
        super().__init__(daemon=True)
        self.group = group
        self.stop = threading.Event()
        self.seen: dict[int, dict[str, Any]] = {}

    def run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self.stop.wait(0.1):
            for pid in map(int, (self.group / "cgroup.procs").read_text().split()):
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2 :].split()
                rec = self.seen.setdefault(pid, {"ppid": int(fields[1])})
                if cmdline or "cmdline" not in rec:  # a process that has exited (a zombie) shows none
                    rec["cmdline"] = cmdline
                rec["cpu"] = (int(fields[11]) + int(fields[12])) / tick

    def by_pid(self) -> dict[int, tuple[str, float]]:
        out = {}
        for pid, rec in self.seen.items():
            parent = self.seen.get(rec["ppid"])
            parent_is_daemon = parent is not None and _is_daemon(parent["cmdline"])
            out[pid] = (_kind(rec["cmdline"], parent_is_daemon), rec["cpu"])
        return out


def run_once(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One run of the job over fresh input: its CPU seconds in all and per kind of process."""
    shutil.rmtree(folder, ignore_errors=True)
    hook, logs, home = folder / "hook", folder / "logs", folder / "home"
    for d in (hook, logs, home):
        d.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(_HOOK % {"env": ENV_LOG, "heavy": HEAVY})
    write_json_input(folder / "input", files=args.files, rows_per_file=args.rows)
    env = job_env(home)
    env["PYTHONPATH"] = os.pathsep.join((str(hook), str(args.repo), env["PYTHONPATH"]))
    env[ENV_LOG] = str(logs)
    cmd = [str(args.repo / ".venv" / "bin" / "python"), "-m", "tests.soak.job", "--input", str(folder / "input"),
           "--checkpoint", str(folder / "cp"), "--max-files", str(args.max_files), "--entry", args.entry,
           "--writer", args.writer]  # fmt: skip
    group = _cgroup()
    poller = _Poller(group) if group else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    # the child joins the cgroup before it execs the job, so every process of the job is counted
    preexec = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None  # noqa: E731
    with (folder / "job.log").open("wb") as out:
        child = subprocess.Popen(cmd, cwd=folder, env=env, stdout=out, stderr=out, preexec_fn=preexec)
        if poller:
            poller.start()
        returncode = child.wait()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if returncode != 0:
        raise SystemExit(f"the job failed ({returncode}): {(folder / 'job.log').read_text()[-3000:]}")
    per_pid: dict[int, tuple[str, float]] = {}
    if group is not None and poller is not None:
        while (group / "cgroup.procs").read_text().strip():  # the daemon's last workers leave after the job
            time.sleep(0.1)
        poller.stop.set()
        poller.join()
        total = int((group / "cpuacct.usage").read_text()) / 1e9
        group.rmdir()
        per_pid = poller.by_pid()
    else:
        total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    logged: dict[int, dict[str, Any]] = {}
    for file in logs.iterdir():
        for line in file.read_text().splitlines():
            rec = json.loads(line)
            logged[rec["pid"]] = rec
    kinds: dict[str, dict[str, Any]] = {}
    for pid in set(per_pid) | set(logged):
        kind, cpu = per_pid.get(pid, ("unknown", 0.0))
        rec = logged.get(pid, {})
        k = kinds.setdefault(kind, {"processes": 0, "cpu": 0.0, "modules": 0, "heavy": set()})
        k["processes"] += 1
        k["cpu"] += max(cpu, rec.get("cpu", 0.0))
        k["modules"] = max(k["modules"], rec.get("modules", 0))
        k["heavy"].update(rec.get("heavy", ()))
    seen = sum(k["cpu"] for k in kinds.values())
    kinds["unaccounted"] = {"processes": 0, "cpu": total - seen, "modules": 0, "heavy": set()}
    return {"total": total, "wall": wall, "cgroup": group is not None, "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entry", choices=("format", "foreach"), default="format")
    p.add_argument("--writer", default="auto", help="foreach_batch's write path (default: %(default)s)")
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--max-files", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--json", action="store_true", help="one JSON line per repetition")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose job runs (default: this one)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lakesink-worker-cpu-") as tmp:
        totals = []
        for rep in range(args.reps):
            r = run_once(args, Path(tmp) / "run")
            totals.append(r["total"])
            if args.json:
                r["kinds"] = {k: {**v, "heavy": sorted(v["heavy"])} for k, v in r["kinds"].items()}
                print(json.dumps({"rep": rep, "entry": args.entry, **r}), flush=True)
                continue
            print(f"rep {rep}: total {r['total']:.1f} CPU-s (wall {r['wall']:.0f} s, {'cgroup' if r['cgroup'] else 'rusage'})")
            for kind, k in sorted(r["kinds"].items(), key=lambda kv: -kv[1]["cpu"]):
                print(f"  {kind:16} {k['processes']:3} processes {k['cpu']:6.1f} CPU-s  modules<={k['modules']:5}  "
                      f"{' '.join(sorted(k['heavy']))}")  # fmt: skip
            sys.stdout.flush()
        if len(totals) > 1:
            print(f"median total {statistics.median(totals):.1f} CPU-s of {[round(t, 1) for t in totals]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
