"""Option route-by's default writer (``writer='auto'``) in real local Spark: Spark's own Parquet writer wherever it keeps
the Arrow path's guarantees (issue 54: the guides' ``foreach_batch(route_by=...)`` got the Arrow path, about 0.6x of
Spark's own file sink, where ``writer='spark'`` gave 1.05x), the Arrow path where it does not: a table Spark's writer
cannot write (here: a column of type uuid), option ``payload`` / ``cdc-format`` and ``dead-letter-table`` (their tests:
test_payload_spark.py, test_routing_dead_letters_spark.py, test_cdc_format_spark.py).

Every input row has a unique id; its table is a function of its id; every table is compared with the ids sent to it (a
multiset) and read back by DuckDB (tests/sink/test_routing_spark_writer.py's checks).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.driver import catalogs
from tests.sink.test_routing_spark_writer import assert_exactly_once, write_plans_since
from tests.support.helpers import INPUT_FIELDS, referenced_data_files
from tests.support.routed_stream import RoutedInput, assert_routed_exactly_once

pytestmark = pytest.mark.spark


class DefaultRoutedStream(RoutedInput):
    def start(self) -> Any:
        sink = lakesink.foreach_batch(route_by="route", namespace="db", catalog_properties=self.props)  # as the guides
        return self.started(self.source().writeStream.foreachBatch(sink))


def test_route_by_writes_with_sparks_writer_by_default(spark: Any, tmp_path: Path, catalog_properties: dict[str, str]) -> None:
    s = DefaultRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=2)
    seen: set[int] = set()
    write_plans_since(spark, seen)
    s.run()
    plans = write_plans_since(spark, seen)
    assert len(plans) == 2 and all("lakesink-split-" in p for p in plans), plans  # a split job per batch, no mapInArrow
    assert_exactly_once(catalog_properties, s.sent)  # every table's files written by Spark (part-*), read by DuckDB


def test_a_table_sparks_writer_cannot_write_sends_the_batch_to_the_arrow_path(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField, UUIDType

    catalog = catalogs.load(None, catalog_properties)
    catalog.create_namespace_if_not_exists(("db",))
    catalog.create_table(("db", "t1"), schema=Schema(*INPUT_FIELDS, NestedField(6, "ref", UUIDType(), required=False)))
    s = DefaultRoutedStream(spark, tmp_path, catalog_properties)
    s.add_input(files=1)
    with caplog.at_level(logging.INFO, logger="lakesink"):
        s.run()
    assert "takes the Arrow path: Spark's writer cannot write table db.t1: column 'ref' has type uuid" in caplog.text
    tables = assert_routed_exactly_once(catalog_properties, s.sent)
    for name, table in tables.items():  # the whole batch through Python workers: no file of Spark's writer
        files = referenced_data_files(table)
        assert files and not any(Path(f).name.startswith("part-") for f in files), name
