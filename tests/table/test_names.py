"""lakesink.table.names: every name lakesink makes parses back to what made it; Iceberg's names are recognised."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from lakesink.executor.messages import TaskIds
from lakesink.executor.task_writer import TaskWriter
from lakesink.table import names
from lakesink.table.names import BatchDirectoryName, BatchOfFile, DataFileName
from tests.support.files import MakePlan

QUERY_IDS = [
    "1964bb6e-59a8-4c1e-9a55-0f6f3c3e2a11",  # what Spark gives (a UUID)
    str(uuid.uuid4()),
    "q-1",  # shorter than 8 characters (tests use such ids)
    "ab-12345-00007-x",  # digits and dashes where the batch id could be mistaken for part of it
    "a",
]
# the test ids name the random UUID by its role, not its value: pytest-xdist's workers must collect the same ids
QUERY_ID_IDS = ["spark-uuid", "random-uuid", "short", "digits-and-dashes", "one-char"]


@pytest.mark.parametrize("query_id", QUERY_IDS, ids=QUERY_ID_IDS)
@pytest.mark.parametrize(
    ("batch_id", "partition_id", "attempt", "counter"), [(0, 0, 0, 0), (7, 12, 1034, 3), (123456, 100000, 5, 100001)]
)
def test_data_file_names_round_trip(query_id: str, batch_id: int, partition_id: int, attempt: int, counter: int) -> None:
    token = names.new_token()
    name = names.data_file_name(
        query_id=query_id, batch_id=batch_id, partition_id=partition_id, task_attempt_id=attempt, token=token, counter=counter
    )
    assert DataFileName.parse(name) == DataFileName(query_id[:8], batch_id, partition_id, attempt, token, counter)
    assert str(DataFileName.parse(name)) == name
    assert BatchDirectoryName.parse(name) is None
    assert names.batch_of(f"file:///wh/db/t/data/{name}") == BatchOfFile(query_id[:8], batch_id)
    assert names.batch_of(f"data/ts_day=2024-01-01/{name}") == BatchOfFile(query_id[:8], batch_id)


@pytest.mark.parametrize("query_id", QUERY_IDS, ids=QUERY_ID_IDS)
@pytest.mark.parametrize("batch_id", [0, 9, 99999, 1234567])
def test_batch_directory_names_round_trip(query_id: str, batch_id: int) -> None:
    token = names.new_token()
    directory = names.batch_directory_name(query_id=query_id, batch_id=batch_id, token=token)
    assert BatchDirectoryName.parse(directory) == BatchDirectoryName(query_id[:8], batch_id, token)
    assert str(BatchDirectoryName.parse(directory)) == directory
    assert DataFileName.parse(directory) is None
    # a file of the Spark path carries Spark's name: its batch is the directory's
    spark_file = f"part-00003-{uuid.uuid4()}-c000.zstd.parquet"
    for path in (f"s3://bucket/wh/t/data/{directory}/{spark_file}", f"data/{directory}/{spark_file}"):
        assert names.batch_of(path) == BatchOfFile(query_id[:8], batch_id)
    # a partitioned batch of the Spark path: the files sit in partition directories inside the batch directory
    for partition in ("ts_day=2024-03-05", "ts_day=2024-03-05/id_bucket_4=3", "lakesink_p0=__HIVE_DEFAULT_PARTITION__"):
        assert names.batch_of(f"file:///wh/t/data/{directory}/{partition}/{spark_file}") == BatchOfFile(query_id[:8], batch_id)
    assert names.batch_of(f"data/ts_day=2024-03-05/{spark_file}") is None  # Spark's writer, not lakesink's


def test_foreign_names_are_not_lakesinks() -> None:
    pyiceberg = "00000-0-1a56d2ad-148a-4a2b-9c3d-0123456789ab.parquet"
    spark_elsewhere = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    for path in (pyiceberg, f"data/{pyiceberg}", f"data/{spark_elsewhere}", spark_elsewhere, "data/x/notes.txt", ""):
        assert names.batch_of(path) is None, path
    assert DataFileName.parse("1964bb6e-00002-00000-2-1A56D2AD148A-00000.parquet") is None  # upper-case token
    assert DataFileName.parse("1964bb6e-0002-00000-2-1a56d2ad148a-00000.parquet") is None  # 4-digit batch
    assert BatchDirectoryName.parse("1964bb6e-00002-1a56d2ad148") is None  # 11-digit token


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"query_id": ""}, "cannot be part of a file name"),
        ({"query_id": "ab/cdefgh"}, "cannot be part of a file name"),
        ({"token": "0123456789AB"}, "hexadecimal"),
        ({"token": "0123"}, "hexadecimal"),
        ({"batch_id": -1}, "batch_id -1 is negative"),
        ({"task_attempt_id": -1}, "task_attempt_id -1 is negative"),
    ],
)
def test_names_that_would_not_parse_back_are_refused(kwargs: dict[str, object], problem: str) -> None:
    args: dict[str, object] = {
        "query_id": "1964bb6e-59a8",
        "batch_id": 1,
        "partition_id": 0,
        "task_attempt_id": 0,
        "token": "0123456789ab",
        "counter": 0,
    }
    with pytest.raises(ValueError, match=problem):
        names.data_file_name(**{**args, **kwargs})  # type: ignore[arg-type]


def test_the_executor_names_its_files_with_names(make_plan: MakePlan) -> None:
    plan = make_plan(pa.schema([pa.field("id", pa.int64())]))
    result = TaskWriter(plan, TaskIds(query_id="1964bb6e-59a8", batch_id=42, partition_id=3, task_attempt_id=17)).write(
        [pa.record_batch([pa.array([1, 2], pa.int64())], names=["id"])]
    )
    (f,) = result.files
    parsed = DataFileName.parse(Path(f.path).name)
    assert parsed is not None and (parsed.query_prefix, parsed.batch_id, parsed.partition_id, parsed.task_attempt_id) == (
        "1964bb6e",
        42,
        3,
        17,
    )


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("00003-6a1b2c3d-aaaa-bbbb-cccc-0123456789ab.metadata.json", "metadata"),
        ("v3.metadata.json.gz", "metadata"),
        ("snap-4185327516478212066-0-0b24891d-514a-455e-ba67-9a7f4522e22a.avro", "manifest-list"),
        ("0b24891d-514a-455e-ba67-9a7f4522e22a-m0.avro", "manifest"),
        ("part-00000-x-c000.zstd.parquet", "data"),
        ("x.orc", "data"),
        ("stats.puffin", "statistics"),
        (names.VERSION_HINT, "other"),
    ],
)
def test_file_kinds(name: str, kind: str) -> None:
    assert names.file_kind(name) == kind


def test_hidden_files_and_nested_tables() -> None:
    assert names.is_hidden("data/_temporary/0/part-0.parquet")
    assert names.is_hidden("data/.x.parquet.crc")
    assert not names.is_hidden("data/_key=1/x.parquet")  # a partition folder
    assert not names.is_hidden("data/q-00001-0123456789ab/part-0.parquet")
    assert names.nested_table_root("data/other/metadata/00000-x.metadata.json") == "data/other"
    assert names.nested_table_root("metadata/00000-x.metadata.json") is None


# --- commits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("query_id", QUERY_IDS, ids=QUERY_ID_IDS)
@pytest.mark.parametrize("batch_id", [0, 7, 123456])
def test_a_batch_commits_names_round_trip_through_pyicebergs_manifest_and_list_names(query_id: str, batch_id: int) -> None:
    commit = names.commit_name(names.BATCH, query_id=query_id, batch_id=batch_id, started_ms=1_795_000_000_123)
    assert names.CommitName.parse(str(commit)) == commit
    for name in (names.manifest_name(commit, 0), names.manifest_name(commit, 12), names.manifest_list_name(commit, -42, 3)):
        assert names.commit_of(name) == commit, name
        found = names.classify(f"s3://b/wh/t/metadata/{name}")
        assert found.batch == BatchOfFile(query_id[:8], batch_id) and found.commit == commit, found
        assert found.stamp_ms == 1_795_000_000_123 and found.lakesinks
    again = commit.next_attempt()
    assert (again.kind, again.started_ms, again.batch_id) == (commit.kind, commit.started_ms, commit.batch_id)
    assert again.token != commit.token


@pytest.mark.parametrize("kind", [names.COMPACT, names.MANIFESTS, names.BRANCH, names.RESTORE])
def test_a_maintenance_commits_names_round_trip(kind: str) -> None:
    commit = names.commit_name(kind)
    assert names.CommitName.parse(str(commit)) == commit and commit.batch_id is None
    assert abs(commit.started_ms - names.now_ms()) < 60_000
    for name in (names.manifest_name(commit, 1), names.manifest_list_name(commit, 5)):
        found = names.classify(f"metadata/{name}")
        assert found.commit == commit and found.batch is None and found.lakesinks
    if kind == names.COMPACT:
        data = names.commit_data_file_name(commit, 3)
        found = names.classify(f"file:///wh/t/data/ts_day=2024-01-01/{data}")
        assert found.kind == "data" and found.commit == commit and found.batch is None


def test_commit_names_are_refused_when_they_would_not_parse_back() -> None:
    with pytest.raises(ValueError, match="commit kind"):
        names.commit_name("vacuum")
    with pytest.raises(ValueError, match="needs the query id and the batch id"):
        names.commit_name(names.BATCH)
    with pytest.raises(ValueError, match="needs the query id and the batch id"):
        names.commit_name(names.COMPACT, query_id="q", batch_id=1)
    with pytest.raises(ValueError, match="negative"):
        names.commit_name(names.BATCH, query_id="q", batch_id=-1)
    with pytest.raises(ValueError, match="batch's data files"):
        names.commit_data_file_name(names.commit_name(names.BATCH, query_id="q", batch_id=1), 0)


def test_foreign_commit_names_are_not_lakesinks() -> None:
    foreign = [
        "0b24891d-514a-455e-ba67-9a7f4522e22a-m0.avro",  # pyiceberg and Iceberg Java
        "snap-4185327516478212066-1-0b24891d-514a-455e-ba67-9a7f4522e22a.avro",
        "lakesink-vacuum-01a2062eff72-45ae4bb8c014-m0.avro",  # not a kind lakesink makes
        "lakesink-batch-01a2062eff72-45ae4bb8c014-m0.avro",  # a batch's commit without its batch
        "lakesink-compact-01a2062eff72-45ae4bb8c014-00001-q-m0.avro",  # a maintenance commit with a batch
        "00000-0-1a56d2ad-148a-4a2b-9c3d-0123456789ab.parquet",
        "compact-0123456789ab-00000.parquet",  # lakesink's compaction output before its names came from here
    ]
    for name in foreign:
        found = names.classify(f"t/{name}")
        assert found.commit is None and found.batch is None and not found.lakesinks, name


def test_metadata_files_lakesink_writes_carry_their_time_and_keep_icebergs_layout() -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    name = names.metadata_file_name(12, at_ms=1_795_000_000_123)
    assert SqlCatalog._parse_metadata_version(f"file:///wh/t/metadata/{name}") == 12  # engines read the version
    uid = uuid.UUID(name.split("-", 1)[1].removesuffix(".metadata.json"))
    assert uid.version == 8 and uid.variant == uuid.RFC_4122
    found = names.classify(f"metadata/{name}")
    assert found.kind == "metadata" and found.stamp_ms == 1_795_000_000_123 and found.lakesinks
    other = names.classify("metadata/00012-6c97e413-d51b-4538-ac70-12fe2a85cb83.metadata.json")
    assert other.stamp_ms is None and not other.lakesinks
    assert len({names.stamped_uuid(5) for _ in range(100)}) == 100  # 62 random bits each


def test_the_window_and_the_deadline() -> None:
    assert names.COMMIT_DEADLINE_MS < names.IN_FLIGHT_WINDOW_MS  # a commit never swaps what the clean-up may delete
    assert names.IN_FLIGHT_WINDOW_MS - names.COMMIT_DEADLINE_MS >= 12 * 3600 * 1000  # room for clocks and slow swaps
