"""Option cdc-transactions=hold on ``format("lakesink")``: a source transaction cut by two micro-batches held back.

foreach_batch decides with Spark before it parses a batch (lakesink.sink.cdc.transactions). ``format("lakesink")``'s commit
runs in a Python worker without Spark, after the executors staged their records (lakesink.executor.staged: with the
option, each task stages its records as they came -- the tables' changes and the transaction topic's ``BEGIN``/``END``
records, Kafka's ``offset`` beside them -- neither parsed nor inferred). Here, in the commit, before anything else:

1. the state the batch starts from is read from the tables (the property ``lakesink.cdc-held.<query>`` their last unit
   set: lakesink.sink.cdc.transactions.starting_state; a replay of a batch whose commit landed starts from the state that
   batch started from), and the records it held back are read first;
2. those and every task's staged records are split by the same plain-Python decision foreach_batch's Spark job makes
   (lakesink.cdc.transactions.split_records: in commit order, the longest prefix of whole transactions);
3. the released records are parsed, inferred and staged by the staging writer's own code
   (:meth:`lakesink.executor.staged.StagedTaskWriter.stage`), as one task of the batch: the commit then goes on as
   without the option (lakesink.sink.staged), over exactly the rows it commits (a column, a key, a truncate of a held
   change is not the table's yet);
4. what is held back goes to the batch's commit (``BatchFacts.held``: the routed committer writes it as the held file and
   names it in every table of the batch's unit, in the same atomic commit, lakesink.driver.actions.held), or deletes
   it when that commit did not land;
5. a batch that plans no table while it holds changes back and no table records what the sink holds (the query's
   first batches, one transaction open) has nowhere to record them: its held changes are parsed and inferred by the
   staging writer's code, nothing staged (:func:`home_inference`), and foreach_batch's decision
   (lakesink.sink.cdc.transactions.homes) makes their tables, empty, in the batch's unit (``BatchFacts.held_homes``).

Cost: the released records are parsed and their payloads inferred in the commit worker (without the option the
executors do both); the held records are read and rewritten every batch (docs/cdc.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa

from lakesink.cdc import transactions as cdc_transactions
from lakesink.driver.actions import held
from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import TaskIds
from lakesink.executor.staged import StagedPlan, StagedTaskResult, StagedTaskWriter, read_staged
from lakesink.options import CDC_TRANSACTIONS
from lakesink.sink.cdc import transactions

log = logging.getLogger("lakesink")

_KNOWN: dict[tuple[str, str | None], tuple[int, tuple[str, ...]]] = {}
"""Per query and sink: the last batch this worker committed and the tables of its unit, where the next batch finds
the held record without listing the sink's namespaces (Spark reuses its commit worker). Used only for the batch right
after it: another worker may have committed a later one."""


def check_records(raw: pa.Schema) -> None:
    """The stream's columns hold Kafka's ``value`` and ``offset`` (checked when the query starts)."""
    if transactions.OFFSET not in raw.names or "value" not in raw.names:
        raise InvalidOptionError(
            f"option '{CDC_TRANSACTIONS}'='hold' orders the transaction topic's END records by their Kafka offset: the "
            f"stream needs columns 'value' and '{transactions.OFFSET}' (Kafka's source gives both; columns: "
            f"{', '.join(raw.names)}). Select Kafka's 'offset' with the value"
        )


def released(
    routed: RoutedCommitter, plan: StagedPlan, raw: pa.Schema, call: BatchCall, results: Sequence[StagedTaskResult]
) -> tuple[list[StagedTaskResult], BatchFacts]:
    """The batch's staged records with those its predecessor held back, split: the released records staged as one
    task's result (none: nothing released), and the batch's facts of what it holds back (``held``, ``held_tables``)."""
    options = routed.options
    query_id, batch_id = call.query_id, call.batch_id
    cached = _KNOWN.get((query_id, options.sink_id))
    known = cached[1] if cached is not None and cached[0] == batch_id - 1 else ()
    tables, start = transactions.starting_state(options, query_id=query_id, batch_id=batch_id, known=known)
    io = next(iter(tables.values())).io if tables else None
    parts: list[pa.Table] = []
    previous, memory = held.read(io, start, list(tables.values()))
    if previous is not None and previous.num_rows:
        parts.append(previous)
    for r in sorted(results, key=lambda r: r.partition_id):
        if r.file is not None:
            parts.append(pa.Table.from_batches(list(read_staged(plan.io, r.file))))
    records = pa.concat_tables([_as(p, raw) for p in parts]) if parts else raw.empty_table()
    try:
        split = cdc_transactions.split_records(
            records,
            offset=transactions.OFFSET,
            memory=memory,
            now_ms=int(time.time() * 1000),
            wait_ms=int(options.cdc_transaction_wait * 1000),
        )
    except ValueError as e:
        raise InvalidOptionError(f"option '{CDC_TRANSACTIONS}'='hold': {e}") from None
    decision = split.decision
    back = held.HeldBack(
        rows=split.held,
        changes=split.held_changes,
        oldest_ms=split.oldest_ms,
        committed_ms=decision.committed_ms,
        waiting_for=decision.waiting_for,
        previous=start,
        memory=decision.memory,
        redelivered=split.redelivered,
        incomplete=decision.incomplete,
    )
    transactions.report(query_id, batch_id, decision, split.redelivered)
    key = held.property_key(query_id, options.sink_id)
    # held_homes: a batch that releases no change and has no table (home_inference)
    facts = BatchFacts(held=back, held_tables=tuple(sorted(n for n, t in tables.items() if key in t.properties)))
    if split.held_changes:
        log.info(
            "lakesink: query=%s batch=%s cdc-transactions: %s transaction(s) released; %s change(s) held back, waiting "
            "for transaction %s",
            query_id,
            batch_id,
            len(decision.released),
            split.held_changes,
            decision.waiting_for,
        )
    if not split.released.num_rows:
        return [], facts
    run_id = call.run_id or next((r.run_id for r in results if r.run_id), None)
    ids = TaskIds(query_id=query_id, batch_id=batch_id, partition_id=0, task_attempt_id=0, run_id=run_id)
    writer = StagedTaskWriter(replace(plan, transactions=False), ids)
    result = writer.stage(iter(split.released.to_batches()))
    return ([result] if result.file is not None else []), facts


def home_inference(plan: StagedPlan, call: BatchCall, facts: BatchFacts) -> StagedTaskResult | None:
    """A batch that holds changes back while no table records what the sink holds (the query's first batches, one
    transaction open), and that plans no table of its own: the held changes parsed and inferred by the staging writer's
    code, nothing staged -- what foreach_batch's inference gives for them (lakesink.sink.cdc.transactions.homes then makes
    their tables, empty, in the batch's unit: ``BatchFacts.held_homes``). None: the batch needs no home."""
    back = facts.held
    if back is None or facts.held_tables or not back.changes:
        return None
    kinds = [not cdc_transactions.is_transaction_record(_payload(v)) for v in back.rows.column("value").to_pylist()]
    changes = back.rows.filter(pa.array(kinds, pa.bool_()))
    ids = TaskIds(query_id=call.query_id, batch_id=call.batch_id, partition_id=0, task_attempt_id=0, run_id=call.run_id)
    return StagedTaskWriter(replace(plan, transactions=False), ids).infer(iter(changes.to_batches()))


def _payload(value: object) -> object:
    try:
        return cdc_transactions.payload_of(value if isinstance(value, str | bytes) else None)
    except ValueError:
        return None


def remember(routed: RoutedCommitter, call: BatchCall, tables: Sequence[str], facts: BatchFacts) -> None:
    """The batch committed (or found committed): where the next batch of this worker finds what it held back."""
    found = tuple(tables) or facts.held_tables
    if found:
        _KNOWN[(call.query_id, routed.options.sink_id)] = (call.batch_id, found)


def _as(records: pa.Table, raw: pa.Schema) -> pa.Table:
    """Records (staged, or held back by an earlier batch) as the stream's columns."""
    missing = [n for n in raw.names if n not in records.schema.names]
    if missing:
        raise InvalidOptionError(
            f"option '{CDC_TRANSACTIONS}'='hold': records held back by an earlier batch lack the stream's column(s) "
            f"{', '.join(missing)} (the stream's columns changed since): restore the stream's columns, or restart from a "
            "new checkpoint once nothing is held back (the table property lakesink.cdc-held.<query> says so)"
        )
    return records.select(raw.names).cast(raw)
