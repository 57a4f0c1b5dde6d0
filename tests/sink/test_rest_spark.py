"""Spark, both entry points, SIGKILLed and restarted, against the catalogs people run in production: the REST
catalog server (lakana) with HTTP faults on its commits, and AWS Glue (moto's Glue, files in moto's S3, Glue's
optimistic lock enforced by the fault proxy); and format("lakesink") with route-by against both REST servers (the
routing soak, tests/soak/routing.py): the first run killed after it created a table, then a kill before the swap (the tests'
server with transactions/commit) or between two tables' commits (lakana), after the swap, and a random-moment kill
(the server with transactions/commit only).

Each test runs the kill -9 soak (tests/soak/runner.py, docs/soak.md) with the catalog given to the job as its
default catalog: the job is SIGKILLed while the commit is held right after the swap (the batch in the table, not in
Spark's commit log) and once more, either inside the commit before the swap or at a random moment (SCHEDULES), and
restarted from its checkpoint each time; meanwhile the proxy answers some commit requests with a 5xx after the
server applied them, refuses one before, and reports a 409 for one it applied. The verdict is the soak's: every id
exactly once (read back with DuckDB), every batch in one snapshot, no gap, every replayed batch skipped.

Each kill costs a Spark start-up (one job run, about a fifth of a test's time), so each fault point is hit once per
catalog and once per entry point, not once per (catalog, entry point): the kill before the swap and the random-moment
kill are shared out between the entry points crosswise (SCHEDULES), the kill after the swap -- the one whose replay is
catalog-specific (the next run reads the batch's snapshot back from the REST server or Glue) -- runs in all four. The
same fault points on the embedded SQLite catalog, both entry points each: tests/test_soak.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_AFTER_TABLE_CREATED, DRIVER_BEFORE_SWAP, DRIVER_BETWEEN_TABLE_COMMITS
from tests.soak.runner import COMMIT_KILL, DELAY, IN_TABLE_NOT_COMMIT_LOG, PAUSE_KILL, main
from tests.soak.seed import run_seed
from tests.support.catalog_servers import glue_properties
from tests.support.http_faults import FaultProxy
from tests.support.soak import exactly_once_seed
from tests.test_soak import SMALL

pytestmark = [pytest.mark.spark, pytest.mark.long]


AFTER_SWAP = PAUSE_KILL  # the commit held right after the swap, the job SIGKILLed: the replay must be skipped
BEFORE_SWAP = f"{COMMIT_KILL}@{DRIVER_BEFORE_SWAP}"  # the committing process SIGKILLs itself before the swap
# (catalog, entry) -> the kill rounds, in order. Every test kills after the swap; the kill before the swap and the
# random-moment kill (DELAY, 0-3 s after the query started) go crosswise: each once per catalog and once per entry.
# The random-moment kill comes after the first commit: a SIGKILL during Spark's very first offset write leaves
# offsets/.0.<uuid>.tmp, and Spark 4.3 then refuses the checkpoint for good (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY:
# "offsets should be empty on batch 0"), seen once here.
SCHEDULES = {
    ("rest", "format"): (BEFORE_SWAP, AFTER_SWAP),
    ("rest", "foreach"): (AFTER_SWAP, DELAY),
    ("glue", "format"): (AFTER_SWAP, DELAY),
    ("glue", "foreach"): (BEFORE_SWAP, AFTER_SWAP),
}


def run_soak(tmp_path: Path, props: dict[str, str], table: str, entry: str, schedule: tuple[str, ...]) -> dict[str, Any]:
    out = tmp_path / "soak.json"
    code = main(
        [
            "--dir", str(tmp_path / "soak"), "--json", str(out), *SMALL,
            "--seed", str(run_seed("soak: the delay and the commit kill's linger")),
            "--rounds", str(len(schedule)), "--entry", entry, "--writer", "arrow",
            "--schedule", ",".join(schedule), "--max-delay", "3",
            "--catalog-json", json.dumps(props), "--table", table,
            "--run-timeout", "420",  # the loaded 2-core machine: the first REST commit worker can take minutes
        ]
    )  # fmt: skip
    seed = exactly_once_seed(code, out)
    assert seed["kills_landed"][IN_TABLE_NOT_COMMIT_LOG] >= 1
    assert seed["replays"]["already_in_table_skipped"] >= 1
    rounds = seed["round_log"]  # every round of the schedule delivered, in its order
    assert len(rounds) == len(schedule), rounds
    assert [r["phase"] + (f"@{r['point']}" if "@" in s else "") for r, s in zip(rounds, schedule, strict=True)] == list(schedule)
    return seed


def arm_commit_faults(proxy: FaultProxy) -> list[Any]:
    return [
        proxy.arm("commit", "status-after", status=503),  # applied, answer lost
        proxy.arm("commit", "status-before", status=502),  # refused before the server saw it
        proxy.arm("commit", "call-before", call=lambda: None),  # (the retry of the one above goes through)
        proxy.arm("commit", "status-after", status=409),  # applied, reported as a conflict
        proxy.arm("commit", "reset-after"),  # applied, connection reset
    ]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_sigkill_rounds_and_http_faults_against_the_rest_server(
    tmp_path: Path, lakana: Any, rest_proxy: FaultProxy, entry: str
) -> None:
    props = lakana.catalog_properties(tmp_path / "warehouse", uri=rest_proxy.uri)
    faults = arm_commit_faults(rest_proxy)
    run_soak(tmp_path, props, "bronze.events", entry, SCHEDULES["rest", entry])
    assert all(f.fired for f in faults), [(f.action, f.fired) for f in faults]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("entry", ["format", "foreach"])
def test_sigkill_rounds_and_http_faults_against_glue(
    tmp_path: Path, moto_server: Any, glue_proxy: FaultProxy, entry: str
) -> None:
    props = glue_properties(moto_server, glue_proxy.uri)
    faults = [
        glue_proxy.arm("commit", "status-after", status=500),  # applied, answer lost: botocore re-sends it
        glue_proxy.arm("commit", "status-before", status=503),  # refused: botocore re-sends it
    ]
    run_soak(tmp_path, props, f"glue_{uuid.uuid4().hex[:8]}.events", entry, SCHEDULES["glue", entry])
    assert all(f.fired for f in faults), [(f.action, f.fired) for f in faults]


def run_routing_soak(tmp_path: Path, props: dict[str, str], *, phases: str, first: str, namespaces: str, per_table: bool) -> Any:
    """format("lakesink") with route-by SIGKILLed and restarted (tests/soak/routing.py): five tables created on first
    sight where the REST server places them, the first run killed right after the first table was created (empty)."""
    from tests.soak import routing

    out = tmp_path / "routing.json"
    args = ["--dir", str(tmp_path / "soak"), "--entry", "format", "--atomic", "auto", "--rounds", str(len(phases.split(",")))]
    args += ["--phases", phases, "--first-phase", first, "--json", str(out), "--seed", str(run_seed("routing soak: the delay"))]
    args += ["--catalog-json", json.dumps(props), "--namespaces", namespaces] + (["--per-table-catalog"] if per_table else [])
    code = routing.main(args)
    (result,) = json.loads(out.read_text())
    assert code == 0 and result["violations"] == [], json.dumps(result, indent=2)[-6000:]
    assert result["rows_in_tables"] == result["rows_sent"] > 0
    killed = [r for r in result["rounds"] if r["phase"] != "delay"]
    assert killed and all(r["killed"] for r in killed), result["rounds"]
    return result


@pytest.mark.timeout(2400)
def test_format_route_by_sigkill_rounds_against_a_rest_server_with_transactions(
    tmp_path: Path, txn_catalog_properties: dict[str, str]
) -> None:
    """The tests' own REST server with transactions/commit: after every kill each batch is in all its tables or in
    none (a table created by the killed batch may be left empty); at the end every id once, in its table."""
    from tests.soak.routing import DELAY, PAUSE

    phases = f"{PAUSE}{DRIVER_BEFORE_SWAP},{PAUSE}{DRIVER_AFTER_SWAP},{DELAY}"
    first = f"{PAUSE}{DRIVER_AFTER_TABLE_CREATED}"
    result = run_routing_soak(
        tmp_path, txn_catalog_properties, phases=phases, first=first, namespaces="soak,other", per_table=False
    )
    assert result["incomplete_after_kills"] == 0


@pytest.mark.timeout(2400)
def test_format_route_by_sigkill_rounds_against_the_rest_server(tmp_path: Path, rest_catalog_properties: dict[str, str]) -> None:
    """lakana (no transactions/commit, no client-chosen locations): table by table, a kill between two tables' commits
    leaves a batch in some of them, the next run completes it; at the end every id once, in its table. The
    random-moment kill (phase delay) is the test above's: each kill here costs a job run (a Spark start-up), and on
    the server with transactions/commit a random kill has the stronger verdict (the batch in all its tables or none)."""
    from tests.soak.routing import PAUSE

    phases = f"{PAUSE}{DRIVER_BETWEEN_TABLE_COMMITS},{PAUSE}{DRIVER_AFTER_SWAP}"
    first = f"{PAUSE}{DRIVER_AFTER_TABLE_CREATED}"
    result = run_routing_soak(
        tmp_path, rest_catalog_properties, phases=phases, first=first, namespaces="bronze,silver", per_table=True
    )
    assert result["incomplete_after_kills"] >= 1
