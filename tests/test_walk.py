"""The walk of one batch's commit stays short (issue 31, "one path"): the lakesink modules the driver's commit of one
batch enters, counted by tests/support/walk.py (``sys.setprofile``), at most what docs/architecture.md ("Where a batch
gets committed") gives -- so the walk cannot grow silently. A change that needs one more module on the walk raises the
number here and in the docs, saying why.

Measured with the same tracer on b345ef1 (before issue 31's rebuild) / 61f3c07 (the start of the last round) /
6c0af56 (the start of this one) / 987a169 / now: format("lakesink") one table 22 / 30 / 25 / 21 / 21, route-by (two
tables) 27 / 40 / 33 / 26 / 25; foreach_batch one table 18 / 27 / 23 / 17 / 17, route-by 20 / 33 / 29 / 21 / 19 (20 on
8da9c98: the commit entered lakesink.driver.committers.routed_tables, the tables' planning, for the committers, the
batch's routes and the replay decided at plan; they are the commit's now, the routes a function of table.routes). Each
test fails on 6c0af56 (the route-by ones entered lakesink.driver.actions.held, the held-back changes' module, with
option cdc-transactions off); the route-by ones also fail on 987a169 (the driver entered lakesink.executor.row_digest,
the executors' row hash, to add the tasks' RowsDigests up: the digest's type and its sum are now the message's,
lakesink.executor.messages). One more on each on 76ad81f-5c0ffa5 (issue 52: an append read its parent's manifest
list with the manifest readers the merge-on-read lookups share, in lakesink._pyiceberg.io.manifests, beside
lakesink._pyiceberg.metadata that writes); back since both are one module of Iceberg's metadata files,
lakesink._pyiceberg.io.metadata (issue 53: no longer than 21 / 25 / 17 / 19). foreach_batch 16 / 18 since the tables
read and committed are kept by the commit seam (lakesink._pyiceberg.commit.load_table/remember, the swapper reading
the pointers) and the catalog's kind answers may_apply_late itself: the commit no longer enters
lakesink.driver.catalogs, which opens catalogs (format("lakesink") still enters it: its commit worker makes the
committer, which opens the catalog); the foreach_batch tests fail on 4103e00 (17 / 19).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.walk import foreach_commit_walk, stream_commit_walk

WALKS = {
    ("format", "one table"): 21,
    ("format", "route-by"): 25,
    ("foreach_batch", "one table"): 16,
    ("foreach_batch", "route-by"): 18,
}

NEVER_ENTERED = {
    "lakesink._pyiceberg.rest_metrics",  # a commit report goes to a REST catalog only: not asked on a SQL catalog
    "lakesink.driver.report.prometheus",  # option metrics not set
    "lakesink.driver.actions.dead_letters",  # no dead-letter table
    "lakesink.driver.actions.upsert",  # no upsert-key
    "lakesink.driver.actions.upsert_order",
    "lakesink.driver.actions.held",  # option cdc-transactions not set (was entered on every routed batch until 6c0af56)
    "lakesink.driver.loop.validation",  # an append validates nothing since its base
    "lakesink.driver.actions.completeness",  # no watermark, no option event-time: nothing about event time to record
    "lakesink._pyiceberg.io.schemas",  # route-by: no template made for a commit that writes no new table
    "lakesink.table.partitioning",
    "lakesink.executor.row_digest",  # the row hash runs in the tasks; the driver adds RowsDigests up (executor.messages)
}


@pytest.mark.parametrize(("entry", "kind"), list(WALKS), ids=[f"{e}-{k}" for e, k in WALKS])
def test_the_walk_of_one_batchs_commit_stays_short(
    entry: str, kind: str, catalog_properties: dict[str, str], tmp_path: Path
) -> None:
    routed = kind == "route-by"
    if entry == "format":
        walk = stream_commit_walk(catalog_properties, tmp_path, routed=routed)
    else:
        walk = foreach_commit_walk(catalog_properties, routed=routed)
    assert "lakesink.driver.actions.batch" in walk and "lakesink.driver.loop.swap" in walk  # the tracer sees the commit
    assert walk & NEVER_ENTERED == set()
    assert len(walk) <= WALKS[(entry, kind)], (
        f"the commit of one batch ({entry}, {kind}) enters {len(walk)} modules, more than {WALKS[(entry, kind)]}: "
        + ", ".join(sorted(walk))
    )
