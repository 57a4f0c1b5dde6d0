"""The command line's output objects: every command renders through the Output its ``--json`` flag chose.

The JSON shape of every command is pinned here (top-level keys, or a list), and the human form is text, not JSON:
the same shapes as when each command branched on ``--json`` by itself (compared command by command against the
previous layout when the CLI moved to lakesink/cli/). Real catalog, real table, real files; no mocks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lakesink.cli import main
from lakesink.cli.main import COMMANDS
from lakesink.cli.output import ConsoleOutput, JsonOutput, Output, human_rows
from lakesink.cli.render import JSON_VERSION, ExitCode
from lakesink.driver.actions.batch import BatchCall
from tests.support.cli import stderr_apart
from tests.support.helpers import commit, make_committer, write_task

ROOT = Path(__file__).resolve().parent.parent.parent

Q = "q-cli"


@pytest.fixture
def catalog_args(catalog_properties: dict[str, str]) -> list[str]:
    c = make_committer(catalog_properties)
    for b in range(3):
        assert commit(c, Q, b, [write_task(c, Q, b, list(range(b * 10, b * 10 + 10)))]).outcome.value == "committed"
    return [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]


def run(args: list[str], catalog_args: list[str], *, exit_code: int = 0) -> str:
    result = CliRunner().invoke(main, [*args, *catalog_args])
    assert result.exit_code == exit_code, result.output
    return result.output


# command -> the JSON it prints: a list, or an object with exactly these keys
SHAPES: list[tuple[list[str], type | set[str]]] = [
    (["history", "db.events"], list),
    (["show", "db.events", "--at", "batch=1"], list),
    (["which", "db.events", "--where", "id = 15"], list),
    (
        ["diff", "db.events", "batch=0", "batch=2"],
        {"added", "added_files", "added_rows", "end_snapshot_id", "method", "removed", "removed_files", "removed_rows"}
        | {"start_snapshot_id"},
    ),
    (
        ["verify", "db.events"],
        {"branch", "files_checked", "head_snapshot_id", "ok", "queries", "snapshots_checked", "table", "violations"}
        | {"routed_batches"},
    ),
    (["verify", "--query", Q], {"query_id", "tables", "batches", "incomplete", "ok"}),
    (
        ["remove-orphan-files", "db.events", "--dry-run"],
        {"cutoff", "dry_run", "failed", "failed_count", "kept_in_flight", "kept_in_flight_bytes", "kept_in_flight_count"}
        | {
            "kept_too_young",
            "kept_too_young_bytes",
            "kept_too_young_count",
            "listed",
            "location",
            "older_than_seconds",
            "other_writers_older_than_seconds",
        }
        | {"referenced", "removed", "removed_bytes", "removed_count", "skipped", "skipped_hidden", "started", "table"},
    ),
    (
        ["compact", "db.events", "--dry-run", "--min-input-files", "2"],
        {"added_bytes", "added_files", "attempts", "branch", "dry_run", "duration_ms", "groups", "rewritten_bytes"}
        | {"rewritten_files", "snapshot_id", "status", "table"},
    ),
    (
        ["expire-snapshots", "db.events", "--dry-run"],
        {"attempts", "deleted_files", "dry_run", "duration_ms", "expired_snapshot_ids", "failed_deletes", "kept_snapshots"}
        | {"max_snapshot_age_ms", "min_snapshots_to_keep", "protected_refs", "removed_refs", "status", "table"}
        | {"files_kept", "restored_refs"},
    ),
    (
        ["rewrite-manifests", "db.events", "--dry-run"],
        {"attempts", "branch", "created", "dry_run", "duration_ms", "entries", "manifests_after", "manifests_before"}
        | {"snapshot_id", "status", "table", "target_size_bytes"},
    ),
    (
        ["rewrite-position-deletes", "db.events", "--dry-run"],
        {"added_bytes", "added_files", "attempts", "branch", "dangling_files", "dry_run", "duration_ms", "groups"}
        | {"removed_files", "rewritten_bytes", "rewritten_files", "snapshot_id", "status", "table"},
    ),
    (
        ["maintain", "db.events", "--dry-run"],
        {"compaction", "dry_run", "expiry", "manifests", "orphans", "position_deletes", "table"},
    ),
    (["forget-query", "db.events", Q, "--dry-run"], {"dry_run", "key", "marker", "risk", "table"}),
]


@pytest.mark.parametrize(("args", "shape"), SHAPES, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_json_shape_and_human_text_of_every_command(args: list[str], shape: type | set[str], catalog_args: list[str]) -> None:
    """The same JSON from ``lakesink --json <command>`` (the format chosen once, for the run) as from the command's
    own ``--json`` (its alias)."""
    for printed in (run([*args, "--json"], catalog_args), run(["--json", *args], catalog_args)):
        value: Any = json.loads(printed)
        if shape is list:
            assert isinstance(value, list) and value
        else:
            assert isinstance(shape, set) and isinstance(value, dict)
            assert set(value) == shape
    human = run(args, catalog_args)
    with pytest.raises(json.JSONDecodeError):
        json.loads(human)
    assert human.strip()


def test_checkpoint_clean_json_shape_and_human_text(tmp_path: Path) -> None:
    """``checkpoint-clean`` takes a checkpoint folder, not a table: its JSON shape and its human form."""
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "0").write_text("v1\n{}\n")
    printed = CliRunner().invoke(main, ["checkpoint-clean", str(checkpoint), "--older-than", "0", "--json"])
    assert printed.exit_code == 0, printed.output
    value: Any = json.loads(printed.output)
    assert isinstance(value, dict)
    assert set(value) == {"checkpoint", "dry_run", "older_than_seconds", "started", "listed", "offset_log"} | {
        "commit_log",
        "removed",
        "failed",
        "still_blocking",
        "in_use",
        "ok",
    }
    human = CliRunner().invoke(main, ["checkpoint-clean", str(checkpoint), "--older-than", "0"])
    assert human.exit_code == 0, human.output
    with pytest.raises(json.JSONDecodeError):
        json.loads(human.output)
    assert human.output.startswith(f"checkpoint {checkpoint}")


def test_publish_json_and_text(catalog_args: list[str]) -> None:
    assert "does not exist" in run(["publish", "db.events", "--branch", "nope", "--json"], catalog_args, exit_code=1)


def test_progress_goes_to_people_only(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: one line (rich's bar) rewritten in place
    people = ConsoleOutput()
    people.progress("compact", 0, 2)
    people.progress("compact", 1, 2)
    JsonOutput().progress("compact", 1, 2)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\r") >= 1 and "\n" not in captured.err, repr(captured.err)
    assert re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", captured.err.rsplit("\r", 1)[1]).startswith("compact ")
    assert "1/2" in captured.err
    people.progress("compact", 2, 2)  # the last step: the bar stays, the line ends
    assert capsys.readouterr().err.endswith("\n\x1b[?25h")


def test_progress_into_a_log_has_no_carriage_returns(capsys: pytest.CaptureFixture[str]) -> None:
    for done in range(4):
        ConsoleOutput().progress("compact", done, 3)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "compact: 3/3\n"


def test_every_output_renders_every_result() -> None:
    """A new kind of result is a new abstract method: both renderers must implement it (or the class is abstract)."""
    abstract = set(Output.__abstractmethods__)
    assert abstract and not ConsoleOutput.__abstractmethods__ and not JsonOutput.__abstractmethods__
    assert ConsoleOutput.show_progress is None and JsonOutput.show_progress is False


# --- errors, not tracebacks (issue 33) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (["show", "db.events", "--where", "id = = 3"], "'id = = 3'"),
        (["which", "db.events", "--where", "id >"], "'id >'"),
    ],
)
def test_a_malformed_where_is_a_usage_error(args: list[str], bad: str, catalog_args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, *catalog_args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"Invalid value for '--where': {bad} is not an Iceberg row filter at character" in result.output
    assert "Traceback" not in result.output and "pyparsing" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["show", "db.events", "--columns", "id,nosuch"],
        ["show", "db.events", "--where", "nosuch = 3"],
        ["which", "db.events", "--where", "nosuch = 3"],
    ],
)
def test_a_column_the_table_lacks_is_an_audit_error_naming_it(args: list[str], catalog_args: list[str]) -> None:
    """pyiceberg's ValueError for a column the table does not have comes out as the command line's error (its
    message, naming the column; exit code 1), in text and under --json, never a traceback."""
    for json_flag in ([], ["--json"]):
        result = CliRunner().invoke(main, [*json_flag, *args, *catalog_args])
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, SystemExit), result.exception
        assert "nosuch" in result.output and "Traceback" not in result.output, result.output
        if json_flag:
            assert json.loads(result.output)["error"]["type"] == "AuditError", result.output
        if "--where" in args:  # the table's columns, not pyiceberg's binding details
            assert "which table db.events does not have; its columns: id, user" in result.output, result.output
            assert "case_sensitive" not in result.output, result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["show", "db.events", "--where", "user > 5"], "column 'user' of table db.events holds string values; 5 is not one"),
        (["which", "db.events", "--where", "user = 5"], "column 'user' of table db.events holds string values; 5 is not one"),
        (["show", "db.events", "--where", "id in (1, 2) and user in (3, 4)"], "holds string values; 3 is not one"),
        (["show", "db.events", "--where", "id > 'abc'"], "column 'id' of table db.events holds long values; 'abc' is not one"),
        (["show", "db.events", "--where", "not usr = 'u1'"], "'usr', which table db.events does not have (did you mean 'user'?)"),
    ],
)
def test_a_where_value_of_another_type_is_one_error_line(args: list[str], said: str, catalog_args: list[str]) -> None:
    """Issue 54: a number compared with a string column was pyiceberg's TypeError, a traceback of ~50 lines (rc 1), under
    --json too. Now one line naming the column, its type and the value (exit status 1), and the JSON error object."""
    text = stderr_apart().invoke(main, [*args, *catalog_args])
    assert text.exit_code == 1 and isinstance(text.exception, SystemExit), text.output
    assert said in text.stderr, text.stderr
    assert len(text.stderr.strip().splitlines()) == 1 and "Traceback" not in text.output, text.output
    as_json = stderr_apart().invoke(main, ["--json", *args, *catalog_args])
    assert as_json.exit_code == 1 and as_json.stdout == "", as_json.output
    error = _error_object(as_json.stderr)
    assert error["type"] == "AuditError" and said in error["message"], error


def test_a_missing_table_lists_what_the_catalog_holds(catalog_args: list[str]) -> None:
    """Issue 54: "table demo.nope does not exist" named no table. Now the namespace's tables (the nearest first), or,
    when the namespace does not exist, the catalog's namespaces."""
    near = run(["history", "db.event"], catalog_args, exit_code=1)
    assert "table db.event does not exist in catalog" in near and "(did you mean 'db.events'?)" in near, near
    assert "the tables of namespace 'db': db.events" in near, near
    other = run(["history", "db.nope"], catalog_args, exit_code=1)
    assert "did you mean" not in other and "the tables of namespace 'db': db.events" in other, other
    namespace = run(["history", "demo.events"], catalog_args, exit_code=1)
    assert "namespace 'demo' does not exist; the catalog's namespaces: db" in namespace, namespace


