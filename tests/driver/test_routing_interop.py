"""Routed tables, committed through lakesink's manifest and manifest-list writers (lakesink/_pyiceberg/io/metadata.py),
read back identically by the engines that are not pyiceberg: DuckDB's C++ reader, iceberg-rust (pyiceberg-core on
DataFusion) and ClickHouse's reader (chdb). They parse the metadata.json, the manifest lists and the manifests
themselves (Avro schema, field ids, partition values, bounds, counts).

No Spark: lakesink's routed task writer writes the Parquet files, ``RoutedCommitter.commit_batch`` commits each batch
to every table as one unit (the tables prepared on lakesink's pool: more tables than
lakesink.table.keys.UNIT_THREADS_FROM), v1 and v2 tables, unpartitioned and partitioned (identity, days, bucket,
truncate), manifests merged along the way (``commit.manifest.min-count-to-merge`` 3), on a SQLite catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from lakesink.audit import interop
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskWriter
from lakesink.options import SinkOptions
from lakesink.table.keys import UNIT_THREADS_FROM
from tests.audit.test_interop import normalized

Q = "routing-interop-query"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
        ("user", pa.string()),
        ("amount", pa.float64()),
        ("day", pa.date32()),
        ("price", pa.decimal128(12, 2)),
        ("route", pa.string()),
    ]
)
TABLES = ["t0", "t1", "t2", "t3", "t4"]
BATCHES = 4
ROWS_PER_BATCH = 60
START = datetime(2024, 5, 1, tzinfo=timezone.utc)


def _batch(batch_id: int) -> pa.RecordBatch:
    ids = range(batch_id * ROWS_PER_BATCH, (batch_id + 1) * ROWS_PER_BATCH)
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "ts": [START + timedelta(hours=7 * i) for i in ids],
            "user": [None if i % 11 == 0 else f"user{i % 9}" for i in ids],
            "amount": [i / 3 for i in ids],
            "day": [date(1969, 12, 1) + timedelta(days=i % 45) for i in ids],
            "price": [Decimal(f"{i}.25") for i in ids],
            "route": [TABLES[i % len(TABLES)] for i in ids],
        },
        schema=SCHEMA,
    )


def _commit_batches(props: Mapping[str, str], **extra: str) -> RoutedCommitter:
    rc = RoutedCommitter(
        SinkOptions.from_mapping(
            {
                "route-by": "route",
                "namespace": "db",
                "maintenance": "off",
                "table-property.commit.manifest.min-count-to-merge": "3",
                **{f"catalog.{k}": v for k, v in props.items()},
                **extra,
            }
        ),
        SCHEMA,
    )
    for b in range(BATCHES):
        plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(TABLES, b), Q), Q, template=False)
        result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=b, partition_id=0, task_attempt_id=0)).write([_batch(b)])
        rc.commit_batch(BatchCall(Q, b, f'[{{"logOffset":{b}}}]'), [result])
    return rc


CASES = {
    "v1-unpartitioned": {"format-version": "1"},
    "v2-unpartitioned": {"format-version": "2"},
    "v1-identity": {"format-version": "1", "partitioned-by": "user, day"},
    "v2-days-bucket-truncate": {"format-version": "2", "partitioned-by": "days(ts), bucket(4, id), truncate(3, user)"},
    "v2-identity-decimal-double": {"format-version": "2", "partitioned-by": "identity(price), amount"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_routed_tables_read_the_same_in_duckdb_iceberg_rust_and_clickhouse(catalog_properties: dict[str, str], case: str) -> None:
    assert len(TABLES) >= UNIT_THREADS_FROM  # prepared on lakesink's pool, as a large unit is
    _commit_batches(catalog_properties, **CASES[case])
    all_ids: list[int] = []
    for i, name in enumerate(TABLES):
        table = catalogs.load_table_fresh(None, dict(catalog_properties), ("db", name))
        assert table.metadata.format_version == int(CASES[case]["format-version"])
        assert len(table.snapshots()) == BATCHES
        head = table.current_snapshot()
        assert head is not None
        manifests = head.manifests(table.io)
        assert len(manifests) < BATCHES  # merged along the way
        expected = normalized(table.scan().to_arrow())
        ids = [r["id"] for r in expected]
        assert ids == [x for x in range(BATCHES * ROWS_PER_BATCH) if x % len(TABLES) == i]
        all_ids += ids
        assert normalized(interop.duckdb_read(table.metadata_location)) == expected, "DuckDB"
        assert normalized(interop.iceberg_rust_read(table.metadata_location)) == expected, "iceberg-rust"
        assert normalized(interop.chdb_read(table.location())) == expected, "ClickHouse (chdb)"
        # filters on partition source columns, evaluated by each engine against the manifests' partition summaries
        # and the files' bounds
        sql = (
            "SELECT count(*) AS n, sum(id) AS s FROM t WHERE user = 'user3' OR id < 40 OR amount > 70"
            " OR price = 121.25 OR ts >= TIMESTAMP '2024-06-20 00:00:00'"
        )
        want = _count(expected)
        assert interop.duckdb_query(table.metadata_location, sql.replace("TIMESTAMP '", "TIMESTAMPTZ '")).to_pylist() == [want], (
            "DuckDB"
        )
        assert interop.iceberg_rust_query(table.metadata_location, sql).to_pylist() == [want], "iceberg-rust"
    assert sorted(all_ids) == list(range(BATCHES * ROWS_PER_BATCH))


def _count(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cut = int(datetime(2024, 6, 20, tzinfo=timezone.utc).timestamp() * 1_000_000)
    hits = [
        r["id"]
        for r in rows
        if r["user"] == "user3" or r["id"] < 40 or r["amount"] > 70 or r["price"] == Decimal("121.25") or r["ts"] >= cut
    ]
    return {"n": len(hits), "s": sum(hits) if hits else None}
