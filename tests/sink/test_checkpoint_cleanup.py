"""lakesink.sink.checkpoint_cleanup and ``lakesink checkpoint-clean``: Spark's abandoned temp files, and nothing else.

The checkpoints are laid out by hand with the names real Spark 4.3 runs left behind when their JVM was
SIGKILLed while writing a checkpoint file (``tests/test_soak.py`` and ``tests/test_checkpoint_clean_spark.py``
produce them with real kills): ``offsets/.0.<uuid>.tmp`` and ``offsets/..0.<uuid>.tmp.crc``. State-store
temp files carry the task attempt (``.1.delta.<uuid>.TID7.tmp``).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from lakesink.cli import main
from lakesink.errors import CheckpointError, CheckpointInUseError
from lakesink.sink.checkpoint_cleanup import clean_checkpoint, temp_file_target

U1 = "2c72ad40-fd29-4120-bfff-6b4a917a5e9a"
U2 = "0ca7eaf0-6f92-4fc0-957d-09a3f7e7a7e6"
U3 = "618c106c-853f-4676-8814-8ae7bb9237b4"

# what Spark needs (or may need) in a checkpoint: never touched
SPARK_FILES = [
    "metadata",
    ".metadata.crc",
    "offsets/0",
    "offsets/.0.crc",
    "offsets/1",
    "offsets/.1.crc",
    "commits/0",
    "commits/.0.crc",
    "sources/0/0",
    "sources/0/.0.crc",
    "sources/0/9.compact",
    "state/0/0/1.delta",
    "state/0/0/.1.delta.crc",
    "state/0/_metadata/metadata",
]
# abandoned temp files, as Spark's CheckpointFileManager and Hadoop's checksum filesystem name them
TEMP_FILES = {
    f"offsets/.2.{U1}.tmp": ("offsets/2", False),
    f"offsets/..2.{U1}.tmp.crc": ("offsets/2", True),
    f"commits/.1.{U3}.tmp": ("commits/1", False),
    f"..metadata.{U2}.tmp.crc": ("metadata", True),
    f"sources/0/.1.{U2}.tmp": ("sources/0/1", False),
    f"state/0/0/.2.delta.{U3}.TID17.tmp": ("state/0/0/2.delta", False),
    f"state/0/0/..2.delta.{U3}.TID17.tmp.crc": ("state/0/0/2.delta", True),
}


def lay_out(root: Path, files: list[str], *, age_s: float = 3600.0) -> Path:
    past = time.time() - age_s
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("v1\n" if not rel.endswith(".tmp") else "")
        os.utime(path, (past, past))
    return root


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("path, expected", [(p, t) for p, t in TEMP_FILES.items()])
def test_temp_file_names_are_recognised_with_the_file_spark_was_writing(path: str, expected: tuple[str, bool]) -> None:
    assert temp_file_target(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        *SPARK_FILES,
        "offsets/.0.tmp",  # no uuid: not a name Spark gives its temp files
        f"offsets/0.{U1}.tmp",  # no leading dot
        f"offsets/.0.{U1}.tmp.bak",
        f"offsets/.0.{U1}.crc",
        "offsets/.0.crc.tmp",
    ],
)
def test_other_names_are_not_temp_files(path: str) -> None:
    assert temp_file_target(path) is None


def test_removes_every_abandoned_temp_file_and_nothing_else(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", SPARK_FILES + list(TEMP_FILES))
    report = clean_checkpoint(str(root))
    assert files_under(root) == set(SPARK_FILES)
    assert sorted(f.path for f in report.removed) == sorted(TEMP_FILES)
    assert {f.path: (f.target, f.checksum) for f in report.removed} == TEMP_FILES
    assert report.offset_log == (0, 1) and report.commit_log == (0,)
    # the offset log has entries: Spark's new-query check does not run, so no temp file blocked a restart
    assert not any(f.blocks_restart for f in report.removed)
    assert report.ok and report.failed == () and report.still_blocking == ()
    assert report.listed == len(SPARK_FILES) + len(TEMP_FILES)


def test_the_first_offset_write_killed_blocks_the_restart_and_is_cleared(tmp_path: Path) -> None:
    """The layout a SIGKILL during the first offset-log write leaves (seen with real Spark 4.3 runs)."""
    left = ["metadata", ".metadata.crc", "sources/0/0", "sources/0/.0.crc", f"offsets/.0.{U1}.tmp", f"offsets/..0.{U1}.tmp.crc"]
    root = lay_out(tmp_path / "ck", left)
    dry = clean_checkpoint(str(root), dry_run=True)
    assert files_under(root) == set(left)  # a dry run removes nothing
    assert dry.dry_run and [f.path for f in dry.removed] == [f"offsets/..0.{U1}.tmp.crc", f"offsets/.0.{U1}.tmp"]
    assert all(f.blocks_restart for f in dry.removed) and dry.offset_log == ()
    assert "Spark refuses to restart because of it" in dry.human() and "would remove 2" in dry.human()
    report = clean_checkpoint(str(root))
    assert files_under(root) == {"metadata", ".metadata.crc", "sources/0/0", "sources/0/.0.crc"}
    assert report.ok and len(report.removed) == 2


def test_refuses_a_checkpoint_that_changed_recently_and_removes_nothing(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", SPARK_FILES + list(TEMP_FILES))
    young = root / "commits" / "1"
    young.write_text("v1\n")  # a batch just committed: the query may be running
    with pytest.raises(CheckpointInUseError, match=r"changed \d+ s ago \(commits/1; 1 file\(s\)") as e:
        clean_checkpoint(str(root), older_than=timedelta(minutes=10))
    assert "--older-than 0" in str(e.value) and "Nothing removed" in str(e.value)
    assert files_under(root) == set(SPARK_FILES) | set(TEMP_FILES) | {"commits/1"}
    # a young temp file alone is a write in progress: refused too
    young.unlink()
    os.utime(root / f"offsets/.2.{U1}.tmp")
    with pytest.raises(CheckpointInUseError):
        clean_checkpoint(str(root))
    # the caller who knows no process runs the query says so
    report = clean_checkpoint(str(root), older_than=timedelta(0))
    assert len(report.removed) == len(TEMP_FILES) and files_under(root) == set(SPARK_FILES)


def test_a_quiet_time_shorter_than_the_last_change_is_accepted(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", SPARK_FILES + list(TEMP_FILES), age_s=120)
    with pytest.raises(CheckpointInUseError):
        clean_checkpoint(str(root))  # default: 10 minutes
    assert len(clean_checkpoint(str(root), older_than=timedelta(minutes=1)).removed) == len(TEMP_FILES)


def test_refuses_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    other = lay_out(tmp_path / "data", ["part-0.parquet", f".x.{U1}.tmp", "sub/file"])
    with pytest.raises(CheckpointError, match="does not look like a Spark streaming checkpoint"):
        clean_checkpoint(str(other), older_than=timedelta(0))
    assert len(files_under(other)) == 3
    with pytest.raises(CheckpointError, match="does not exist"):
        clean_checkpoint(str(tmp_path / "missing"))


def test_a_checkpoint_with_only_its_first_metadata_write_is_a_checkpoint(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", [f".metadata.{U2}.tmp", f"..metadata.{U2}.tmp.crc"])
    report = clean_checkpoint(str(root), older_than=timedelta(0))
    assert files_under(root) == set() and len(report.removed) == 2


def test_files_that_still_block_the_restart_are_named_and_left_alone(tmp_path: Path) -> None:
    """An empty offset log with other files in offsets/ or commits/: Spark refuses; the command says so."""
    left = ["metadata", f"offsets/.0.{U1}.tmp", "offsets/0.bak", "commits/notes.txt"]
    root = lay_out(tmp_path / "ck", left)
    report = clean_checkpoint(str(root))
    assert [f.path for f in report.removed] == [f"offsets/.0.{U1}.tmp"]
    assert report.still_blocking == ("commits/notes.txt", "offsets/0.bak") and not report.ok
    assert files_under(root) == {"metadata", "offsets/0.bak", "commits/notes.txt"}
    assert "Spark will still refuse to restart the query" in report.human()


def test_through_a_file_url(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", SPARK_FILES + list(TEMP_FILES))
    report = clean_checkpoint(f"file://{root}/")
    assert len(report.removed) == len(TEMP_FILES) and files_under(root) == set(SPARK_FILES)


# --- the command --------------------------------------------------------------------------------------


def test_command_dry_run_json_and_removal(tmp_path: Path) -> None:
    left = ["metadata", "sources/0/0", f"offsets/.0.{U1}.tmp", f"offsets/..0.{U1}.tmp.crc"]
    root = lay_out(tmp_path / "ck", left)
    runner = CliRunner()
    dry = runner.invoke(main, ["checkpoint-clean", str(root), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "(dry run: nothing removed)" in dry.output and f"offsets/.0.{U1}.tmp" in dry.output
    assert files_under(root) == set(left)
    done = runner.invoke(main, ["checkpoint-clean", str(root), "--json"])
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    assert out["ok"] and out["offset_log"] == [] and not out["dry_run"]
    assert sorted(f["path"] for f in out["removed"]) == sorted(left[2:])
    assert all(f["blocks_restart"] and f["target"] == "offsets/0" for f in out["removed"])
    assert files_under(root) == {"metadata", "sources/0/0"}


def test_command_refusals_exit_1_with_the_reason(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "ck", ["metadata", f"offsets/.0.{U1}.tmp"], age_s=0)
    runner = CliRunner()
    busy = runner.invoke(main, ["checkpoint-clean", str(root)])
    assert busy.exit_code == 1 and "the query may still be running" in busy.output
    assert f"offsets/.0.{U1}.tmp" in files_under(root)
    forced = runner.invoke(main, ["checkpoint-clean", str(root), "--older-than", "0"])
    assert forced.exit_code == 0, forced.output
    blocked = lay_out(tmp_path / "ck2", ["metadata", "offsets/0.bak"])
    still = runner.invoke(main, ["checkpoint-clean", str(blocked)])
    assert still.exit_code == 1 and "still make Spark refuse the restart" in still.output
    bad = runner.invoke(main, ["checkpoint-clean", str(tmp_path / "ck"), "--older-than", "soon"])
    assert bad.exit_code == 2 and "is not a duration" in bad.output


def test_command_dry_run_of_a_busy_checkpoint_lists_and_warns_and_names_the_option(tmp_path: Path) -> None:
    """A dry run removes nothing, so a checkpoint that changed recently is no reason to refuse it: it lists what a run
    would remove and says why a run would be refused now; the refusal of a run names the command's option."""
    left = ["metadata", f"offsets/.0.{U1}.tmp"]
    root = lay_out(tmp_path / "ck", left, age_s=0)
    runner = CliRunner()
    dry = runner.invoke(main, ["checkpoint-clean", str(root), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"offsets/.0.{U1}.tmp" in dry.output and "a run now would be refused" in dry.output
    as_json = json.loads(runner.invoke(main, ["checkpoint-clean", str(root), "--dry-run", "--json"]).output)
    assert "the query may still be running" in as_json["in_use"] and [f["path"] for f in as_json["removed"]] == left[1:]
    assert files_under(root) == set(left)
    busy = runner.invoke(main, ["checkpoint-clean", str(root)])
    assert busy.exit_code == 1 and "run it with --older-than 0" in busy.output and "older_than=0" not in busy.output
    assert files_under(root) == set(left)
