"""The small-batch path of foreach_batch (lakesink.sink.driver_write): rows collected as Arrow, written on the driver.

The exactly-once tests of both entry points run over it too (the ``foreach-driver`` entry of the ``stream``
fixture: tests/sink/test_spark_sink.py, tests/sink/test_fault_matrix.py, tests/sink/test_types.py, ...), and the
kill -9 soak (tests/test_soak.py); here: which batches ``writer="auto"`` writes where.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import lakesink
from lakesink.driver import catalogs
from lakesink.sink.driver_write import SMALL_BATCH_ROWS
from lakesink.table.names import BatchDirectoryName, DataFileName
from tests.support.helpers import (
    SCHEMA_DDL,
    assert_files_are_referenced,
    assert_snapshot_invariants,
    referenced_data_files,
    run_to_end,
    table_ids,
    write_json_input,
)

pytestmark = pytest.mark.spark


def _files_by_batch(table: Any) -> dict[int, list[str]]:
    """The table's data files by the batch their name says wrote them, as paths relative to the data folder:
    ``<batch directory>/part-...`` (Spark's writer) or ``<query8>-<batch>-...parquet`` (lakesink's TaskWriter)."""
    data = table.location().rstrip("/") + "/data/"
    out: dict[int, list[str]] = {}
    for path in referenced_data_files(table):
        relative = path.split(data, 1)[1]
        directory = BatchDirectoryName.parse(relative.split("/")[0]) if "/" in relative else None
        file = DataFileName.parse(relative) if "/" not in relative else None
        assert directory is not None or file is not None, path
        batch = directory.batch_id if directory is not None else file.batch_id  # type: ignore[union-attr]
        out.setdefault(batch, []).append(relative)
    return out


def _run(
    spark: Any, src: Path, ck: Path, props: dict[str, str], rows_per_file: list[int], *, start: int = 0, **options: Any
) -> list[int]:
    """One run of the query over new input files of ``rows_per_file`` rows each (ids from ``start``): one batch each."""
    sent: list[int] = []
    for n in rows_per_file:
        sent += write_json_input(src, files=1, rows_per_file=n, start=start + len(sent))
    df = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(str(src))
    sink = lakesink.foreach_batch("db.events", catalog_properties=props, **options)
    run_to_end(df.writeStream.foreachBatch(sink).option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    return sent


def test_auto_writes_a_batch_on_the_driver_after_a_small_batch_of_the_same_run(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    src = tmp_path / "input"
    src.mkdir()
    # batch 0: the run's first (Spark's writer); 1: after a small batch (driver); 2: after a small batch (driver,
    # though larger itself); 3: after a batch over the limit (Spark's writer again)
    sent = _run(spark, src, tmp_path / "ck", catalog_properties, [20, 30, SMALL_BATCH_ROWS + 1, 40])
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
    files = _files_by_batch(table)
    assert sorted(files) == [0, 1, 2, 3]

    def spark_path(names: list[str]) -> bool:
        return bool(names) and all("/" in n for n in names)

    def driver_path(names: list[str]) -> bool:
        return bool(names) and all("/" not in n for n in names)

    assert spark_path(files[0]) and driver_path(files[1]) and driver_path(files[2]) and spark_path(files[3]), files
    assert_files_are_referenced(table)


def test_a_new_run_starts_on_spark_s_writer_then_goes_back_to_the_driver(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    src, ck = tmp_path / "input", tmp_path / "ck"
    src.mkdir()
    sent = _run(spark, src, ck, catalog_properties, [10, 10])
    sent += _run(spark, src, ck, catalog_properties, [10, 10], start=len(sent))
    table = catalogs.load(None, catalog_properties).load_table(("db", "events"))
    assert table_ids(table) == Counter(sent)
    files = _files_by_batch(table)
    layout = ["spark" if "/" in names[0] else "driver" for _, names in sorted(files.items())]
    assert layout == ["spark", "driver", "spark", "driver"], files


def test_route_by_values_read_from_the_collected_rows_equal_the_spark_job_s(spark: Any) -> None:
    """Route-by on the driver reads the batch's routing values from the rows it collects (no Spark job of their own):
    the same values as the Spark job over the batch finds -- each once, a null as None, a value that is not UTF-8 as
    its bytes (an invalid route, kept exactly), names that differ by case or namespace apart."""
    from lakesink.sink import driver_write
    from lakesink.sink.spark import routed as spark_routed

    df = spark.sql(
        "SELECT r, id FROM VALUES ('db.a', 1), ('b', 2), ('db.a', 3), (NULL, 4), ('B', 5), ('b', 6), "
        "(CAST(unhex('FF61') AS STRING), 7), ('ns.x.y', 8), ('', 9), (NULL, 10) AS t(r, id)"
    )
    collected = driver_write.collect(df, table="route-by", batch_id=0)
    assert collected is not None and collected.num_rows == 10
    here = driver_write.routing_values(collected, "r")
    there = spark_routed.routing_values(df, "r")
    assert Counter(map(repr, here)) == Counter(map(repr, there))
    assert sorted(map(repr, here)) == sorted(map(repr, ["db.a", "b", None, "B", b"\xffa", "ns.x.y", ""]))