def test_report_checks_its_output_path_before_building_the_report(
    catalog_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lakesink.cli import audit

    built: list[str] = []
    monkeypatch.setattr(audit, "write_report", lambda *a, **k: built.append("built"))  # must not be reached
    missing = tmp_path / "nonexistent" / "r.html"
    result = CliRunner().invoke(main, ["report", "db.events", "--html", str(missing), *catalog_args])
    assert result.exit_code == 2, result.output
    assert f"the folder {missing.parent} does not exist" in result.output
    result = CliRunner().invoke(main, ["report", "db.events", "--html", str(tmp_path), *catalog_args])
    assert result.exit_code == 2 and "is a directory" in result.output, result.output
    assert built == [] and not missing.parent.exists()


QA = "abcd1111-aaaa-4000-8000-000000000001"
QB = "abcd2222-bbbb-4000-8000-000000000002"


def test_the_query_id_prefix_history_prints_is_accepted_everywhere(catalog_properties: dict[str, str]) -> None:
    c = make_committer(catalog_properties)
    for q, start in ((QA, 100), (QB, 200)):
        for b in range(2):
            ids = list(range(start + b * 10, start + b * 10 + 3))
            assert commit(c, q, b, [write_task(c, q, b, ids)]).outcome.value == "committed"
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    printed = run(["history", "db.events"], args)
    prefix = QB[:8] + QB[8:10]  # what history prints (8 characters) is ambiguous here: one more character
    assert QB[:8] in printed and QB not in printed
    shown = json.loads(run(["show", "db.events", "--at", f"batch={prefix}:0", "--json"], args))
    assert sorted(r["id"] for r in shown) == [100, 101, 102, 110, 111, 112, 200, 201, 202]  # as of QB's batch 0
    verified = json.loads(run(["verify", "--query", prefix, "--json"], args))
    assert verified["query_id"] == QB and verified["ok"] is True
    forgotten = run(["forget-query", "db.events", prefix, "--dry-run", "--json"], args)
    assert json.loads(forgotten)["key"] == f"lakesink.last-batch.{QB}"
    for command in (
        ["show", "db.events", "--at", "batch=abcd:1"],
        ["verify", "--query", "abcd"],
        ["forget-query", "db.events", "abcd", "--dry-run"],
    ):
        out = run(command, args, exit_code=1)
        assert "query id 'abcd' is ambiguous: 2 queries start with it" in out and QA in out and QB in out, out
    unknown = run(["verify", "--query", "zzzz"], args, exit_code=1)
    assert unknown.startswith("ERROR: no table read holds a snapshot of query 'zzzz'") and QA in unknown, unknown


def test_commands_never_create_a_catalog_and_name_the_path_they_read(
    isolated_config: Path, monkeypatch: pytest.MonkeyPatch, catalog_properties: dict[str, str]
) -> None:
    """From a folder without ./lakehouse and without LAKESINK_HOME, a command says which catalog file it looked for,
    where that path comes from, and creates nothing."""
    monkeypatch.delenv("LAKESINK_HOME", raising=False)
    for args in (["history", "demo.events"], ["verify", "--query", "q"], ["compact", "demo.events", "--dry-run"]):
        out = run(args, [], exit_code=1)
        assert f"no catalog file {isolated_config / 'lakehouse' / 'catalog.db'}" in out, out
        assert "LAKESINK_HOME is not set" in out and "set LAKESINK_HOME to the folder that holds catalog.db" in out, out
        assert not (isolated_config / "lakehouse").exists()
    # a table missing from an existing catalog: the error names the catalog and its file
    c = make_committer(catalog_properties)
    assert commit(c, Q, 0, [write_task(c, Q, 0, [1])]).outcome.value == "committed"
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    out = run(["history", "db.nope"], args, exit_code=1)
    db = catalog_properties["uri"][len("sqlite:///") :]
    assert f"table db.nope does not exist in catalog 'lakesink' (catalog file {db})" in out, out


def test_history_branch_and_source_offsets_as_json_values(catalog_properties: dict[str, str]) -> None:
    c = make_committer(catalog_properties)
    for b in range(2):
        offsets = json.dumps([{"logOffset": b}, None])
        c.commit_batch(BatchCall(Q, b, offsets), [write_task(c, Q, b, [b])])
    t = c.table.load()
    head = t.current_snapshot()
    assert head is not None
    t.manage_snapshots().create_branch(head.snapshot_id, "audit").commit()
    c.table.load().append(c.table.load().scan().to_arrow().slice(0, 0), branch="audit")  # a snapshot only on branch audit
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    every = json.loads(run(["history", "db.events", "--json"], args))
    assert [r["source_offsets"] for r in every[:2]] == [[{"logOffset": 0}, None], [{"logOffset": 1}, None]]
    on_main = json.loads(run(["history", "db.events", "--branch", "main", "--json"], args))
    on_audit = json.loads(run(["history", "db.events", "--branch", "audit", "--json"], args))
    assert len(every) == 3 and len(on_main) == 2 and len(on_audit) == 3
    assert all("main" in r["branches"] for r in on_main)
    missing = run(["history", "db.events", "--branch", "nope"], args, exit_code=1)
    assert "table db.events has no branch 'nope'; its branches: audit, main" in missing


def test_show_limit_reads_at_most_one_row_more_and_refuses_a_negative_limit(catalog_args: list[str]) -> None:
    out = run(["show", "db.events", "--limit", "2"], catalog_args)
    assert out.rstrip().endswith("(first 2 row(s) shown; the table has more: --limit 0 for all)"), out
    assert run(["show", "db.events", "--limit", "0"], catalog_args).rstrip().endswith("(30 row(s))")
    assert run(["show", "db.events", "--limit", "30"], catalog_args).rstrip().endswith("(30 row(s))")
    assert len(json.loads(run(["show", "db.events", "--limit", "3", "--json"], catalog_args))) == 3
    for command in (["show", "db.events"], ["diff", "db.events", "batch=0", "batch=2"]):
        refused = run([*command, "--limit", "-1"], catalog_args, exit_code=2)
        assert "Invalid value for '--limit': -1 is not in the range x>=0" in refused, refused


def test_read_at_stops_at_the_limit(catalog_properties: dict[str, str]) -> None:
    from lakesink.audit import read_at

    c = make_committer(catalog_properties)
    for b in range(3):
        commit(c, Q, b, [write_task(c, Q, b, list(range(b * 10, b * 10 + 10)))])
    assert read_at(c.table.load(), limit=4).num_rows == 4 and read_at(c.table.load()).num_rows == 30


def test_sizes_are_printed_in_one_unit_system(catalog_properties: dict[str, str]) -> None:
    c = make_committer(catalog_properties)
    for b in range(6):
        commit(c, Q, b, [write_task(c, Q, b, list(range(b * 10, b * 10 + 10)))])
    out = run(["compact", "db.events", "--dry-run"], [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()])
    assert "would rewrite 6 file(s)" in out, out
    assert re.search(r"\d{4,} B\b", out) is None and "KiB" in out, out


def test_where_reads_a_time_without_zone_offset_as_utc_like_at(catalog_properties: dict[str, str]) -> None:
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    from lakesink.driver import catalogs

    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace_if_not_exists("db")
    start = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
    rows = pa.table({"id": pa.array(range(6), pa.int64()), "ts": [start + timedelta(hours=i) for i in range(6)]})
    catalog.create_table("db.times", schema=rows.schema).append(rows)
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    for where, ids in (
        ("ts >= '2026-11-23T13:00:00'", [3, 4, 5]),
        ("ts >= '2026-11-23 13:00'", [3, 4, 5]),
        ("ts < '2026-11-23T13:00:00+01:00'", [0, 1]),  # an explicit offset is kept
        ("ts in ('2026-11-23T11:00:00', '2026-11-23T14:00:00') or id = 0", [0, 1, 4]),
        ("not ts < '2026-11-24'", []),
    ):
        shown = json.loads(run(["show", "db.times", "--where", where, "--limit", "0", "--json"], args))
        assert sorted(r["id"] for r in shown) == ids, where
        traced = json.loads(run(["which", "db.times", "--where", where, "--json"], args))
        assert sorted(r["id"] for r in traced) == ids, where


# --- one output per run: lakesink --json, errors through it, exit codes, rich (issue 31 item 5) ----------------------


def test_every_command_takes_the_group_json_flag(
    catalog_args: list[str], catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    """``lakesink --json <command>``: every command of the group prints JSON (``report`` its page's path and the
    verify result shown on it; ``checkpoint-clean`` takes a folder)."""
    table = make_committer(catalog_properties).table.load()
    head = table.current_snapshot()
    assert head is not None
    table.manage_snapshots().create_branch(head.snapshot_id, "audit").commit()
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    page = tmp_path / "r.html"
    done = {args[0] for args, _ in SHAPES}
    printed = run(["--json", "report", "db.events", "--html", str(page)], catalog_args)
    assert json.loads(printed)["html"] == str(page) and json.loads(printed)["verify"]["ok"] is True and page.exists()
    result = CliRunner().invoke(main, ["--json", "checkpoint-clean", str(checkpoint), "--older-than", "0"])
    assert result.exit_code == 0 and json.loads(result.output)["checkpoint"] == str(checkpoint), result.output
    published = stderr_apart().invoke(main, ["--json", "publish", "db.events", "--branch", "audit", *catalog_args])
    assert published.exit_code == 0 and "main_after" in json.loads(published.stdout), published.output
    waited = stderr_apart().invoke(main, ["--json", "wait", "db.events", "--watermark", "0", *catalog_args])
    assert waited.exit_code == ExitCode.WAIT_NO_WATERMARK and json.loads(waited.stdout)["outcome"] == "no-watermark"
    # history-of on a table that is not a history table: the error comes as the JSON error object (its rows: the
    # history tables' tests, tests/sink/test_history_spark.py)
    versions = stderr_apart().invoke(
        main, ["--json", "history-of", "x.y", "--history", "db.events", "--key", "id=1", *catalog_args]
    )
    assert versions.exit_code == ExitCode.FAILED, versions.output
    assert "not a history table" in _error_object(versions.stderr)["message"]
    assert set(COMMANDS) == done | {"report", "checkpoint-clean", "publish", "wait", "history-of"}


def _error_object(stderr: str) -> dict[str, Any]:
    """The JSON error object: the last line of stderr, one line."""
    value: Any = json.loads(stderr.strip().splitlines()[-1])
    assert set(value) == {"version", "error"} and value["version"] == JSON_VERSION == 1, value
    assert set(value["error"]) == {"type", "message", "exit_code"}, value
    assert isinstance(value["error"]["message"], str) and value["error"]["message"]
    return dict(value["error"])


ERRORS: list[tuple[list[str], str, int, str]] = [
    (["history", "db.nope"], "CatalogError", 1, "table db.nope does not exist in catalog"),
    (["show", "db.events", "--at", "batch=99"], "AuditError", 1, "batch 99"),
    (["history", "db.events", "--branch", "nope"], "AuditError", 1, "has no branch 'nope'"),
    (["show", "db.events", "--where", "id = = 3"], "UsageError", 2, "is not an Iceberg row filter"),
    (["show", "db.events", "--no-such-option"], "UsageError", 2, "--no-such-option"),
    (["which", "db.events"], "UsageError", 2, "give exactly one of --where or --file"),
    (["no-such-command"], "UsageError", 2, "no-such-command"),
]


@pytest.mark.parametrize(("args", "kind", "status", "said"), ERRORS, ids=lambda v: v[0] if isinstance(v, list) else None)
def test_an_error_under_json_is_one_versioned_json_object_on_stderr(
    args: list[str], kind: str, status: int, said: str, catalog_args: list[str]
) -> None:
    """Before: under --json an error came out as click's plain text. Now one JSON object on stderr (stdout holds
    only the result: here none), whichever --json was given; its exit_code is the process's."""
    forms = [["--json", *args]] + ([[*args, "--json"]] if args[0] in COMMANDS else [])
    for argv in forms:
        result = stderr_apart().invoke(main, [*argv, *catalog_args])
        assert result.exit_code == status, result.output
        assert result.stdout == "", result.stdout
        error = _error_object(result.stderr)
        assert (error["type"], error["exit_code"]) == (kind, status) and said in error["message"], error
    text = stderr_apart().invoke(main, [*args, *catalog_args])  # without --json: click's text, as before
    assert text.exit_code == status and text.stdout == "" and "Error: " in text.stderr and said in text.stderr
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.stderr.strip().splitlines()[-1])


def test_a_failure_found_after_the_report_keeps_stdout_one_json_document(tmp_path: Path) -> None:
    """``checkpoint-clean`` reports, then fails (a file Spark would still refuse): the report on stdout, the error
    object on stderr, exit status 1."""
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "metadata").write_text("{}")
    (checkpoint / "offsets" / ".0.5b4f6c9e-aaaa-4000-8000-000000000001.tmp").write_text("")
    (checkpoint / "offsets" / "0.bak").write_text("")  # an empty offset log and another file: Spark still refuses
    result = stderr_apart().invoke(main, ["--json", "checkpoint-clean", str(checkpoint), "--older-than", "0"])
    report = json.loads(result.stdout)
    assert report["still_blocking"] == ["offsets/0.bak"] and report["ok"] is False
    assert result.exit_code == ExitCode.FAILED, result.output
    error = _error_object(result.stderr)
    assert error["type"] == "CommandFailed" and error["exit_code"] == 1 and "listed above" in error["message"]


