"""The kill -9 soak (``python -m tests.soak``, docs/soak.md), short: one fault of each kind.

Each test runs the soak runner in this process; the runner starts the streaming job as a child
process (one Spark session at a time), kills and restarts it, and checks the table through DuckDB.
The long version (many random rounds, several seeds) is run with its own command.

Each kill costs a run of the job (a JVM and its Python workers: about 35 s of CPU, measured), so a fault point is
hit once per run of this file where its recovery is the same code for both entry points: the random-moment kill
and the kill before the swap are shared out between format("lakesink") and foreach_batch by a seed of the run
(:func:`shared_out`, printed; LAKESINK_TEST_SEED replays it); the kill after the swap -- the worst moment, whose
replay each entry point's own commit process must skip -- runs in both.
"""

from __future__ import annotations

import functools
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from tests.soak.runner import (
    COMMIT_KILL,
    DELAY,
    EXECUTOR_KILL,
    EXECUTOR_RAISE,
    IN_TABLE_NOT_COMMIT_LOG,
    OFFSET_KILL,
    PAUSE_KILL,
    PHASES,
    START_UP,
    main,
)
from tests.soak.seed import run_seed
from tests.support.soak import exactly_once_seed

pytestmark = [pytest.mark.spark, pytest.mark.long]

# a guard against a hang, not a speed limit: a run with no progress for --run-timeout (150 s) aborts the soak
# first; on a loaded machine (load average 11 on 2 cores) one short soak took up to 6 minutes
TEST_TIMEOUT_S = 1200

SMALL = ["--initial-files", "8", "--ahead", "8", "--rows-per-file", "50", "--run-timeout", "150"]

BEFORE_SWAP = f"{COMMIT_KILL}@driver.before-swap"
SHARED = (DELAY, BEFORE_SWAP)  # hit once per run, by one entry point or the other
ENTRIES = ("format", "foreach")


@functools.cache
def _shared_seed() -> int:
    """One seed per test session, so that the two tests that share the points out draw from the same one; it is also
    their soaks' seed (the delay, the commit kill's linger; foreach_batch's soak: the seed + 1), so that the one seed
    printed replays either test whole."""
    return run_seed("soak: the kills shared out between the entry points, the delay and the commit kill's linger")


def shared_out(entry: str, seed: int | None = None) -> str:
    """The one of :data:`SHARED` that ``entry``'s test runs (the other entry point's test runs the other one)."""
    order = list(SHARED)
    random.Random(_shared_seed() if seed is None else seed).shuffle(order)
    return order[ENTRIES.index(entry)]


def test_the_entry_points_share_the_random_kill_and_the_kill_before_the_swap_out() -> None:
    """Whatever the seed, each of the two is run once over the entry points; either may get either."""
    got = {tuple(shared_out(e, seed) for e in ENTRIES) for seed in range(40)}
    assert got == {SHARED, SHARED[::-1]}


