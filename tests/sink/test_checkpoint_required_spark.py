"""A query whose next start would not find its checkpoint (a new query id: no exactly-once across restarts) is refused
by both entry points, before anything is written; foreach_batch(allow_temporary_checkpoint=True) runs it with a warning."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

import lakesink
from lakesink.driver import catalogs
from tests.support.helpers import SCHEMA_DDL, TABLE, run_to_end, table_ids, write_json_input

pytestmark = pytest.mark.spark

SESSION_ROOT = "spark.sql.streaming.checkpointLocation"


def _table_exists(props: dict[str, str]) -> bool:
    return bool(catalogs.load(None, props).table_exists(tuple(TABLE.split("."))))


def _input(spark: Any, tmp_path: Path) -> tuple[Any, list[int]]:
    ids = write_json_input(tmp_path / "input", files=2, rows_per_file=20)
    return spark.readStream.schema(SCHEMA_DDL).json(str(tmp_path / "input")), ids


@pytest.fixture
def session_root(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """spark.sql.streaming.checkpointLocation set for one test."""
    root = tmp_path / "checkpoints"
    spark.conf.set(SESSION_ROOT, str(root))
    try:
        yield root
    finally:
        spark.conf.unset(SESSION_ROOT)


def test_foreach_batch_refuses_spark_temporary_checkpoint(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    df, _ = _input(spark, tmp_path)
    sink = lakesink.foreach_batch(TABLE, catalog_properties=catalog_properties)
    with pytest.raises(StreamingQueryException) as info:
        run_to_end(df.writeStream.foreachBatch(sink).trigger(availableNow=True).start())
    message = str(info.value)
    assert "temporary checkpoint" in message and "checkpointLocation" in message, message
    assert "allow_temporary_checkpoint=True" in message, message
    assert not _table_exists(catalog_properties)  # refused before the table was created, nothing written


def test_foreach_batch_refuses_a_random_checkpoint_under_the_session_root(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], session_root: Path
) -> None:
    df, _ = _input(spark, tmp_path)
    sink = lakesink.foreach_batch(TABLE, catalog_properties=catalog_properties)
    with pytest.raises(StreamingQueryException) as info:
        run_to_end(df.writeStream.foreachBatch(sink).trigger(availableNow=True).start())
    assert "queryName" in str(info.value) and SESSION_ROOT in str(info.value), str(info.value)
    assert not _table_exists(catalog_properties)
    # with a queryName the session root gives a lasting checkpoint: accepted
    ids = _input(spark, tmp_path / "named")[1]
    df = spark.readStream.schema(SCHEMA_DDL).json(str(tmp_path / "named" / "input"))
    run_to_end(df.writeStream.queryName("named_events").foreachBatch(sink).trigger(availableNow=True).start())
    assert (session_root / "named_events" / "metadata").exists()
    assert table_ids(catalogs.load(None, catalog_properties).load_table(("db", "events"))) == Counter(ids)


def test_foreach_batch_runs_on_a_temporary_checkpoint_when_allowed(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    df, ids = _input(spark, tmp_path)
    sink = lakesink.foreach_batch(TABLE, catalog_properties=catalog_properties, allow_temporary_checkpoint=True)
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        run_to_end(df.writeStream.foreachBatch(sink).trigger(availableNow=True).start())
    assert table_ids(catalogs.load(None, catalog_properties).load_table(("db", "events"))) == Counter(ids)
    warnings = [r.getMessage() for r in caplog.records if "allow_temporary_checkpoint=True" in r.getMessage()]
    assert len(warnings) == 1 and "temporary checkpoint" in warnings[0], warnings


def test_format_refuses_a_query_without_checkpoint_location(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], session_root: Path
) -> None:
    """format('lakesink') never runs on a temporary checkpoint: Spark refuses a query with no checkpoint at all (the
    source is not one of Spark's one-time sinks), and lakesink refuses one whose checkpoint comes from the session's
    root (it must read the query id from the folder the option names)."""
    df, _ = _input(spark, tmp_path)
    writer = df.writeStream.format("lakesink").option("table", TABLE).trigger(availableNow=True)
    for k, v in catalog_properties.items():
        writer = writer.option(f"catalog.{k}", v)
    with pytest.raises(StreamingQueryException) as info:
        run_to_end(writer.start())
    assert "option 'checkpointLocation' is required with format('lakesink')" in str(info.value)
    spark.conf.unset(SESSION_ROOT)
    with pytest.raises(AnalysisException, match="checkpointLocation must be specified"):
        writer.start()
    assert not _table_exists(catalog_properties)
