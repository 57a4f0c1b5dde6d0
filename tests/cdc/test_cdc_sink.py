"""The PostgreSQL oracle through the sink (issue 32): the seeded workload's Debezium records (tests/support/cdc_oracle.py:
eleven tables of different schemas and primary keys, inserts, updates to NULL, deletes, key changes, transactions
over several tables, ALTER TABLE ADD COLUMN in round 2, a TRUNCATE in round 3), one file per round, streamed by
foreach_batch with cdc-format=debezium through SIGKILLs and restarts from the same checkpoint (the kills in a job process
of its own, tests/jobs/cdc_oracle_job.py; the last run, after them, in the test's Spark session); then every Iceberg
table equals ``SELECT *`` of its PostgreSQL table, row for row and column for column, read by pyiceberg and by DuckDB.
With option history on (issue 55), every table's history table is checked too: each key's versions (operation and
``valid_from``) are those the source's change log -- the Debezium records, read field by field with ``json`` -- gives
(a truncate ends every live key with a delete at its time), and at every committed batch the table equals its history's
current versions.

Typed columns: the records carry the Kafka Connect schema (``schemas.enable``), which types each column
(lakesink.cdc.connect): the tables lakesink creates have PostgreSQL's types as Iceberg types (int, long,
decimal(p,s), string, boolean, date, timestamp, timestamptz, float, double, binary; uuid as string), and the compare
is exact, with no normalisation beyond the oracle's own mapping (cdc_oracle.normalise: timestamptz in UTC, real as
32 bits, uuid as text).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.faults import CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP
from tests.jobs import cdc_oracle_job as job
from tests.support import cdc_oracle
from tests.support.cdc_oracle import ROUNDS, TABLES
from tests.support.helpers import assert_table_is_current_versions, lakesink_snapshots, run_to_end
from tests.support.job_process import killed_in_job, start_job

pytestmark = pytest.mark.spark


def _job(props: dict[str, str], src: Path, ck: Path, faults_dir: str | None, entry: str = "foreach") -> subprocess.Popen[str]:
    return start_job("tests.jobs.cdc_oracle_job", json.dumps(props), str(src), str(ck), entry, faults_dir=faults_dir)


def _utc(value: Any) -> Any:
    """An aware datetime in UTC (readers give timestamptz in their session's zone: the same instant)."""
    return value.astimezone(dt.timezone.utc) if isinstance(value, dt.datetime) and value.tzinfo is not None else value


def _rows(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    out = {tuple(r[k] for k in key): {c: _utc(v) for c, v in r.items()} for r in rows}
    assert len(out) == len(rows), "a key is in the table more than once"
    return out


@pytest.mark.long
@pytest.mark.timeout(1500)
@pytest.mark.parametrize(
    ("entry", "points"),
    [
        # killed inside the first unit's database transaction (between two tables), then after a unit's swap
        ("foreach-history", (CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP)),
        # format("lakesink"): the executors stage the rows, the commit worker writes and commits them; the same two
        # kill points, in one run each (issue 34: the suite's time)
        ("format-history", (CATALOG_BETWEEN_TABLE_SWAPS, DRIVER_AFTER_SWAP)),
    ],
    ids=["foreach", "format"],
)
def test_the_postgresql_oracle_streamed_through_sigkills_equals_select_star(
    spark: Any,
    captured: tuple[str, Path],
    tmp_path: Path,
    catalog_properties: dict[str, str],
    faults: Any,
    entry: str,
    points: tuple[str, ...],
) -> None:
    dsn, folder = captured
    src, ck = tmp_path / "in", tmp_path / "ck"
    src.mkdir()
    for n in range(ROUNDS + 1):  # one file a round, in order (Spark's file source orders by modification time)
        path = src / f"round-{n:04d}.jsonl"
        shutil.copy(folder / cdc_oracle.DEBEZIUM_SCHEMAS / path.name, path)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    for point in points:  # foreach: the point kills the driver; format: the whole job killed while it pauses there
        killed_in_job(
            faults, point, entry.removesuffix("-history"), lambda: _job(catalog_properties, src, ck, str(faults.folder), entry)
        )
    # the last run, the restart after the kills, in this test's Spark session: the job's stream (its time zone set as
    # the job sets it), from the same checkpoint, without the start-up of a JVM of its own (issue 34)
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", job.TIME_ZONE)
    try:
        run_to_end(job.start(spark, catalog_properties, str(src), str(ck), entry))  # done: no error
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)

    expected = cdc_oracle.expected_tables(dsn)
    catalog = catalogs.load(None, catalog_properties)
    with cdc_oracle.connect(dsn) as conn, conn.cursor() as cur:
        columns = {t.qualified: list(cdc_oracle.column_types(cur, t.qualified)) for t in TABLES}
    for t in TABLES:
        table = catalog.load_table((t.schema, t.name))
        assert table.schema().column_names == columns[t.qualified], t.qualified  # the columns, in PostgreSQL's order
        assert table.schema().identifier_field_names() == set(t.key), t.qualified
        want = expected[t.qualified]
        assert _rows(table.scan().to_arrow().to_pylist(), t.key) == want, f"{t.qualified} (pyiceberg)"
        assert _rows(interop.duckdb_read(table.metadata_location).to_pylist(), t.key) == want, f"{t.qualified} (DuckDB)"
        batches = [s["batch_id"] for s in lakesink_snapshots(table)]
        assert batches == sorted(set(batches)), f"{t.qualified} holds a batch twice: {batches}"
    assert sum(len(rows) for rows in expected.values()) > 50
    if entry.endswith("-history"):
        logged = change_log([src / f"round-{n:04d}.jsonl" for n in range(ROUNDS + 1)])
        for t in TABLES:
            table, history = catalog.load_table((t.schema, t.name)), catalog.load_table((t.schema, t.name + "__history"))
            assert versions_by_key(history.scan().to_arrow().to_pylist(), t.key) == logged[t.qualified], t.qualified
            assert_table_is_current_versions(table, history, t.key)
    staged = list((ck / "lakesink" / "staging").rglob("*.parquet")) if (ck / "lakesink").exists() else []
    assert staged == [], f"staged files left behind: {staged}"


Versions = list[tuple[tuple[str, dt.datetime], ...]]


def change_log(files: list[Path]) -> dict[str, Versions]:
    """Per table (``schema.table``), each key's versions as the source's change log gives them: (operation, the
    source's commit time) in log order, from the Debezium records (JSON, ``schemas.enable``) read field by field;
    sorted (a key's identity is its Kafka key, which the history holds in the table's types: compared as a multiset of
    version chains)."""
    chains: dict[str, dict[str, list[tuple[str, dt.datetime]]]] = {}
    records = []
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["value"] is None:
                continue  # a tombstone
            value = json.loads(r["value"])
            payload = value["payload"] if "schema" in value and "payload" in value else value
            source = payload["source"]
            key = json.loads(r["key"]) if r["key"] is not None else None
            if isinstance(key, dict) and set(key) == {"schema", "payload"}:
                key = key["payload"]
            records.append((int(source["lsn"]), f"{source['schema']}.{source['table']}", payload["op"], key, source["ts_ms"]))
    for _lsn, table, op, key, ts_ms in sorted(records, key=lambda r: r[0]):
        when = dt.datetime.fromtimestamp(ts_ms / 1000, dt.timezone.utc)
        keys = chains.setdefault(table, {})
        if op == "t":  # every live key ends with a delete at the truncate
            for chain in keys.values():
                if chain and chain[-1][0] != "delete":
                    chain.append(("delete", when))
            continue
        chain = keys.setdefault(json.dumps(key, sort_keys=True), [])
        alive = bool(chain) and chain[-1][0] != "delete"
        chain.append(("delete" if op == "d" else "update" if alive else "insert", when))
    return {t: sorted(tuple(c) for c in keys.values()) for t, keys in chains.items()}


def versions_by_key(rows: list[dict[str, Any]], key: tuple[str, ...]) -> Versions:
    """The history's versions as :func:`change_log` gives them, each chain in change_order; every chain linked: a
    version ends where the next begins, only the last may be current (and is, unless a delete)."""
    chains: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        chains.setdefault(tuple(r[k] for k in key), []).append(r)
    out = []
    for versions in chains.values():
        versions.sort(key=lambda r: r["change_order"])
        for i, v in enumerate(versions):
            last = i == len(versions) - 1
            assert v["valid_to"] == (None if last else versions[i + 1]["valid_from"]), v
            assert v["is_current"] == (last and v["operation"] != "delete"), v
        out.append(tuple((v["operation"], _utc(v["valid_from"])) for v in versions))
    return sorted(out)
