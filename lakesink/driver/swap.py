"""Driver side: the one compare-and-swap loop, with the replay re-check on every attempt.

Every commit lakesink makes for a batch -- a data snapshot or a marker-only commit of an empty batch --
goes through :func:`swap_with_recheck`. Each attempt re-reads the table and re-checks whether the
(query id, sink id, batch id) is already committed *before* it swaps: a check made once and then
retried blindly is how Iceberg's Flink sink committed the same data twice (iceberg#14425).

An error of the swap itself (not a clean conflict) leaves the outcome unknown. It is settled by reading
the table through a fresh connection (:class:`Settled`): our commit id is there (landed), another
commit of the batch is there (committed by another writer), or neither (not landed). Only a
certainly-not-landed commit is discarded; when the table cannot be read the outcome stays unknown and
nothing is deleted.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from lakesink._pyiceberg.commit import PreparedCommit, refused_by_the_catalog
from lakesink.driver import catalogs
from lakesink.errors import CommitOutcomeUnknownError, InFlightTooLongError, LakesinkError
from lakesink.faults import DRIVER_AFTER_SWAP, DRIVER_BEFORE_CHECK, DRIVER_BEFORE_SWAP, fault_point
from lakesink.table import names
from lakesink.table.markers import CommittedBatch
from lakesink.table.settings import CommitRetry

log = logging.getLogger("lakesink")

_SETTLE_ATTEMPTS = 6


class Settled(enum.Enum):
    """What reading the table says about a commit whose swap ended in an error."""

    LANDED = "landed"
    """Our commit (its commit id) is in the table."""
    NOT_LANDED = "not landed"
    """Neither our commit nor any other commit of the batch is in the table: ours certainly failed."""
    BY_OTHER = "committed by another writer"
    """Another commit of the same (query, sink, batch) is in the table (a zombie driver, a replay)."""
    UNKNOWN = "unknown"
    """The table could not be read."""


class Status(enum.Enum):
    LANDED = "landed"
    """This call's commit is in the table."""
    ALREADY_COMMITTED = "already committed"
    """The batch was found committed by another commit (a replay, or another writer of the same batch)."""


@dataclass(frozen=True)
class SwapResult:
    status: Status
    attempts: int
    snapshot_id: int | None = None
    """The committed snapshot (LANDED)."""
    done: CommittedBatch | None = None
    """The sink's last committed batch as found (ALREADY_COMMITTED)."""


class RetriesExhausted(LakesinkError):
    """Every attempt's swap conflicted with another writer (callers turn it into CommitConflictError)."""

    def __init__(self, attempts: int, last: BaseException | None, locked: int = 0):
        super().__init__(f"{attempts} attempt(s) conflicted")
        self.attempts = attempts
        self.last = last
        self.locked = locked

    def describe(self) -> str:
        """Why the attempts failed, for the error message: lost swaps, or a catalog that refused the write."""
        if self.locked and self.locked == self.attempts:
            return f"the catalog refused every attempt's write, last: {self.last}"
        if self.locked:
            return f"conflicted with other writers, and the catalog refused {self.locked} attempt(s)' write, last: {self.last}"
        return "conflicted with other writers"


class _Conflict(Exception):
    """One attempt's compare-and-swap lost against another commit (retry after re-checking)."""


def _retrying(retry: CommitRetry) -> Retrying:
    return Retrying(
        stop=stop_after_attempt(retry.num_retries + 1) | stop_after_delay(retry.total_timeout_ms / 1000),
        wait=wait_exponential_jitter(
            initial=retry.min_wait_ms / 1000, max=retry.max_wait_ms / 1000, jitter=retry.min_wait_ms / 1000
        ),
        retry=retry_if_exception_type(_Conflict),
        reraise=False,
    )


@contextmanager
def _entered(guard: Callable[[], AbstractContextManager[None]] | None) -> Iterator[None]:
    """Enter ``guard`` (if any); a CommitFailedException on entering it is a conflict, retried like a lost swap."""
    with ExitStack() as stack:
        if guard is not None:
            try:
                stack.enter_context(guard())
            except CommitFailedException as e:
                log.info("lakesink: %s; retrying", e)
                raise _Conflict(str(e)) from e
        yield


