"""How many threads prepare a unit of many tables' commits (lakesink._pyiceberg.threads.unit_threads).

On a local filesystem preparing a table's commit is CPU under one GIL: more threads than cores only hand it back and
forth (docs/performance.md, "One stream, many tables"), so a unit of local tables is prepared on the machine's cores.
On object storage each file is a round trip the pool overlaps: 8 threads. Checked on the pools a real routed batch
creates (their ``max_workers``), and that the batch still lands exactly.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from lakesink._pyiceberg import sql_catalog as seam_sql
from lakesink._pyiceberg import threads as seam_threads
from lakesink.driver import catalogs
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.driver.loop import swap
from lakesink.executor.messages import TaskIds
from lakesink.executor.routed_writer import RoutedTaskWriter
from lakesink.options import SinkOptions

Q = "threads-query"
SCHEMA = pa.schema([("id", pa.int64()), ("route", pa.string())])


def table_at(location: str) -> Any:
    return SimpleNamespace(
        metadata_location=f"{location}/metadata/00001-x.metadata.json", metadata=SimpleNamespace(location=location)
    )


@pytest.mark.parametrize("cores", [1, 2, 4, 16])
def test_local_tables_get_the_machines_cores_at_most_eight(monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    tables = [table_at("/data/wh/db.db/a"), table_at("file:///data/wh/db.db/b")]
    assert seam_threads.unit_threads(tables) == min(cores, 8)


@pytest.mark.parametrize("location", ["s3://bucket/wh/db.db/a", "gs://bucket/wh/a", "abfss://c@acct.dfs.core.windows.net/a"])
def test_a_unit_with_any_table_on_object_storage_gets_eight(monkeypatch: pytest.MonkeyPatch, location: str) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert seam_threads.unit_threads([table_at("/data/wh/db.db/a"), table_at(location)]) == 8
    assert seam_threads.unit_threads([table_at(location)]) == 8


def test_a_routed_batch_of_local_tables_is_prepared_on_the_cores(
    monkeypatch: pytest.MonkeyPatch, catalog_properties: dict[str, str]
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    pools: list[tuple[str, int]] = []

    class Recording(ThreadPoolExecutor):
        def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "", **kw: Any) -> None:
            pools.append((thread_name_prefix, max_workers or 0))
            super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix, **kw)

    monkeypatch.setattr(swap, "ThreadPoolExecutor", Recording)
    monkeypatch.setattr(seam_sql, "ThreadPoolExecutor", Recording)
    options = SinkOptions.from_mapping(
        {
            "route-by": "route",
            "namespace": "db",
            "maintenance": "off",
            **{f"catalog.{k}": v for k, v in catalog_properties.items()},
        }
    )
    rc = RoutedCommitter(options, SCHEMA)
    names = [f"t{i}" for i in range(6)]
    sent: dict[str, Counter[int]] = {}
    for batch in range(3):  # batch 0 creates the tables; 1 and 2 commit into tables that exist
        ids = [100 * batch + i for i in range(12)]
        routes = [names[i % len(names)] for i in range(len(ids))]
        for i, r in zip(ids, routes, strict=True):
            sent.setdefault(r, Counter())[i] += 1
        rows = pa.RecordBatch.from_pydict({"id": ids, "route": routes}, schema=SCHEMA)
        plan = rc.tables.routed_plan(rc.tables.plans(rc.tables.routes(names, batch), Q), Q, template=False)
        result = RoutedTaskWriter(plan, TaskIds(query_id=Q, batch_id=batch, partition_id=0, task_attempt_id=0)).write([rows])
        rc.commit_batch(BatchCall(Q, batch, f'[{{"logOffset":{batch}}}]'), [result])
    assert ("lakesink-prepare", 2) in pools, pools
    assert all(workers == 2 for _, workers in pools), pools
    catalog = catalogs.load(None, catalog_properties)
    for name in names:
        got = Counter(catalog.load_table(("db", name)).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())
        assert got == sent[name], name
