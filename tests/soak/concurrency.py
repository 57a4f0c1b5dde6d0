"""Concurrency soak: a lakesink stream with its own maintenance beside other writers of the same table, for minutes.

    python -m tests.soak.concurrency --minutes 20 [--entry format|foreach|both] [--seed N] [--dir D] [--json F]

(docs/soak.md, "The concurrency soak"; ``make soak-concurrency``.) One soak:

- **the stream** (``tests/soak/job.py``, a child process in a session of its own): JSON files of uniquely keyed
  rows, added by the runner every ``--file-every`` seconds, read with a processing-time trigger and written with
  ``writeStream.format("lakesink")`` or ``foreach_batch``, option ``maintenance=auto`` (the default) and the table
  properties of :data:`TABLE_PROPERTIES`: compaction, snapshot expiry (``history.expire.*``) and manifest rewrites
  run inside the sink, between its batches. It is SIGKILLed ``--kills`` times at random moments (the whole session:
  driver, JVM, Python workers) and restarted from its checkpoint;
- **other processes** on the same table (``tests/soak/others.py``): a pyiceberg writer appending rows with ids of its
  own; merge-on-read deletes (position and equality delete files, from ``--deletes-after`` of the run; equality
  deletes from ``--equality-after``); tags created at the head, now and then moved or removed, some with a
  ``max-ref-age-ms`` of their own; and ``lakesink remove-orphan-files --older-than 0`` in a loop.

**The model** (plain Python): the ids of every input file (the runner writes them) and which batch read each file
(Spark's file-source log, ``<checkpoint>/sources/0``); every pyiceberg append and delete that **committed** (the
journals of the other processes: an intent before the commit, the outcome after, settled from the table). The
content of ``main`` at a snapshot with sequence number ``s`` in a metadata file whose replay marker names batch
``B``: the stream's ids of batches ``<= B`` and the appended ids of appends with sequence number ``<= s``, minus the
ids of deletes with sequence number ``<= s``. Every tag created or moved records its snapshot's ``s`` and ``B``.

**The checks**, every ``--check-every`` seconds while everything runs, and at the end when all is quiet:

- the head read through DuckDB, iceberg-rust and pyiceberg (pyiceberg 0.12 cannot read equality deletes: only while
  the head has none) equals the model: every id that was never deleted exactly once, no deleted id;
- every tag that exists points at the snapshot it was created on or moved to, and reads (DuckDB, and pyiceberg
  without equality deletes) as the model says that snapshot was; no tag is gone unless expiry removed it for its
  age; no tag exists that nobody committed;
- ``lakesink verify`` is clean; every file the table references (manifest lists, manifests, and the data and delete
  files a manifest lists live: a ``DELETED`` entry is a tombstone, see :func:`referenced_files`) exists (a file
  missing from an older metadata read is re-checked against the current metadata: expiry deletes what it expired);
- at the end also: Spark's commit log ends at the table's replay marker, every input file was read, and a last
  ``remove_orphan_files(older_than=0)`` leaves the table reading the same.

Exit code 0: no violation; 1: violations; 2: the soak could not run to the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from tests.soak.others import IDENT, SUMMARY_OP, TABLE, TAG_PREFIX, catalog_properties, read_journal  # noqa: E402
from tests.support.helpers import write_json_files  # noqa: E402
from tests.support.soak import SoakFolder, job_env, kill_session  # noqa: E402

ROLES = ("appender", "deleter", "tagger", "orphans")

#: The table the stream creates: maintenance inside the sink often, expiry of snapshots older than two minutes.
TABLE_PROPERTIES = {
    "history.expire.max-snapshot-age-ms": "120000",
    "history.expire.min-snapshots-to-keep": "20",
    "write.lakesink.maintenance.interval-ms": "15000",
    "commit.manifest.min-count-to-merge": "20",
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


class SoakAborted(Exception):
    """The soak could not run to the end: not a verdict."""


class ReadRaced(Exception):
    """A read of an older metadata file found a file gone that the current metadata no longer references."""


@dataclass(frozen=True)
class Config:
    seed: int
    minutes: float
    folder: Path
    entry: str = "format"
    rows_per_file: int = 50
    files_per_batch: int = 2
    file_every: float = 2.0
    trigger_seconds: float = 2.0
    kills: int = 2
    check_every: float = 240.0
    append_every: float = 3.0
    append_rows: int = 20
    delete_every: float = 4.0
    deletes_after: float = 0.25
    equality_after: float = 0.5
    tag_every: float = 10.0
    orphans_every: float = 3.0
    drain_timeout: float = 900.0
    master: str = "local[2,4]"


@dataclass
class TagState:
    snapshot_id: int
    sequence: int
    stream_batch: int | None
    timestamp_ms: int
    max_ref_age_ms: int | None
    op: str


@dataclass
class Model:
    """What the table must hold, from the runner's input files, Spark's file-source log and the committed operations."""

    file_ids: dict[str, list[int]] = field(default_factory=dict)  # input file name -> its ids
    file_batch: dict[str, int] = field(default_factory=dict)  # input file name -> the batch that read it
    appends: list[tuple[int, int, list[int]]] = field(default_factory=list)  # (sequence, snapshot id, ids)
    deletes: list[tuple[int, int, list[int], str]] = field(default_factory=list)  # (sequence, snapshot id, ids, kind)
    tags: dict[str, TagState] = field(default_factory=dict)
    pending_tags: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)  # committed / failed operations by kind

    def stream_ids(self, batch: int | None) -> list[int]:
        if batch is None:
            return []
        return [i for name, b in self.file_batch.items() if b <= batch for i in self.file_ids[name]]

    def expected(self, sequence: int, stream_batch: int | None) -> tuple[Counter[int], set[int]]:
        """(ids the snapshot must hold once each, ids it must not hold)."""
        written = Counter(self.stream_ids(stream_batch))
        for seq, _, ids in self.appends:
            if seq <= sequence:
                written.update(ids)
        deleted = {i for seq, _, ids, _ in self.deletes if seq <= sequence for i in ids}
        return Counter({i: 1 for i in written if i not in deleted}), deleted


def spark_files_log(checkpoint: Path) -> dict[str, int]:
    """Input file name -> batch id, from Spark's file-source log (``sources/0/N`` and its ``N.compact`` files)."""
    out: dict[str, int] = {}
    folder = checkpoint / "sources" / "0"
    if not folder.is_dir():
        return out
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or not p.name.split(".")[0].isdigit():
            continue
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:  # a log file Spark compacted away meanwhile
            continue
        for line in lines[1:]:
            if line.strip():
                entry = json.loads(line)
                out[entry["path"].rsplit("/", 1)[-1]] = int(entry["batchId"])
    return out


