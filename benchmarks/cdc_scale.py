"""A database's change stream at production size (issue 52, "Performance"): what an upsert batch costs as the
tables grow, in each write mode Iceberg's table properties select, against ``foreachBatch`` + Iceberg Java's
``MERGE INTO`` in merge-on-read mode on the same changes.

**The changes** (seeded, :class:`Workload`): tables ``t000...`` of realistic rows -- the key ``id`` and twelve
columns (five strings, four numbers, a boolean, two timestamps; :data:`VALUE_COLUMNS`) plus the change's ``op`` and
``seq``, which the tables keep --, one zstd Parquet file per micro-batch with the routing column ``route``. Batch 0
loads every table (not measured). Each later batch holds ``changes`` changes routed at random over the tables: 40 %
inserts of new keys, 45 % updates and 15 % deletes of live keys, drawn over the whole key range, 30 % of them from a
set of hot keys (1 % of the keys, a Zipf rank over slots scattered across the range), so that a key changes several times in a
batch (the latest ``seq`` wins). A row's values are a function of its key and ``seq`` (:func:`values`), so the model
of the final tables is two integers per key (its latest ``seq`` and ``op``) and every run's tables are compared,
row by row and column by column, with it: a run whose tables differ fails the benchmark.

**The modes** (``--modes``): ``cow`` creates the tables with ``write.update.mode``, ``write.delete.mode`` and
``write.merge.mode`` = ``copy-on-write``, ``mor`` with ``merge-on-read`` (foreach_batch's ``table_properties``).
Before measuring a mode, a probe stream (one table, one batch of updates and deletes) checks what lakesink does with
it: a mode whose batch does not commit as the mode says (``mor``: no delete file written; ``cow``: a delete file
written) or fails is reported as skipped with that reason, never measured as something else. Every measured run
records the data and delete files its batches added (``mode_effective``).

**The parts** (``--parts``):

- ``scale``: for each table size of ``--sizes``, ``--tables`` tables, ``--batches`` batches of ``--changes``
  changes; per batch its time (``durationMs.triggerExecution``: reading, resolving, writing, committing), lakesink's
  commit time (its log line), and the bytes the batch added to the tables (data and delete files, from the
  manifests, plus lakesink's order file of tombstones when the batch rewrote it) over the bytes of the batch's
  change file (the changed rows, zstd Parquet): the write amplification. The cost ratio is a size's time per batch
  over the smallest size's, per mode. ``java-mor`` (at the sizes of ``--java-sizes``): Spark 3.5 + Iceberg 1.9.2
  (``.venv-iceberg-java``, benchmarks/cdc_java_job.py, its own JVM), tables merge-on-read loaded with the same rows
  by pyiceberg (not measured), ``foreachBatch`` keeping each key's latest change then one ``MERGE INTO`` per table.
  Repetitions run the paths in alternating order, so that the machine's load hits all alike; ratios are paired
  within a repetition.
- ``small``: ``--small-tables`` tables of ``--small-rows`` rows, batches of ``--small-changes`` changes (a 1 s
  trigger at 1,000 changes/s): time per batch and the commit's share per table.
- ``reads``: one table of ``--read-rows`` rows after ``--read-batches`` batches of ``--read-changes`` changes
  (``maintenance="off"``, so that nothing compacts it meanwhile), scanned whole (every column) by DuckDB and by
  pyiceberg ``--read-reps`` times, alternating; then compacted by lakesink (:func:`lakesink.maintenance.compaction.
  compact`) and scanned again. Every scan is checked against the model.

Every lakesink run goes through ``foreach_batch(route_by="route", upsert_key="id", delete_when="op = 'd'",
order_by="seq")`` reading the change files with Spark's file source (``maxFilesPerTrigger=1``, ``availableNow``: the
batches run back to back), on a fresh PostgreSQL catalog database (Iceberg's JdbcCatalog needs it for the Java side).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks import java_sink
from benchmarks.cdc import timed_stream
from benchmarks.common import duckdb_connection, summarise

NAMESPACE = "cdc"
MODES = {"cow": "copy-on-write", "mor": "merge-on-read", "cow-history": "copy-on-write", "mor-history": "merge-on-read"}
"""The write modes measured; ``-history``: the same with option history on (issue 55: each table's history table in the
batch's unit, valid_from the change's ``updated_at``), whose time per batch is compared with the mode's without it."""
DEFAULT_MODES = ("cow", "mor")
MODE_PROPERTIES = ("write.update.mode", "write.delete.mode", "write.merge.mode")
PARTS = ("scale", "small", "reads")
JAVA_JOB = Path(__file__).resolve().parent / "cdc_java_job.py"
BASE_US = 1_700_000_000_000_000  # 2023-11-14 UTC, in microseconds

FIRST = ["Ada", "Alan", "Barbara", "Claude", "Dennis", "Edsger", "Frances", "Grace", "Guido", "John", "Ken", "Leslie",
         "Linus", "Margaret", "Niklaus", "Radia", "Tim", "Tony", "Vint", "Yukihiro"]  # fmt: skip
LAST = ["Hopper", "Turing", "Liskov", "Shannon", "Ritchie", "Dijkstra", "Allen", "Knuth", "Lamport", "Torvalds",
        "Hamilton", "Wirth", "Perlman", "Lee", "Hoare", "Cerf", "Matsumoto", "Backus", "Codd", "Gray"]  # fmt: skip
CITIES = ["Amsterdam", "Berlin", "Bogota", "Cairo", "Chicago", "Delhi", "Dublin", "Jakarta", "Lagos", "Lima", "Lisbon",
          "London", "Madrid", "Manila", "Mumbai", "Nairobi", "Osaka", "Paris", "Prague", "Santiago", "Seoul", "Sydney",
          "Tokyo", "Toronto", "Vienna", "Warsaw", "Zurich", "Oslo", "Quito", "Riga"]  # fmt: skip
