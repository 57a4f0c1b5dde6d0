"""A routed batch's facts are a value (issue 53, item 1): what its changes carry beside its rows -- the tables it
truncates and where, what it holds back (option cdc-transactions=hold) -- travels as one frozen
:class:`~lakesink.driver.committers.facts.BatchFacts`, produced by the entry points' steps and passed to
``RoutedCommitter.plans`` and ``commit_batch``; the committer keeps none of it between calls.

No Spark: the facts come from the steps both entry points run (lakesink.sink.cdc.truncates.mark, as format("lakesink")'s
staged commit calls it), the tasks' files are written by the routed task writer (tests/driver/test_routing_upserts.py),
and two batches' facts are made first and committed through one committer in the other order: each batch lands with
its own truncate and its own held-back record, which a committer carrying facts from one call to the next would mix.
"""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal

import pyarrow as pa

from lakesink.driver import catalogs
from lakesink.driver.actions import held
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.facts import NO_FACTS
from lakesink.sink.cdc import truncates
from lakesink.table.keys import SUMMARY_CDC_HELD_CHANGES
from tests.driver import test_routing_upserts as routing
from tests.support import routed_upserts

Event = routing.Event


def held_record() -> pa.Table:
    """One change of an open source transaction, as Kafka delivers a Debezium record (the PostgreSQL connector's
    envelope: ``before``, ``after``, ``source``, ``op``, ``ts_ms``, ``transaction`` with the provide.transaction.metadata
    fields ``id``, ``total_order``, ``data_collection_order``), with its Kafka offset."""
    value = {
        "before": None,
        "after": {"id": 40, "value": "held", "seq": 400},
        "source": {
            "version": "2.7.3.Final",
            "connector": "postgresql",
            "name": "pg",
            "ts_ms": 1_700_000_000_000,
            "snapshot": "false",
            "db": "shop",
            "sequence": '["0","400"]',
            "schema": "public",
            "table": "b",
            "txId": 771,
            "lsn": 400,
            "xmin": None,
        },
        "op": "c",
        "ts_ms": 1_700_000_000_100,
        "transaction": {"id": "771:400", "total_order": 1, "data_collection_order": 1},
    }
    return pa.table({"value": [json.dumps(value)], "offset": pa.array([17], pa.int64())})


def head_held(props: dict[str, str], name: str) -> str | None:
    """What the table's last snapshot records of the changes its batch held back."""
    table = catalogs.load_table_fresh(None, dict(props), ("db", name))
    head = table.current_snapshot()
    assert head is not None and head.summary is not None
    return head.summary.get(SUMMARY_CDC_HELD_CHANGES)


def test_two_batches_facts_committed_in_the_other_order_each_land_as_their_own(catalog_properties: dict[str, str]) -> None:
    """Batch 1 truncates table a (at source position 100) and holds nothing back; batch 2 writes table b, truncates
    nothing and holds one change back. Both batches' facts are made, and their files written, before either commits;
    then batch 2 commits, then batch 1. Fails when a batch's facts are attributes of the committer (written by the
    steps that find them, read by the commit): batch 1's commit then takes batch 2's -- a is not truncated (keys 1 and
    2 stay) and a records batch 2's held-back change."""
    props = catalog_properties
    rc = routing.routed(props)
    first: list[Event] = [("a", 1, "one", 10, False), ("a", 2, "two", 20, False), ("b", 1, "b-one", 11, False)]
    routed_upserts.commit_or_abort(rc, routing.Q, 0, routing.write(rc, 0, first), '[{"logOffset":0}]')

    # batch 1: a truncate of table a at 100, then a change after it (what truncates.apply leaves of the batch)
    one: list[Event] = [("a", 5, "five", 110, False)]
    values_one, facts_one = truncates.mark(rc, rc.tables.routing, {"a": Decimal(100)}, ["a"], NO_FACTS)
    # batch 2: table b, no truncate; one change of an open transaction held back
    two: list[Event] = [("b", 3, "b-three", 120, False)]
    values_two, facts_two = truncates.mark(rc, rc.tables.routing, {}, ["b"], NO_FACTS)
    back = held.HeldBack(
        rows=held_record(), changes=1, oldest_ms=1_700_000_000_100, committed_ms=None, waiting_for="771:400", previous=None
    )
    facts_two = replace(facts_two, held=back)
    assert (values_one, values_two) == (["a"], ["b"])
    assert facts_one.truncating == {"db.a"} and facts_one.truncated_at == {"db.a": Decimal(100)} and facts_one.held is None
    assert not facts_two.truncating and facts_two.held is back

    results_one = routing.write(rc, 1, one, facts=facts_one)
    results_two = routing.write(rc, 2, two, facts=facts_two)
    out_two = routed_upserts.commit_or_abort(rc, routing.Q, 2, results_two, '[{"logOffset":2}]', facts_two)
    out_one = routed_upserts.commit_or_abort(rc, routing.Q, 1, results_one, '[{"logOffset":1}]', facts_one)

    assert {n: o.outcome for n, o in out_two.tables.items()} == {"db.b": Outcome.COMMITTED}
    assert {n: o.outcome for n, o in out_one.tables.items()} == {"db.a": Outcome.COMMITTED}
    assert routing.state(props, ["db.a", "db.b"]) == {
        "db.a": {5: ("five", 110)},  # batch 1's truncate: the rows before it gone
        "db.b": {1: ("b-one", 11), 3: ("b-three", 120)},  # batch 2 truncates nothing
    }
    key = held.property_key(routing.Q, rc.options.sink_id)
    b = catalogs.load_table_fresh(None, dict(props), ("db", "b"))
    a = catalogs.load_table_fresh(None, dict(props), ("db", "a"))
    assert head_held(props, "b") == "1" and key in b.properties  # batch 2's record
    assert head_held(props, "a") is None and key not in a.properties  # batch 1 holds nothing
