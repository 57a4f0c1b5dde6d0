"""Both entry points from a Spark Connect client (``SparkSession.builder.remote(...)``) against a real
Spark Connect server started by the test (pyspark's ``sbin/start-connect-server.sh``, tests/support/connect.py).

- ``format("lakesink")``: the data source's writers and its commit run in the server's Python workers,
  which find the query id in the checkpoint, as on classic Spark;
- ``lakesink.foreach_batch``: the function runs in a server-side Python process where neither the
  SparkContext nor the query's JVM object is reachable. It needs ``checkpoint_location=`` (the query id
  is read from the checkpoint's metadata); without it the batch fails with an error that says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lakesink.driver import catalogs
from tests.support.connect import ConnectServer
from tests.support.helpers import assert_snapshot_invariants, table_ids, write_json_input

pytestmark = [pytest.mark.spark, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: Any) -> Iterator[ConnectServer]:
    # its own folder, not under pytest's numbered temporary folders (which other pytest runs on the
    # machine prune while this one runs)
    folder = Path(tempfile.mkdtemp(prefix="lakesink-connect-"))
    server = ConnectServer.start(folder, env={"PYTHONPATH": str(ROOT)})
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


# On a loaded machine the server's foreachBatch worker can take longer to start (it imports pyspark's
# Connect client, pandas and pyarrow before it connects back) than the server waits for it; the query
# then fails before any batch ran. Starting it again from the same checkpoint is the ordinary recovery.
WORKER_START_TIMEOUT = "Python worker failed to connect back"


def run_client(server: ConnectServer, tmp_path: Path, props: dict[str, str], entry: str, **extra: Any) -> dict[str, Any]:
    for _ in range(3):
        result = _run_client_once(server, tmp_path, props, entry, **extra)
        if result["ok"] or WORKER_START_TIMEOUT not in result["error"]:
            return result
    return result


def _run_client_once(server: ConnectServer, tmp_path: Path, props: dict[str, str], entry: str, **extra: Any) -> dict[str, Any]:
    cfg = {
        "url": server.url,
        "entry": entry,
        "input": str(tmp_path / "input"),
        "checkpoint": str(tmp_path / "ck"),
        "table": "db.events",
        "catalog_properties": props,
        **extra,
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.jobs.connect_job", json.dumps(cfg)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the Connect client printed no result: {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    if not result["ok"]:  # what the server saw, for the failure message
        logs = sorted(server.folder.glob("*.out*")) + sorted(server.folder.glob("*.log"))
        result["server_log"] = "\n".join(p.read_text(errors="replace")[-4000:] for p in logs)
    return result


@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_both_entry_points_from_a_connect_client(
    tmp_path: Path, connect_server: ConnectServer, catalog_properties: dict[str, str], entry: str
) -> None:
    sent = write_json_input(tmp_path / "input", files=3, rows_per_file=20)
    result = run_client(connect_server, tmp_path, catalog_properties, entry, pass_checkpoint=True)
    assert result == {"ok": True}, result
    # a second run on the same checkpoint (new input) goes on where the first stopped
    sent += write_json_input(tmp_path / "input", files=1, rows_per_file=20, start=1000)
    assert run_client(connect_server, tmp_path, catalog_properties, entry, pass_checkpoint=True) == {"ok": True}
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)


def test_foreach_batch_under_connect_without_checkpoint_location_says_what_to_do(
    tmp_path: Path, connect_server: ConnectServer, catalog_properties: dict[str, str]
) -> None:
    write_json_input(tmp_path / "input", files=1, rows_per_file=5)
    result = run_client(connect_server, tmp_path, catalog_properties, "foreach", pass_checkpoint=False)
    assert not result["ok"]
    assert "Spark Connect" in result["error"] and "checkpoint_location=" in result["error"]
    assert not catalogs.load(None, catalog_properties).table_exists(("db", "events"))  # failed before any write