def spark_offsets_log(checkpoint: Path) -> dict[int, int]:
    """Micro-batch id -> the file source's log offset it read up to (``offsets/N``: ``{"logOffset": L}``). Spark keeps
    only the last ``minBatchesToRetain`` (100) entries: the runner reads them as it goes (:meth:`poll_offsets`)."""
    out: dict[int, int] = {}
    folder = checkpoint / "offsets"
    if not folder.is_dir():
        return out
    for p in folder.iterdir():
        if not p.name.isdigit():
            continue
        try:
            lines = p.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:  # purged meanwhile
            continue
        if len(lines) >= 3 and lines[2].strip():  # "v1", the batch's metadata, then one line per source
            out[int(p.name)] = int(json.loads(lines[2])["logOffset"])
    return out


def file_batches(source_files: dict[str, int], batch_offsets: dict[int, int]) -> tuple[dict[str, int], list[str]]:
    """Input file name -> the micro-batch that read it, from the file source's log (file -> source log offset) and the
    offset log (batch -> the source log offset it read up to): batch ``N`` read the files of offsets
    ``(L[N-1], L[N]]``. The source's offsets are not the batch ids: a run killed after the source logged its next
    files but before the offset log named them leaves the source one offset ahead of the batches for good.
    Files of offsets no batch has read yet are left out; the second result: files whose batch cannot be told
    (the offset log entries around them were purged before the runner read them)."""
    ordered = sorted(batch_offsets.items())
    out: dict[str, int] = {}
    unknown: list[str] = []
    for name, offset in source_files.items():
        batch = next((b for b, last in ordered if last >= offset), None)
        if batch is None:
            continue  # not read by a batch yet
        previous = batch_offsets.get(batch - 1)
        if batch == 0 or (previous is not None and previous < offset):
            out[name] = batch
        else:
            unknown.append(name)
    return out, sorted(unknown)


