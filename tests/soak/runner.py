"""Kill -9 soak: SIGKILL a streaming job into a lakesink table at random moments, restart it, check the table.

One soak (one seed):

1. a fresh run folder: JSON input files of uniquely keyed rows (``tests.support.helpers.write_json_input``),
   a checkpoint, a faults folder, and an embedded SQLite catalog (``LAKESINK_HOME`` = ``<run>/lakehouse``);
2. ``--rounds`` rounds. Each round picks one fault with ``random.Random(seed)`` and delivers it to the
   streaming job (``tests/soak/job.py``, a child process in a session of its own, ``local[2,4]``):

   - ``delay``: SIGKILL the job's whole session (Python driver, JVM, Spark's Python daemon and
     workers) a random delay (``--min-delay``..``--max-delay``) after the run's streaming query
     started (or after the round started, when the job was already running);
   - ``commit-kill``: arm ``kill`` at ``driver.before-check``, ``driver.before-swap`` or
     ``driver.after-swap``: the process that commits (Spark's commit worker with
     ``format("lakesink")``, the job's driver with ``foreach_batch``) SIGKILLs itself inside the
     commit; a random moment later the runner SIGKILLs the whole job;
   - ``pause-kill``: arm ``pause`` at ``driver.after-swap`` and SIGKILL the whole job while the commit
     is held there: the batch is in the table, not in Spark's commit log (the worst moment);
   - ``executor-kill``: arm ``kill`` at ``executor.after-file`` or ``executor.before-write``: a Python
     worker is SIGKILLed while it writes a task; Spark retries the task and the job must go on without
     a restart (the batch is committed by the same run);
   - ``executor-raise``: the same with an exception at an executor point;
   - ``offset-kill``: SIGKILL the job's JVM while Spark writes an offset-log entry (both temp files of
     ``offsets/N`` exist, neither is renamed: ``tests/support/chmod_shim.py``), then the whole job. In the
     first run of a checkpoint this is the first entry, ``offsets/0``, and Spark 4.3 refuses the restart
     (below).

   After every process-level kill the job is restarted from the same checkpoint (more input is
   added first when less than ``--ahead`` files are left unconsumed, so that rounds rarely find the
   stream finished); a job that finishes its input before the round's fault hit it is restarted
   with twice as much input ahead, and the same fault waits for the new run. A restart that Spark
   refuses with ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`` (a kill while it wrote the first
   offset-log entry left that entry's temp files; see :mod:`lakesink.sink.checkpoint_cleanup`) gets the
   documented recovery, ``lakesink checkpoint-clean`` (its library call, once the job's processes
   are all gone), and the job is started again; each such recovery is counted and reported
   (``spark_refused_restarts``, ``checkpoint_recoveries``), never a silent retry;

3. a final run without faults, until all input is consumed (after an executor-side last round, the
   running job is the final run);
4. the verdict: the exact multiset of ids read back with DuckDB (``lakesink.audit.interop.duckdb_query``
   on the table's metadata location) against the ids sent; every (query id, batch id) in at most one
   snapshot, batch ids from 0 without gaps, and the same last batch as Spark's commit log (whose
   retained entries are all in the table); every batch that was in the table but not in Spark's
   commit log when the job was killed is logged ``replay skipped`` by a later run and no data file
   is written for it after the kill; every file the table references exists; files left on disk
   unreferenced (killed tasks and drivers) are counted.

The soak exits with code 1 on any violation, 2 when it could not run to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# Spark's Python workers (started by the job's JVM) must run this interpreter; set before any Spark start.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyiceberg.exceptions import NoSuchTableError  # noqa: E402

from examples.demo import describe_processes, local_path, session_members, spark_log  # noqa: E402
from lakesink.audit import interop  # noqa: E402
from lakesink.driver import catalogs  # noqa: E402
from lakesink.faults import (  # noqa: E402
    DRIVER_AFTER_SWAP,
    DRIVER_BEFORE_CHECK,
    DRIVER_BEFORE_SWAP,
    ENV_FAULTS_DIR,
    EXECUTOR_AFTER_FILE,
    EXECUTOR_BEFORE_RETURN,
    EXECUTOR_BEFORE_WRITE,
)
from lakesink.sink.checkpoint_cleanup import SPARK_NOT_EMPTY_ERROR, clean_checkpoint  # noqa: E402
from lakesink.table import storage  # noqa: E402
from tests.support import chmod_shim  # noqa: E402
from tests.support.helpers import (  # noqa: E402
    assert_snapshot_invariants,
    data_files_on_disk,
    lakesink_snapshots,
    referenced_data_files,
    write_json_input,
)
from tests.support.soak import SoakFolder, job_env, kill, kill_session, progress_signature  # noqa: E402

TABLE = "soak.events"
IDENT = ("soak", "events")
POLL_S = 0.05

DELAY = "delay"
COMMIT_KILL = "commit-kill"
PAUSE_KILL = "pause-kill"
EXECUTOR_KILL = "executor-kill"
EXECUTOR_RAISE = "executor-raise"
OFFSET_KILL = "offset-kill"
PROCESS_PHASES = (DELAY, COMMIT_KILL, PAUSE_KILL, OFFSET_KILL)
EXECUTOR_PHASES = (EXECUTOR_KILL, EXECUTOR_RAISE)
PHASES = PROCESS_PHASES + EXECUTOR_PHASES
POINTS = {
    COMMIT_KILL: (DRIVER_BEFORE_CHECK, DRIVER_BEFORE_SWAP, DRIVER_AFTER_SWAP),
    PAUSE_KILL: (DRIVER_AFTER_SWAP,),
    EXECUTOR_KILL: (EXECUTOR_AFTER_FILE, EXECUTOR_BEFORE_WRITE),
    EXECUTOR_RAISE: (EXECUTOR_BEFORE_WRITE, EXECUTOR_AFTER_FILE, EXECUTOR_BEFORE_RETURN),
}
ACTION = {COMMIT_KILL: "kill", PAUSE_KILL: "pause", EXECUTOR_KILL: "kill", EXECUTOR_RAISE: "raise"}
WRITERS = ("auto", "spark", "arrow", "driver")  # foreach_batch's option writer (tests/soak/job.py --writer)
SHIM_ARM = "spark.offset-log-write"  # the arm file of tests/support/chmod_shim.py, in the faults folder

# what deliver() found
DELIVERED = "delivered"
FINISHED_FIRST = "finished first"  # the run consumed its input before the fault hit it
REFUSED_BY_SPARK = "refused by Spark"  # the restart failed with SPARK_NOT_EMPTY_ERROR; the checkpoint was cleaned

# where a process-level kill left the stream (Spark's offset and commit logs against the table)
IN_TABLE_NOT_COMMIT_LOG = "batch in the table, not in Spark's commit log"
PENDING_NOT_IN_TABLE = "batch in flight, not in the table"
BETWEEN_BATCHES = "between batches"
START_UP = "start-up (no batch of this run begun)"
LANDINGS = (IN_TABLE_NOT_COMMIT_LOG, PENDING_NOT_IN_TABLE, BETWEEN_BATCHES, START_UP)

_DATA_FILE = re.compile(r"^[0-9a-f]{8}-(\d{5})-(\d{5})-")
_SKIPPED = re.compile(r"batch=(\d+) replay skipped")
_TASK_FAILED = re.compile(r"ERROR Executor: Exception in task")  # Spark's line for a failed task attempt


class SoakAborted(Exception):
    """The soak could not run to the end (a hang, a job that keeps failing): not a verdict."""


class Stall:
    """A hang guard that measures silence, not speed: how long nothing the job does has been seen.

    A wall-clock deadline per fault made the short soak fail at random on a loaded machine (load
    average 11 on 2 cores: Spark needed over 100 s from a run's start to its first commit, and the
    round gave up at 150 s, ``--run-timeout`` of tests/test_soak.py). Progress is any change of the job's log, its checkpoint,
    the table's files or the fault markers; only a job that changes none of them for ``limit``
    seconds is taken for hung.
    """

    def __init__(self, soak: Soak, limit: float):
        self.soak, self.limit = soak, limit
        self.seen = soak.progress_signature()
        self.since = self.checked = time.monotonic()

    def stalled_for(self) -> float | None:
        """Seconds without progress when that exceeds the limit, else None (looks at most once a second)."""
        now = time.monotonic()
        if now - self.checked < 1.0:
            return None
        self.checked = now
        seen = self.soak.progress_signature()
        if seen != self.seen:
            self.seen, self.since = seen, now
            return None
        return now - self.since if now - self.since > self.limit else None


@dataclass(frozen=True)
class Config:
    seed: int
    rounds: int
    folder: Path
    entry: str = "format"
    writer: str = "auto"
    """foreach_batch's write path (executor.* fault points fire on the arrow path only); comma-separated: the writer of
    each run in turn, the last one for every later run (e.g. ``arrow,driver``: run 1 on the Arrow path, the restarts
    with every batch written on the driver; the option changes, the checkpoint and the table stay)."""
    phases: tuple[str, ...] = PHASES
    schedule: tuple[str, ...] | None = None  # explicit phases (``phase`` or ``phase@point``), in order
    rows_per_file: int = 100
    files_per_batch: int = 2
    initial_files: int = 40
    ahead_files: int = 60
    min_delay: float = 0.0
    max_delay: float = 12.0
    run_timeout: float = 300.0  # seconds the job may go without any progress (see Soak.stalled_for)
    master: str = "local[2,4]"
    catalog: tuple[tuple[str, str], ...] = ()
    """pyiceberg properties of the catalog to soak against (default: an embedded SQLite catalog in the run folder);
    the job gets them as catalog ``lakesink`` of a ``.pyiceberg.yaml`` (e.g. a REST server, tests/sink/test_rest_spark.py)."""
    table: str = TABLE


@dataclass(frozen=True)
class Fault:
    phase: str
    point: str | None = None
    delay: float | None = None  # DELAY: seconds after the run's query (or the round) started
    linger: float | None = None  # COMMIT_KILL: seconds between the commit process's death and the job's kill

    def __str__(self) -> str:
        if self.phase == DELAY:
            return f"{DELAY} {self.delay:.1f}s"
        if self.phase == OFFSET_KILL:
            return f"{OFFSET_KILL} (JVM SIGKILLed while Spark writes an offset-log entry)"
        extra = f" +{self.linger:.1f}s" if self.linger is not None else ""
        return f"{self.phase} at {self.point}{extra}"


@dataclass
class RunRecord:
    number: int
    pid: int
    started: float
    ended: float = 0.0
    exit_code: int | None = None
    killed: bool = False
    note: str = ""
    log_offset: int = 0
    offsets_at_start: list[int] = field(default_factory=list)
    commits_at_start: list[int] = field(default_factory=list)
    writer: str = "auto"


@dataclass
class RoundRecord:
    number: int
    fault: str
    phase: str
    point: str | None
    run: int = 0
    landed: str | None = None  # process-level kills: where the stream was (LANDINGS)
    batch: int | None = None  # the batch pending at the kill, or the batch of the executor fault
    restarts_before_delivery: int = 0
    seconds: float = 0.0


@dataclass
class OwedSkip:
    """A batch in the table but not in Spark's commit log at a kill: a later run must skip it."""

    batch: int
    killed_at: float  # wall clock after the kill
    log_offset: int  # size of the job log at the kill