COUNTRIES = ["NL", "DE", "CO", "EG", "US", "IN", "IE", "ID", "NG", "PE", "PT", "GB", "ES", "PH", "KE", "JP", "FR", "CZ",
             "CL", "KR", "AU", "CA", "AT", "PL", "CH", "NO", "EC", "LV"]  # fmt: skip
STATUSES = ["active", "pending", "suspended", "closed", "trial"]

#: The twelve value columns of every table (besides the key ``id`` and the change's ``op`` and ``seq``).
VALUE_SCHEMA = pa.schema(
    [
        ("name", pa.string()),
        ("email", pa.string()),
        ("city", pa.string()),
        ("country", pa.string()),
        ("status", pa.string()),
        ("amount", pa.float64()),
        ("score", pa.float64()),
        ("qty", pa.int32()),
        ("visits", pa.int64()),
        ("active", pa.bool_()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
VALUE_COLUMNS = tuple(VALUE_SCHEMA.names)
#: What the tables hold (route-by drops the routing column), in this order.
COLUMNS = ("id", "op", "seq", *VALUE_COLUMNS)
CHANGE_SCHEMA = pa.schema([("route", pa.string()), ("op", pa.string()), ("seq", pa.int64()), ("id", pa.int64()), *VALUE_SCHEMA])
SPARK_SCHEMA = (
    "route STRING, op STRING, seq BIGINT, id BIGINT, name STRING, email STRING, city STRING, country STRING, "
    "status STRING, amount DOUBLE, score DOUBLE, qty INT, visits BIGINT, active BOOLEAN, created_at TIMESTAMP, "
    "updated_at TIMESTAMP"
)
#: Updates and deletes: this share draws from the hot keys (:data:`HOT_KEYS` of the loaded keys, a Zipf rank of
#: exponent :data:`ZIPF_EXPONENT`), the rest uniformly over the live keys.
HOT_SHARE = 0.3
HOT_KEYS = 0.01
ZIPF_EXPONENT = 1.0
OPS = np.array(["", "c", "u"])  # the model's op codes: 0 absent or deleted, 1 inserted, 2 updated


def table_names(tables: int) -> list[str]:
    return [f"t{i:03d}" for i in range(tables)]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 of uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _pick(words: list[str], idx: np.ndarray) -> pa.Array:
    return pa.array(words, pa.string()).take(pa.array(idx.astype(np.int64)))


def values(table: int, keys: np.ndarray, seqs: np.ndarray) -> pa.Table:
    """The twelve values of rows with these keys as written by the change with these ``seq`` numbers (a pure
    function: the model recomputes any row from its key and ``seq``)."""
    with np.errstate(over="ignore"):
        h = _mix(keys.astype(np.uint64) * np.uint64(1_000_003) + seqs.astype(np.uint64) * np.uint64(7919) + np.uint64(table))
    n = len(keys)

    def bits(shift: int, mod: int) -> np.ndarray:
        return ((h >> np.uint64(shift)) % np.uint64(mod)).astype(np.int64)

    name = pc.binary_join_element_wise(_pick(FIRST, bits(0, len(FIRST))), _pick(LAST, bits(5, len(LAST))), " ")
    email = pc.binary_join_element_wise(
        pa.array(np.full(n, "user")), pc.cast(pa.array(keys), pa.string()), pa.array(np.full(n, ".")),
        pc.cast(pa.array(bits(10, 1000)), pa.string()), pa.array(np.full(n, "@example.com")), "",
    )  # fmt: skip
    columns = [
        name,
        email,
        _pick(CITIES, bits(20, len(CITIES))),
        _pick(COUNTRIES, bits(25, len(COUNTRIES))),
        _pick(STATUSES, bits(30, len(STATUSES))),
        pa.array(bits(33, 10_000_000) / 100.0),
        pa.array(bits(13, 1_000_000) / 1_000_000.0),
        pa.array(bits(40, 1000).astype(np.int32)),
        pa.array(bits(44, 1 << 20)),
        pa.array(bits(63, 2).astype(bool)),
        pa.array(BASE_US + keys.astype(np.int64) * 1_000_000, pa.timestamp("us", tz="UTC")),
        pa.array(BASE_US + seqs.astype(np.int64) * 1_000, pa.timestamp("us", tz="UTC")),
    ]
    return pa.Table.from_arrays(columns, schema=VALUE_SCHEMA)


@dataclass
class _Keys:
    """One table's keys: the model (latest ``seq`` and ``op`` per key) and the live keys for drawing."""

    seq: np.ndarray
    op: np.ndarray
    live: np.ndarray
    pos: np.ndarray
    count: int
    next_id: int
    hot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @classmethod
    def loaded(cls, rows: int, rng: np.random.Generator, hot_keys: int) -> _Keys:
        cap = max(16, rows * 2)
        seq = np.full(cap, -1, np.int64)
        seq[:rows] = 0
        op = np.zeros(cap, np.int8)
        op[:rows] = 1
        live = np.zeros(cap, np.int64)
        live[:rows] = np.arange(rows)
        pos = np.full(cap, -1, np.int64)
        pos[:rows] = np.arange(rows)
        hot = rng.choice(max(rows, 1), size=min(max(rows, 1), hot_keys), replace=False).astype(np.int64)
        return cls(seq, op, live, pos, rows, rows, hot)

    def _grow(self) -> None:
        cap = len(self.seq) * 2
        self.seq = np.concatenate([self.seq, np.full(cap - len(self.seq), -1, np.int64)])
        self.op = np.concatenate([self.op, np.zeros(cap - len(self.op), np.int8)])
        self.live = np.concatenate([self.live, np.zeros(cap - len(self.live), np.int64)])
        self.pos = np.concatenate([self.pos, np.full(cap - len(self.pos), -1, np.int64)])

    def insert(self, seq: int) -> int:
        if self.next_id >= len(self.seq):
            self._grow()
        key = self.next_id
        self.next_id += 1
        self.live[self.count] = key
        self.pos[key] = self.count
        self.count += 1
        self.seq[key], self.op[key] = seq, 1
        return key

    def draw(self, rng: np.random.Generator, zipf: np.ndarray) -> int:
        """A live key: with probability :data:`HOT_SHARE` a hot one (a Zipf rank over slots scattered across the key
        range), else any live key."""
        if len(self.hot) and rng.random() < HOT_SHARE:
            slot = int(self.hot[int(np.searchsorted(zipf, rng.random() * zipf[len(self.hot) - 1]))])
            return int(self.live[slot % self.count])
        return int(self.live[int(rng.integers(self.count))])

    def update(self, key: int, seq: int) -> None:
        self.seq[key], self.op[key] = seq, 2

    def delete(self, key: int) -> None:
        i = int(self.pos[key])
        last = int(self.live[self.count - 1])
        self.live[i], self.pos[last] = last, i
        self.pos[key] = -1
        self.count -= 1
        self.seq[key], self.op[key] = -1, 0

    def expected(self, table: int) -> pa.Table:
        """The model's rows of this table, sorted by key, in :data:`COLUMNS` order."""
        keys = np.flatnonzero(self.seq[: self.next_id] >= 0).astype(np.int64)
        seqs = self.seq[keys]
        vals = values(table, keys, seqs)
        head = [pa.array(keys), pa.array(OPS[self.op[keys]]), pa.array(seqs)]
        return pa.Table.from_arrays([*head, *vals.columns], names=list(COLUMNS))


@dataclass
class Workload:
    """The change files of one stream in ``folder`` (batch 0: the load) and the model of the final tables."""

    folder: Path
    tables: list[str]
    rows_per_table: int
    keys: list[_Keys]
    batches: list[dict[str, Any]]

    @classmethod
    def write(cls, folder: Path, *, tables: int, rows_per_table: int, batches: int, changes: int, seed: int = 52) -> Workload:
        rng = np.random.default_rng(seed)
        names = table_names(tables)
        hot_keys = max(1, int(rows_per_table * HOT_KEYS))
        keys = [_Keys.loaded(rows_per_table, rng, hot_keys) for _ in names]
        zipf = np.cumsum(1.0 / np.arange(1, hot_keys + 1) ** ZIPF_EXPONENT)
        folder.mkdir(parents=True, exist_ok=True)
        described: list[dict[str, Any]] = []

        def path(n: int) -> Path:
            return folder / f"batch-{n:05d}.parquet"

        def stamp(n: int) -> None:  # the file source takes files by modification time
            os.utime(path(n), (1_700_000_000 + n, 1_700_000_000 + n))

        with pq.ParquetWriter(path(0), CHANGE_SCHEMA, compression="zstd") as w:
            for t, name in enumerate(names):
                ids = np.arange(rows_per_table, dtype=np.int64)
                w.write_table(_changes(name, t, np.full(rows_per_table, "c"), np.zeros(rows_per_table, np.int64), ids))
        stamp(0)
        described.append({"batch": 0, "kind": "load", "changes": rows_per_table * tables, "bytes": path(0).stat().st_size})
        seq = 0
        for b in range(1, batches + 1):
            route = np.zeros(changes, np.int64)
            ops = np.empty(changes, dtype="<U1")
            seqs = np.zeros(changes, np.int64)
            ids = np.zeros(changes, np.int64)
            for i in range(changes):
                t = int(rng.integers(tables))
                k = keys[t]
                seq += 1
                x = rng.random()
                if k.count == 0 or x < 0.40:
                    key, op = k.insert(seq), "c"
                else:
                    key = k.draw(rng, zipf)
                    if x < 0.85:
                        k.update(key, seq)
                        op = "u"
                    else:
                        k.delete(key)
                        op = "d"
                route[i], ops[i], seqs[i], ids[i] = t, op, seq, key
            parts = []
            for t, name in enumerate(names):
                mine = route == t
                if mine.any():
                    parts.append(_changes(name, t, ops[mine], seqs[mine], ids[mine]))
            order = np.argsort(np.concatenate([seqs[route == t] for t in range(tables) if (route == t).any()]))
            pq.write_table(pa.concat_tables(parts).take(pa.array(order)), path(b), compression="zstd")
            stamp(b)
            distinct = len({(int(r), int(i)) for r, i in zip(route, ids, strict=True)})
            described.append(
                {
                    "batch": b,
                    "kind": "change",
                    "changes": changes,
                    "inserts": int((ops == "c").sum()),
                    "updates": int((ops == "u").sum()),
                    "deletes": int((ops == "d").sum()),
                    "distinct_keys": distinct,
                    "tables": len(set(route.tolist())),
                    "bytes": path(b).stat().st_size,
                }
            )
        return cls(folder, names, rows_per_table, keys, described)

    def expected(self, t: int) -> pa.Table:
        return self.keys[t].expected(t)

    def model_rows(self) -> int:
        return sum(k.count for k in self.keys)


def _changes(route: str, t: int, ops: np.ndarray, seqs: np.ndarray, ids: np.ndarray) -> pa.Table:
    """Change rows of one table; a delete carries only its key and its time ``updated_at`` (its other values null)."""
    vals = values(t, ids, seqs)
    deleted = pa.array(ops == "d")
    cols = [
        c if name == "updated_at" else pc.if_else(deleted, pa.nulls(len(ids), c.type), c)
        for name, c in zip(vals.column_names, vals.columns, strict=True)
    ]
    head = [pa.array(np.full(len(ids), route)), pa.array(ops.astype(str)), pa.array(seqs), pa.array(ids)]
    return pa.Table.from_arrays([*head, *cols], schema=CHANGE_SCHEMA)


# --- checking a table against the model ------------------------------------------------------------------------


def compare(actual: pa.Table, expected: pa.Table) -> dict[str, Any]:
    """Rows of a table (any order, :data:`COLUMNS` at least) against the model's: counts, keys, every column."""
    a = actual.select(list(COLUMNS)).sort_by("id")
    out: dict[str, Any] = {"rows": a.num_rows, "model_rows": expected.num_rows}
    a_ids, e_ids = a.column("id").to_numpy(), expected.column("id").to_numpy()
    out["missing_keys"] = int(len(np.setdiff1d(e_ids, a_ids)))
    out["extra_keys"] = int(len(np.setdiff1d(a_ids, e_ids)))
    out["duplicate_keys"] = int(len(a_ids) - len(np.unique(a_ids)))
    if a.num_rows == expected.num_rows and not out["missing_keys"]:
        wrong = [c for c in COLUMNS if not a.column(c).combine_chunks().cast(expected.schema.field(c).type).equals(
            expected.column(c).combine_chunks())]  # fmt: skip
        out["wrong_columns"] = wrong
    else:
        out["wrong_columns"] = None
    out["equals_model"] = out["rows"] == out["model_rows"] and out["wrong_columns"] == []
    return out


def _catalog(props: dict[str, str]) -> Any:
    from lakesink.driver import catalogs

    return catalogs.load(None, props)


def check_tables(props: dict[str, str], w: Workload, namespace: str = NAMESPACE) -> dict[str, Any]:
    catalog = _catalog(props)
    per_table = {}
    for t, name in enumerate(w.tables):
        data = catalog.load_table((namespace, name)).scan(selected_fields=COLUMNS).to_arrow()
        per_table[name] = compare(data, w.expected(t))
    bad = {n: c for n, c in per_table.items() if not c["equals_model"]}
    return {
        "equals_model": not bad,
        "rows": sum(c["rows"] for c in per_table.values()),
        "model_rows": w.model_rows(),
        "tables_wrong": bad,
    }


# --- what each batch wrote -----------------------------------------------------------------------------------


def _added(table: Any, snap: Any) -> dict[str, int]:
    """Bytes and files of data and delete files this snapshot added (from its manifests)."""
    from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

    out = {"data_bytes": 0, "data_files": 0, "delete_bytes": 0, "delete_files": 0}
    for m in snap.manifests(table.io):
        if m.added_snapshot_id != snap.snapshot_id:
            continue
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
            if e.status != ManifestEntryStatus.ADDED or e.snapshot_id != snap.snapshot_id:
                continue
            kind = "data" if e.data_file.content == DataFileContent.DATA else "delete"
            out[f"{kind}_bytes"] += e.data_file.file_size_in_bytes
            out[f"{kind}_files"] += 1
    return out


def written_per_batch(props: dict[str, str], tables: Sequence[str], namespace: str = NAMESPACE) -> dict[str, Any]:
    """Per batch id (lakesink's summary ``lakesink.batch-id``): what its snapshots added over the tables -- data and
    delete files, the order file of tombstones when the batch wrote a new one, the bytes its copy-on-write read; and
    what the other snapshots (maintenance) added."""
    from lakesink.table.keys import SUMMARY_BATCH_ID, SUMMARY_UPSERT_BYTES_READ, SUMMARY_UPSERT_ORDER_FILE

    catalog = _catalog(props)
    per: dict[int, dict[str, int]] = {}
    other = {"snapshots": 0, "data_bytes": 0, "delete_bytes": 0}
    for name in tables:
        table = catalog.load_table((namespace, name))
        order_file = None
        for snap in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
            summary = snap.summary.additional_properties if snap.summary else {}
            added = _added(table, snap)
            batch = summary.get(SUMMARY_BATCH_ID)
            if batch is None:
                other["snapshots"] += 1
                other["data_bytes"] += added["data_bytes"]
                other["delete_bytes"] += added["delete_bytes"]
                continue
            b = per.setdefault(int(batch), {"tables": 0, "order_file_bytes": 0, "cow_bytes_read": 0})
            b["tables"] += 1
            for k, v in added.items():
                b[k] = b.get(k, 0) + v
            b["cow_bytes_read"] += int(summary.get(SUMMARY_UPSERT_BYTES_READ, 0))
            named = summary.get(SUMMARY_UPSERT_ORDER_FILE)
            if named and named != order_file:
                b["order_file_bytes"] += _size(named)
            order_file = named or order_file
    return {"batches": per, "other": other}


def _size(location: str) -> int:
    try:
        return os.path.getsize(location.removeprefix("file://"))
    except OSError:
        return 0


# --- the lakesink runs ---------------------------------------------------------------------------------------


def mode_properties(mode: str) -> dict[str, str]:
    return dict.fromkeys(MODE_PROPERTIES, MODES[mode])


def run_lakesink(
    spark: Any,
    changes: Path,
    checkpoint: Path,
    props: dict[str, str],
    mode: str,
    *,
    maintenance: str = "auto",
) -> dict[str, Any]:
    """One stream over ``changes`` into fresh tables: per batch its progress and lakesink's commit time."""
    import lakesink

    history = mode.endswith("-history")
    sink = lakesink.foreach_batch(
        route_by="route",
        namespace=NAMESPACE,
        upsert_key="id",
        delete_when="op = 'd'",
        order_by="seq",
        catalog_properties=props,
        table_properties=mode_properties(mode),
        maintenance=maintenance,
        history="on" if history else None,
        history_time="updated_at" if history else None,
    )
    seconds, batches = timed_stream(spark, sink, SPARK_SCHEMA, changes, str(checkpoint))
    return {"seconds": seconds, "batches": batches}


def probe_mode(spark: Any, root: Path, props: dict[str, str], mode: str) -> str | None:
    """Why lakesink cannot be measured in ``mode`` (None: it can): one table of 50 rows, one batch of 40 changes
    (updates and deletes of loaded keys among them), then the batch's snapshot is read."""
    folder = root / f"probe-{mode}"
    w = Workload.write(folder / "changes", tables=1, rows_per_table=50, batches=1, changes=40, seed=1)
    try:
        run_lakesink(spark, w.folder, folder / "checkpoint", props, mode, maintenance="off")
    except Exception as e:  # the reason is the report: what lakesink said about a table in this mode
        return f"lakesink failed on a {MODES[mode]} table: {type(e).__name__}: {str(e)[:300]}"
    check = check_tables(props, w)
    if not check["equals_model"]:
        return f"the probe's table differs from the model in {MODES[mode]} mode: {check['tables_wrong']}"
    wrote = written_per_batch(props, w.tables)["batches"].get(1, {})
    base = mode.removesuffix("-history")
    if base == "mor" and not wrote.get("delete_files"):
        return (
            "lakesink applied the probe's updates and deletes copy-on-write although the table says "
            f"{', '.join(f'{p}=merge-on-read' for p in MODE_PROPERTIES)} (no delete file written; "
            f"{wrote.get('data_files', 0)} data files added): merge-on-read upserts are not in this version"
        )
    if base == "cow" and wrote.get("delete_files"):
        return f"lakesink wrote {wrote['delete_files']} delete files on a copy-on-write table"
    return None


def lakesink_run(spark: Any, w: Workload, root: Path, props: dict[str, str], mode: str, *, maintenance: str) -> dict[str, Any]:
    """A measured lakesink run: the stream, the check against the model, the bytes each batch wrote."""
    r = run_lakesink(spark, w.folder, root / "checkpoint", props, mode, maintenance=maintenance)
    check = check_tables(props, w)
    if mode.endswith("-history"):  # each history's current versions are the table's rows
        catalog = _catalog(props)
        for name in w.tables:
            current = catalog.load_table((NAMESPACE, name + "__history")).scan(row_filter="is_current = true").to_arrow()
            rows = catalog.load_table((NAMESPACE, name)).scan(selected_fields=("id", "seq")).to_arrow()
            if sorted(zip(current.column("id").to_pylist(), current.column("seq").to_pylist(), strict=True)) != sorted(
                zip(rows.column("id").to_pylist(), rows.column("seq").to_pylist(), strict=True)
            ):
                check = {**check, "equals_model": False, "history_wrong": name}
    written = written_per_batch(props, w.tables)
    sizes = {d["batch"]: d for d in w.batches}
    for b in r["batches"]:
        x = written["batches"].get(b["batch_id"], {})
        b.update({k: x.get(k, 0) for k in ("data_bytes", "delete_bytes", "data_files", "delete_files", "order_file_bytes",
                                            "cow_bytes_read")})  # fmt: skip
        b["change_bytes"] = sizes[b["batch_id"]]["bytes"]
        b["amplification"] = (b["data_bytes"] + b["delete_bytes"]) / b["change_bytes"]
    measured = [b for b in r["batches"] if b["batch_id"] > 0]
    deletes = sum(b["delete_files"] for b in measured)
    return {
        "path": f"lakesink-{mode}",
        "mode": mode,
        **r,
        **check,
        "maintenance_snapshots": written["other"],
        "delete_files_added": deletes,
        "mode_effective": deletes > 0 if mode == "mor" else deletes == 0,
    }


# --- the Java baseline ---------------------------------------------------------------------------------------


def java_schema() -> pa.Schema:
    return pa.schema([pa.field("id", pa.int64(), nullable=False), ("op", pa.string()), ("seq", pa.int64()), *VALUE_SCHEMA])


def java_run(w: Workload, root: Path, props: dict[str, str], rep: int, say: Callable[[str], None]) -> dict[str, Any]:
    """foreachBatch + MERGE INTO merge-on-read over the same change files (without the load, which pyiceberg appends
    to the Java side's tables first, not measured), in the Java environment."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(java_sink.CATALOG, **props)  # the catalog name Iceberg's Java side looks its tables up under
    ns = f"mor_{rep}"
    catalog.create_namespace((ns,))
    properties = {"format-version": "2", **mode_properties("mor")}
    load = pq.ParquetFile(w.folder / "batch-00000.parquet")
    tables = {n: catalog.create_table((ns, n), schema=java_schema(), properties=properties) for n in w.tables}
    for i in range(load.num_row_groups):
        part = load.read_row_group(i)
        for n, table in tables.items():
            mine = part.filter(pc.equal(part["route"], n))
            if mine.num_rows:
                table.append(mine.select(list(COLUMNS)).cast(java_schema()))
    after_load = root / "changes-java"
    after_load.mkdir(parents=True)
    for f in sorted(w.folder.glob("batch-*.parquet"))[1:]:
        os.link(f, after_load / f.name)  # the same files, the same modification times
    expected = root / "expected.parquet"
    with pq.ParquetWriter(expected, pa.schema([("route", pa.string()), *java_schema()])) as out:
        for t, n in enumerate(w.tables):
            e = w.expected(t)
            out.write_table(e.add_column(0, "route", pa.array([n] * e.num_rows, pa.string())).cast(out.schema))
    job = {
        "conf": java_sink.conf(props, driver_memory="4g"),
        "changes": str(after_load),
        "first_batch": 1,
        "expected": str(expected),
        "tables": w.tables,
        "modes": ["mor"],
        "root": str(root),
        "rep": rep,
        "schema": SPARK_SCHEMA,
        "columns": list(COLUMNS),
    }
    runs: list[dict[str, Any]] = java_sink.run_job(job, root / "java.json", say, script=JAVA_JOB)["runs"]
    (r,) = runs
    catalog = SqlCatalog(java_sink.CATALOG, **props)
    added = {"data_bytes": 0, "delete_bytes": 0, "data_files": 0, "delete_files": 0}
    for n in w.tables:
        table = catalog.load_table((ns, n))
        for snap in table.snapshots()[1:]:  # after the load's append
            for k, v in _added(table, snap).items():
                added[k] += v
    batches = max(1, len(r["batches"]))
    changed = sum(d["bytes"] for d in w.batches[1:])
    r["written"] = added
    r["amplification"] = (added["data_bytes"] + added["delete_bytes"]) / max(1, changed)
    r["written_per_batch"] = (added["data_bytes"] + added["delete_bytes"]) / batches
    r["mode_effective"] = added["delete_files"] > 0
    return r


# --- reads -----------------------------------------------------------------------------------------------------


def reads(table: Any, expected: pa.Table, reps: int) -> dict[str, Any]:
    """Full scans of the table's current snapshot by DuckDB and pyiceberg, alternating; each checked."""
    from lakesink._pyiceberg import io as seam

    con = duckdb_connection()
    location = table.metadata_location.removeprefix("file://")
    head = table.current_snapshot()
    live = {"data_files": 0, "delete_files": 0}
    if head is not None:
        live["data_files"] = sum(1 for _ in seam.data_file_entries(table, head))
        live["delete_files"] = sum(
            1 for m in head.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
            if e.data_file.content != 0
        )  # fmt: skip
    times: dict[str, list[float]] = {"duckdb": [], "pyiceberg": []}
    checks: dict[str, Any] = {}
    cols = ", ".join(COLUMNS)
    for i in range(reps):
        for reader in ("duckdb", "pyiceberg") if i % 2 == 0 else ("pyiceberg", "duckdb"):
            t0 = time.perf_counter()
            if reader == "duckdb":
                data = con.execute(f"SELECT {cols} FROM iceberg_scan('{location}')").fetch_arrow_table()
            else:
                data = table.scan(selected_fields=COLUMNS).to_arrow()
            times[reader].append((time.perf_counter() - t0) * 1000)
            if reader not in checks:
                checks[reader] = compare(data, expected)
    return {**live, "ms": {k: summarise(v) for k, v in times.items()}, "raw_ms": times, "checks": checks}


def reads_run(
    spark: Any, root: Path, props: dict[str, str], mode: str, *, rows: int, batches: int, changes: int, reps: int
) -> dict[str, Any]:
    from lakesink.maintenance.compaction import compact
    from lakesink.maintenance.position_deletes import rewrite_position_deletes

    w = Workload.write(root / "changes", tables=1, rows_per_table=rows, batches=batches, changes=changes, seed=7)
    r = run_lakesink(spark, w.folder, root / "checkpoint", props, mode, maintenance="off")
    table = _catalog(props).load_table((NAMESPACE, w.tables[0]))
    expected = w.expected(0)
    before = reads(table, expected, reps)
    # lakesink's rewrite of the position delete files (maintenance's rewrite-position-deletes), data files kept
    t0 = time.perf_counter()
    rewrite = rewrite_position_deletes(table, min_input_files=2)  # every partition's delete files, at any size
    rewrite_ms = (time.perf_counter() - t0) * 1000
    table = _catalog(props).load_table((NAMESPACE, w.tables[0]))
    rewritten = reads(table, expected, reps)
    t0 = time.perf_counter()
    report = compact(table)
    compact_ms = (time.perf_counter() - t0) * 1000
    table = _catalog(props).load_table((NAMESPACE, w.tables[0]))
    after = reads(table, expected, reps)

    def ratio(over: dict[str, Any]) -> dict[str, Any]:
        return {
            reader: summarise([b / a for b, a in zip(over["raw_ms"][reader], after["raw_ms"][reader], strict=True)])
            for reader in ("duckdb", "pyiceberg")
        }

    ok = all(c["equals_model"] for x in (before, rewritten, after) for c in x["checks"].values())
    return {
        "path": f"lakesink-{mode}",
        "mode": mode,
        "rows": rows,
        "batches": len([b for b in r["batches"] if b["batch_id"] > 0]),
        "changes": changes,
        "stream_seconds": r["seconds"],
        "before_compaction": before,
        "deletes_rewrite": {"status": rewrite.status, "ms": rewrite_ms},
        "deletes_rewritten": rewritten,
        "compaction": {"status": report.status, "ms": compact_ms, "rewritten_files": report.rewritten_files},
        "after_compaction": after,
        "ratio_before_to_after": ratio(before),
        "ratio_rewritten_to_after": ratio(rewritten),
        "equals_model": ok,
    }


# --- the whole benchmark ---------------------------------------------------------------------------------------


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return summarise(vals).get("median") if vals else None


def _batch_line(r: dict[str, Any]) -> str:
    measured = [b for b in r["batches"] if b["batch_id"] > 0]
    ms = _median([b["trigger_ms"] for b in measured])
    amp = _median([b.get("amplification") for b in measured]) if measured and "amplification" in measured[0] else None
    commit = _median([b.get("commit_ms") for b in measured])
    return (
        f"{len(measured)} batches, median {ms or 0:,.0f} ms"
        + (f" (commit {commit:,.0f} ms)" if commit else "")
        + (f", amplification {amp:,.1f}x" if amp is not None else "")
        + f", equals the model: {r['equals_model']}"
    )


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per part, path and size: the medians and spreads the page shows, and the paired ratios."""
    out: dict[str, Any] = {}
    scale = result.get("scale")
    if scale:
        per: dict[str, dict[str, Any]] = {}
        for run in scale["runs"]:
            per.setdefault(run["path"], {}).setdefault(str(run["size"]), []).append(run)
        table: dict[str, Any] = {}
        for path, by_size in per.items():
            table[path] = {}
            for size, runs in by_size.items():
                ms, cps, amp, commit = [], [], [], []
                for run in runs:
                    measured = [b for b in run["batches"] if b["batch_id"] > 0]
                    if not measured:
                        continue
                    ms.append(_median([b["trigger_ms"] for b in measured]) or 0.0)
                    secs = sum(b["trigger_ms"] for b in measured) / 1000
                    cps.append(sum(b["rows"] for b in measured) / secs if secs else 0.0)
                    if "amplification" in measured[0]:
                        amp.append(_median([b["amplification"] for b in measured]) or 0.0)
                    elif "amplification" in run:
                        amp.append(run["amplification"])
                    c = _median([b.get("commit_ms") for b in measured])
                    if c is not None:
                        commit.append(c)
                written = [
                    _median([b["data_bytes"] + b["delete_bytes"] for b in run["batches"] if b["batch_id"] > 0])
                    if "data_bytes" in run["batches"][-1]
                    else run.get("written_per_batch")
                    for run in runs
                ]
                table[path][size] = {
                    "batch_ms": summarise(ms),
                    "changes_per_s": summarise(cps),
                    "amplification": summarise(amp),
                    "bytes_written_per_batch": summarise([float(x) for x in written if x is not None]),
                    "commit_ms": summarise(commit),
                    "equals_model": all(r["equals_model"] for r in runs),
                    "mode_effective": all(r.get("mode_effective", True) for r in runs),
                }
        # the cost ratio: each size's batch time over the smallest size's, per repetition
        sizes = sorted({int(s) for by in per.values() for s in by})
        growth: dict[str, Any] = {}
        for path, by_size in per.items():
            low = {r["rep"]: r for r in by_size.get(str(sizes[0]), [])}
            growth[path] = {}
            for n in sizes[1:]:
                pairs = []
                for r in by_size.get(str(n), []):
                    base = low.get(r["rep"])
                    if base:
                        a = _median([b["trigger_ms"] for b in r["batches"] if b["batch_id"] > 0])
                        z = _median([b["trigger_ms"] for b in base["batches"] if b["batch_id"] > 0])
                        if a and z:
                            pairs.append(a / z)
                growth[path][str(n)] = summarise(pairs)
        # lakesink over Java, paired per repetition (Java's batch time over lakesink's)
        versus: dict[str, Any] = {}
        java = {(r["rep"], r["size"]): r for r in scale["runs"] if r["path"] == "java-mor"}
        for path in per:
            if path == "java-mor":
                continue
            versus[path] = {}
            for n in sizes:
                pairs = []
                for r in per[path].get(str(n), []):
                    j = java.get((r["rep"], r["size"]))
                    if j:
                        a = _median([b["trigger_ms"] for b in r["batches"] if b["batch_id"] > 0])
                        z = _median([b["trigger_ms"] for b in j["batches"]])
                        if a and z:
                            pairs.append(z / a)
                if pairs:
                    versus[path][str(n)] = summarise(pairs)
        # option history's cost: a mode's batch time with history over without it, paired per repetition and size
        history_cost: dict[str, Any] = {}
        for path in per:
            if not path.endswith("-history") or path.removesuffix("-history") not in per:
                continue
            without = {(r["rep"], r["size"]): r for rs in per[path.removesuffix("-history")].values() for r in rs}
            history_cost[path] = {}
            for n in sizes:
                pairs = []
                for r in per[path].get(str(n), []):
                    w = without.get((r["rep"], r["size"]))
                    if w:
                        a = _median([b["trigger_ms"] for b in r["batches"] if b["batch_id"] > 0])
                        z = _median([b["trigger_ms"] for b in w["batches"] if b["batch_id"] > 0])
                        if a and z:
                            pairs.append(a / z)
                if pairs:
                    history_cost[path][str(n)] = summarise(pairs)
        out["scale"] = {
            "paths": table,
            "growth_over_smallest": growth,
            "speedup_over_java_mor": versus,
            "history_over_without": history_cost,
        }
    small = result.get("small")
    if small:
        out["small"] = {}
        for run in small["runs"]:
            measured = [b for b in run["batches"] if b["batch_id"] > 0]
            s = out["small"].setdefault(
                run["path"], {"batch_ms": [], "commit_ms": [], "commit_share": [], "commit_ms_per_table": []}
            )
            s["batch_ms"] += [b["trigger_ms"] for b in measured]
            s["commit_ms"] += [b["commit_ms"] for b in measured if b.get("commit_ms") is not None]
            s["commit_share"] += [b["commit_ms"] / b["trigger_ms"] for b in measured if b.get("commit_ms") and b["trigger_ms"]]
            s["commit_ms_per_table"] += [
                b["commit_ms"] / b["tables_committed"] for b in measured if b.get("commit_ms") and b.get("tables_committed")
            ]
        for s in out["small"].values():
            for k in list(s):
                s[k] = summarise(s[k])
    return out


def run(
    spark: Any,
    root: Path,
    *,
    parts: Sequence[str],
    modes: Sequence[str],
    tables: int,
    sizes: Sequence[int],
    changes: int,
    batches: int,
    reps: int,
    java_sizes: Sequence[int],
    maintenance: str,
    small_tables: int,
    small_rows: int,
    small_changes: int,
    small_batches: int,
    read_rows: int,
    read_batches: int,
    read_changes: int,
    read_reps: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    from tests.support.pg import PostgresServer

    server = PostgresServer.start()
    counter = iter(range(10**6))

    def fresh(label: str) -> tuple[Path, dict[str, str]]:
        """A scratch folder, a fresh database of the PostgreSQL server and a fresh warehouse: one catalog per run."""
        folder = root / f"{next(counter):03d}-{label}"
        (folder / "warehouse").mkdir(parents=True)
        return folder, {"type": "sql", "uri": server.create_database(), "warehouse": f"file://{folder / 'warehouse'}"}

    result: dict[str, Any] = {"parts": list(parts), "modes": list(modes), "maintenance": maintenance}
    try:
        skipped: dict[str, str] = {}
        for mode in modes:
            folder, props = fresh(f"probe-{mode}")
            why = probe_mode(spark, folder, props, mode)
            if why:
                skipped[mode] = why
                say(f"  lakesink {mode}: skipped: {why}")
        measured_modes = [m for m in modes if m not in skipped]
        java_why = java_sink.unavailable() if "scale" in parts and java_sizes else None
        if java_why:
            say(f"  foreachBatch + MERGE INTO skipped: {java_why}")
        result["skipped"] = {f"lakesink-{m}": why for m, why in skipped.items()}
        if java_why:
            result["skipped"]["java-mor"] = java_why

        if "scale" in parts:
            scale_runs: list[dict[str, Any]] = []
            workloads = {}
            for size in sizes:
                t0 = time.perf_counter()
                workloads[size] = Workload.write(
                    root / f"changes-{size}", tables=tables, rows_per_table=size, batches=batches, changes=changes
                )
                say(
                    f"scale: {tables} tables x {size:,} rows, {batches} batches of {changes:,} changes "
                    f"(written in {time.perf_counter() - t0:.1f} s)"
                )
            for rep in range(1, reps + 1):
                for size in sizes:
                    w = workloads[size]
                    steps: list[str] = [f"lakesink-{m}" for m in measured_modes]
                    if not java_why and size in java_sizes:
                        steps.append("java-mor")
                    for step in steps if rep % 2 == 1 else steps[::-1]:
                        folder, props = fresh(f"{step}-{size}-{rep}")
                        load = [round(x, 2) for x in os.getloadavg()]
                        if step == "java-mor":
                            r = java_run(w, folder, props, rep, say)
                        else:
                            r = lakesink_run(spark, w, folder, props, step.removeprefix("lakesink-"), maintenance=maintenance)
                        r.update({"rep": rep, "size": size, "load_average": [*load, *(round(x, 2) for x in os.getloadavg())]})
                        scale_runs.append(r)
                        say(f"  rep {rep}, {size:,} rows, {step}: {_batch_line(r)}")
            result["scale"] = {
                "tables": tables,
                "sizes": list(sizes),
                "changes": changes,
                "batches": batches,
                "reps": reps,
                "java_sizes": list(java_sizes),
                "workload": {str(s): w.batches for s, w in workloads.items()},
                "runs": scale_runs,
            }

        if "small" in parts:
            w = Workload.write(
                root / "changes-small", tables=small_tables, rows_per_table=small_rows, batches=small_batches,
                changes=small_changes, seed=53,
            )  # fmt: skip
            say(f"small: {small_tables} tables x {small_rows} rows, {small_batches} batches of {small_changes:,} changes")
            small_runs = []
            for rep in range(1, reps + 1):
                for mode in measured_modes if rep % 2 == 1 else measured_modes[::-1]:
                    folder, props = fresh(f"small-{mode}-{rep}")
                    load = [round(x, 2) for x in os.getloadavg()]
                    r = lakesink_run(spark, w, folder, props, mode, maintenance=maintenance)
                    r.update({"rep": rep, "load_average": [*load, *(round(x, 2) for x in os.getloadavg())]})
                    small_runs.append(r)
                    say(f"  rep {rep}, lakesink-{mode}: {_batch_line(r)}")
            result["small"] = {
                "tables": small_tables,
                "rows_per_table": small_rows,
                "changes": small_changes,
                "batches": small_batches,
                "workload": w.batches,
                "runs": small_runs,
            }

        if "reads" in parts:
            say(f"reads: 1 table x {read_rows:,} rows after {read_batches} batches of {read_changes:,} changes")
            read_runs = []
            for mode in measured_modes:
                folder, props = fresh(f"reads-{mode}")
                load = [round(x, 2) for x in os.getloadavg()]
                r = reads_run(
                    spark, folder, props, mode, rows=read_rows, batches=read_batches, changes=read_changes, reps=read_reps
                )
                r["load_average"] = [*load, *(round(x, 2) for x in os.getloadavg())]
                read_runs.append(r)
                b, a = r["before_compaction"], r["after_compaction"]
                say(
                    f"  lakesink-{mode}: {b['data_files']} data + {b['delete_files']} delete files -> compaction "
                    f"({r['compaction']['status']}) -> {a['data_files']} + {a['delete_files']}; DuckDB "
                    f"{b['ms']['duckdb']['median']:,.0f} -> {a['ms']['duckdb']['median']:,.0f} ms, pyiceberg "
                    f"{b['ms']['pyiceberg']['median']:,.0f} -> {a['ms']['pyiceberg']['median']:,.0f} ms; equals the model: "
                    f"{r['equals_model']}"
                )
            result["reads"] = {"rows": read_rows, "batches": read_batches, "changes": read_changes, "reps": read_reps,
                               "runs": read_runs}  # fmt: skip
    finally:
        server.stop()
    bad = [
        f"{part} {r['path']} rep {r.get('rep', 1)}"
        for part in ("scale", "small", "reads")
        for r in (result.get(part) or {}).get("runs", [])
        if not r["equals_model"]
    ]
    result["summary"] = summary(result)
    if bad:
        result["wrong"] = bad
    return result
