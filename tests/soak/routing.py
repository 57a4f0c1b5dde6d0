"""Kill -9 soak of option route-by: ``python -m tests.soak.routing`` (docs/soak.md, docs/routing.md).

One stream routed into five tables (``soak.t0`` .. ``soak.t3`` and ``other.t4``: the table of a row is its id
mod 5, see tests/soak/job.py ``--route-by``; ``--namespaces`` names other namespaces), through either entry point, on
the embedded SQLite catalog or the catalog ``--catalog-json`` describes (a REST server: tests/sink/test_rest_spark.py).
Each round
adds input files, starts the job, and SIGKILLs every process of the job (driver, JVM, Python workers): after a
random delay, or while a commit is held at a fault point (``pause`` there, then the kill): inside the SQL
transaction between two tables' row updates, between two tables' commits (``--atomic off``), just before or just
after the swap.

After every kill, from the catalog alone (lakesink.audit.routes.verify_query): with ``--atomic auto`` on an atomic
catalog (one database transaction or one transactions/commit request per batch) each batch is in all its tables or in
none; with ``--atomic off``, or on a catalog that commits table by table (``--per-table-catalog``), a batch may be
missing from some tables until the next run completes it. ``--first-phase`` kills the first run too (e.g. while a
table the batch created is still empty: ``pause-kill@driver.after-table-created``). At the end (a run without
faults): every id sent is in the table its id names, exactly once, and nowhere else (read by pyiceberg and DuckDB);
every table's batches without duplicates or gaps; every batch in all its tables; no staged file left.

``--upsert``: a change stream (option upsert-key; tests/soak/job.py ``--upsert``): key = id % 40 (each key in one
table), a row whose id % 7 = 0 deletes its key (delete-when), the greatest id wins (order-by); foreach_batch in update
mode, format("lakesink") repartitioned by the routing column and the key. At the end every table equals the model of
the stream: for each key the row of its greatest id sent, absent when that row is a delete (read by pyiceberg and
DuckDB); every batch once in every table.

``--lookups``: the routing column is computed from a lookup (key id % 5 -> table, a JSON file the job reads at its
start and joins to the stream) that the runner rewrites before every round, a new version each time (seeded,
printed): odd rounds give another set of tables than the last run's (one key moved to a sixth table ``<namespace>.t5``, or
back), even rounds permute the last run's tables among the keys (the same set). A run that replays a committed batch
(killed after the swap, before Spark's commit log) with another set of tables must fail with ``ReplayMismatchError``
and commit nothing; the runner
then restores the lookup of the previous run (the documented recovery) and reruns the round. A replay with the same
set skips the batch everywhere; with ``--atomic off`` or ``--per-table-catalog``, a replay that completes a batch a kill
left in some of its tables only must route the same rows to each table holding it (else ``ReplayMismatchError``, the
lookup restored, the round rerun: counted in ``replays_refused_moved_rows`` as well). Counted: ``replays_refused``,
``replays_skipped``. At the end every id sent is in
exactly one table over all six, and every batch's rows are where one lookup version in use puts them all (each
batch read from its own snapshots).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyiceberg.exceptions import NoSuchTableError

from examples.demo import session_members
from lakesink.audit import interop
from lakesink.audit.routes import verify_query
from lakesink.driver import catalogs
from lakesink.driver.tables.staging import STAGING_FOLDER
from lakesink.faults import (
    CATALOG_BETWEEN_TABLE_SWAPS,
    DRIVER_AFTER_SWAP,
    DRIVER_BEFORE_SWAP,
    DRIVER_BETWEEN_TABLE_COMMITS,
    ENV_FAULTS_DIR,
)
from tests.support.helpers import assert_snapshot_invariants, lakesink_snapshots, table_ids, write_json_input
from tests.support.soak import job_env, kill, progress_signature

TABLES = ("soak.t0", "soak.t1", "soak.t2", "soak.t3", "other.t4")


def tables_in(namespaces: tuple[str, str]) -> tuple[str, ...]:
    """The soak's five tables: t0..t3 in the first namespace (option namespace), t4 in the second."""
    first, other = namespaces
    return (*(f"{first}.t{i}" for i in range(4)), f"{other}.t4")


