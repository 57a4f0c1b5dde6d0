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
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.audit import interop
from lakesink.driver import catalogs
from tests.sink.test_routing_spark_writer import assert_exactly_once, write_plans_since
from tests.support.helpers import INPUT_FIELDS, assert_each_batch_once, data_files_on_disk, referenced_data_files, table_ids
from tests.support.routed_stream import RoutedInput, assert_routed_exactly_once

pytestmark = pytest.mark.spark


class DefaultRoutedStream(RoutedInput):
    atomic = "auto"

    def start(self) -> Any:
        sink = lakesink.foreach_batch(route_by="route", namespace="db", catalog_properties=self.props, atomic=self.atomic)
        return self.started(self.source().writeStream.foreachBatch(sink))  # as the guides (atomic: its default)


def run_three_batches(spark: Any, s: DefaultRoutedStream, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Three input files, a batch each, in one run (lakesink's log kept in ``caplog``): the Parquet write jobs' plans."""
    s.add_input(files=3)
    seen: set[int] = set()
    write_plans_since(spark, seen)
    with caplog.at_level(logging.INFO, logger="lakesink"):
        s.run()
    return write_plans_since(spark, seen)


def test_route_by_writes_with_sparks_writer_by_default_and_small_batches_on_the_driver(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A run's first batch (often a backlog) is written by Spark's writer, a split job; the next one, after a small
    batch, on the driver (the tables of a SQLite catalog commit as one unit): no write job, no Python worker."""
    s = DefaultRoutedStream(spark, tmp_path, catalog_properties)
    plans = run_three_batches(spark, s, caplog)
    assert len(plans) == 1 and "lakesink-split-" in plans[0], plans  # batch 0: a split job, no mapInArrow
    on_driver = [m for m in caplog.messages if "route-by batch=" in m and "on_driver=" in m]
    assert len(on_driver) == 2 and all(m.endswith("on_driver=True") for m in on_driver), on_driver  # batches 1, 2
    tables = assert_routed_exactly_once(catalog_properties, s.sent)
    for name, table in tables.items():
        assert_each_batch_once(table, name)
        read = Counter(interop.duckdb_query(table.metadata_location, "SELECT id FROM t").column("id").to_pylist())
        assert read == table_ids(table), name
        assert data_files_on_disk(table) <= referenced_data_files(table), name
    files = [Path(f).name for t in tables.values() for f in referenced_data_files(t)]
    # Spark's writer names its files part-*; the driver's are named like the Arrow path's (<query8>-<batch>-...)
    assert any(f.startswith("part-") for f in files) and any(not f.startswith("part-") for f in files), files


def test_without_one_unit_auto_never_writes_on_the_driver(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """atomic='off' (each table committed on its own): a replay may find the batch in some tables only and compare
    their digests, which differ between paths; writer='auto' keeps Spark's writer for every batch."""
    s = DefaultRoutedStream(spark, tmp_path, catalog_properties)
    s.atomic = "off"
    plans = run_three_batches(spark, s, caplog)
    assert len(plans) == 3 and all("lakesink-split-" in p for p in plans), plans  # a split job per batch
    assert not any("on_driver=True" in m for m in caplog.messages), caplog.messages
    assert_exactly_once(catalog_properties, s.sent)


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