def run_soak(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "soak.json"
    code = main(["--dir", str(tmp_path / "soak"), "--json", str(out), *SMALL, *args])
    seed = exactly_once_seed(code, out)
    assert seed["batches_in_table"] == seed["snapshots"] > 0
    # files left on disk only for batches a fault touched (a killed worker, a batch in flight at a kill)
    assert seed["unreferenced_data_files_unexplained"] == 0
    return seed


def kills_by_phase(kills: dict[str, int]) -> dict[str, int]:
    """The report's ``kills_by_phase`` of a seed whose rounds killed ``kills`` (phase -> count): every phase, the others 0."""
    return {phase: kills.get(phase, 0) for phase in PHASES}


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_process_kills_in_the_first_offset_write_at_random_moment_inside_the_commit_and_after_the_swap(
    tmp_path: Path,
) -> None:
    """SIGKILL of the whole job, three rounds of one soak (one stream, one checkpoint):

    1. while Spark writes ``offsets/0`` (both temp files there, neither renamed): Spark 4.3 refuses every restart
       (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY ... offsets should be empty on batch 0). The harness recognises the
       refusal, applies lakesink checkpoint-clean, counts it, and the stream goes on: every id once. Before the
       recovery existed, every restart failed and the soak aborted ("the job failed 3 times without a fault that
       explains it"), as a fresh clone's make test once did;
    2. after a random delay (0-3 s after the query started; the seed is printed, LAKESINK_TEST_SEED replays it), or
       with the commit worker killed before the swap (and the whole job after a random linger): the one of the two
       that :func:`shared_out` gives format("lakesink") this run (foreach_batch gets the other);
    3. with the commit paused after the swap: the batch in the table, not in Spark's commit log."""
    second = shared_out("format")
    seed = run_soak(
        tmp_path,
        "--seed", str(_shared_seed()),
        "--rounds", "3",
        "--schedule", f"{OFFSET_KILL},{second},{PAUSE_KILL}",
        "--max-delay", "3",
    )  # fmt: skip
    assert seed["entry"] == "format"
    assert seed["kills_by_phase"] == kills_by_phase({second.partition("@")[0]: 1, PAUSE_KILL: 1, OFFSET_KILL: 1})
    offset_round, second_round, pause_round = seed["round_log"]
    delay_round = second_round if second == DELAY else None
    assert offset_round["run"] == 1 and offset_round["landed"] == START_UP  # killed before its first batch began
    # the first run that reached Spark's start-up check after it was refused and recovered: run 2, or run 3 when the
    # delay killed run 2 in its start-up too (seen). The delay may land in a later first offset-log write as well:
    # refused and recovered again
    assert seed["spark_refused_restarts"] >= 1
    assert len(seed["checkpoint_recoveries"]) == seed["spark_refused_restarts"]
    first_recovery = seed["checkpoint_recoveries"][0]
    assert first_recovery["run"] in (2, 3), first_recovery
    if first_recovery["run"] == 3:
        assert delay_round is not None and delay_round["run"] == 2 and delay_round["landed"] == START_UP, delay_round
    for recovery in seed["checkpoint_recoveries"]:
        assert recovery["failed"] == [] and recovery["still_blocking"] == [], recovery
    # exactly the two files of the interrupted write of offsets/0: the temp file and its checksum, one uuid
    uuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    temp, crc = sorted(first_recovery["removed"], key=len)
    assert re.fullmatch(rf"offsets/\.0\.({uuid})\.tmp", temp), first_recovery
    assert crc == f"offsets/.{temp.split('/')[1]}.crc", first_recovery
    # three kills, three restarts from the same checkpoint (plus a restart for any run that finished its input before
    # its round's fault hit it; that fault then waits for the next run), plus one for every restart Spark refused
    late = sum(r["restarts_before_delivery"] for r in seed["round_log"])
    assert seed["runs"] == 4 + late + seed["spark_refused_restarts"]
    # the pause at driver.after-swap always leaves a batch in the table that Spark's commit log lacks:
    # the next run replays it and lakesink skips it (checked by the runner: logged, no new file)
    assert pause_round["landed"] == IN_TABLE_NOT_COMMIT_LOG
    assert seed["kills_landed"][IN_TABLE_NOT_COMMIT_LOG] >= 1
    assert seed["replays"]["already_in_table_skipped"] >= 1
    owed = {r["batch"] for r in seed["round_log"] if r["landed"] == IN_TABLE_NOT_COMMIT_LOG}
    assert seed["replays"]["replay_skipped_log_lines"] >= len(owed)
    collect_orphans(seed)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_executor_faults_retried_then_process_kills_with_every_batch_written_on_the_driver(tmp_path: Path) -> None:
    """foreach_batch, one soak (one stream, one checkpoint), the option writer changed between runs:

    1. run 1 on the Arrow path (the executor.* fault points fire in Python workers): a Python worker SIGKILLed while
       writing (after its file, before its write) and a task that raises; Spark retries each task, the same run commits
       the batch (no restart). Then the whole job killed with its commit paused after the swap: the batch in the table,
       not in Spark's commit log (whose replay foreach_batch skips on the driver before any writer is chosen);
    2. the restarts write every batch on the driver (writer="driver", foreach_batch's small-batch path): the replay
       skipped, then a SIGKILL after a delay or just before the swap (its files written, nothing committed) -- the one
       of the two that :func:`shared_out` gives foreach_batch this run (format("lakesink") gets the other).

    One job run fewer than a soak per writer (issue 34); more random kills of the driver path: ``make soak``, whose
    foreach seeds write their small batches on the driver too (docs/soak.md)."""
    second = shared_out("foreach")
    executor = [
        f"{EXECUTOR_KILL}@executor.after-file",
        f"{EXECUTOR_KILL}@executor.before-write",
        f"{EXECUTOR_RAISE}@executor.after-file",
    ]
    seed = run_soak(
        tmp_path,
        "--seed", str(_shared_seed() + 1),
        "--rounds", str(len(executor) + 2),
        "--entry", "foreach",
        "--writer", "arrow,driver",
        "--initial-files", "12",  # the first run's batches: one per executor fault and the pause, and to spare
        "--schedule", ",".join([*executor, PAUSE_KILL, second]),
        "--max-delay", "3",
    )  # fmt: skip
    assert seed["entry"] == "foreach"
    assert seed["kills_by_phase"] == kills_by_phase(
        {EXECUTOR_KILL: 2, EXECUTOR_RAISE: 1, PAUSE_KILL: 1, second.partition("@")[0]: 1}
    )
    *executor_rounds, pause_round, second_round = seed["round_log"]
    writers = {run["number"]: run["writer"] for run in seed["run_log"]}
    # every executor fault retried by Spark in the first run, on the Arrow path: no restart
    assert [(r["run"], r["restarts_before_delivery"]) for r in executor_rounds] == [(1, 0)] * 3, executor_rounds
    assert writers[1] == "arrow"
    assert seed["failed_task_attempts_in_log"] >= 3
    # the worker killed after writing its file could not delete it: on disk, never referenced
    assert seed["unreferenced_data_files"] >= 1
    # the pause after the swap: replayed by a run writing on the driver, skipped
    assert pause_round["landed"] == IN_TABLE_NOT_COMMIT_LOG
    assert seed["replays"]["already_in_table_skipped"] >= 1
    assert writers[second_round["run"]] == "driver" and second_round["run"] > pause_round["run"], seed["run_log"]
    assert set(list(writers.values())[1:]) == {"driver"}
    collect_orphans(seed)


def collect_orphans(seed: dict[str, Any]) -> None:
    """Orphan clean-up against the soak's leftovers: every unreferenced file goes, the table stays intact."""
    from collections import Counter
    from datetime import timedelta

    import lakesink
    from lakesink.audit import interop
    from lakesink.driver import catalogs
    from tests.support.helpers import data_files_on_disk, referenced_data_files

    home = Path(seed["folder"]) / "lakehouse"
    props = {"type": "sql", "uri": f"sqlite:///{home}/catalog.db", "warehouse": f"file://{home}/warehouse"}
    table = catalogs.load("lakesink", props).load_table(("soak", "events"))
    leftovers = data_files_on_disk(table) - referenced_data_files(table)
    assert len(leftovers) == seed["unreferenced_data_files"]
    before = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
    # every batch of the soak is committed (the marker names the last one), so nothing is in flight:
    # the leftovers are collectable at once, whatever their age
    report = lakesink.remove_orphan_files(table, older_than=timedelta(0))
    removed = {f.path for f in report.removed}
    assert leftovers <= removed
    table = catalogs.load("lakesink", props).load_table(("soak", "events"))
    assert data_files_on_disk(table) == referenced_data_files(table)
    after = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
    assert after == before and sum(after.values()) == seed["rows_sent"]


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize(
    ("entry", "atomic", "phases", "lookups"),
    [
        # one kill each, in the first run (the run that creates the tables): no clean run before it (issue 34)
        ("foreach", "auto", "pause-kill@catalog.between-table-swaps", False),
        ("foreach", "off", "pause-kill@driver.between-table-commits", False),
        # the routing column from a lookup that changes before every round; the first run killed after the swap:
        # round 1 another set of tables (the replay of the batch held after the swap is refused, the lookup restored,
        # the round rerun: the replay skipped, the next batch killed after the swap), round 2 the same set permuted
        # (the replay skipped) killed inside the SQL transaction of a batch's tables
        ("format", "auto", "pause-kill@driver.after-swap,pause-kill@catalog.between-table-swaps", True),
    ],
)
def test_routed_stream_through_sigkill_rounds(tmp_path: Path, entry: str, atomic: str, phases: str, lookups: bool) -> None:
    """Option route-by (tests/soak/routing.py): SIGKILL of the whole job inside the SQL transaction of a batch's
    tables, between two tables' commits (atomic=off), after the swap. After every kill each batch is in all its tables
    or in none (atomic=auto); at the end every id is in the table its id names, once. Without a lookup the one kill is
    in the first run (``--first-phase``, no round after it); with one, the first run is killed after the swap, then
    every phase is a round."""
    from tests.soak import routing

    out = tmp_path / "routing.json"
    listed = phases.split(",")
    first, rounds = (listed[0], []) if not lookups else ("pause-kill@driver.after-swap", listed)
    code = routing.main(
        ["--dir", str(tmp_path / "soak"), "--entry", entry, "--atomic", atomic, "--rounds", str(len(rounds))]
        + (["--phases", ",".join(rounds)] if rounds else [])
        + ["--first-phase", first, "--json", str(out)]
        + (["--lookups", "--seed", "7"] if lookups else [])
    )
    (result,) = json.loads(out.read_text())
    assert code == 0 and result["violations"] == [], json.dumps(result, indent=2)
    assert result["rows_in_tables"] == result["rows_sent"] > 0
    assert [r["phase"] for r in result["rounds"]] == [first, *rounds]
    assert all(r["killed"] for r in result["rounds"]), result["rounds"]
    if atomic == "auto":
        assert result["incomplete_after_kills"] == 0
    else:  # the kill between two tables' commits leaves the batch in the first table only, the next run completes it
        assert result["incomplete_after_kills"] >= 1
    if lookups:  # both cases happened: a replay with another set of tables refused, one with the same set skipped
        assert result["replays_refused"] >= 1 and result["replays_skipped"] >= 1, json.dumps(result, indent=2)
        assert result["runs"] == 5, json.dumps(result, indent=2)  # 3 kills, the refused run, the final run