DELAY = "delay"
PAUSE = "pause-kill@"
PHASES_ATOMIC = (DELAY, PAUSE + CATALOG_BETWEEN_TABLE_SWAPS, PAUSE + DRIVER_BEFORE_SWAP, PAUSE + DRIVER_AFTER_SWAP)
PHASES_OFF = (DELAY, PAUSE + DRIVER_BETWEEN_TABLE_COMMITS, PAUSE + DRIVER_AFTER_SWAP)
RUN_TIMEOUT_S = 300.0  # a guard against a hang (seconds of silence), not a speed limit


def table_of(i: int, tables: tuple[str, ...] = TABLES) -> str:
    return tables[i % 5]


class SoakFailed(Exception):
    pass


@dataclass
class Result:
    entry: str
    atomic: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    runs: int = 0
    rows_sent: int = 0
    rows_in_tables: int = 0
    incomplete_after_kills: int = 0
    """Batches found in some of their tables only after a kill (0 with atomic=auto; completed by the next run)."""
    violations: list[str] = field(default_factory=list)
    lookups: list[dict[str, str]] = field(default_factory=list)
    """With --lookups: every lookup version written, in order (version n is lookups[n])."""
    replays_refused: int = 0
    """Runs that replayed a committed batch with another set of tables: failed with ReplayMismatchError."""
    replays_refused_moved_rows: int = 0
    """Of those, with --atomic off or a per-table catalog: replays completing a batch found in some of its tables only
    that route rows of a table holding it to another table of the same set (the rows' digest differs)."""
    replays_skipped: int = 0
    """Runs that replayed a committed batch with the same set of tables (after a restore, or a permuted lookup)."""


