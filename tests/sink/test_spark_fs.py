"""Which Hadoop filesystem scheme Spark's writer would need for a table location."""

from __future__ import annotations

import pytest

from lakesink.sink.spark.fs import hadoop_scheme


@pytest.mark.parametrize(
    ("location", "scheme"),
    [
        ("s3://bucket/wh/db/t/data", "s3a"),  # pyiceberg's s3:// is Hadoop's s3a://
        ("S3://bucket/wh", "s3a"),
        ("s3a://bucket/wh", "s3a"),
        ("file:///srv/wh", "file"),
        ("/srv/wh", "file"),
        ("gs://bucket/wh", "gs"),
        ("abfss://c@acct.dfs.core.windows.net/wh", "abfss"),
        ("hdfs://nn:8020/wh", "hdfs"),
    ],
)
def test_hadoop_scheme(location: str, scheme: str) -> None:
    assert hadoop_scheme(location) == scheme
