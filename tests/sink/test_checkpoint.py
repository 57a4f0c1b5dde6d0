"""lakesink.sink.checkpoint: the query id and source offsets read from a Spark streaming checkpoint.

The folders are made by hand in the format Spark writes (``metadata``: one JSON line; ``offsets/<batch>``:
``v1``, a JSON line of batch metadata, then one line per source, ``-`` for a source without an offset).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakesink.errors import CheckpointError
from lakesink.sink.checkpoint import read_query_id, read_source_offsets

QUERY_ID = "8c3f2a6e-59a8-4d0a-9f43-3c5d0e5e9b41"

BATCH_METADATA = json.dumps(
    {
        "batchWatermarkMs": 0,
        "batchTimestampMs": 1732147200000,
        "conf": {
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
            ),
            "spark.sql.shuffle.partitions": "4",
        },
    },
    separators=(",", ":"),
)


def make_checkpoint(root: Path, *, metadata: str | None = None, offsets: dict[int, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(exist_ok=True)
    (root / "sources" / "0").mkdir(parents=True, exist_ok=True)
    if metadata is not None:
        (root / "metadata").write_text(metadata, encoding="utf-8")
    if offsets:
        (root / "offsets").mkdir(exist_ok=True)
        for batch_id, text in offsets.items():
            (root / "offsets" / str(batch_id)).write_text(text, encoding="utf-8")
    return root


def offset_log(*sources: str) -> str:
    return "\n".join(["v1", BATCH_METADATA, *sources])


# --- query id -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [f'{{"id":"{QUERY_ID}"}}', f'{{"id":"{QUERY_ID}"}}\n', f'{{"id": "{QUERY_ID}"}}\n\n'])
def test_query_id(tmp_path: Path, text: str) -> None:
    ck = make_checkpoint(tmp_path / "ck", metadata=text)
    assert read_query_id(str(ck)) == QUERY_ID


def test_query_id_through_file_urls_and_trailing_slash(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck", metadata=f'{{"id":"{QUERY_ID}"}}')
    for location in (f"file://{ck}", f"file:{ck}", f"{ck}/", f"file://{ck}/"):
        assert read_query_id(location) == QUERY_ID, location


def test_query_id_is_none_before_the_query_first_started(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck")
    assert read_query_id(str(ck)) is None
    assert read_query_id(str(tmp_path / "does-not-exist")) is None
    assert read_query_id(f"file://{tmp_path}/does-not-exist") is None


@pytest.mark.parametrize(
    "text",
    ["", "\n", "not json", '{"id": "trunc', "{}", '{"name": "x"}', "[]", "[1, 2]", "null", '"just a string"', "42"],
)
def test_garbage_metadata_raises_checkpoint_error(tmp_path: Path, text: str) -> None:
    ck = make_checkpoint(tmp_path / "ck", metadata=text)
    with pytest.raises(CheckpointError) as e:
        read_query_id(str(ck))
    assert str(e.value) == f"checkpoint metadata {ck}/metadata has no query id"


def test_unreadable_metadata_raises_checkpoint_error(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck")
    (ck / "metadata").mkdir()  # a folder where the file should be
    with pytest.raises(CheckpointError) as e:
        read_query_id(str(ck))
    assert str(e.value).startswith(f"cannot read {ck}/metadata: ")


# --- source offsets -------------------------------------------------------------------------------


def test_offsets_of_several_sources_as_a_json_list(tmp_path: Path) -> None:
    ck = make_checkpoint(
        tmp_path / "ck",
        metadata=f'{{"id":"{QUERY_ID}"}}',
        offsets={
            0: offset_log('{"logOffset":0}', "-"),
            7: offset_log('{"events":{"0":42,"1":17}}', '{"logOffset":6}', "12"),
        },
    )
    assert read_source_offsets(str(ck), 0) == '[{"logOffset":0},null]'
    assert read_source_offsets(str(ck), 7) == '[{"events":{"0":42,"1":17}},{"logOffset":6},12]'
    assert json.loads(read_source_offsets(str(ck), 7) or "") == [{"events": {"0": 42, "1": 17}}, {"logOffset": 6}, 12]


def test_offsets_with_trailing_newline_and_through_a_file_url(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck", offsets={3: offset_log('{"logOffset":2}') + "\n"})
    for location in (str(ck), f"file://{ck}", f"file:{ck}", f"file://{ck}/"):
        assert read_source_offsets(location, 3) == '[{"logOffset":2}]', location


def test_offsets_of_a_source_that_is_not_json_are_kept_as_text(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck", offsets={1: offset_log("opaque-offset-v2", "-")})
    assert read_source_offsets(str(ck), 1) == '["opaque-offset-v2",null]'


def test_offsets_with_no_source_line_is_an_empty_list(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck", offsets={0: offset_log()})
    assert read_source_offsets(str(ck), 0) == "[]"


def test_offsets_not_recorded_is_none(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path / "ck", offsets={0: offset_log('{"logOffset":0}')})
    assert read_source_offsets(str(ck), 1) is None
    assert read_source_offsets(str(tmp_path / "empty"), 0) is None


@pytest.mark.parametrize("text", ["", "v1", "garbage\nmore garbage\n{}", '{"logOffset":0}\n{}\n-'])
def test_garbage_offsets_raise_checkpoint_error(tmp_path: Path, text: str) -> None:
    ck = make_checkpoint(tmp_path / "ck", offsets={5: text})
    with pytest.raises(CheckpointError) as e:
        read_source_offsets(str(ck), 5)
    assert str(e.value) == f"unexpected offset log format in {ck}/offsets/5"


def test_a_checkpoint_the_next_start_will_not_find() -> None:
    from lakesink._pyspark import QueryCheckpoint
    from lakesink.sink.checkpoint import not_found_by_a_restart

    uid = "5a70e287-d482-427e-9795-6ce46a64bb6c"
    temp = QueryCheckpoint(root=f"file:/tmp/temporary-{uid}", temporary=True, query_name=None, session_root=None)
    assert "temporary checkpoint" in (not_found_by_a_restart(temp) or "")
    random = QueryCheckpoint(root=f"file:/data/ck/{uid}", temporary=False, query_name=None, session_root="/data/ck/")
    assert "queryName" in (not_found_by_a_restart(random) or "")
    named = QueryCheckpoint(root="file:/data/ck/events", temporary=False, query_name="events", session_root="/data/ck")
    given = QueryCheckpoint(root="file:/data/other/events", temporary=False, query_name=None, session_root="/data/ck")
    unknown = QueryCheckpoint(root="s3://b/ck", temporary=None, query_name=None, session_root=None)
    assert [not_found_by_a_restart(c) for c in (named, given, unknown)] == [None, None, None]