class RoutingSoak:
    def __init__(
        self,
        folder: Path,
        *,
        entry: str,
        atomic: str,
        seed: int,
        rows_per_file: int,
        files_per_batch: int,
        catalog: dict[str, str] | None = None,
        namespaces: tuple[str, str] = ("soak", "other"),
        per_table_catalog: bool = False,
        lookups: bool = False,
        upsert: bool = False,
    ):
        self.upsert = upsert
        self.folder = folder
        self.entry, self.atomic = entry, atomic
        self.namespaces = namespaces
        self.tables = tables_in(namespaces)
        self.expect_whole = atomic == "auto" and not per_table_catalog
        """Every batch in all its tables or in none after every kill (an atomic catalog, atomic=auto)."""
        self.rng = random.Random(seed)
        self.rows_per_file, self.files_per_batch = rows_per_file, files_per_batch
        self.home, self.input, self.ck, self.faults = (folder / n for n in ("home", "input", "checkpoint", "faults"))
        for d in (self.home, self.input, self.faults):
            d.mkdir(parents=True, exist_ok=True)
        self.log = folder / "job.log"
        self.sent: list[int] = []
        self.result = Result(entry, atomic)
        self.props = (
            dict(catalog)
            if catalog
            else {
                "type": "sql",
                "uri": f"sqlite:///{self.home}/catalog.db",
                "warehouse": f"file://{self.home}/warehouse",
            }
        )
        self.own_catalog = bool(catalog)
        self.seed = seed
        self.lookup_file = folder / "lookup.json" if lookups else None
        self.sixth = f"{namespaces[0]}.t5"
        self.version = -1
        """The lookup version the next run reads (with --lookups)."""
        if self.lookup_file is not None:
            self.write_lookup(dict(enumerate(self.tables)))

    def say(self, text: str) -> None:
        print(f"[routing soak {self.entry}/{self.atomic}] {text}", flush=True)

    def add_input(self, files: int) -> None:
        self.sent += write_json_input(self.input, files=files, rows_per_file=self.rows_per_file, start=len(self.sent) + 10_000)

    def write_lookup(self, tables: dict[int, str]) -> None:
        """A new lookup version (key id % 5 -> table), read by the next run."""
        assert self.lookup_file is not None
        self.result.lookups.append({str(k): v for k, v in sorted(tables.items())})
        self.use_lookup(len(self.result.lookups) - 1)

    def use_lookup(self, version: int) -> None:
        assert self.lookup_file is not None
        self.version = version
        tables = self.result.lookups[version]
        self.lookup_file.write_text(json.dumps({"version": version, "tables": tables}))
        self.say(f"lookup version {version} (seed {self.seed}): {tables}")

    def next_lookup(self, number: int) -> None:
        """Round ``number``'s lookup, a new version: on odd rounds another set of tables than the last run's (one key
        moved to the sixth table, or back from it), on even rounds the last run's set permuted among the keys."""
        last = list(self.result.lookups[self.version].values())
        if number % 2 == 0:
            tables = last
        elif self.sixth in last:
            tables = list(self.tables)
        else:
            tables = list(self.tables)
            tables[self.rng.randrange(5)] = self.sixth
        self.rng.shuffle(tables)
        self.write_lookup(dict(enumerate(tables)))

    def pending_replay(self) -> bool:
        """A batch in the tables that Spark's commit log does not have (the next run replays it)."""
        query_id = self.query_id()
        if query_id is None:
            return False
        catalog = catalogs.load(None, self.props)
        held = -1
        for name in self.all_tables():
            table = _load(catalog, name)
            if table is not None:
                held = max([held, *(s["batch_id"] for s in lakesink_snapshots(table) if s["query_id"] == query_id)])
        commits = self.ck / "commits"
        logged = max((int(p.name) for p in commits.iterdir() if p.name.isdigit()), default=-1) if commits.exists() else -1
        return held > logged

    def all_tables(self) -> tuple[str, ...]:
        return (*self.tables, self.sixth) if self.lookup_file is not None else self.tables

    def start(self) -> subprocess.Popen[bytes]:
        env = job_env(self.home)
        env[ENV_FAULTS_DIR] = str(self.faults)
        if self.own_catalog:  # the job's default catalog "lakesink", from a configuration file of its own
            home = self.folder / "pyiceberg"
            home.mkdir(exist_ok=True)
            lines = ["catalog:", "  lakesink:"]  # block style: pyiceberg's strictyaml refuses JSON-like flow mappings
            lines += [f"    {k}: '{v.replace(chr(39), chr(39) * 2)}'" for k, v in sorted(self.props.items())]
            (home / ".pyiceberg.yaml").write_text("\n".join(lines) + "\n")
            env["PYICEBERG_HOME"] = str(home)
        cmd = [
            sys.executable, "-m", "tests.soak.job",
            "--input", str(self.input),
            "--checkpoint", str(self.ck),
            "--max-files", str(self.files_per_batch),
            "--entry", self.entry,
            "--route-by",
            "--atomic", self.atomic,
            "--route-namespaces", ",".join(self.namespaces),
        ]  # fmt: skip
        if self.lookup_file is not None:
            cmd += ["--route-lookup", str(self.lookup_file)]
        if self.upsert:
            cmd += ["--upsert"]
        self.result.runs += 1
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            log.write(f"\n===== run {self.result.runs} =====\n".encode())
            log.flush()
            return subprocess.Popen(cmd, cwd=self.folder, stdout=log, stderr=log, env=env, start_new_session=True)

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL every process of the job's session (the driver, its JVM, the Python workers)."""
        sid = proc.pid
        deadline = time.monotonic() + 60
        while True:
            left = session_members(sid)
            if proc.poll() is None:
                left[proc.pid] = "job"
            if not left:
                break
            if time.monotonic() > deadline:
                raise SoakFailed(f"processes of the killed job survive: {left}")
            kill(left)
            time.sleep(0.05)
        proc.wait()

    def wait(self, proc: subprocess.Popen[bytes], until: Any = None) -> bool:
        """Wait for the job to exit (True) or ``until()`` to hold (False)."""
        # silence, not speed (as runner.Stall): the guard restarts whenever the job's log, checkpoint, warehouse or
        # fault markers change, so a loaded machine's slow but working job is never taken for hung
        seen, since, checked = self.progress_signature(), time.monotonic(), time.monotonic()
        while proc.poll() is None:
            if until is not None and until():
                return False
            now = time.monotonic()
            if now - checked >= 1.0:
                checked, signature = now, self.progress_signature()
                if signature != seen:
                    seen, since = signature, now
                elif now - since > RUN_TIMEOUT_S:
                    self.kill(proc)
                    raise SoakFailed(f"the job made no progress for {RUN_TIMEOUT_S:.0f} s; see {self.log}")
            time.sleep(0.05)
        return True

    def progress_signature(self) -> tuple[float, ...]:
        """What changes while the job works (tests.support.soak.progress_signature): its log, checkpoint, home
        (catalog and warehouse) and fault markers."""
        return progress_signature(self.log, (self.ck, self.home, self.faults))

    def clear_faults(self) -> None:
        for p in self.faults.iterdir():
            p.unlink()

    def round(self, number: int, phase: str) -> None:
        self.add_input(self.files_per_batch * 2)
        record: dict[str, Any] = {"round": number, "phase": phase}
        if self.lookup_file is not None:
            previous, pending = self.version, self.pending_replay()
            # a batch a kill left in some of its tables only (atomic=off, or a catalog that commits table by table)
            partial = pending and not self.expect_whole and bool(self.check_units())
            self.next_lookup(number)
            record["lookup"] = self.version
            record["pending_replay"] = pending
        while True:
            proc, exited = self.run_phase(phase, record)
            if not (exited and self.lookup_file is not None and self.refused()):
                break
            # the documented recovery: restore what the routing column was computed from when the batch was committed
            same_set = set(self.result.lookups[self.version].values()) == set(self.result.lookups[previous].values())
            if not pending or (same_set and not partial):
                self.violation(f"round {number}: a run refused a replay (ReplayMismatchError) that routes to the same tables")
                break
            if same_set:
                # completing a batch found in some of its tables only, with its rows moved among the same tables:
                # refused (the rows' digest of a table holding it differs), as the replay of another set of tables
                self.result.replays_refused_moved_rows += 1
            self.result.replays_refused += 1
            record["refused_then_restored"] = previous
            self.say(f"round {number}: replay refused with lookup version {self.version}; restoring version {previous}")
            self.clear_faults()
            self.use_lookup(previous)
            pending = False
        if self.lookup_file is not None and pending and record.get("reached"):
            self.result.replays_skipped += 1  # the run went past the replayed batch with the same set of tables
        if not exited:
            self.kill(proc)
        record["killed"] = not exited
        record["exit_code"] = proc.returncode
        self.clear_faults()
        report = self.check_units()
        record["incomplete"] = [b.describe() for b in report]
        self.result.incomplete_after_kills += len(report)
        if report and self.expect_whole:
            self.violation(f"round {number} ({phase}): a batch is in some of its tables only: {report[0].describe()}")
        self.result.rounds.append(record)
        self.say(json.dumps(record))

    def run_phase(self, phase: str, record: dict[str, Any]) -> tuple[subprocess.Popen[bytes], bool]:
        if phase == DELAY:
            proc = self.start()
            delay = self.rng.uniform(4.0, 14.0)
            exited = self.wait(proc, until=_after(delay))
            record["delay_s"] = round(delay, 1)
        else:
            point = phase.removeprefix(PAUSE)
            (self.faults / point).write_text("pause")
            proc = self.start()
            exited = self.wait(proc, until=lambda: (self.faults / f"{point}.reached").exists())
            record["reached"] = not exited
        return proc, exited

    def refused(self) -> bool:
        """The last run failed with ReplayMismatchError (its part of the job log)."""
        with self.log.open("rb") as f:
            f.seek(self.log_from)
            text = f.read().decode(errors="replace")
        return "ReplayMismatchError" in text or "into another set of tables than the batch was committed to" in text

    def query_id(self) -> str | None:
        meta = self.ck / "metadata"
        return str(json.loads(meta.read_text())["id"]) if meta.exists() else None

    def check_units(self) -> list[Any]:
        query_id = self.query_id()
        if query_id is None:
            return []
        return list(verify_query(catalogs.load(None, self.props), query_id).incomplete)

    def violation(self, text: str) -> None:
        self.say(f"VIOLATION: {text}")
        self.result.violations.append(text)

    def final(self) -> None:
        proc = self.start()
        self.wait(proc)
        if proc.returncode != 0:
            self.violation(f"the final run failed (exit code {proc.returncode}); see {self.log}")
            return
        catalog = catalogs.load(None, self.props)
        want: dict[str, Counter[int]] = {t: Counter() for t in self.tables}
        for i in upsert_model(self.sent) if self.upsert else self.sent:
            want[table_of(i, self.tables)][i] += 1
        total = 0
        every: Counter[int] = Counter()
        for name in self.all_tables():
            table = _load(catalog, name)
            if table is None:
                if name in want:
                    self.violation(f"table {name} does not exist")
                continue
            got = table_ids(table)
            read = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
            if read != got:
                self.violation(f"table {name}: DuckDB reads {sum(read.values())} id(s), pyiceberg {sum(got.values())}")
            staged = self.ck / STAGING_FOLDER
            if staged.exists() and any(p.is_file() for p in staged.rglob("*")):
                self.violation(f"staged files left in {staged} after the final run")
            total += sum(got.values())
            every += got
            if self.lookup_file is not None:
                # a table records only the batches that routed rows to it: no duplicate batch (gaps: verify_query)
                keys = Counter((s["query_id"], s["sink_id"], s["batch_id"]) for s in lakesink_snapshots(table))
                if dupes := {k: n for k, n in keys.items() if n > 1}:
                    self.violation(f"table {name}: batches committed more than once: {dupes}")
                continue
            if got != want[name]:
                ids = want[name]
                self.violation(f"table {name}: {sum((got - ids).values())} id(s) too many, {sum((ids - got).values())} missing")
            try:
                assert_snapshot_invariants(table)
            except AssertionError as e:
                self.violation(f"table {name}: {e}")
        if self.lookup_file is not None:
            sent = Counter(self.sent)
            if every != sent:
                self.violation(
                    f"over all tables: {sum((every - sent).values())} id(s) too many (in two tables, or twice), "
                    f"{sum((sent - every).values())} missing"
                )
            self.check_batches_routed_by_one_version(catalog)
        query_id = self.query_id()
        assert query_id is not None
        report = verify_query(catalog, query_id)
        if not report.ok:
            self.violation(f"after the final run: {report.human()}")
        self.result.rows_sent, self.result.rows_in_tables = len(self.sent), total

    def check_batches_routed_by_one_version(self, catalog: Any) -> None:
        """Every batch's rows (each table's snapshot of the batch minus its parent) are where one lookup version
        that a run used puts them all: a replay never routed part of a batch with another version."""
        rows: dict[int, dict[int, str]] = {}  # batch id -> id -> table
        for name in self.all_tables():
            table = _load(catalog, name)
            if table is None:
                continue
            before: Counter[int] = Counter()
            for snap in lakesink_snapshots(table):
                scan = table.scan(snapshot_id=snap["snapshot_id"], selected_fields=("id",))
                now = Counter(scan.to_arrow().column("id").to_pylist())
                for i in now - before:
                    rows.setdefault(snap["batch_id"], {})[i] = name
                before = now
        for batch, where in sorted(rows.items()):
            fits = [
                v for v, tables in enumerate(self.result.lookups) if all(tables[str(i % 5)] == name for i, name in where.items())
            ]
            if not fits:
                self.violation(f"batch {batch}: its {len(where)} row(s) are where no single lookup version puts them")
        self.say(f"{len(rows)} batch(es): each routed by one lookup version")

    def play(self, rounds: int, phases: tuple[str, ...], first_phase: str | None = None) -> Result:
        if first_phase is not None:  # the first run killed too (the tables are created by it)
            self.round(0, first_phase)
        else:
            self.add_input(self.files_per_batch)
            first = self.start()  # a clean first run: batch 0 and the tables exist before the first kill
            self.wait(first)
            if first.returncode != 0:
                raise SoakFailed(f"the first run failed (exit code {first.returncode}); see {self.log}")
        for n in range(rounds):
            self.round(n + 1, phases[n % len(phases)] if n < len(phases) else self.rng.choice(phases))
        self.final()
        return self.result


