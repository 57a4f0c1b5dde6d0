"""lakesink on object storage: a real S3-compatible server (moto's, on 127.0.0.1), the warehouse at
``s3://<bucket>/warehouse`` behind the PostgreSQL catalog, through both of pyiceberg's FileIOs that reach
S3 (PyArrow's C++ client and fsspec's s3fs).

Spark's own Parquet writer cannot write there (pyspark ships no hadoop-aws): ``writer="auto"`` falls back
to the Arrow path by itself, ``writer="spark"`` says what is missing.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lakesink.cli import main as cli
from lakesink.driver import catalogs
from lakesink.errors import InvalidOptionError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_SWAP, ENV_FAULTS_DIR
from lakesink.maintenance.orphans import remove_orphan_files
from lakesink.table import names
from tests.support.helpers import Stream, assert_snapshot_invariants, referenced_data_files, table_ids, write_json_input
from tests.support.job_process import deploy_job
from tests.support.s3 import SECRET_KEY, S3Server

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server.start()
    yield server
    server.stop()


def s3_catalog(s3_server: S3Server, postgres: Any, io: str) -> tuple[dict[str, str], str]:
    """A PostgreSQL catalog (fresh database) whose warehouse is a fresh bucket; (properties, bucket)."""
    bucket = s3_server.create_bucket()
    props = {
        "type": "sql",
        "uri": postgres.create_database(),
        "warehouse": f"s3://{bucket}/warehouse",
        **s3_server.properties(io),
    }
    return props, bucket


def data_objects(s3_server: S3Server, bucket: str) -> set[str]:
    return {f"s3://{bucket}/{k}" for k in s3_server.keys(bucket, "warehouse/") if k.endswith(".parquet")}


@pytest.mark.parametrize("entry", ["format", "foreach"])
@pytest.mark.parametrize("io", ["pyarrow", "fsspec"])
def test_exactly_once_on_s3_through_a_crash_after_the_swap(
    spark: Any, tmp_path: Path, s3_server: S3Server, postgres: Any, faults: Any, io: str, entry: str, caplog: Any
) -> None:
    """Both entry points, both FileIOs: a crash between the table commit and Spark's commit log, a replay."""
    props, bucket = s3_catalog(s3_server, postgres, io)
    s = Stream(spark, tmp_path, props, entry)
    s.add_input(files=3, rows_per_file=40)
    faults.arm(DRIVER_AFTER_SWAP, "raise")
    with caplog.at_level(logging.DEBUG, logger="lakesink"):  # (py4j logs every option it sends at DEBUG)
        message = s.run_failing()  # writer="auto" for foreach: the Arrow path, since Spark cannot write s3a://
        s.run()
    assert "fault injected" in message and SECRET_KEY not in message
    assert SECRET_KEY not in caplog.text
    s.assert_exactly_once()
    table = s.table
    assert table.location().startswith(f"s3://{bucket}/")
    assert data_objects(s3_server, bucket) == referenced_data_files(table)  # the replay left no orphan
    # the files are really in the bucket, and only there
    assert not list(tmp_path.rglob("*.parquet"))


def test_spark_writer_on_s3_without_hadoop_aws_names_what_is_missing(
    spark: Any, tmp_path: Path, s3_server: S3Server, postgres: Any
) -> None:
    props, bucket = s3_catalog(s3_server, postgres, "pyarrow")
    s = Stream(spark, tmp_path, props, "foreach")
    s.add_input(files=1, rows_per_file=10)
    message = s.run_failing(writer="spark")
    assert InvalidOptionError.__name__ in message or "writer='spark' cannot write" in message
    assert "s3a" in message and "hadoop-aws" in message
    assert SECRET_KEY not in message
    assert data_objects(s3_server, bucket) == set()