@dataclass
class Soak(SoakFolder):
    cfg: Config
    rng: random.Random = field(init=False)
    t0: float = field(default_factory=time.monotonic)
    sent: list[int] = field(default_factory=list)
    runs: list[RunRecord] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    owed: list[OwedSkip] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    child: subprocess.Popen[bytes] | None = None
    unexpected_failures: int = 0
    # restarts Spark refused (SPARK_NOT_EMPTY_ERROR) and what lakesink checkpoint-clean removed for each
    recoveries: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self.props = dict(self.cfg.catalog) or {
            "type": "sql",
            "uri": f"sqlite:///{self.home}/catalog.db",
            "warehouse": f"file://{self.home}/warehouse",
        }
        self.ident = tuple(self.cfg.table.split("."))

    # --- paths ----------------------------------------------------------------------------------

    @property
    def faults(self) -> Path:
        return self.folder / "faults"

    @property
    def log(self) -> Path:
        return self.folder / "job.log"

    @property
    def shim_arm(self) -> Path:
        return self.faults / SHIM_ARM

    def progress_signature(self) -> tuple[float, ...]:
        """What changes while the job works: its log's size, and the count and newest modification of the
        files in its checkpoint, the table's warehouse and the faults folder."""
        return progress_signature(self.log, (self.checkpoint, self.home, self.faults))

    def say(self, text: str) -> None:
        print(f"[seed {self.cfg.seed} {time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    # --- set-up and input -----------------------------------------------------------------------

    def prepare(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        for sub in (self.input, self.checkpoint, self.faults, self.home):
            sub.mkdir(parents=True)
        self.shim_bin = chmod_shim.install(self.folder)
        self.add_files(self.cfg.initial_files)

    def add_files(self, files: int) -> None:
        if files > 0:
            self.sent += write_json_input(self.input, files=files, rows_per_file=self.cfg.rows_per_file, start=len(self.sent))

    def table(self) -> Any:
        return catalogs.load(None, self.props).load_table(self.ident)

    def rows_committed(self) -> int:
        """Rows in the table (the current snapshot's summary); only read while no job runs."""
        try:
            snapshot = self.table().current_snapshot()
        except NoSuchTableError:
            return 0
        return int(snapshot.summary["total-records"]) if snapshot and snapshot.summary else 0

    def top_up(self, ahead: int) -> None:
        """Before a run that will be killed: keep at least ``ahead`` files unconsumed."""
        left = (len(self.sent) - self.rows_committed()) // self.cfg.rows_per_file
        if left < ahead:
            self.add_files(ahead - left)

    def table_batches(self) -> list[int]:
        try:
            return sorted(s["batch_id"] for s in lakesink_snapshots(self.table()))
        except NoSuchTableError:
            return []

    # --- the job ----------------------------------------------------------------------------------

    def start_run(self) -> subprocess.Popen[bytes]:
        env = job_env(self.home)
        env[ENV_FAULTS_DIR] = str(self.faults)  # read by the job's driver, commit worker and executors
        if self.cfg.catalog:  # the job's default catalog "lakesink", from a configuration file of its own
            home = self.folder / "pyiceberg"
            home.mkdir(exist_ok=True)
            lines = ["catalog:", "  lakesink:"]  # block style: pyiceberg's strictyaml refuses JSON-like flow mappings
            lines += [f"    {k}: '{v.replace(chr(39), chr(39) * 2)}'" for k, v in self.cfg.catalog]
            (home / ".pyiceberg.yaml").write_text("\n".join(lines) + "\n")
            env["PYICEBERG_HOME"] = str(home)
        env = chmod_shim.environment(env, self.shim_bin, self.shim_arm)  # phase offset-kill
        number = len(self.runs) + 1
        with self.log.open("a") as f:
            f.write(f"\n===== run {number}, started {datetime.now():%H:%M:%S} =====\n")
        log_offset = self.log.stat().st_size
        cmd = [
            sys.executable, "-m", "tests.soak.job",
            "--input", str(self.input),
            "--checkpoint", str(self.checkpoint),
            "--table", self.cfg.table,
            "--max-files", str(self.cfg.files_per_batch),
            "--entry", self.cfg.entry,
            "--writer", self.writer_of(number),
            "--master", self.cfg.master,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            # a session of its own: the job, its JVM and the JVM's Python processes are killed together
            proc = subprocess.Popen(
                cmd, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
            )
        self.child = proc
        self.runs.append(
            RunRecord(
                number=number,
                writer=self.writer_of(number),
                pid=proc.pid,
                started=time.time(),
                log_offset=log_offset,
                offsets_at_start=spark_log(self.checkpoint / "offsets"),
                commits_at_start=spark_log(self.checkpoint / "commits"),
            )
        )
        return proc

    def writer_of(self, number: int) -> str:
        """The writer of run ``number`` (1 is the first): :attr:`Config.writer`'s entry for it, else its last."""
        writers = self.cfg.writer.split(",")
        return writers[min(number, len(writers)) - 1]

    @property
    def run(self) -> RunRecord:
        return self.runs[-1]

    def query_started(self) -> bool:
        """The current run's streaming query has started (the job printed its query id)."""
        with self.log.open("rb") as f:
            f.seek(self.run.log_offset)
            return b"soak_job: query id" in f.read()

    def kill(self) -> dict[int, str]:
        """SIGKILL every process of the job's session (see examples/demo.py: Spark's Python daemon
        leaves the job's process group, not its session) and wait until all are gone."""
        proc = self.child
        assert proc is not None
        killed = kill_session(proc, what="the killed job", error=SoakAborted)
        self.run.ended, self.run.exit_code, self.run.killed = time.time(), proc.returncode, True
        self.child = None
        return killed

    def stop_child(self) -> None:
        """On the way out (an error, Ctrl-C, SIGTERM): the job is in a session of its own, kill it."""
        if self.child is not None and self.child.poll() is None:
            self.say(f"stopping the job (pid {self.child.pid})")
            self.kill()

    def reap(self, *, expected_failure: bool) -> bool:
        """The job exited by itself: record it; a failure nobody caused is a violation.

        True when Spark refused to start the query over temp files a kill left in the checkpoint
        (SPARK_NOT_EMPTY_ERROR): the recovery was applied and the job is to be started again.
        """
        proc = self.child
        assert proc is not None and proc.returncode is not None
        self.run.ended, self.run.exit_code = time.time(), proc.returncode
        self.child = None
        if proc.returncode == 0 or expected_failure:
            return False
        if self.refused_by_spark():
            self.recover_refused_restart()
            return True
        self.unexpected_failures += 1
        self.violation(
            f"run {self.run.number} of the job failed with exit code {proc.returncode} without a fault "
            f"that explains it; end of its log:\n{self.log_tail()}"
        )
        if self.unexpected_failures >= 3:
            raise SoakAborted("the job failed 3 times without a fault that explains it")
        return False

    def refused_by_spark(self) -> bool:
        """The current run failed because Spark refused a checkpoint whose offset log is empty but not its folder."""
        with self.log.open("rb") as f:
            f.seek(self.run.log_offset)
            return SPARK_NOT_EMPTY_ERROR.encode() in f.read()

    def recover_refused_restart(self) -> None:
        """The recovery docs/protocol.md gives for SPARK_NOT_EMPTY_ERROR: ``lakesink checkpoint-clean``.

        Every process of the failed run is gone first (the run exited; leftovers of its session are
        killed), so the checkpoint cannot change: the runner knows what the command's quiet-time rule
        guesses, hence ``older_than=0``. Counted and reported; a clean-up that leaves Spark's check
        failing aborts the soak.
        """
        run = self.run
        deadline = time.monotonic() + 30
        while left := session_members(run.pid):
            if time.monotonic() > deadline:
                raise SoakAborted(f"processes of the failed run {run.number} survive: {left}")
            kill(left)
            time.sleep(0.02)
        report = clean_checkpoint(str(self.checkpoint), older_than=timedelta(0))
        removed = [f.path for f in report.removed]
        self.recoveries.append(
            {
                "run": run.number,
                "removed": removed,
                "failed": [f.path for f in report.failed],
                "still_blocking": list(report.still_blocking),
            }
        )
        run.note = f"{REFUSED_BY_SPARK} ({SPARK_NOT_EMPTY_ERROR}); lakesink checkpoint-clean removed {removed}"
        self.say(
            f"run {run.number}: Spark refused to restart the query ({SPARK_NOT_EMPTY_ERROR}); lakesink checkpoint-clean "
            f"removed {len(removed)} abandoned temp file(s): {removed}"
        )
        if not report.ok or not removed:
            raise SoakAborted(
                f"run {run.number}: Spark refused the restart and lakesink checkpoint-clean did not clear it:\n"
                f"{report.human()}\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])

    def violation(self, text: str) -> None:
        self.violations.append(text)
        self.say(f"VIOLATION: {text}")

    # --- faults -----------------------------------------------------------------------------------

    def arm(self, fault: Fault) -> None:
        if fault.phase == OFFSET_KILL:
            chmod_shim.arm(self.shim_arm, chmod_shim.OFFSET_LOG_WRITE)
        elif fault.point is not None:
            (self.faults / fault.point).write_text(ACTION[fault.phase])

    def fired(self, point: str) -> bool:
        return any(p.name.startswith(f"{point}.fired.") for p in self.faults.iterdir())

    def clear_faults(self) -> None:
        for p in self.faults.iterdir():
            p.unlink(missing_ok=True)

    def next_fault(self, number: int) -> Fault:
        if self.cfg.schedule is not None:
            phase, _, point = self.cfg.schedule[(number - 1) % len(self.cfg.schedule)].partition("@")
        else:
            phase, point = self.rng.choice(self.cfg.phases), ""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
        if phase == DELAY:
            return Fault(DELAY, delay=round(self.rng.uniform(self.cfg.min_delay, self.cfg.max_delay), 2))
        if phase == OFFSET_KILL:
            return Fault(OFFSET_KILL)
        if point and point not in POINTS[phase]:
            raise ValueError(f"phase {phase} has no point {point!r}; valid: {', '.join(POINTS[phase])}")
        point = point or self.rng.choice(POINTS[phase])
        linger = round(self.rng.uniform(0.0, 1.0), 2) if phase == COMMIT_KILL else None
        return Fault(phase, point=point, linger=linger)

    # --- one round --------------------------------------------------------------------------------

    def play_round(self, number: int) -> None:
        fault = self.next_fault(number)
        record = RoundRecord(number=number, fault=str(fault), phase=fault.phase, point=fault.point)
        started = time.monotonic()
        self.arm(fault)
        while True:
            fresh = self.child is None
            if fresh:
                # a run that consumed all its input before the fault hit it: twice as much for the next
                self.top_up(self.cfg.ahead_files * 2**record.restarts_before_delivery)
                self.start_run()
            record.run = self.run.number
            outcome = self.deliver(fault, record, fresh=fresh)
            if outcome == DELIVERED:
                break
            if outcome == REFUSED_BY_SPARK:
                if len(self.recoveries) > self.cfg.rounds:
                    raise SoakAborted(f"round {number}: Spark refused more restarts than there were kills")
                continue  # recovered: the same fault waits for the new run
            record.restarts_before_delivery += 1
            if record.restarts_before_delivery > 5:
                raise SoakAborted(f"round {number}: {fault} never hit the job in 5 runs")
        record.seconds = round(time.monotonic() - started, 2)
        self.rounds.append(record)
        self.clear_faults()

    def deliver(self, fault: Fault, record: RoundRecord, *, fresh: bool) -> str:
        """Deliver the fault to the running job: DELIVERED, FINISHED_FIRST (the job finished its input first:
        restart it) or REFUSED_BY_SPARK (Spark refused the restart; the checkpoint was cleaned: start it again).

        A delay counts from the moment the streaming query of a fresh run started (Spark's start-up,
        10-30 s on a busy machine, is not the interesting part), or from the start of the round when
        the job was already running (after an executor-side round).
        """
        proc = self.child
        assert proc is not None
        begin = time.monotonic()
        stall = Stall(self, self.cfg.run_timeout)
        anchor = None if fresh else begin
        reached = self.faults / f"{DRIVER_AFTER_SWAP}.reached"
        while True:
            if fault.phase == DELAY:
                if anchor is None and self.query_started():
                    anchor = time.monotonic()
                hit = anchor is not None and time.monotonic() - anchor >= (fault.delay or 0.0)
            elif fault.phase == PAUSE_KILL:
                hit = reached.exists()
            elif fault.phase == OFFSET_KILL:
                hit = chmod_shim.fired(self.shim_arm) is not None
            else:
                hit = self.fired(fault.point or "")
            if hit:
                break
            if proc.poll() is not None:
                if self.reap(expected_failure=False):
                    return REFUSED_BY_SPARK
                self.say(f"run {self.run.number} ended (exit {proc.returncode}) before {fault} hit it; restarting")
                return FINISHED_FIRST
            if (silent := stall.stalled_for()) is not None:
                raise SoakAborted(f"{fault}: not delivered; no progress of the job for {silent:.0f}s\n{self.log_tail()}")
            time.sleep(POLL_S)

        if fault.phase in EXECUTOR_PHASES:
            self.executor_fault_retried(fault, record, stall)
            return DELIVERED
        if fault.phase == COMMIT_KILL:
            time.sleep(fault.linger or 0.0)  # the job may notice its dead commit process meanwhile
        self.kill_and_classify(fault, record)
        return DELIVERED

    def executor_fault_retried(self, fault: Fault, record: RoundRecord, stall: Stall) -> None:
        """After a task failed (worker killed, or an exception): the same run must commit that batch."""
        proc = self.child
        assert proc is not None
        offsets = spark_log(self.checkpoint / "offsets")
        batch = offsets[-1] if offsets else 0  # the batch whose task failed (or a later one)
        record.batch = batch
        while True:
            commits = spark_log(self.checkpoint / "commits")
            if commits and commits[-1] >= batch:
                break
            if proc.poll() is not None:
                self.reap(expected_failure=True)
                if proc.returncode != 0:
                    self.violation(
                        f"round {record.number}: {fault} failed the query (exit {proc.returncode}) instead of "
                        f"a task retry; end of the log:\n{self.log_tail()}"
                    )
                    return
                break  # the run finished its input, batch included
            if (silent := stall.stalled_for()) is not None:
                raise SoakAborted(f"{fault}: batch {batch} not committed; no progress of the job for {silent:.0f}s")
            time.sleep(POLL_S)
        self.say(
            f"round {record.number}: {fault} in batch {batch} of run {self.run.number}: task retried, batch "
            "committed by the same run"
        )

    def kill_and_classify(self, fault: Fault, record: RoundRecord) -> None:
        run = self.run
        killed = self.kill()
        killed_at = time.time()
        offsets, commits = spark_log(self.checkpoint / "offsets"), spark_log(self.checkpoint / "commits")
        in_table = self.table_batches()
        top_offset = offsets[-1] if offsets else -1
        top_commit = commits[-1] if commits else -1
        if top_offset > top_commit:
            record.batch = top_offset
            if top_offset in in_table:
                record.landed = IN_TABLE_NOT_COMMIT_LOG
                self.owed.append(OwedSkip(top_offset, killed_at, self.log.stat().st_size))
            else:
                record.landed = PENDING_NOT_IN_TABLE
        else:
            # no new offset and no new commit since the run started: it never began a batch
            unchanged = (offsets, commits) == (run.offsets_at_start, run.commits_at_start)
            record.landed = START_UP if unchanged else BETWEEN_BATCHES
        run.note = f"{fault}: {record.landed}"
        what = describe_processes(killed, run.pid) if killed else "its processes had already exited"
        self.say(
            f"round {record.number}: {fault}; SIGKILL run {run.number}: {what}; "
            f"{record.landed}" + (f" (batch {record.batch})" if record.batch is not None else "")
        )

    def final_run(self) -> None:
        """Let a run without faults consume all input (the job of an executor-side last round goes on)."""
        self.clear_faults()
        for _ in range(3):  # a restart Spark refuses is recovered and started again (at most twice)
            if self.child is None:
                self.start_run()
                self.say(f"final run {self.run.number}: no faults, until all input is consumed")
            else:
                self.say(f"final run: run {self.run.number} goes on without faults until all input is consumed")
            proc = self.child
            assert proc is not None
            stall = Stall(self, self.cfg.run_timeout)
            while proc.poll() is None:
                if (silent := stall.stalled_for()) is not None:
                    raise SoakAborted(f"the final run made no progress for {silent:.0f}s\n{self.log_tail()}")
                time.sleep(POLL_S * 4)
            if not self.reap(expected_failure=False):
                break
        self.run.note = "final run"
        if self.run.exit_code != 0:
            raise SoakAborted(f"the final run failed (exit {self.run.exit_code})")

    # --- the verdict --------------------------------------------------------------------------------

    def verify(self) -> dict[str, Any]:
        table = self.table()
        local = table.metadata_location.startswith(("file:", "/"))
        if local:
            ids = interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist()
        else:  # object storage: DuckDB's httpfs extension cannot be installed offline; pyiceberg reads it
            ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
        reader = "DuckDB" if local else "pyiceberg"
        counts = Counter(ids)
        expected = Counter(self.sent)
        duplicates = sum(c - expected.get(i, 0) for i, c in counts.items() if c > expected.get(i, 0) and i in expected)
        missing = sum(c - counts.get(i, 0) for i, c in expected.items() if c > counts.get(i, 0))
        unexpected = sum(c for i, c in counts.items() if i not in expected)
        if duplicates or missing or unexpected:
            self.violation(
                f"ids read with {reader}: {duplicates} duplicate(s), {missing} missing, {unexpected} unexpected "
                f"({len(ids)} rows in the table, {len(self.sent)} sent)"
            )

        snaps = lakesink_snapshots(table)
        keys = Counter((s["query_id"], s["batch_id"]) for s in snaps)
        twice = sorted(b for (_, b), n in keys.items() if n > 1)
        if twice:
            self.violation(f"batches committed in more than one snapshot: {twice}")
        try:
            assert_snapshot_invariants(table)
        except AssertionError as e:
            self.violation(f"snapshot invariants: {e}")
        query_ids = sorted({s["query_id"] for s in snaps})
        if len(query_ids) != 1:
            self.violation(f"expected one streaming query id (one checkpoint), found {query_ids}")
        foreign = len(table.snapshots()) - len(snaps)
        if foreign:
            self.violation(f"{foreign} snapshot(s) not written by lakesink")
        batches = sorted({s["batch_id"] for s in snaps})
        if batches and batches[0] != 0:
            self.violation(f"the table's first batch is {batches[0]}, not 0")
        # Spark keeps only the last spark.sql.streaming.minBatchesToRetain (100) entries of its commit log:
        # every retained entry must be in the table, and the table must end where the commit log ends
        commit_log = spark_log(self.checkpoint / "commits")
        not_in_table = sorted(set(commit_log) - set(batches))
        if not_in_table:
            self.violation(f"batches in Spark's commit log but not in the table: {not_in_table}")
        if batches and commit_log and batches[-1] != commit_log[-1]:
            self.violation(f"the table ends at batch {batches[-1]}, Spark's commit log at batch {commit_log[-1]}")

        log_text = self.log.read_text(errors="replace")
        skipped_lines = [int(b) for b in _SKIPPED.findall(log_text)]
        task_failures = len(_TASK_FAILED.findall(log_text))
        on_disk = data_files_on_disk(table) if local else _data_files_in_storage(table)
        referenced = referenced_data_files(table)
        for owed in self.owed:
            if owed.batch not in {int(b) for b in _SKIPPED.findall(log_text[owed.log_offset :])}:
                self.violation(f"batch {owed.batch} was in the table at a kill but no later run logged it 'replay skipped'")
            late = sorted(
                p
                for p in on_disk
                if (m := _DATA_FILE.match(p.rsplit("/", 1)[-1]))
                and int(m[1]) == owed.batch
                and _modified(table, p, local) > owed.killed_at
            )
            if late:
                self.violation(f"batch {owed.batch} was already in the table, yet data files were written for it: {late}")
        dangling = sorted(referenced - on_disk)
        if dangling:
            self.violation(f"the table references {len(dangling)} missing data file(s): {dangling[:5]}")
        unreferenced = sorted(on_disk - referenced)
        unexplained = self.unexplained(unreferenced)
        if unexplained:
            self.say(f"note: {len(unexplained)} unreferenced data file(s) of batches no fault touched: {unexplained[:5]}")

        kills = [r for r in self.rounds if r.phase in PROCESS_PHASES]
        landed = Counter(r.landed for r in kills)
        return {
            "seed": self.cfg.seed,
            "entry": self.cfg.entry,
            "rounds": len(self.rounds),
            "runs": len(self.runs),
            "restarts": len(self.runs) - 1,
            "kills_by_phase": {p: sum(r.phase == p for r in self.rounds) for p in PHASES},
            "faults_by_point": dict(sorted(Counter(f"{r.phase}@{r.point}" for r in self.rounds if r.point).items())),
            "kills_landed": {k: landed.get(k, 0) for k in LANDINGS},
            "replays": {
                # batches Spark ran again after a restart: offset log entry without commit log entry at a kill
                "batches_replayed": landed.get(IN_TABLE_NOT_COMMIT_LOG, 0) + landed.get(PENDING_NOT_IN_TABLE, 0),
                "already_in_table_skipped": len(self.owed),
                "not_in_table_rewritten": landed.get(PENDING_NOT_IN_TABLE, 0),
                "replay_skipped_log_lines": len(skipped_lines),
            },
            "failed_task_attempts_in_log": task_failures,
            # restarts Spark refused over temp files a kill left in the checkpoint, each recovered with
            # lakesink checkpoint-clean (which files it removed, per refused run)
            "spark_refused_restarts": len(self.recoveries),
            "checkpoint_recoveries": list(self.recoveries),
            "rows_sent": len(self.sent),
            "rows_in_table": len(ids),
            "duplicates": duplicates,
            "missing": missing,
            "unexpected": unexpected,
            "batches_in_table": len(batches),
            "snapshots": len(table.snapshots()),
            "data_files_referenced": len(referenced),
            "unreferenced_data_files": len(unreferenced),
            # files of batches that no fault touched (no worker killed after a file, no kill mid-batch):
            # a leak on a normal path; reported, not an exactly-once violation
            "unreferenced_data_files_unexplained": len(unexplained),
            "violations": list(self.violations),
            "seconds": round(time.monotonic() - self.t0, 1),
            "metadata_location": table.metadata_location,
            "folder": str(self.folder),
            "round_log": [asdict(r) for r in self.rounds],
            "run_log": [asdict(r) for r in self.runs],
        }

    def unexplained(self, unreferenced: list[str]) -> list[str]:
        """Unreferenced files whose batch was neither in flight at a process-level kill nor had a worker
        killed after writing a file (the batch an executor fault is recorded with is the last offset
        seen when it fired, so the batch before it counts too)."""
        touched: set[int] = set()
        for r in self.rounds:
            if r.batch is None:
                continue
            if r.landed == PENDING_NOT_IN_TABLE:
                touched.add(r.batch)
            elif r.phase == EXECUTOR_KILL and r.point == EXECUTOR_AFTER_FILE:
                touched.update((r.batch - 1, r.batch))
        out = []
        for path in unreferenced:
            m = _DATA_FILE.match(path.rsplit("/", 1)[-1])
            if m is None or int(m[1]) not in touched:
                out.append(path)
        return out

    # --- all of it ------------------------------------------------------------------------------------

    def play(self) -> dict[str, Any]:
        self.say(
            f"entry {self.cfg.entry}, {self.cfg.rounds} rounds, {self.cfg.rows_per_file} rows per file, "
            f"{self.cfg.files_per_batch} files per batch, folder {self.folder}"
        )
        try:
            self.prepare()
            for number in range(1, self.cfg.rounds + 1):
                self.play_round(number)
            self.final_run()
        finally:
            self.stop_child()
        result = self.verify()
        self.say(
            f"done: {result['rows_in_table']:,} rows in the table, {result['rows_sent']:,} sent; "
            f"{result['duplicates']} duplicates, {result['missing']} missing; {len(self.violations)} violation(s)"
        )
        return result


# --- the command --------------------------------------------------------------------------------------


def _data_files_in_storage(table: Any) -> set[str]:
    """Every Parquet file under the table's data folder on object storage (listed through the table's FileIO)."""
    root = f"{table.location().rstrip('/')}/data"
    return {f"{root}/{f.relative}" for f in storage.list_files(table.io, root) if f.relative.endswith(".parquet")}


def _modified(table: Any, path: str, local: bool) -> float:
    if local:
        return os.stat(local_path(path)).st_mtime
    folder, _, name = path.rpartition("/")
    for f in storage.list_files(table.io, folder):
        if f.relative == name and f.modified is not None:
            return f.modified.timestamp()
    return 0.0


def summarize(results: list[dict[str, Any]]) -> str:
    lines = []
    head = (
        f"{'seed':>5} {'entry':<8} {'rounds':>6} {'runs':>5} {'delay':>5} {'commit':>6} {'pause':>5} {'ex-kill':>7} "
        f"{'ex-raise':>8} {'replays':>7} {'skipped':>7} {'rows':>8} {'dup':>4} {'miss':>4} {'unref':>5} {'time':>7}"
    )
    lines.append(head)
    for r in results:
        k = r["kills_by_phase"]
        lines.append(
            f"{r['seed']:>5} {r['entry']:<8} {r['rounds']:>6} {r['runs']:>5} {k[DELAY]:>5} {k[COMMIT_KILL]:>6} "
            f"{k[PAUSE_KILL]:>5} {k[EXECUTOR_KILL]:>7} {k[EXECUTOR_RAISE]:>8} {r['replays']['batches_replayed']:>7} "
            f"{r['replays']['already_in_table_skipped']:>7} {r['rows_sent']:>8} {r['duplicates']:>4} {r['missing']:>4} "
            f"{r['unreferenced_data_files']:>5} {r['seconds']:>6.0f}s"
        )
    lines.append("")
    lines.append("columns: delay/commit/pause = process-level SIGKILLs by phase; ex-kill/ex-raise = executor-side faults")
    lines.append("(task retried, no restart); replays = batches Spark ran again after a restart; skipped = of those,")
    lines.append("batches already in the table, logged 'replay skipped' by a later run; unref = data files on disk that")
    lines.append("no snapshot references (killed tasks and drivers)")
    for r in results:
        lines.append("")
        lines.append(
            f"seed {r['seed']}: where the process-level kills landed: "
            + ", ".join(f"{k}: {v}" for k, v in r["kills_landed"].items())
        )
        lines.append(f"seed {r['seed']}: faults by point: " + ", ".join(f"{k}: {v}" for k, v in r["faults_by_point"].items()))
        lines.append(
            f"seed {r['seed']}: restarts Spark refused ({SPARK_NOT_EMPTY_ERROR}), each recovered with lakesink "
            f"checkpoint-clean: {r['spark_refused_restarts']}"
            + "".join(f"; run {c['run']}: removed {', '.join(c['removed'])}" for c in r["checkpoint_recoveries"])
        )
        lines.append(
            f"seed {r['seed']}: 'replay skipped' log lines: {r['replays']['replay_skipped_log_lines']}; failed task "
            f"attempts in the log: {r['failed_task_attempts_in_log']}; unreferenced data files of batches no fault "
            f"touched: {r['unreferenced_data_files_unexplained']}; batches: "
            f"{r['batches_in_table']}; snapshots: {r['snapshots']}; rows in the table (DuckDB): {r['rows_in_table']:,}"
        )
        for v in r["violations"]:
            lines.append(f"seed {r['seed']}: VIOLATION: {v}")
    return "\n".join(lines)


def parse_seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=50, help="faults per seed (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="one seed (default: 1)")
    p.add_argument("--seeds", type=parse_seeds, default=None, help="comma-separated seeds, one soak each, one after the other")
    p.add_argument(
        "--entry",
        choices=("format", "foreach", "both"),
        default="format",
        help="lakesink entry point: format('lakesink'), foreach_batch, or both (the seeds alternate, format first)",
    )
    p.add_argument(
        "--writer",
        default="auto",
        help="foreach_batch's write path: auto, spark, arrow or driver (executor.* fault points fire on the arrow path "
        "only); comma-separated: the writer of each run in turn, the last for the later runs, e.g. arrow,driver "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--phases",
        type=parse_list,
        default=PHASES,
        help=f"phases to draw from (default: all: {','.join(PHASES)})",
    )
    p.add_argument(
        "--schedule",
        type=parse_list,
        default=None,
        help="explicit phases in order instead of drawing them, e.g. delay,commit-kill@driver.after-swap,pause-kill",
    )
    p.add_argument("--rows-per-file", type=int, default=100, help="rows per input file (default: %(default)s)")
    p.add_argument("--files-per-batch", type=int, default=2, help="maxFilesPerTrigger (default: %(default)s)")
    p.add_argument("--initial-files", type=int, default=40, help="input files before the first run (default: %(default)s)")
    p.add_argument(
        "--ahead",
        type=int,
        default=60,
        help="before each restart, add input files until this many are unconsumed; doubled for a round whose "
        "fault the previous run finished before (default: %(default)s)",
    )
    p.add_argument(
        "--min-delay",
        type=float,
        default=0.0,
        help="phase delay: shortest delay after the query started, s (default: %(default)s)",
    )
    p.add_argument(
        "--max-delay",
        type=float,
        default=12.0,
        help="phase delay: longest delay after the query started, s (default: %(default)s)",
    )
    p.add_argument(
        "--run-timeout",
        type=float,
        default=300.0,
        help="seconds the job may go without progress (its log, checkpoint, table files) before the soak gives up "
        "(default: %(default)s)",
    )
    p.add_argument("--master", default="local[2,4]", help="the job's Spark master (default: %(default)s)")
    p.add_argument(
        "--catalog-json",
        default=None,
        help="pyiceberg properties (JSON) of the catalog to soak against (default: an embedded SQLite catalog per seed)",
    )
    p.add_argument("--table", default=TABLE, help="the table the job writes (default: %(default)s)")
    p.add_argument("--dir", default=None, help="run folder (default: a new temporary folder); one sub-folder per seed")
    p.add_argument("--json", default=None, help="write the results as JSON to this file")
    args = p.parse_args(argv)
    for writer in args.writer.split(","):
        if writer not in WRITERS:
            p.error(f"unknown writer {writer!r}; valid: {', '.join(WRITERS)}")
    for phase in args.phases:
        if phase not in PHASES:
            p.error(f"unknown phase {phase!r}; valid: {', '.join(PHASES)}")
    if args.seed is not None and args.seeds is not None:
        p.error("give --seed or --seeds, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seeds = args.seeds or [args.seed if args.seed is not None else 1]
    root = Path(args.dir).expanduser().resolve() if args.dir else Path(tempfile.mkdtemp(prefix="lakesink-soak-"))
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    print(f"lakesink kill -9 soak: seeds {seeds}, {args.rounds} rounds each, entry {args.entry}, folder {root}", flush=True)
    results: list[dict[str, Any]] = []
    aborted: str | None = None
    for i, seed in enumerate(seeds):
        entry = ("format", "foreach")[i % 2] if args.entry == "both" else args.entry
        cfg = Config(
            seed=seed,
            rounds=args.rounds,
            folder=root / f"seed-{seed}-{entry}",
            entry=entry,
            writer=args.writer,
            phases=args.phases,
            schedule=args.schedule,
            rows_per_file=args.rows_per_file,
            files_per_batch=args.files_per_batch,
            initial_files=args.initial_files,
            ahead_files=args.ahead,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            run_timeout=args.run_timeout,
            master=args.master,
            catalog=tuple(sorted(json.loads(args.catalog_json).items())) if args.catalog_json else (),
            table=args.table,
        )
        try:
            results.append(Soak(cfg).play())
        except SoakAborted as e:
            aborted = f"seed {seed}: {e}"
            print(f"\nSOAK ABORTED: {aborted}", flush=True)
            break
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (see __main__): the job was killed on the way out
            aborted = f"seed {seed}: interrupted"
            print(f"\nSOAK INTERRUPTED during seed {seed}", flush=True)
            break
    wall = time.monotonic() - t0
    print()
    print(summarize(results))
    violations = sum(len(r["violations"]) for r in results)
    total = {
        "rounds": sum(r["rounds"] for r in results),
        "restarts": sum(r["restarts"] for r in results),
        "spark_refused_restarts": sum(r["spark_refused_restarts"] for r in results),
        "kills_by_phase": {p: sum(r["kills_by_phase"][p] for r in results) for p in PHASES},
        "batches_replayed": sum(r["replays"]["batches_replayed"] for r in results),
        "replays_skipped": sum(r["replays"]["already_in_table_skipped"] for r in results),
        "rows_sent": sum(r["rows_sent"] for r in results),
        "duplicates": sum(r["duplicates"] for r in results),
        "missing": sum(r["missing"] for r in results),
        "unreferenced_data_files": sum(r["unreferenced_data_files"] for r in results),
        "violations": violations,
        "wall_seconds": round(wall, 1),
    }
    print()
    print(
        f"total: {total['rounds']} rounds, {total['restarts']} restarts ({total['spark_refused_restarts']} refused by "
        f"Spark, recovered with lakesink checkpoint-clean), kills by phase {total['kills_by_phase']}, "
        f"{total['batches_replayed']} batches replayed ({total['replays_skipped']} already in the table, skipped), "
        f"{total['rows_sent']:,} rows sent, duplicates {total['duplicates']}, missing {total['missing']}, "
        f"{total['unreferenced_data_files']} unreferenced data files, wall time {wall / 60:.1f} min"
    )
    if args.json:
        report = {
            "command": " ".join(["python -m tests.soak", *(argv if argv is not None else sys.argv[1:])]),
            "started": started.isoformat(timespec="seconds"),
            "aborted": aborted,
            "total": total,
            "seeds": results,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if aborted:
        return 2
    if violations:
        print(f"FAILED: {violations} violation(s)")
        return 1
    print("OK: every row exactly once, no batch in two snapshots, no gap")
    return 0