def refuse_stale_files(prepared: PreparedCommit, what: str) -> None:
    """Raise InFlightTooLongError when the oldest file ``prepared`` writes into the table is older than
    :data:`lakesink.table.names.COMMIT_DEADLINE_MS`: the orphan clean-up keeps a commit's files in flight for
    :data:`lakesink.table.names.IN_FLIGHT_WINDOW_MS` only, so some of them may be gone (the commit side of that contract)."""
    since = prepared.files_since_ms
    if since is None:
        return
    age = names.now_ms() - since
    if age > names.COMMIT_DEADLINE_MS:
        raise InFlightTooLongError(
            f"{what}: its oldest file was written {age / 3_600_000:.1f} h ago, longer than lakesink lets a commit use "
            f"files ({names.COMMIT_DEADLINE_MS / 3_600_000:.0f} h; the orphan-file clean-up keeps files in flight for "
            f"{names.IN_FLIGHT_WINDOW_MS / 3_600_000:.0f} h, so some may already be gone). Nothing was committed; "
            "restarting the query writes the batch again (docs/maintenance.md, 'Safety rules')"
        )


def settle(
    *, load_fresh: Callable[[], Table], recheck: Callable[[Table], CommittedBatch | None], batch_id: int, commit_id: str
) -> tuple[Settled, CommittedBatch | None, Table | None]:
    """After a swap error: did our commit land? Read the table (through a fresh connection) to find out."""
    for i in range(_SETTLE_ATTEMPTS):
        try:
            table = load_fresh()
        except Exception as e:
            log.info("lakesink: settling the commit of batch %s: cannot read the table yet (%s)", batch_id, type(e).__name__)
            time.sleep(min(0.2 * 2**i, 5.0))
            continue
        done = recheck(table)
        if done is not None and done.batch_id == batch_id and done.commit_id == commit_id:
            return Settled.LANDED, done, table
        if done is not None and done.batch_id >= batch_id:
            return Settled.BY_OTHER, done, table
        return Settled.NOT_LANDED, done, table
    return Settled.UNKNOWN, None, None


class _Pending:
    """Attempts of one call whose commit request got no clean answer, kept (with their manifests) until the table
    shows they did not land, and never can.

    A 409 does not prove the request did not land: an HTTP client, gateway or SDK that re-sent a commit whose
    first answer was lost gets 409 for the re-sent request (the first moved the head), and botocore re-sends
    Glue's UpdateTable on its own. It does prove that no copy of it can land *later* (its requirements failed, and
    they stay failed): the next read of the table settles it. After a timeout, a 5xx or a reset connection, a
    catalog server may even apply the request later (queued behind a slow commit, held by a gateway): reading the
    table once says "not yet", not "never" (``late_landing``). Such an attempt is discarded only once a later read
    shows neither our commit id nor a head it could still land on (:meth:`PreparedCommit.could_land_on`): a later
    attempt of ours that lands, or any other commit that moves the head, fences it.
    """

    def __init__(self, late_landing: bool):
        self.late_landing = late_landing
        self.attempts: list[tuple[PreparedCommit, bool]] = []

    def add(self, prepared: PreparedCommit, *, may_land_later: bool) -> None:
        self.attempts.append((prepared, may_land_later and self.late_landing))

    def settle_on(self, table: Table, *, landed: int | None = None) -> None:
        """Discard every pending attempt the table shows did not land (``landed``: the snapshot id that did) and
        that can no longer land on it."""
        keep: list[tuple[PreparedCommit, bool]] = []
        for p, later in self.attempts:
            if landed is not None and p.snapshot_id == landed:
                continue  # the attempt that landed: its manifests are the table's
            if later and p.could_land_on(table.metadata):
                keep.append((p, later))
            else:
                p.discard()
        self.attempts = keep