def test_the_exit_codes_are_the_documented_ones() -> None:
    """docs/cli.md lists every exit status; the table and :class:`ExitCode` are the same."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    documented = {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| `(\w+)` \|", section, re.M)}
    assert documented == {int(code): code.name for code in ExitCode}
    assert f'"version": {JSON_VERSION}' in page


def test_progress_into_a_pipe_or_a_file_has_no_carriage_return(catalog_properties: dict[str, str], tmp_path: Path) -> None:
    """A command with progress (compact, maintain), its stderr a pipe, then a file: the last step of each, as a plain
    line, and no carriage return anywhere."""
    import os
    import subprocess

    c = make_committer(catalog_properties)
    for b in range(6):
        assert commit(c, Q, b, [write_task(c, Q, b, [b])]).outcome.value == "committed"
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-c", "from lakesink.cli import main; main()"]
    piped = subprocess.run([*cli, "compact", "db.events", "--min-input-files", "2", *args], env=env, capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert b"\r" not in piped.stderr + piped.stdout and piped.stderr.decode().splitlines() == ["rewriting: 1/1"]
    log = tmp_path / "maintain.log"
    with log.open("wb") as f:
        done = subprocess.run([*cli, "maintain", "db.events", "--no-orphans", *args], env=env, stdout=f, stderr=f)
    assert done.returncode == 0 and b"\r" not in log.read_bytes() and b"compaction of db.events" in log.read_bytes()


def test_text_tables_align_by_width_on_screen() -> None:
    """Tables are drawn by rich: a wide (CJK) character takes two columns on screen, and the next column still
    starts at one place on every line (``ljust`` counted characters: it was off by one per wide character)."""
    import unicodedata

    import pyarrow as pa

    def on_screen(text: str) -> int:
        return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)

    text = human_rows(pa.table({"name": ["日本語", "ab", "[bold]x[/]"], "id": [1, 22, 333]}))
    starts = {on_screen(line[: line.rindex(" ") + 1]) for line in text.splitlines()}
    assert len(starts) == 1, text
    assert "[bold]x[/]" in text  # a cell is text, never markup


def test_history_shows_a_restart_of_the_query(catalog_properties: dict[str, str]) -> None:
    """Each snapshot records Spark's run id (lakesink.run-id, a new one at every restart): history marks the first
    batch of a new run of the query, in text (a line before it) and JSON (``run_id``, ``restarted``)."""
    c = make_committer(catalog_properties)
    for b, run_id in enumerate(["run-a", "run-a", "run-b", "run-b", "run-c"]):
        outcome = c.commit_batch(BatchCall(Q, b, None, run_id), [write_task(c, Q, b, [b])])
        assert outcome.outcome.value == "committed"
    c.commit_batch(BatchCall("q-other", 0, None, "x"), [write_task(c, "q-other", 0, [9])])
    args = [f"--catalog-property={k}={v}" for k, v in catalog_properties.items()]
    records = json.loads(run(["--json", "history", "db.events"], args))
    assert [(r["batch_id"], r["run_id"], r["restarted"]) for r in records] == [
        (0, "run-a", False),
        (1, "run-a", False),
        (2, "run-b", True),
        (3, "run-b", False),
        (4, "run-c", True),
        (0, "x", False),  # another query's first run
    ]
    lines = run(["history", "db.events"], args).splitlines()
    marks = [i for i, line in enumerate(lines) if line.strip() == f"({Q[:8]} restarted)"]
    assert len(marks) == 2 and all(lines[i + 1].split()[5] == str(b) for i, b in zip(marks, (2, 4), strict=True)), lines


def test_report_marks_each_restart_and_draws_whole_counts_on_batch_axes(catalog_properties: dict[str, str]) -> None:
    """The report explains the gaps a killed run leaves: each restart of a query (a new run id) is listed on the page and
    drawn as a dashed line; the batch axes carry at most 15 integer ticks and the file counts whole numbers only."""
    from lakesink.cli import report

    c = make_committer(catalog_properties)
    runs = ["run-a"] * 20 + ["run-b"] * 15 + ["run-c"] * 5
    for b, run_id in enumerate(runs):
        outcome = c.commit_batch(BatchCall(Q, b, None, run_id), [write_task(c, Q, b, [b])])
        assert outcome.outcome.value == "committed"
    drawn: list[dict[str, Any]] = []
    original = report._png

    def keep(fig: Any) -> str:  # what each plot shows, read before the figure is cleared
        for ax in fig.axes:
            lo, hi = ax.get_xlim()
            drawn.append(
                {
                    "x": ax.get_xlabel(),
                    "y": ax.get_ylabel(),
                    "xticks": [t for t in ax.get_xticks() if lo <= t <= hi],
                    "yticks": list(ax.get_yticks()),
                    "dashed": sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"),
                }
            )
        return original(fig)

    report._png = keep
    try:
        page, verdict = report.render_report(c.table.load())
    finally:
        report._png = original
    assert verdict.ok
    listed = re.findall(r"restarted before batch (\d+)", page)
    assert listed == ["20", "35"], listed
    assert "2 restart(s)" in page and page.count('src="data:image/png;base64,') == 4
    batch_axes = [ax for ax in drawn if ax["x"] == "batch id"]
    assert len(batch_axes) == 2
    for ax in batch_axes:
        assert 0 < len(ax["xticks"]) <= 16 and all(float(t).is_integer() for t in ax["xticks"]), ax
        assert ax["dashed"] == [19.5, 34.5], ax
    (files,) = [ax for ax in drawn if ax["y"] == "data files added"]
    assert all(float(t).is_integer() for t in files["yticks"]), files
    timed = [ax for ax in drawn if ax["y"] in ("rows added", "KiB added")]
    assert len(timed) == 2 and all(len(ax["dashed"]) == 2 for ax in timed)


def test_show_orders_rows_by_the_columns_given(catalog_args: list[str]) -> None:
    """Issue 54: ``show`` printed rows in file order only. ``--order-by`` sorts every matching row, then limits."""
    top = json.loads(run(["show", "db.events", "--order-by", "id desc", "--limit", "3", "--json"], catalog_args))
    assert [r["id"] for r in top] == [29, 28, 27], top
    by_user = json.loads(run(["show", "db.events", "--order-by", "user, id DESC", "--limit", "0", "--json"], catalog_args))
    expected = sorted(range(30), key=lambda i: (f"u{i % 7}", -i))
    assert [r["id"] for r in by_user] == expected, by_user
    only_user = json.loads(run(["show", "db.events", "--columns", "user", "--order-by", "id", "--json"], catalog_args))
    assert only_user == [{"user": f"u{i % 7}"} for i in range(20)], only_user  # sorted by a column not shown
    text = run(["show", "db.events", "--order-by", "id", "--limit", "2"], catalog_args)
    assert text.rstrip().endswith("(first 2 row(s) shown; the table has more: --limit 0 for all)"), text
    missing = run(["show", "db.events", "--order-by", "ids"], catalog_args, exit_code=1)
    assert "--order-by names column 'ids', which table db.events does not have (did you mean 'id'?)" in missing, missing
    assert run(["show", "db.events", "--order-by", "id sideways"], catalog_args, exit_code=2).count("asc or desc") == 1


def test_the_top_level_help_names_the_audit_commands() -> None:
    """Issue 54: ``lakesink --help`` said "Maintenance of the Iceberg tables lakesink writes" only."""
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    summary = result.output.split("Options:", 1)[0]
    assert "Audit and maintain" in summary, summary
    for command in COMMANDS:
        assert command in " ".join(re.sub(r"-\n\s*", "-", summary).split()), command
