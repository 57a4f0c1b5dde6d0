"""A batch's commit as the driver-side entry points run it, after the batch was planned.

:func:`commit_or_abort`: the one commit of ``foreach_batch`` (one table or many) and of a staged batch, and the abort
that follows when it raised. :func:`commit_routed`: a routed batch from its plans on -- the replay check of the whole
batch before any file is written, the skip of a batch every table holds already, the write, the commit -- the same
sequence for foreach_batch's two write paths (lakesink.sink.foreach) and format("lakesink")'s staged batch
(lakesink.sink.staged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TypeVar

from lakesink.cdc.unavailable import LetterKey
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.actions.completeness import BatchTime
from lakesink.driver.committers.facts import NO_FACTS, BatchFacts
from lakesink.driver.committers.interface import BatchCommitter
from lakesink.driver.committers.routed import RoutedCommitter, RoutedOutcome
from lakesink.driver.tables.routed_tables import BatchPlans
from lakesink.errors import UnavailableValueError
from lakesink.executor.routed_writer import RoutedTaskResult
from lakesink.table.routes import Route

log = logging.getLogger("lakesink")

M = TypeVar("M")
OutcomeT = TypeVar("OutcomeT")


def commit_or_abort(
    committer: BatchCommitter[M], *, query_id: str, batch_id: int, results: Sequence[M], commit: Callable[[], OutcomeT]
) -> OutcomeT:
    """The batch's commit (``commit``: a call of the committer's ``commit_batch`` with what this batch knows, its
    arguments computed inside it), or, when it raised, what Spark does for a data source whose commit raised: abort
    with the complete task results (abort settles by reading the table; it never deletes files a committed snapshot
    references), and the error raised again. foreach_batch's one commit, for one table or many."""
    try:
        return commit()
    except BaseException:
        try:
            committer.abort_batch(query_id=query_id, batch_id=batch_id, results=results)
        except Exception:
            log.exception("lakesink: abort of batch %s failed; its files are left for orphan clean-up", batch_id)
        raise


def commit_routed(
    routed: RoutedCommitter,
    call: BatchCall,
    *,
    routes: Sequence[Route],
    plans: BatchPlans,
    write: Callable[[Mapping[str, frozenset[LetterKey]]], list[RoutedTaskResult]],
    batch_time: Callable[[], BatchTime | None],
    invalid: bool = False,
    facts: BatchFacts = NO_FACTS,
) -> RoutedOutcome:
    """A routed batch (``call``; its time is read by ``batch_time`` when the commit is made) whose tables are planned
    (``plans`` of ``routes``): a batch some of its tables hold already is decided for the whole batch, before any file
    is written (``check_replay_at_plan``); one every table held when it was planned is skipped; else its files are
    written (``write``, also when the batch has only rows of an invalid route, ``invalid``: dead letters) and committed
    as one unit with the batch's ``facts`` (what its changes carry beside its rows), or aborted when the commit raised.
    With option dead-letter-table, a batch whose write or commit finds changes holding Debezium's unavailable-value
    placeholder with no value to keep (UnavailableValueError) is written again, ``write`` given those keys per table
    (lakesink.executor.routed_writer.RoutedPlan.unavailable_letters: dead letters), until none is left: its dead
    letters and its other rows in one unit, as every routed batch."""
    routed.check_replay_at_plan(call, plans)
    batch_id = call.batch_id
    if (
        routes
        and not invalid
        and all(p.last_committed_batch is not None and batch_id <= p.last_committed_batch for p in plans.plans.values())
    ):
        # found committed in every table when planned: checked before any file is written
        return routed.skip_replay(call, routes=routes)
    letters: dict[str, frozenset[LetterKey]] = {}
    while True:
        try:
            results = write(letters) if routes or invalid else []
            return commit_or_abort(
                routed,
                query_id=call.query_id,
                batch_id=batch_id,
                results=results,
                commit=partial(_commit, routed, call, batch_time, results, facts),
            )
        except UnavailableValueError as e:
            # option cdc-format: changes with Debezium's unavailable-value placeholder and no value to keep, found by
            # the commit (the table holds no row of their key) or the writer (the batch deleted the key before): with
            # a dead-letter table, nothing committed, the batch written again with them as dead letters, one unit
            known = letters.get(e.table, frozenset())
            if routed.tables.dead_letters is None or e.keys <= known:
                raise
            letters[e.table] = known | e.keys
            log.warning(
                "lakesink: batch %s: %s change key(s) of table %s hold Debezium's unavailable-value placeholder with no "
                "value to keep: the batch is written again with them as dead letters (unavailable-value)",
                batch_id,
                len(e.keys - known),
                e.table,
            )


def _commit(
    routed: RoutedCommitter,
    call: BatchCall,
    batch_time: Callable[[], BatchTime | None],
    results: list[RoutedTaskResult],
    facts: BatchFacts,
) -> RoutedOutcome:
    return routed.commit_batch(replace(call, time=batch_time()), results, facts)
