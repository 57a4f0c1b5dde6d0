"""Route-by with writer='spark' uses two column names of its own while it writes (lakesink.sink.spark.routed: the
table's number in its write job, ``__lakesink_route``, and each row's hash, ``__lakesink_row_hash``): a stream column of
either name is refused before any table is opened or any file written, appends and upserts alike, naming the column
and the fix. Real local Spark, a SQLite catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException

import lakesink
from lakesink.driver import catalogs
from lakesink.sink.spark.routed import HASH_COLUMN, ROUTE_KEY
from tests.support.helpers import run_to_end

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("column", [HASH_COLUMN, ROUTE_KEY])
@pytest.mark.parametrize("upserts", [False, True], ids=["appends", "upserts"])
def test_a_stream_column_named_as_the_spark_writers_own_is_refused_before_any_table_is_opened(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], column: str, upserts: bool
) -> None:
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(
        pa.table({"route": ["t0", "t1", "t0"], "id": [1, 2, 3], "seq": [1, 2, 3], column: ["a", "b", "c"]}), src / "b0.parquet"
    )
    keyed: dict[str, Any] = {"upsert_key": "id", "order_by": "seq"} if upserts else {}
    props = catalog_properties
    sink = lakesink.foreach_batch(route_by="route", namespace="db", writer="spark", catalog_properties=props, **keyed)
    df = spark.readStream.schema(f"route STRING, id LONG, seq LONG, `{column}` STRING").parquet(str(src))
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
    with pytest.raises(StreamingQueryException, match=f"has a column '{ROUTE_KEY}' or '{HASH_COLUMN}'.*rename it"):
        run_to_end(q.start())
    catalog = catalogs.load(None, props)
    assert not catalog.list_namespaces() or not catalog.list_tables(("db",))
    assert not any(p.is_file() for p in (tmp_path / "warehouse").rglob("*.parquet"))