def swap_with_recheck(
    *,
    first: Table,
    load: Callable[[], Table],
    load_fresh: Callable[[], Table],
    recheck: Callable[[Table], CommittedBatch | None],
    prepare: Callable[[Table, CommittedBatch | None, int], PreparedCommit],
    batch_id: int,
    commit_id: str,
    retry: CommitRetry,
    what: str,
    redact: Callable[[BaseException], str],
    attempt_guard: Callable[[], AbstractContextManager[None]] | None = None,
    late_landing: bool | None = None,
) -> SwapResult:
    """Commit once for (query, sink, batch): re-check, prepare, swap; retry on conflicts.

    ``first`` is the table to try first (already read by the caller); later attempts ``load`` it again.
    ``prepare(table, done, attempt)`` stages the commit on ``table`` (``done``: the sink's last batch, below this
    one). Raises :class:`RetriesExhausted` when every attempt conflicted and CommitOutcomeUnknownError when the
    outcome could not be settled (the table could not be read, or an attempt could still land: see
    :class:`_Pending`); in both cases what the attempts prepared was discarded or is unknown, and the caller
    decides about the batch's data files.

    ``late_landing``: the catalog may apply a request after having answered it with an error (any catalog reached
    over HTTP: REST, Glue); False for pyiceberg's SQL catalogs, whose failed calls lakesink rolls back before
    the error reaches it (lakesink.driver.catalogs.guard_sql_catalog). Default: :func:`lakesink.driver.catalogs.may_apply_late`
    of ``first``'s catalog.

    ``attempt_guard`` is entered around each whole attempt (read, re-check, prepare, swap) and then every attempt
    reads the table afresh (``first`` is not used): maintenance takes its turn between the sink's batches with it
    (lakesink.maintenance.auto.AutoMaintainer), so that a stream committing every second cannot move the head between a
    maintenance commit's read and its swap. It may raise CommitFailedException (a conflict: retried).
    """
    attempts = 0
    refused = 0  # attempts whose swap failed with an error (settled as not landed), not a clean conflict
    if late_landing is None:
        late_landing = first.catalog is None or catalogs.may_apply_late(first.catalog)
    pending = _Pending(late_landing)
    table = first

    def found_committed(t: Table, done: CommittedBatch | None) -> SwapResult | None:
        if done is None or done.batch_id < batch_id:
            return None
        if done.batch_id == batch_id and done.commit_id == commit_id:
            # an earlier attempt of this very call landed (its answer was lost, or a re-sent request got 409)
            pending.settle_on(t, landed=done.snapshot_id)
            return SwapResult(Status.LANDED, attempts, snapshot_id=done.snapshot_id)
        pending.settle_on(t)
        return SwapResult(Status.ALREADY_COMMITTED, attempts, done=done)

    try:
        for attempt in _retrying(retry):
            with attempt, _entered(attempt_guard):
                attempts += 1
                if attempts > 1 or attempt_guard is not None:
                    table = load()
                fault_point(DRIVER_BEFORE_CHECK)
                done = recheck(table)
                if (result := found_committed(table, done)) is not None:
                    return result
                pending.settle_on(table)
                prepared = None
                try:
                    prepared = prepare(table, done, attempts)
                    fault_point(DRIVER_BEFORE_SWAP)
                    refuse_stale_files(prepared, what)
                except BaseException:
                    if prepared is not None:  # failed before the swap: certainly not committed
                        prepared.discard()
                    raise
                try:
                    prepared.commit()
                except CommitFailedException as e:
                    pending.add(prepared, may_land_later=False)  # discarded once the next read shows it did not land
                    log.info("lakesink: %s conflicted (%s); re-checking and retrying", what, e)
                    raise _Conflict(str(e)) from e
                except Exception as e:
                    settled, found, read = settle(load_fresh=load_fresh, recheck=recheck, batch_id=batch_id, commit_id=commit_id)
                    log.warning(
                        "lakesink: %s: the catalog failed (%s); settled by reading the table: %s", what, redact(e), settled.value
                    )
                    if settled is Settled.UNKNOWN:
                        raise CommitOutcomeUnknownError(
                            f"{what}: the catalog failed ({redact(e)}) and the table could not be read to settle the "
                            "outcome; no file was deleted, a restart settles it"
                        ) from None
                    assert read is not None
                    # the catalog's definite no (4xx) never lands later; a timeout, 5xx or reset may
                    pending.add(prepared, may_land_later=not refused_by_the_catalog(e))
                    if (result := found_committed(read, found)) is not None:
                        return result
                    # Settled.NOT_LANDED: not (yet) in the table
                    pending.settle_on(read)
                    refused += 1
                    raise _Conflict(f"commit failed and did not land: {redact(e)}") from e
                else:
                    catalogs.remember(prepared.table)  # the next read of the unmoved table parses nothing
                pending.settle_on(prepared.table, landed=prepared.snapshot_id)
                fault_point(DRIVER_AFTER_SWAP)
                return SwapResult(Status.LANDED, attempts, snapshot_id=prepared.snapshot_id)
    except RetryError as e:
        last = e.last_attempt.exception()
        if pending.attempts:  # the last answers were not clean: read once more before giving up
            try:
                table = load()
            except Exception as read_error:
                raise CommitOutcomeUnknownError(
                    f"{what}: {attempts} attempt(s) failed (last: {redact(last) if last else 'none'}) and the table "
                    f"could not be read to settle them ({redact(read_error)}); no file was deleted, a restart settles it"
                ) from None
            if (result := found_committed(table, recheck(table))) is not None:
                return result
            pending.settle_on(table)
            if pending.attempts:
                raise CommitOutcomeUnknownError(
                    f"{what}: {attempts} attempt(s) failed (last: {redact(last) if last else 'none'}); the catalog may "
                    f"still apply {len(pending.attempts)} of them (a request it has not answered yet): no file was "
                    "deleted, a restart settles it"
                ) from None
        raise RetriesExhausted(attempts, last, refused) from None
    raise AssertionError("unreachable")  # pragma: no cover
