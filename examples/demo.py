"""lakesink demo: exactly-once streaming into an Iceberg table, through SIGKILLs (``make demo``).

What it does, on the embedded default catalog (a SQLite file and a warehouse folder under
$LAKESINK_HOME, default ./lakehouse; no other service):

1. prepares a fresh run: drops the table ``demo.events`` and removes an earlier run's input and
   checkpoint from the demo folder (default ./demo-run);
2. writes a replayable source: JSON files in which every event has a unique id;
3. runs the streaming job (examples/stream_job.py: JSON files → ``format("lakesink")``) as a child
   process and SIGKILLs it, with everything it started (JVM, Python workers), in the middle of the
   stream: once at an arbitrary moment, once at the worst moment (the batch is committed to the
   table but Spark's checkpoint does not know it yet); each time it restarts it from the same
   checkpoint, the last run goes on until all input is consumed;
4. reads the table back with DuckDB (not pyiceberg, not Spark) and compares the ids with the ids it
   sent: 0 duplicates, 0 missing, or the exit code is 1.

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python examples/demo.py [--fast] [--dir DIR] [--s3]

With ``--s3`` (``make demo DEMO_ARGS=--s3``) the warehouse is ``s3://lakesink-demo/warehouse`` on an
S3-compatible server the demo starts on 127.0.0.1 (moto's, ``pip install 'moto[server]>=5.2.5'``, in
``.venv`` through the demo extra); the catalog is a SQLite file beside the embedded one
(``catalog-s3.db``), handed to the job through pyiceberg's ``PYICEBERG_CATALOG__LAKESINK__*`` variables.
DuckDB has no S3 access here (no httpfs extension without an extension server): the table is read back
with pyiceberg, through S3, and the leftover count comes from an orphan-file dry run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# Spark's Python workers (started by the child's JVM) must run this interpreter, the one that can
# import lakesink; set before anything could start Spark.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyiceberg.exceptions import NoSuchTableError  # noqa: E402

from lakesink.audit import interop  # noqa: E402
from lakesink.driver import catalogs
from lakesink.faults import DRIVER_AFTER_SWAP, ENV_FAULTS_DIR  # noqa: E402
from lakesink.table.keys import ENV_HOME, SUMMARY_BATCH_ID, SUMMARY_QUERY_ID

HERE = Path(__file__).resolve().parent
STREAM_JOB = HERE / "stream_job.py"
TABLE = "demo.events"
IDENT = ("demo", "events")
POLL_S = 0.2
USERS = ("ada", "alan", "barbara", "edsger", "grace", "john", "ken", "margaret", "niklaus", "tony")


@dataclass(frozen=True)
class Size:
    files: int
    rows_per_file: int
    files_per_batch: int

    @property
    def rows(self) -> int:
        return self.files * self.rows_per_file

    @property
    def batches(self) -> int:
        return -(-self.files // self.files_per_batch)


FULL = Size(files=40, rows_per_file=2_500, files_per_batch=2)
FAST = Size(files=8, rows_per_file=500, files_per_batch=2)


@dataclass(frozen=True)
class KillPoint:
    """Kill the job once the table holds ``after`` batches; ``worst`` = right after a table commit."""

    after: int
    worst: bool


@dataclass
class Run:
    number: int
    started: float
    ended: float = 0.0
    killed: bool = False
    exit_code: int | None = None
    note: str = ""


@dataclass
class Demo:
    folder: Path
    size: Size
    run_timeout: float
    t0: float = field(default_factory=time.monotonic)
    runs: list[Run] = field(default_factory=list)
    catalog: Any = None
    table: Any = None
    s3: bool = False  # the warehouse is on the demo's S3-compatible server
    child: subprocess.Popen[bytes] | None = None  # the running stream job

    # --- paths ----------------------------------------------------------------------------------

    @property
    def input(self) -> Path:
        return self.folder / "input"

    @property
    def checkpoint(self) -> Path:
        return self.folder / "checkpoint"

    @property
    def faults(self) -> Path:
        return self.folder / "faults"

    @property
    def log(self) -> Path:
        return self.folder / "stream_job.log"

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    # --- 1. a fresh run ---------------------------------------------------------------------------

    def prepare(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for sub in (self.input, self.checkpoint, self.faults):
            shutil.rmtree(sub, ignore_errors=True)
        self.log.unlink(missing_ok=True)
        self.faults.mkdir()
        self.catalog = catalogs.load(None, {})  # the embedded default catalog, created on first use
        try:
            old = self.catalog.load_table(IDENT)
        except NoSuchTableError:
            self.say(f"table {TABLE} does not exist yet (the stream job creates it)")
            return
        location = old.location()
        self.catalog.drop_table(IDENT)
        # drop_table forgets the table; its files (and files of tasks killed before their commit) go too
        if location.startswith("file://"):
            shutil.rmtree(location[len("file://") :], ignore_errors=True)
        self.say(f"dropped table {TABLE} of an earlier demo run and removed its files")

    # --- 2. the source ----------------------------------------------------------------------------

    def generate_input(self) -> None:
        self.input.mkdir(parents=True)
        rng = random.Random(42)
        start = datetime(2025, 1, 1, tzinfo=timezone.utc)
        for f in range(self.size.files):
            lines = []
            for r in range(self.size.rows_per_file):
                event_id = f * self.size.rows_per_file + r
                ts = start + timedelta(milliseconds=event_id * 250 + rng.randrange(250))
                lines.append(
                    json.dumps(
                        {
                            "id": event_id,
                            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                            "user": rng.choice(USERS),
                            "amount": round(rng.uniform(0.5, 500.0), 2),
                            "kind": rng.randrange(5),
                        }
                    )
                )
            part = self.input / f"events-{f:04d}.json.tmp"
            part.write_text("\n".join(lines) + "\n")
            part.rename(part.with_suffix(""))  # the file source never sees a half-written file
        self.say(
            f"input: {self.size.files} JSON files x {self.size.rows_per_file:,} rows = {self.size.rows:,} events "
            f"(ids 0..{self.size.rows - 1:,}) in {self.input}"
        )

    # --- 3. the stream, killed and restarted -------------------------------------------------------

    def committed(self, *, polling: bool = False) -> list[Any]:
        """The table's lakesink snapshots (one per committed batch); [] while the table does not exist."""
        try:
            if self.table is None:
                self.table = self.catalog.load_table(IDENT)
            else:
                self.table.refresh()
        except NoSuchTableError:
            return []
        except Exception:
            if polling:  # the catalog may be busy with the job's commit: ask again at the next poll
                return []
            raise
        return [s for s in self.table.snapshots() if s.summary and SUMMARY_BATCH_ID in s.summary.additional_properties]

    def batches_in_table(self) -> list[int]:
        return sorted(int(s.summary[SUMMARY_BATCH_ID]) for s in self.committed())

    def start_run(self, *, faults: bool) -> tuple[Run, subprocess.Popen[bytes]]:
        run = Run(number=len(self.runs) + 1, started=time.time())
        self.runs.append(run)
        env = dict(os.environ)
        env.pop(ENV_FAULTS_DIR, None)
        if faults:
            env[ENV_FAULTS_DIR] = str(self.faults)  # read by the job's driver and Python workers
        with self.log.open("a") as log:
            log.write(f"\n===== run {run.number}, started {datetime.now():%H:%M:%S} =====\n")
        output = self.log.open("ab")
        cmd = [
            sys.executable,
            str(STREAM_JOB),
            "--input", str(self.input),
            "--checkpoint", str(self.checkpoint),
            "--table", TABLE,
            "--max-files", str(self.size.files_per_batch),
        ]  # fmt: skip
        # its own session: the job, its JVM and the JVM's Python workers can all be killed together
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env, start_new_session=True)
        self.child = proc
        output.close()
        what = "restarted from the same checkpoint" if run.number > 1 else "started"
        self.say(f"run {run.number}: stream job {what} (pid {proc.pid})")
        return run, proc

    def run_and_kill(self, point: KillPoint) -> None:
        run, proc = self.start_run(faults=point.worst)
        deadline = time.monotonic() + self.run_timeout
        armed = self.faults / DRIVER_AFTER_SWAP
        reached = self.faults / f"{DRIVER_AFTER_SWAP}.reached"
        seen, last_new, interval = 0, time.monotonic(), 1.0
        while True:
            if proc.poll() is not None:
                self.finished(run, proc, note=f"finished before the planned kill point (batch {point.after})")
                self.clear_faults()
                return
            if time.monotonic() > deadline:
                self.kill(proc)
                self.fail(f"run {run.number} made no progress in {self.run_timeout:.0f}s")
            n = len(self.committed(polling=True))
            if n > seen:
                now = time.monotonic()
                if seen:
                    interval = now - last_new
                seen, last_new = n, now
            if point.worst:
                # Hold the commit of the next batch right after its snapshot landed in the table (the
                # fault point pauses the commit there), then kill: the table has the batch, Spark's
                # commit log does not; the restart replays the batch and lakesink must skip it.
                if n >= point.after - 1 and not armed.exists() and not reached.exists():
                    armed.write_text("pause")
                if reached.exists():
                    break
            elif n >= point.after:
                # somewhere in the middle of the next batch (executors writing files, or the commit)
                time.sleep(min(max(interval * 0.5, 0.2), 3.0))
                break
            time.sleep(POLL_S)
        if proc.poll() is not None:
            self.finished(run, proc, note="finished before the planned kill")
            self.clear_faults()
            return
        killed = self.kill(proc)
        run.ended, run.killed = time.time(), True
        self.clear_faults()
        in_table = self.batches_in_table()
        offsets, commits = spark_log(self.checkpoint / "offsets"), spark_log(self.checkpoint / "commits")
        how = "right after a table commit" if point.worst else "mid-stream"
        self.say(f"run {run.number}: SIGKILL {how}: {describe_processes(killed, proc.pid)}")
        state = (
            f"table has batches {span(in_table)}; Spark's checkpoint: offset log up to batch {last(offsets)}, "
            f"commit log up to batch {last(commits)}"
        )
        top_table, top_commit = last(in_table), last(commits)
        if in_table and (not commits or in_table[-1] > commits[-1]):
            run.note = (
                f"batch {top_table} is in the table but not in Spark's commit log: "
                "Spark will run it again and lakesink must recognise it"
            )
        elif offsets and (not commits or offsets[-1] > commits[-1]):
            run.note = f"batch {last(offsets)} was in flight (not in the table): Spark will run it again"
        else:
            run.note = f"killed between batches (after batch {top_commit})"
        self.say(f"         {state}")
        self.say(f"         → {run.note}")

    def run_to_end(self) -> None:
        run, proc = self.start_run(faults=False)
        try:
            proc.wait(timeout=self.run_timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            self.fail(f"run {run.number} did not finish in {self.run_timeout:.0f}s")
        self.finished(run, proc, note="ran until all input was consumed")

    def finished(self, run: Run, proc: subprocess.Popen[bytes], *, note: str) -> None:
        run.ended, run.exit_code, run.note = time.time(), proc.returncode, note
        if proc.returncode != 0:
            self.fail(f"run {run.number} of the stream job exited with code {proc.returncode}")
        self.say(
            f"run {run.number}: stream job exited normally, {note}; table has batches {span(self.batches_in_table())}"
        )

    def kill(self, proc: subprocess.Popen[bytes]) -> dict[int, str]:
        """SIGKILL the child's process group and every process of its session, and wait until they are gone.

        The JVM's Python daemon puts itself (and its workers) into a process group of its own, so a
        killpg of the child's group alone would leave them running for a moment; they are still in the
        child's session, which is how they are found (Linux /proc; elsewhere killpg only, and the
        daemon stops its workers when the JVM is gone).
        """
        sid = proc.pid  # start_new_session: session id = process group id = the child's pid
        killed = session_members(sid)
        try:
            os.killpg(sid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = session_members(sid)
            if not left:
                break
            for pid, name in left.items():
                killed[pid] = name
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        proc.wait()
        return killed

    def stop_child(self) -> None:
        """On the way out (Ctrl-C, SIGTERM, an error): its own session does not get our signals, kill it."""
        if self.child is not None and self.child.poll() is None:
            print(f"stopping the stream job (pid {self.child.pid}) and its processes", flush=True)
            self.kill(self.child)

    def clear_faults(self) -> None:
        for p in self.faults.iterdir():
            p.unlink()

    def fail(self, message: str) -> None:
        print(f"\nDEMO FAILED: {message}", flush=True)
        print(f"last lines of {self.log}:", flush=True)
        if self.log.exists():
            for line in self.log.read_text(errors="replace").splitlines()[-40:]:
                print(f"    {line}")
        sys.exit(2)

    # --- 4. the verdict ---------------------------------------------------------------------------

    def report(self) -> int:
        table = self.table = self.catalog.load_table(IDENT)
        snapshots = self.committed()
        if self.s3:
            ids = table.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
        else:
            ids = interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist()
        counts = Counter(ids)
        sent = range(self.size.rows)
        duplicates = sum(c - 1 for c in counts.values() if c > 1)
        missing = sum(1 for i in sent if i not in counts)
        unexpected = sum(c for i, c in counts.items() if not (isinstance(i, int) and 0 <= i < self.size.rows))
        batch_ids = [int(s.summary[SUMMARY_BATCH_ID]) for s in snapshots]
        repeated = sorted(b for b, c in Counter(batch_ids).items() if c > 1)
        skipped = sorted(
            {int(m) for m in re.findall(r"batch=(\d+) replay skipped", self.log.read_text(errors="replace"))}
        )
        kills = sum(r.killed for r in self.runs)
        referenced = {local_path(task.file.file_path) for task in table.scan().plan_files()}
        if self.s3:
            from lakesink.maintenance.orphans import remove_orphan_files

            dry = remove_orphan_files(table, older_than=timedelta(0), dry_run=True)
            leftovers = len(dry.removed) + len(dry.kept_in_flight) + len(dry.kept_too_young)
        else:
            on_disk = {str(p) for p in Path(local_path(table.location()), "data").rglob("*.parquet")}
            leftovers = len(on_disk - referenced)
        query_ids = sorted({s.summary[SUMMARY_QUERY_ID] for s in snapshots})

        print()
        print("Snapshot history of demo.events (one Iceberg snapshot per micro-batch)")
        header = ("snapshot id", "committed at", "run", "operation", "batch", "added rows")
        print("  {:>20}  {:<12}  {:>3}  {:<9}  {:>5}  {:>10}".format(*header))
        for s in snapshots:
            at = datetime.fromtimestamp(s.timestamp_ms / 1000)
            print(
                f"  {s.snapshot_id:>20}  {at:%H:%M:%S}.{at.microsecond // 1000:03d}  {self.run_of(s.timestamp_ms):>3}  "
                f"{s.summary.operation.value:<9}  {s.summary[SUMMARY_BATCH_ID]:>5}  "
                f"{int(s.summary.get('added-records', 0)):>10,}"
            )
        print()
        print("Runs of the stream job")
        for r in self.runs:
            outcome = "SIGKILL" if r.killed else f"exit {r.exit_code}"
            print(f"  run {r.number}: {r.ended - r.started:5.1f}s, {outcome:<8} {r.note}")
        print()
        print("Result")
        print(f"  streaming query id:    {', '.join(query_ids)} (the same across restarts: one checkpoint)")
        print(f"  rows sent:             {self.size.rows:,}")
        reader = "pyiceberg, through S3" if self.s3 else "DuckDB's Iceberg reader"
        print(f"  rows in the table:     {len(ids):,} (read with {reader})")
        print(f"  duplicates:            {duplicates}")
        print(f"  missing:               {missing}")
        if unexpected:
            print(f"  unexpected ids:        {unexpected}")
        print(
            f"  batches in the table:  {len(batch_ids)} ({span(sorted(batch_ids))}), committed twice: {len(repeated)}"
        )
        replays = f"batch {', '.join(map(str, skipped))}" if skipped else "none"
        print(f"  replays skipped:       {replays} (run again by Spark after a restart, already in the table)")
        print(
            f"  data files:            {len(referenced)} in the table, {leftovers} written by killed tasks and never "
            "committed (not part of the table)"
        )
        print(f"  kills (SIGKILL):       {kills}")
        print(f"  restarts:              {len(self.runs) - 1}")
        print(f"  time:                  {time.monotonic() - self.t0:.0f}s")
        print()
        print(f"  table metadata:        {table.metadata_location}")
        print(f"  stream job log:        {self.log}")
        print(f"  checkpoint:            {self.checkpoint}")
        ok = duplicates == 0 and missing == 0 and unexpected == 0 and not repeated
        print()
        if ok:
            print(
                f"OK: every one of the {self.size.rows:,} events is in the table exactly once, after {kills} kill(s)."
            )
            return 0
        print("FAILED: the table does not hold every event exactly once.")
        return 1

    def run_of(self, timestamp_ms: int) -> str:
        t = timestamp_ms / 1000
        for r in self.runs:
            if r.started <= t <= (r.ended or float("inf")) + 1:
                return str(r.number)
        return "?"


# --- helpers ------------------------------------------------------------------------------------


def session_members(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (pid → command name), from /proc; {} where there is no /proc."""
    members: dict[int, str] = {}
    if not os.path.isdir("/proc"):
        return members
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        close = stat.rfind(")")
        fields = stat[close + 2 :].split()  # state, ppid, pgrp, session, ...
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == sid:
            members[int(entry.name)] = stat[stat.find("(") + 1 : close]
    return members


def describe_processes(killed: dict[int, str], sid: int) -> str:
    if not killed:
        return "its process group"
    names = Counter(name for pid, name in killed.items() if pid != sid)
    java = names.pop("java", 0)
    others = sum(names.values())
    parts = ["the job's Python driver" if sid in killed else None, "its JVM" if java else None]
    if others:
        parts.append(f"{others} Spark Python worker process{'es' if others > 1 else ''}")
    return f"{len(killed)} processes ({', '.join(p for p in parts if p)})"


def local_path(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def spark_log(folder: Path) -> list[int]:
    """Batch ids in one of Spark's checkpoint logs (offsets/ or commits/)."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def last(values: list[int]) -> str:
    return str(values[-1]) if values else "none"


def span(values: list[int]) -> str:
    if not values:
        return "none"
    return f"{values[0]}-{values[-1]}" if len(values) > 1 else str(values[0])


def kill_points(batches: int, kills: int) -> list[KillPoint]:
    """Where to kill: at the worst moment past half-way; with two kills, first at an arbitrary moment early on."""
    if kills == 0:
        return []
    worst = KillPoint(after=max(2, round(batches * 0.6)), worst=True)
    if kills == 1:
        return [worst]
    first = KillPoint(after=max(1, round(batches * 0.25)), worst=False)
    return [first, KillPoint(after=max(first.after + 2, worst.after), worst=True)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="demo-run", help="demo folder: input, checkpoint, log (default: ./%(default)s)")
    p.add_argument(
        "--home",
        default=None,
        help="folder of the embedded catalog (sets LAKESINK_HOME; default: $LAKESINK_HOME or ./lakehouse)",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help=f"a small input ({FAST.rows:,} rows instead of {FULL.rows:,}) and one kill (used by the tests)",
    )
    p.add_argument(
        "--kills",
        type=int,
        choices=(0, 1, 2),
        default=None,
        help="how many times to kill the job (default: 2, --fast: 1)",
    )
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds one run of the job may take")
    p.add_argument(
        "--s3",
        action="store_true",
        help="put the warehouse on an S3-compatible server (moto) the demo starts on 127.0.0.1",
    )
    return p.parse_args(argv)


S3_BUCKET = "lakesink-demo"


def start_s3(home: Path) -> Any:
    """Start moto's S3 server on a free port; point the embedded catalog's definition at it (also for the job)."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per HTTP request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    key, secret = "demo-access-key", "demo-secret-key"  # moto accepts any; never printed
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1"
    ).create_bucket(Bucket=S3_BUCKET)
    db = home / "catalog-s3.db"
    db.unlink(missing_ok=True)  # the server keeps objects in memory: an earlier run's catalog points nowhere
    home.mkdir(parents=True, exist_ok=True)
    settings = {
        "TYPE": "sql",
        "URI": f"sqlite:///{db}",
        "WAREHOUSE": f"s3://{S3_BUCKET}/warehouse",
        "S3__ENDPOINT": endpoint,
        "S3__ACCESS_KEY_ID": key,
        "S3__SECRET_ACCESS_KEY": secret,
        "S3__REGION": "us-east-1",
        "S3__FORCE_VIRTUAL_ADDRESSING": "false",
    }
    for name, value in settings.items():
        os.environ[f"PYICEBERG_CATALOG__{catalogs.EMBEDDED_CATALOG_NAME.upper()}__{name}"] = value
    return server


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.home:
        os.environ[ENV_HOME] = args.home
    # absolute, so that the child processes (started in the same folder or not) use the same catalog
    home = catalogs.lakesink_home()
    os.environ[ENV_HOME] = str(home)
    size = FAST if args.fast else FULL
    kills = args.kills if args.kills is not None else (1 if args.fast else 2)
    demo = Demo(folder=Path(args.dir).expanduser().resolve(), size=size, run_timeout=args.run_timeout, s3=args.s3)
    s3_server = start_s3(home) if args.s3 else None
    _, props = catalogs.resolve_catalog_properties(None, {})

    title = "lakesink demo: exactly-once streaming into Apache Iceberg, through SIGKILLs"
    print(title)
    print("=" * len(title))
    print(f"catalog     {props['uri']}  (embedded default catalog, LAKESINK_HOME={home})")
    where = f"  (S3-compatible server at {props['s3.endpoint']})" if s3_server is not None else ""
    print(f"warehouse   {props['warehouse']}{where}")
    print(f"demo folder {demo.folder}  (input/, checkpoint/, stream_job.log)")
    print(
        f"plan        {size.files} files, {size.files_per_batch} per micro-batch = {size.batches} batches; "
        f"kill the job {kills} time(s), restart it from its checkpoint, then check the table"
    )
    print(flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally below runs
    try:
        demo.prepare()
        demo.generate_input()
        for point in kill_points(size.batches, kills):
            demo.run_and_kill(point)
        demo.run_to_end()
        return demo.report()
    except KeyboardInterrupt:
        print("\ninterrupted", flush=True)
        return 130
    finally:
        demo.stop_child()
        if s3_server is not None:
            s3_server.stop()


if __name__ == "__main__":
    sys.exit(main())
