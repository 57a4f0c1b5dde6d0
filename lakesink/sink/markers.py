"""foreach_batch: the replay markers each sink of a query claims in a batch (driver process).

Several lakesink sinks may run in one foreachBatch function (two filters of the batch, main and an audit branch). A
replay marker (``lakesink.last-batch.<query>[.<sink id>]``, lakesink.table.markers) tells a replay from a new batch
only when one sink writes it. Two sinks of one query that would move the same marker -- one table (or its branches)
under one sink id, or one dead-letter table under one dead-letter marker (routed sinks with the same routing column,
namespace and sink id: lakesink.driver.actions.dead_letters.dead_letter_options) -- cannot be told apart by the
marker: the second one's commit finds the batch "committed by this run" (DuplicateSinkError), and after a restart
(another run) it finds it "committed by an earlier run" and skips it as a replay, losing its rows or its dead letters
silently, one batch per restart (issue 51, item 10).

So every call claims the markers it will move for its batch before anything is written: a second sink claiming one
in the same batch of the same run is refused with DuplicateSinkError, in every run, until the sinks get ids of their
own. All sinks of a query run their batch in this process (the foreachBatch function runs in the driver, or under
Spark Connect in one server-side process per run), so a process-wide table suffices. ``format("lakesink")`` has one
sink per query: it claims nothing.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from lakesink.driver.actions.dead_letters import dead_letter_options
from lakesink.errors import DuplicateSinkError
from lakesink.options import SINK_ID, SinkOptions
from lakesink.table.markers import last_batch_key


@dataclass(frozen=True)
class _Claim:
    run_id: str
    batch_id: int
    owner: weakref.ref[object]


_lock = threading.Lock()
_claims: dict[tuple[object, ...], _Claim] = {}
"""(catalog, table, marker key) -> the sink that claimed it last (one entry per marker: bounded by the process's sinks)."""


def marker_keys(options: SinkOptions, query_id: str) -> list[tuple[tuple[object, ...], str]]:
    """The markers a sink of ``options`` moves in every batch, as (claim key, what it is, for a message): its table's
    (a sink of one table) and its dead-letter table's (option dead-letter-table). A routed sink's tables are known
    per batch only; a second routed sink writing one of them is refused when its batch is planned
    (RoutedCommitter.check_replay_at_plan)."""
    catalog = (options.catalog_name, tuple(sorted(options.catalog_properties.items())))
    keys: list[tuple[tuple[object, ...], str]] = []
    if options.routing is None:
        keys.append(((catalog, str(options.table), last_batch_key(query_id, options.sink_id)), f"table {options.table}"))
    if options.dead_letter_table is not None:
        letters = dead_letter_options(options)
        keys.append(
            (
                (catalog, str(letters.table), last_batch_key(query_id, letters.sink_id)),
                f"dead-letter table {letters.table} (its marker for the sink's dead letters: sink id {letters.sink_id})",
            )
        )
    return keys


def claim(owner: object, options: SinkOptions, *, query_id: str, run_id: str | None, batch_id: int) -> None:
    """Claim ``owner``'s markers for batch ``batch_id`` of this run of the query; DuplicateSinkError (nothing written
    yet) when another sink claimed one of them in the same batch of the same run. ``run_id`` None (not known): no
    claim (a restart could not be told from a second sink)."""
    if run_id is None:
        return
    with _lock:
        for key, what in marker_keys(options, query_id):
            held = _claims.get(key)
            other = held.owner() if held is not None else None
            mine = held is not None and (held.run_id, held.batch_id) == (run_id, batch_id)
            if mine and other is not None and other is not owner:
                raise DuplicateSinkError(
                    f"two sinks of query {query_id} write the same replay marker in batch {batch_id}: {what}, under sink "
                    f"id {options.sink_id or '(default)'} (two lakesink calls in one foreachBatch function). A marker "
                    "tells a replay from a new batch only for one sink: the second would be taken for a replay of the "
                    f"first and skipped, after a restart silently. Give each sink its own sink_id (foreach_batch(..., "
                    f"sink_id='audit') / option '{SINK_ID}'): keep the sink that runs first as it is, so that a restart "
                    "finds its batches, and give the other one a new id. Nothing of this call was written; once the "
                    "sinks have ids of their own, a restart writes its rows and dead letters (docs/protocol.md, "
                    "'Several sinks of one query')"
                )
        for key, _ in marker_keys(options, query_id):
            _claims[key] = _Claim(run_id, batch_id, weakref.ref(owner))


__all__ = ["claim", "marker_keys"]