def upsert_model(sent: list[int]) -> list[int]:
    """--upsert: the ids the tables hold at the end -- for each key (id % 40, which fixes the table) the greatest id
    sent, unless that row is a delete (id % 7 = 0). Files and batches take ids in increasing order, so the greatest id
    of a key is its last change."""
    last: dict[int, int] = {}
    for i in sent:
        last[i % 40] = max(last.get(i % 40, i), i)
    return sorted(i for i in last.values() if i % 7 != 0)


def _load(catalog: Any, name: str) -> Any:
    try:
        return catalog.load_table(tuple(name.split(".")))
    except NoSuchTableError:
        return None


def _after(seconds: float) -> Any:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() > deadline


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.soak.routing", description=__doc__)
    p.add_argument("--dir", required=True, help="a folder of its own for the soak")
    p.add_argument("--entry", choices=("format", "foreach", "both"), default="both")
    p.add_argument("--atomic", choices=("auto", "off"), default="auto")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rows-per-file", type=int, default=60)
    p.add_argument("--files-per-batch", type=int, default=2)
    p.add_argument("--phases", default=None, help="comma-separated phases (default: every phase of the atomic mode)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--catalog-json", default=None, help="the catalog's pyiceberg properties (default: a SQLite catalog)")
    p.add_argument("--namespaces", default="soak,other", help="option namespace, and the namespace of table t4")
    p.add_argument(
        "--per-table-catalog",
        action="store_true",
        help="the catalog commits table by table (a REST server without transactions/commit): a kill may leave a "
        "batch in some of its tables, the next run completes it",
    )
    p.add_argument("--first-phase", default=None, help="kill the first run too, in this phase")
    p.add_argument(
        "--lookups",
        action="store_true",
        help="the routing column from a lookup (id %% 5 -> table) that changes before every round (module docstring)",
    )
    p.add_argument("--upsert", action="store_true", help="a change stream with option upsert-key (module docstring)")
    args = p.parse_args(argv)
    if args.upsert and args.lookups:
        p.error("--upsert and --lookups are separate variants")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phases = tuple(args.phases.split(",")) if args.phases else (PHASES_ATOMIC if args.atomic == "auto" else PHASES_OFF)
    results = []
    for entry in ("format", "foreach") if args.entry == "both" else (args.entry,):
        soak = RoutingSoak(
            Path(args.dir) / entry,
            entry=entry,
            atomic=args.atomic,
            seed=args.seed,
            rows_per_file=args.rows_per_file,
            files_per_batch=args.files_per_batch,
            catalog=json.loads(args.catalog_json) if args.catalog_json else None,
            namespaces=(args.namespaces.split(",")[0], args.namespaces.split(",")[1]),
            per_table_catalog=args.per_table_catalog,
            lookups=args.lookups,
            upsert=args.upsert,
        )
        results.append(soak.play(args.rounds, phases, args.first_phase))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))
    for r in results:
        print(
            f"{r.entry}/{r.atomic}: {len(r.rounds)} round(s), {r.runs} run(s), {r.rows_in_tables}/{r.rows_sent} rows, "
            f"{r.incomplete_after_kills} incomplete batch(es) seen after kills, {len(r.violations)} violation(s)"
            + (
                f", seed {args.seed}, {len(r.lookups)} lookup version(s), {r.replays_skipped} replay(s) skipped, "
                f"{r.replays_refused} refused (ReplayMismatchError; {r.replays_refused_moved_rows} for rows moved among "
                "the same tables) then restored"
                if args.lookups
                else ""
            )
        )
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
