"""Table properties are parsed once, on the driver, into TableSettings: bad values name the property and the table."""

from __future__ import annotations

import pytest

from lakesink.errors import InvalidOptionError
from lakesink.table.settings import CommitRetry, TableSettings


def test_defaults_are_icebergs() -> None:
    s = TableSettings.parse("db.t", {})
    assert s == TableSettings()
    assert s.target_file_size == 512 * 1024 * 1024 and s.codec == "zstd" and s.manifest_merge is True
    assert s.commit_retry == CommitRetry(num_retries=4, min_wait_ms=100, max_wait_ms=60_000, total_timeout_ms=1_800_000)


def test_values_are_read_and_typed() -> None:
    s = TableSettings.parse(
        "db.t",
        {
            "write.target-file-size-bytes": "1048576",
            "write.parquet.compression-codec": "NONE",
            "write.parquet.compression-level": "3",
            "commit.manifest-merge.enabled": "False",
            "commit.retry.num-retries": "0",
            "write.lakesink.max-open-files": "7",
        },
    )
    assert (s.target_file_size, s.codec, s.compression_level, s.manifest_merge) == (1048576, "uncompressed", 3, False)
    assert s.commit_retry.num_retries == 0 and s.max_open_files == 7


def test_every_bad_value_is_listed_with_the_table() -> None:
    with pytest.raises(InvalidOptionError) as info:
        TableSettings.parse(
            "db.events",
            {
                "write.target-file-size-bytes": "512MB",
                "commit.retry.num-retries": "-1",
                "write.parquet.compression-codec": "lzma",
                "commit.manifest-merge.enabled": "yes",
            },
        )
    message = str(info.value)
    for part in (
        "table db.events",
        "write.target-file-size-bytes='512MB' is not an integer",
        "commit.retry.num-retries='-1' must be at least 0",
        "write.parquet.compression-codec='lzma' is not a known codec",
        "commit.manifest-merge.enabled='yes' must be 'true' or 'false'",
        "ALTER TABLE db.events SET TBLPROPERTIES",
    ):
        assert part in message
