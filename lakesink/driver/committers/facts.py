"""What a routed batch's changes tell its planning and its commit, as one value: :class:`BatchFacts`.

How a Debezium change reaches the commit: the entry point (lakesink.sink.foreach, lakesink.sink.staged) infers each
table's columns and carried keys from the batch's payloads, marks the tables its truncates empty (lakesink.sink.cdc.truncates)
and, with option cdc-transactions=hold, splits off what the batch holds back (lakesink.sink.cdc.transactions,
lakesink.sink.cdc.staged_transactions); each step returns a new ``BatchFacts``, which the entry point passes to
``RoutedCommitter.plans`` and ``RoutedCommitter.commit_batch``; what the planning learned (a ``BatchPlans``) goes on to
the replay check at plan time and the tasks' plan. The committer keeps none of it between calls: two batches' facts
committed through one committer, in any order, each land as their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from lakesink.cdc import binlog
from lakesink.driver.actions.held import HeldBack
from lakesink.driver.tables.routed_tables import TableFacts


@dataclass(frozen=True)
class BatchFacts(TableFacts):
    """One routed batch's facts beside its rows (none of them: :data:`NO_FACTS`, a batch of plain rows): what its
    tables' planning takes (:class:`~lakesink.driver.tables.routed_tables.TableFacts`: each table's columns, the keys
    its changes carry) and what its commit takes besides."""

    truncating: frozenset[str] = frozenset()
    """Option cdc-format: the tables the batch truncates (lakesink.sink.cdc.truncates keeps only their changes after the
    truncate): their part of the unit replaces everything live (actions.batch.action_for)."""
    truncated_at: Mapping[str, Decimal] = field(default_factory=dict)
    """Of them, each one's truncate position (the source position): with order-by, the floor its commit records
    (actions.batch.TruncateBatch)."""
    truncated_time: Mapping[str, Any] = field(default_factory=dict)
    """Option history: of them, each one's truncate time at its source (Debezium's ``source.ts_ms``): the versions it
    ends end then (lakesink.driver.actions.history)."""
    binlog_seen: Mapping[str, binlog.Seen] = field(default_factory=dict)
    """Option cdc-format: per table, its changes' greatest source position and the change made last: checked against
    the table's binlog high-water mark, which the batch's commit raises (lakesink.cdc.binlog.HighWater)."""
    held: HeldBack | None = None
    """Option cdc-transactions=hold: what the batch holds back, recorded in every table of its unit, in the same commit
    (lakesink.driver.actions.held). None (the option off): the batch's commit does not enter that module."""
    held_tables: tuple[str, ...] = ()
    """Option cdc-transactions=hold: the tables that recorded the state the batch started from."""
    held_homes: frozenset[str] = frozenset()
    """Option cdc-transactions=hold: the tables a batch that releases no change made for the changes it holds back,
    when no table recorded what the sink holds yet (lakesink.sink.cdc.transactions.homes): in its unit without a row,
    their commits carry the record."""


NO_FACTS = BatchFacts()
"""A batch whose rows are all there is to it (no payload, no truncate, nothing held back)."""
