"""Table names on a case-insensitive catalog (AWS Glue, on moto's server behind the tests' fault proxy): routing
values that spell one table in different cases in DIFFERENT batches (``Orders`` in one, ``orders`` in the next) name
one table. Within a batch the spellings are refused (tests/driver/test_routing.py); across batches each batch must
land in that one table exactly once, through a crash between the tables' commits and its replay, with the committer
of one spelling never trusting a view of the table older than the other spelling's commits.

Every row has a unique id; the table is compared as a multiset.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import InjectedFault
from lakesink.faults import DRIVER_BETWEEN_TABLE_COMMITS
from lakesink.options import SinkOptions, TableName
from tests.driver.test_routing import SCHEMA, ids, options, run, snapshots
from tests.support.helpers import arrow_rows, commit, sink_committer, write_task
from tests.support.http_faults import FaultProxy


def test_spellings_of_one_table_in_different_batches_land_each_batch_once(
    glue_catalog_properties: dict[str, str], glue_proxy: FaultProxy, faults: Any
) -> None:
    glue_proxy.lowercase_glue_names()  # as AWS Glue: Orders and orders are one table
    props = dict(glue_catalog_properties)
    ns = f"db_{uuid.uuid4().hex[:8]}"

    def committer() -> RoutedCommitter:
        return RoutedCommitter(options(props, namespace=ns), SCHEMA)

    rc = committer()
    run(rc, 0, {"Orders": [1, 2], "t": [3]})
    run(rc, 1, {"orders": [4, 5], "t": [6]})
    run(rc, 2, {"ORDERS": [7], "t": [8]})  # the first spelling's committer again: after the others' commits
    run(rc, 3, {"Orders": [9]})
    assert ids(props, f"{ns}.orders") == Counter([1, 2, 4, 5, 7, 9])
    # a crash between the tables' commits of batch 4, then its replay by a new run: each table holds batch 4 once
    faults.arm(DRIVER_BETWEEN_TABLE_COMMITS, "raise")
    with pytest.raises(InjectedFault):
        run(rc, 4, {"orders": [10], "t": [11]})
    faults.clear()
    out = run(committer(), 4, {"orders": [10], "t": [11]})
    assert sorted(o.outcome.value for o in out.tables.values()) == sorted([Outcome.REPLAY_SKIPPED.value, Outcome.COMMITTED.value])
    assert ids(props, f"{ns}.orders") == Counter([1, 2, 4, 5, 7, 9, 10])
    assert ids(props, f"{ns}.t") == Counter([3, 6, 8, 11])
    for name in ("orders", "t"):
        batches = [s["batch_id"] for s in snapshots(props, f"{ns}.{name}")]
        assert len(batches) == len(set(batches)), (name, batches)  # no batch twice in a table


def test_a_single_table_sink_with_a_mixed_case_name_creates_and_writes_its_table(
    glue_catalog_properties: dict[str, str], glue_proxy: FaultProxy
) -> None:
    """Option table ``<db>.Events`` on Glue: the table Glue stores is ``events``; listed back as a sibling of the
    namespace it is the same table (its UUID), not another table at the same location (which used to drop the table
    lakesink had just created and refuse every start)."""
    glue_proxy.lowercase_glue_names()
    ns = f"db_{uuid.uuid4().hex[:8]}"
    props = dict(glue_catalog_properties)

    def committer() -> TableCommitter:
        c = sink_committer(SinkOptions(table=TableName((ns,), "Events"), catalog_properties=props))
        c.table.open_table(arrow_rows([]).schema)
        return c

    sink = committer()
    for b in range(2):
        commit(sink, "case-query", b, [write_task(sink, "case-query", b, [b * 10, b * 10 + 1])])
    restarted = committer()  # a restart: the table exists under its lowercase name
    replay = commit(restarted, "case-query", 1, [write_task(restarted, "case-query", 1, [10, 11])])
    assert replay.outcome is Outcome.REPLAY_SKIPPED
    assert catalogs.load(None, props).list_tables(ns) == [(ns, "events")]
    assert ids(props, f"{ns}.events") == Counter([0, 1, 10, 11])