def test_kill_9_in_the_middle_then_replay_on_s3(tmp_path: Path, s3_server: S3Server, postgres: Any) -> None:
    """The job (own JVM) SIGKILLs itself right after a table commit, and is SIGKILLed once more at random."""
    props, bucket = s3_catalog(s3_server, postgres, "pyarrow")
    faults_dir = tmp_path / "faults"
    faults_dir.mkdir()
    sent = write_json_input(tmp_path / "input", files=6, rows_per_file=30)
    # foreach: the driver itself runs the commit, the kill takes the whole job down
    job = deploy_job(tmp_path, props, entry="foreach", master="local[2,4]")
    env = {**os.environ, ENV_FAULTS_DIR: str(faults_dir), "PYTHONPATH": str(ROOT)}
    (faults_dir / DRIVER_AFTER_SWAP).write_text("kill")
    first = subprocess.run(job, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    table = catalogs.load(None, props).load_table(("db", "events"))
    assert len(table.snapshots()) == 1  # batch 0 landed, Spark's commit log does not know it
    # a second run, killed from outside after its next commit (whatever it is doing then)
    proc = subprocess.Popen(job, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(table.refresh().snapshots()) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the second run made no commit"
        time.sleep(0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    last = subprocess.run(job, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert last.returncode == 0, last.stderr[-3000:]
    assert SECRET_KEY not in first.stderr + last.stderr
    table = catalogs.load(None, props).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
    # orphan clean-up on S3: what the kills left behind goes, every committed file stays
    report = remove_orphan_files(table, older_than=timedelta(0))
    assert SECRET_KEY not in repr(report)
    assert data_objects(s3_server, bucket) == referenced_data_files(table)
    assert table_ids(table) == Counter(sent)


def test_orphan_clean_up_audit_commands_and_reader_on_s3(
    spark: Any, tmp_path: Path, s3_server: S3Server, postgres: Any, faults: Any
) -> None:
    props, bucket = s3_catalog(s3_server, postgres, "fsspec")
    s = Stream(spark, tmp_path, props, "format")
    s.add_input(files=2, rows_per_file=25)
    s.run()
    table = s.table
    committed = referenced_data_files(table)
    # a batch that fails before the swap deletes its own files; a stray file (a writer killed before its
    # abort) is left for orphan clean-up
    s.add_input(files=1, rows_per_file=25)
    faults.arm(DRIVER_BEFORE_SWAP, "raise")
    s.run_failing()
    assert data_objects(s3_server, bucket) == committed
    # named as lakesink names a data file: a killed attempt (9) of the committed batch 1 -- a file lakesink did not
    # name would be kept for a day (other_writers_older_than), which tests/maintenance/test_orphans.py covers
    name = names.data_file_name(
        query_id=s.query_id, batch_id=1, partition_id=0, task_attempt_id=9, token=names.new_token(), counter=0
    )
    stray = f"{table.location()}/data/{name}"
    s3_server.client().put_object(Bucket=bucket, Key=stray.split(f"s3://{bucket}/", 1)[1], Body=b"PAR1")
    dry = remove_orphan_files(table, older_than=timedelta(0), dry_run=True)
    assert [f.path for f in dry.removed] == [stray] and not dry.failed
    done = remove_orphan_files(table, older_than=timedelta(0))
    assert [f.path for f in done.removed] == [stray]
    assert data_objects(s3_server, bucket) == committed
    s.run()
    s.assert_exactly_once()

    # the audit commands, with the S3 secret given on the command line: never printed
    runner = CliRunner()

    def cli_args(properties: dict[str, str]) -> list[str]:
        return ["db.events", *[a for k, v in properties.items() for a in ("--catalog-property", f"{k}={v}")]]

    args = cli_args(props)
    for command in (["verify", *args], ["history", *args, "--json"], ["show", *args, "--limit", "0", "--json"]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, result.output
        assert SECRET_KEY not in result.output
    shown = json.loads(runner.invoke(cli, ["show", *args, "--limit", "0", "--json"]).output)
    assert Counter(r["id"] for r in shown) == Counter(s.sent)
    bad = runner.invoke(cli, ["verify", *cli_args({**props, "s3.endpoint": "http://127.0.0.1:9"})])  # nobody serves it
    assert bad.exit_code != 0 and SECRET_KEY not in bad.output

    # spark.read.format("lakesink") reads the S3 table
    reader = spark.read.format("lakesink").option("table", "db.events")
    for k, v in props.items():
        reader = reader.option(f"catalog.{k}", v)
    rows = reader.load().select("id").collect()
    assert Counter(r.id for r in rows) == Counter(s.sent)