def spark_log(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def stream_marker(properties: dict[str, str]) -> int | None:
    from lakesink.table.keys import LAST_BATCH_PREFIX

    batches = [int(json.loads(v)["batch-id"]) for k, v in properties.items() if k.startswith(LAST_BATCH_PREFIX)]
    return max(batches) if batches else None


def local(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def duckdb_ids(metadata_location: str, snapshot_id: int | None = None) -> list[int]:
    from lakesink.audit import interop

    con = interop.duckdb_connection()
    try:
        path = local(metadata_location).replace("'", "''")
        at = f", snapshot_from_id={int(snapshot_id)}" if snapshot_id is not None else ""
        rows = con.execute(f"SELECT id FROM iceberg_scan('{path}'{at})").to_arrow_table()
    finally:
        con.close()
    return [int(i) for i in rows.column("id").to_pylist()]


def rust_ids(metadata_location: str) -> list[int]:
    from lakesink.audit import interop

    rows = interop.iceberg_rust_query(metadata_location, "SELECT id FROM t")
    return [int(i) for i in rows.column("id").to_pylist()] if rows.num_columns else []


def has_equality_deletes(table: Any, snapshot: Any) -> bool:
    from pyiceberg.manifest import DataFileContent, ManifestContent

    for manifest in snapshot.manifests(table.io):
        if manifest.content == ManifestContent.DELETES:
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.data_file.content == DataFileContent.EQUALITY_DELETES:
                    return True
    return False


def pyiceberg_ids(table: Any, snapshot_id: int) -> list[int]:
    rows = table.scan(snapshot_id=snapshot_id, selected_fields=("id",)).to_arrow()
    return [int(i) for i in rows.column("id").to_pylist()]


def referenced_files(table: Any, snapshots: list[Any] | None = None) -> dict[str, str]:
    """Every file ``table``'s metadata references through its snapshots: path -> what it is (for a data or delete file:
    its content and a snapshot whose manifests list it live). A manifest list or manifest that cannot be read is
    listed without what it lists (the caller finds it missing).

    Data and delete files count only where a manifest lists them live (``ADDED`` or ``EXISTING``): an entry
    ``DELETED`` (a compaction rewrote the file, a delete removed it) is a tombstone that no reader opens, and
    snapshot expiry may delete its file once no kept snapshot lists it live -- as Iceberg Java's expiry does
    (``ManifestFiles.readPaths``: live entries only). A snapshot that still needs the file lists it live."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for snapshot in table.metadata.snapshots if snapshots is None else snapshots:
        out[snapshot.manifest_list] = f"manifest-list (snapshot {snapshot.snapshot_id})"
        try:
            manifests = snapshot.manifests(table.io)
        except FileNotFoundError:
            continue
        for manifest in manifests:
            out.setdefault(manifest.manifest_path, f"manifest (snapshot {snapshot.snapshot_id})")
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            try:
                entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            except FileNotFoundError:
                continue
            for entry in entries:
                out[entry.data_file.file_path] = (
                    f"{entry.data_file.content.name.lower()} ({entry.status.name.lower()} in snapshot {snapshot.snapshot_id})"
                )
    return out


@dataclass
class Check:
    """The result of one check of the table."""

    number: int
    at_s: float
    final: bool
    metadata_location: str = ""
    head_sequence: int = 0
    stream_batch: int | None = None
    expected_rows: int = 0
    readers: dict[str, int] = field(default_factory=dict)  # reader -> rows read
    tags_checked: int = 0
    files_referenced: int = 0
    retries: int = 0
    seconds: float = 0.0
    load_average: float = 0.0
    violations: list[str] = field(default_factory=list)


@dataclass
class Process:
    role: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class ConcurrencySoak(SoakFolder):
    cfg: Config
    t0: float = field(default_factory=time.monotonic)
    rng: random.Random = field(init=False)
    model: Model = field(default_factory=Model)
    stream: subprocess.Popen[bytes] | None = None
    stream_runs: int = 0
    kills: list[dict[str, Any]] = field(default_factory=list)
    others: list[Process] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)
    files_written: int = 0
    batch_offsets: dict[int, int] = field(default_factory=dict)  # micro-batch -> file source log offset (offsets/N)
    unmapped_files: list[str] = field(default_factory=list)
    _offsets_polled: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.cfg.seed)
        self.props = catalog_properties(self.home)

    # --- paths ------------------------------------------------------------------------------------

    @property
    def stop_others(self) -> Path:
        return self.folder / "stop-others"

    @property
    def stop_stream(self) -> Path:
        return self.folder / "stop-stream"

    def journal(self, role: str) -> Path:
        return self.folder / f"{role}.jsonl"

    def say(self, text: str) -> None:
        print(f"[concurrency seed {self.cfg.seed} {time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    def violation(self, text: str) -> None:
        self.violations.append(text)
        self.say(f"VIOLATION: {text}")

    def table(self) -> Any:
        from lakesink.driver import catalogs

        return catalogs.load(None, self.props).load_table(IDENT)

    # --- input ------------------------------------------------------------------------------------

    def add_file(self) -> None:
        n = self.files_written
        self.model.file_ids.update(
            write_json_files(self.input, files=1, rows_per_file=self.cfg.rows_per_file, start=n * self.cfg.rows_per_file)
        )
        self.files_written += 1

    # --- processes --------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return job_env(self.home)

    def start_stream(self) -> None:
        self.stream_runs += 1
        log = self.folder / "job.log"
        with log.open("a") as f:
            f.write(f"\n===== run {self.stream_runs}, started {datetime.now():%H:%M:%S} =====\n")
        cmd = [
            sys.executable, "-m", "tests.soak.job",
            "--input", str(self.input),
            "--checkpoint", str(self.checkpoint),
            "--table", TABLE,
            "--max-files", str(self.cfg.files_per_batch),
            "--entry", self.cfg.entry,
            "--master", self.cfg.master,
            "--trigger-seconds", str(self.cfg.trigger_seconds),
            "--stop-file", str(self.stop_stream),
        ]  # fmt: skip
        for key, value in TABLE_PROPERTIES.items():
            cmd += ["--table-property", f"{key}={value}"]
        with log.open("ab") as out:
            self.stream = subprocess.Popen(
                cmd, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env(), start_new_session=True
            )
        self.say(f"stream run {self.stream_runs} started (pid {self.stream.pid}, entry {self.cfg.entry})")

    def start_others(self) -> None:
        duration = self.cfg.minutes * 60
        plans: dict[str, list[str]] = {
            "appender": ["--interval", str(self.cfg.append_every), "--rows", str(self.cfg.append_rows)],
            "deleter": [
                "--interval", str(self.cfg.delete_every),
                "--start-after", str(self.cfg.deletes_after * duration),
                "--equality-after", str(max(0.0, self.cfg.equality_after - self.cfg.deletes_after) * duration),
            ],
            "tagger": ["--interval", str(self.cfg.tag_every)],
            "orphans": ["--interval", str(self.cfg.orphans_every)],
        }  # fmt: skip
        for role in ROLES:
            log = self.folder / f"{role}.log"
            cmd = [
                sys.executable, "-m", "tests.soak.others", role,
                "--home", str(self.home),
                "--journal", str(self.journal(role)),
                "--stop-file", str(self.stop_others),
                "--seed", str(self.cfg.seed),
                *plans[role],
            ]  # fmt: skip
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    cmd, cwd=self.folder, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=self.env(), start_new_session=True
                )
            self.others.append(Process(role, proc, log))
        self.say("other writers started: " + ", ".join(f"{p.role} (pid {p.proc.pid})" for p in self.others))

    def kill_session(self, proc: subprocess.Popen[bytes]) -> int:
        return len(kill_session(proc, what=f"the killed session {proc.pid}", error=SoakAborted))

    def kill_stream(self) -> None:
        assert self.stream is not None
        marker_before = self.marker()
        n = self.kill_session(self.stream)
        self.kills.append({"at_s": round(time.monotonic() - self.t0, 1), "processes": n, "marker": marker_before})
        self.say(f"SIGKILL stream run {self.stream_runs}: {n} process(es), table at batch {marker_before}; restarting")
        self.stream = None
        self.start_stream()

    def marker(self) -> int | None:
        try:
            return stream_marker(dict(self.table().properties))
        except Exception:
            return None

    def poll_offsets(self, *, now: bool = True) -> None:
        """Keep every entry of Spark's offset log (it purges all but the last 100); ``now=False``: at most once a
        second."""
        if not now and time.monotonic() - self._offsets_polled < 1.0:
            return
        self._offsets_polled = time.monotonic()
        for batch, offset in spark_offsets_log(self.checkpoint).items():
            known = self.batch_offsets.setdefault(batch, offset)
            if known != offset:
                self.violation(f"Spark's offset log entry of batch {batch} changed from logOffset {known} to {offset}")
                self.batch_offsets[batch] = offset

    def watch_processes(self) -> None:
        self.poll_offsets(now=False)
        if self.stream is not None and self.stream.poll() is not None:
            self.violation(
                f"stream run {self.stream_runs} exited by itself with {self.stream.returncode}: {self.log_tail('job')}"
            )
            raise SoakAborted("the stream exited without a fault that explains it")
        for p in self.others:
            if p.proc.poll() is not None and not self.stop_others.exists():
                raise SoakAborted(f"the {p.role} exited with {p.proc.returncode}: {self.log_tail(p.role)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.folder / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(f"    {line}" for line in text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for p in self.others:
            if p.proc.poll() is None:
                self.kill_session(p.proc)
        if self.stream is not None and self.stream.poll() is None:
            self.kill_session(self.stream)

    # --- the model --------------------------------------------------------------------------------

    def load_model(self, metadata: Any, loaded_at: float) -> None:
        """Rebuild the committed operations from the journals; an intent without an outcome is settled from
        ``metadata`` (read before the journals: every operation it holds has its intent journaled). A tag operation
        whose outcome was journaled after ``loaded_at`` (the wall clock before ``metadata`` was read) may have landed
        before or after that read: its tag is not checked this time."""
        m = self.model
        self.poll_offsets()
        m.file_batch, self.unmapped_files = file_batches(spark_files_log(self.checkpoint), self.batch_offsets)
        m.appends, m.deletes, m.tags, m.pending_tags = [], [], {}, set()
        m.counts = Counter()
        by_op: dict[str, int] = {}
        for snapshot in metadata.snapshots:
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if SUMMARY_OP in props:
                by_op[props[SUMMARY_OP]] = snapshot.sequence_number
        for role in ("appender", "deleter", "tagger"):
            intents: dict[str, dict[str, Any]] = {}
            for rec in read_journal(self.journal(role)):
                if rec["phase"] == "intent":
                    intents[rec["op"]] = rec
                    continue
                intent = intents.pop(rec["op"])
                if intent["kind"].startswith("tag-") and rec["t"] >= loaded_at:
                    m.pending_tags.add(intent["tag"])
                    continue
                self.apply(intent, rec["outcome"] == "committed", rec.get("sequence"), rec.get("snapshot_id"))
            for op, intent in intents.items():  # in flight when the journal was read
                if intent["kind"].startswith("tag-"):
                    m.pending_tags.add(intent["tag"])
                elif op in by_op:
                    self.apply(intent, True, by_op[op], None)

    def apply(self, intent: dict[str, Any], committed: bool, sequence: int | None, snapshot_id: int | None) -> None:
        m = self.model
        kind = intent["kind"]
        m.counts[f"{kind} {'committed' if committed else 'failed'}"] += 1
        if not committed:
            return
        if kind == "append":
            assert sequence is not None
            m.appends.append((sequence, snapshot_id or 0, list(range(intent["first"], intent["first"] + intent["count"]))))
        elif kind.endswith("-delete"):
            assert sequence is not None
            m.deletes.append((sequence, snapshot_id or 0, list(intent["ids"]), kind))
        elif kind == "tag-remove":
            m.tags.pop(intent["tag"], None)
        else:
            m.tags[intent["tag"]] = TagState(
                intent["snapshot_id"],
                intent["sequence"],
                intent["stream_batch"],
                intent["timestamp_ms"],
                intent["max_ref_age_ms"],
                intent["op"],
            )

    # --- the checks -------------------------------------------------------------------------------

    def check(self, *, final: bool) -> Check:
        started = time.monotonic()
        result = Check(number=len(self.checks) + 1, at_s=round(started - self.t0, 1), final=final)
        result.load_average = os.getloadavg()[0]
        self.loads.append(result.load_average)
        for _attempt in range(4):
            result.violations = []
            try:
                self.check_once(result)
                break
            except ReadRaced as e:
                result.retries += 1
                self.say(f"check {result.number}: {e}; again on the current metadata")
        else:
            result.violations.append("four reads in a row raced expiry; the table could not be checked")
        result.seconds = round(time.monotonic() - started, 1)
        for v in result.violations:
            self.violation(f"check {result.number}{' (final)' if final else ''}: {v}")
        self.checks.append(result)
        self.say(
            f"check {result.number}{' (final)' if final else ''}: head seq {result.head_sequence}, stream batch "
            f"{result.stream_batch}, {result.expected_rows} rows expected, read {result.readers}, "
            f"{result.tags_checked} tag(s), {result.files_referenced} files referenced, load {result.load_average:.1f}, "
            f"{result.seconds:.0f}s, {len(result.violations)} violation(s)"
        )
        return result

    def check_once(self, result: Check) -> None:
        from lakesink.audit import verify

        loaded_at = time.time()
        table = self.table()
        md = table.metadata
        self.load_model(md, loaded_at)
        result.metadata_location = table.metadata_location
        # the readers get a copy of the metadata file: the writers delete old ones (previous-versions-max)
        copy = self.folder / "checks" / f"{result.number}-{result.retries}.metadata.json"
        copy.parent.mkdir(exist_ok=True)
        try:
            copy.write_bytes(table.io.new_input(table.metadata_location).open().read())
        except FileNotFoundError as e:
            raise ReadRaced(f"the metadata file read was deleted before it was copied ({e})") from e
        metadata_copy = f"file://{copy}"
        head = md.snapshot_by_name("main")
        assert head is not None
        batch = stream_marker(dict(md.properties))
        result.head_sequence, result.stream_batch = head.sequence_number, batch
        missing_inputs = [n for n in self.model.file_batch if n not in self.model.file_ids]
        if self.unmapped_files:
            result.violations.append(
                f"the batch of {len(self.unmapped_files)} input file(s) cannot be told (Spark purged its offset log "
                f"entries before the runner read them): {self.unmapped_files[:5]}"
            )
        if missing_inputs:
            result.violations.append(f"Spark read input files the runner never wrote: {missing_inputs[:5]}")

        # every referenced file exists (one missing from this read but no longer referenced now: expiry deleted it)
        refs = referenced_files(table)
        result.files_referenced = len(refs)
        gone = [p for p in refs if not os.path.exists(local(p))]
        if gone:
            self.judge_missing(gone, refs, result)

        expected, deleted = self.model.expected(head.sequence_number, batch)
        result.expected_rows = sum(expected.values())
        readers = {"duckdb": lambda: duckdb_ids(metadata_copy), "iceberg-rust": lambda: rust_ids(metadata_copy)}
        if not has_equality_deletes(table, head):
            readers["pyiceberg"] = lambda: pyiceberg_ids(table, head.snapshot_id)
        for reader, read in readers.items():
            ids = self.read(reader, read, refs, result)
            if ids is None:
                continue
            result.readers[reader] = len(ids)
            self.compare(
                f"main (snapshot {head.snapshot_id}, seq {head.sequence_number}, batch {batch}) read by {reader}",
                ids,
                expected,
                deleted,
                result,
            )

        # tags
        tags_now = {name: ref for name, ref in md.refs.items() if name.startswith(TAG_PREFIX)}
        for name, ref in sorted(tags_now.items()):
            if name in self.model.pending_tags:
                continue
            state = self.model.tags.get(name)
            if state is None:
                result.violations.append(f"tag {name} exists (snapshot {ref.snapshot_id}) but no committed operation made it")
                continue
            if ref.snapshot_id != state.snapshot_id:
                result.violations.append(
                    f"tag {name} points at {ref.snapshot_id}, made to point at {state.snapshot_id} ({state.op})"
                )
                continue
            snapshot = md.snapshot_by_id(state.snapshot_id)
            if snapshot is None:
                result.violations.append(f"tag {name}: its snapshot {state.snapshot_id} is not in the table")
                continue
            result.tags_checked += 1
            expected_t, deleted_t = self.model.expected(state.sequence, state.stream_batch)
            tag_readers = {"duckdb": lambda s=state: duckdb_ids(metadata_copy, s.snapshot_id)}
            if not has_equality_deletes(table, snapshot):
                tag_readers["pyiceberg"] = lambda s=state: pyiceberg_ids(table, s.snapshot_id)
            tag_refs = referenced_files(table, [snapshot])
            for reader, read in tag_readers.items():
                ids = self.read(reader, read, tag_refs, result)
                if ids is not None:
                    self.compare(
                        f"tag {name} (snapshot {state.snapshot_id}, seq {state.sequence}, batch {state.stream_batch}) "
                        f"read by {reader}",
                        ids,
                        expected_t,
                        deleted_t,
                        result,
                    )
        now_ms = md.last_updated_ms
        for name, state in sorted(self.model.tags.items()):
            if name in tags_now or name in self.model.pending_tags:
                continue
            aged = state.max_ref_age_ms is not None and now_ms - state.timestamp_ms > state.max_ref_age_ms
            if not aged:
                result.violations.append(
                    f"tag {name} ({state.op}, snapshot {state.snapshot_id}) is gone, though no one removed it and its "
                    f"max-ref-age ({state.max_ref_age_ms}) has not passed"
                )

        report = verify(table)
        if not report.ok:
            result.violations.append("lakesink verify: " + "; ".join(f"{v.kind}: {v.message}" for v in report.violations[:5]))

    def read(self, reader: str, read: Any, refs: dict[str, str], result: Check) -> list[int] | None:
        try:
            ids: list[int] = read()
            return ids
        except Exception as e:
            gone = [p for p in refs if not os.path.exists(local(p))]
            if gone:
                self.judge_missing(gone, refs, result)
                raise ReadRaced(f"{reader} could not read ({type(e).__name__}); {len(gone)} file(s) missing") from e
            result.violations.append(f"{reader} failed: {type(e).__name__}: {str(e)[:500]}")
            return None

    def judge_missing(self, gone: list[str], refs: dict[str, str], result: Check) -> None:
        current = referenced_files(self.table())
        still = [p for p in gone if p in current and not os.path.exists(local(p))]
        if still:
            result.violations.append(
                f"{len(still)} file(s) the table references are missing: "
                + ", ".join(f"{current[p]} {p.rsplit('/', 2)[-2]}/{p.rsplit('/', 1)[-1]}" for p in still[:6])
            )
            return
        raise ReadRaced(f"{len(gone)} file(s) of an older metadata read were deleted since (no longer referenced)")

    def compare(self, what: str, ids: list[int], expected: Counter[int], deleted: set[int], result: Check) -> None:
        got = Counter(ids)
        duplicates = sorted(i for i, n in got.items() if n > 1)
        missing = sorted(i for i in expected if i not in got)
        resurrected = sorted(i for i in got if i in deleted)
        unexpected = sorted(i for i in got if i not in expected and i not in deleted)
        if duplicates or missing or resurrected or unexpected:
            result.violations.append(
                f"{what}: {len(ids)} rows, {sum(expected.values())} expected: {len(duplicates)} duplicated "
                f"{duplicates[:5]}, {len(missing)} missing {missing[:5]}, {len(resurrected)} deleted but present "
                f"{resurrected[:5]}, {len(unexpected)} unexpected {unexpected[:5]}"
            )

    # --- the run ------------------------------------------------------------------------------------

    def wait_for_table(self, timeout: float = 600.0) -> None:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.table().current_snapshot() is not None:
                    return
            except (NoSuchTableError, NoSuchNamespaceError):
                pass
            self.watch_processes()
            if time.monotonic() > deadline:
                raise SoakAborted(f"the stream created no table within {timeout:.0f}s: {self.log_tail('job')}")
            self.add_file_if_due()
            time.sleep(0.5)

    _next_file: float = 0.0

    def add_file_if_due(self) -> None:
        if time.monotonic() >= self._next_file:
            self.add_file()
            self._next_file = time.monotonic() + self.cfg.file_every

    def play(self) -> dict[str, Any]:
        cfg = self.cfg
        shutil.rmtree(self.folder, ignore_errors=True)
        for sub in (self.input, self.checkpoint, self.home):
            sub.mkdir(parents=True)
        self.say(f"entry {cfg.entry}, {cfg.minutes} minutes, folder {self.folder}")
        try:
            for _ in range(4):
                self.add_file()
            self.start_stream()
            self.wait_for_table()
            self.start_others()
            began = time.monotonic()
            duration = cfg.minutes * 60
            kill_at = sorted(began + self.rng.uniform(0.15, 0.85) * duration for _ in range(cfg.kills))
            next_check = began + cfg.check_every
            while time.monotonic() < began + duration:
                self.watch_processes()
                self.add_file_if_due()
                if kill_at and time.monotonic() >= kill_at[0]:
                    kill_at.pop(0)
                    self.kill_stream()
                if time.monotonic() >= next_check:
                    self.check(final=False)
                    next_check = time.monotonic() + cfg.check_every
                time.sleep(0.1)
            self.finish()
        finally:
            self.stop_all()
        return self.result()

    def finish(self) -> None:
        """Stop the other writers, let the stream read every input file, stop it, and check the quiet table."""
        self.say("time is up: stopping the other writers")
        self.stop_others.touch()
        for p in self.others:
            try:
                p.proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise SoakAborted(f"the {p.role} did not stop within 300s: {self.log_tail(p.role)}") from None
            if p.proc.returncode != 0:
                self.violation(f"the {p.role} exited with {p.proc.returncode}: {self.log_tail(p.role)}")
        self.say(f"waiting for the stream to read all {self.files_written} input files")
        deadline = time.monotonic() + self.cfg.drain_timeout
        while True:
            self.watch_processes()
            files, _ = file_batches(spark_files_log(self.checkpoint), self.batch_offsets)
            marker = self.marker()
            if len(files) == self.files_written and marker is not None and marker >= max(files.values()):
                break
            if time.monotonic() > deadline:
                raise SoakAborted(f"the stream did not read all input within {self.cfg.drain_timeout:.0f}s")
            time.sleep(1)
        self.stop_stream.touch()
        assert self.stream is not None
        try:
            self.stream.wait(timeout=300)
        except subprocess.TimeoutExpired:
            raise SoakAborted("the stream did not stop within 300s") from None
        if self.stream.returncode != 0:
            self.violation(f"the stream's last run exited with {self.stream.returncode}: {self.log_tail('job')}")
        self.stream = None
        final = self.check(final=True)
        commits = spark_log(self.checkpoint / "commits")
        if commits and final.stream_batch is not None and commits[-1] != final.stream_batch:
            self.violation(f"Spark's commit log ends at batch {commits[-1]}, the table's marker at {final.stream_batch}")
        self.cli_verify()
        self.last_orphans(final)

    def cli_verify(self) -> None:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "lakesink"), "verify", TABLE, "--json"],
            capture_output=True, text=True, env=self.env(), check=False,
        )  # fmt: skip
        if done.returncode != 0:
            self.violation(f"lakesink verify exited with {done.returncode}: {done.stdout[-1500:]} {done.stderr[-1500:]}")
        else:
            try:
                out = json.loads(done.stdout)
                self.say(
                    f"lakesink verify: ok={out.get('ok')}, {out.get('snapshots_checked')} snapshot(s), "
                    f"{out.get('files_checked')} file(s) checked, {len(out.get('violations') or [])} violation(s)"
                )
            except ValueError:
                self.say(f"lakesink verify: exit 0, {done.stdout.strip()[:200]}")

    def last_orphans(self, final: Check) -> None:
        from datetime import timedelta

        import lakesink

        report = lakesink.remove_orphan_files(self.table(), older_than=timedelta(0))
        self.orphans_at_end = {"removed": len(report.removed), "kept_in_flight": len(report.kept_in_flight)}
        self.say(f"last orphan clean-up: removed {len(report.removed)}, kept in flight {len(report.kept_in_flight)}")
        after = self.check(final=True)
        if after.readers != final.readers:
            self.violation(f"the table reads differently after the last orphan clean-up: {final.readers} -> {after.readers}")

    orphans_at_end: dict[str, int] | None = None

    # --- the result ---------------------------------------------------------------------------------

    def operations(self) -> dict[str, Any]:
        counts = Counter(self.model.counts)
        orphan_runs = list(read_journal(self.journal("orphans")))
        removed = Counter(kind for r in orphan_runs if r.get("outcome") == "committed" for kind, _ in r["removed"])
        log = (self.folder / "job.log").read_text(errors="replace") if (self.folder / "job.log").exists() else ""
        import re

        return {
            "by_kind": dict(sorted(counts.items())),
            "appended_rows": sum(len(ids) for _, _, ids in self.model.appends),
            "deleted_rows": sum(len(ids) for _, _, ids, _ in self.model.deletes),
            "orphan_runs": len(orphan_runs),
            "orphan_runs_failed": sum(1 for r in orphan_runs if r.get("outcome") != "committed"),
            "orphan_files_removed": dict(sorted(removed.items())),
            "orphan_files_kept_in_flight": sum(r.get("kept_in_flight", 0) for r in orphan_runs),
            "compactions": len(re.findall(r"compacted \d+ file\(s\) into", log)),
            "compactions_gave_up": len(re.findall(r"compaction of .* gave up|compaction.*gave up", log)),
            "expiries": len(re.findall(r"expired \d+ snapshot\(s\)", log)),
            "manifest_rewrites": len(re.findall(r"rewrote \d+ data manifest", log)),
            "maintenance_failures": len(re.findall(r"background maintenance failed", log)),
            "replays_skipped": len(re.findall(r"replay skipped", log)),
        }

    def result(self) -> dict[str, Any]:
        return {
            "seed": self.cfg.seed,
            "entry": self.cfg.entry,
            "minutes": self.cfg.minutes,
            "config": {k: str(v) for k, v in asdict(self.cfg).items()},
            "table_properties": TABLE_PROPERTIES,
            "input_files": self.files_written,
            "stream_rows": self.files_written * self.cfg.rows_per_file,
            "stream_runs": self.stream_runs,
            "kills": self.kills,
            "operations": self.operations(),
            "tags_at_end": len(self.model.tags),
            "checks": [asdict(c) for c in self.checks],
            "orphans_at_end": self.orphans_at_end,
            "load_average": {
                "min": round(min(self.loads), 1) if self.loads else None,
                "mean": round(sum(self.loads) / len(self.loads), 1) if self.loads else None,
                "max": round(max(self.loads), 1) if self.loads else None,
            },
            "violations": list(self.violations),
            "seconds": round(time.monotonic() - self.t0, 1),
            "folder": str(self.folder),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.soak.concurrency", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=20.0, help="how long the other writers run beside the stream")
    p.add_argument("--entry", choices=("format", "foreach", "both"), default="both", help="both: one soak each, format first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kills", type=int, default=2, help="SIGKILLs of the stream at random moments (restarted each time)")
    p.add_argument("--check-every", type=float, default=240.0, help="seconds between checks while everything runs")
    p.add_argument("--file-every", type=float, default=2.0, help="seconds between input files")
    p.add_argument("--rows-per-file", type=int, default=50)
    p.add_argument("--trigger-seconds", type=float, default=2.0)
    p.add_argument("--deletes-after", type=float, default=0.25, help="share of the run before deletes start")
    p.add_argument("--equality-after", type=float, default=0.5, help="share of the run before equality deletes start")
    p.add_argument("--dir", default=None, help="run folder (default: a new temporary folder)")
    p.add_argument("--json", default=None, help="write the results to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(args.dir).expanduser().resolve() if args.dir else Path(tempfile.mkdtemp(prefix="lakesink-concurrency-"))
    entries = ("format", "foreach") if args.entry == "both" else (args.entry,)
    started = datetime.now(timezone.utc)
    results: list[dict[str, Any]] = []
    aborted = None
    for i, entry in enumerate(entries):
        cfg = Config(
            seed=args.seed + i,
            minutes=args.minutes,
            folder=root / f"{entry}-seed-{args.seed + i}",
            entry=entry,
            kills=args.kills,
            check_every=args.check_every,
            file_every=args.file_every,
            rows_per_file=args.rows_per_file,
            trigger_seconds=args.trigger_seconds,
            deletes_after=args.deletes_after,
            equality_after=args.equality_after,
        )
        soak = ConcurrencySoak(cfg)
        try:
            results.append(soak.play())
        except SoakAborted as e:
            aborted = f"{entry}: {e}"
            print(f"\nSOAK ABORTED: {aborted}", flush=True)
            results.append(soak.result())
            break
        except KeyboardInterrupt:
            aborted = f"{entry}: interrupted"
            results.append(soak.result())
            break
        except Exception:
            aborted = f"{entry}: {traceback.format_exc()}"
            print(f"\nSOAK ABORTED: {aborted}", flush=True)
            results.append(soak.result())
            break
    violations = sum(len(r["violations"]) for r in results)
    report = {
        "command": " ".join(["python -m tests.soak.concurrency", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "aborted": aborted,
        "violations": violations,
        "soaks": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        print(
            json.dumps(
                {k: r[k] for k in ("seed", "entry", "input_files", "stream_runs", "operations", "load_average", "violations")},
                indent=2,
            )
        )
    if aborted:
        return 2
    if violations:
        print(f"FAILED: {violations} violation(s)")
        return 1
    print("OK: every id never deleted exactly once, every deleted id absent, every tag as created, verify clean")
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
