"""Driver side: the one compare-and-swap loop, with the "has it landed?" re-check on every attempt.

Every commit lakesink makes is a :class:`~lakesink.driver.loop.action.CommitAction` run by :func:`run_unit` (a batch's
snapshot or marker-only commit, a replay found at plan time, compaction, expiry, manifest rewrite), alone or
with actions on other tables as one unit. Each attempt re-reads the tables and asks every action whether it is
already in its table *before* it swaps: a check made once and then retried blindly is how Iceberg's Flink sink
committed the same data twice (iceberg#14425).

An error of the swap itself (not a clean conflict) leaves the outcome unknown. It is settled by reading
each table through a fresh connection (:class:`Settled`): our commit id is there (landed), an equivalent
commit is there (committed by another writer), or neither (not landed). Only a
certainly-not-landed commit is discarded; when the table cannot be read the outcome stays unknown and
nothing is deleted.

The loop's commits take turns on a table (:class:`Turns`): a batch holds its table for its whole loop, a maintenance
attempt waits until no batch of the table in this process is committing.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    retry_if_not_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import refusals as seam_refusals
from lakesink._pyiceberg import threads as seam_threads
from lakesink._pyiceberg.commit import PreparedCommit
from lakesink._pyiceberg.refusals import refused_by_the_catalog
from lakesink.driver import catalogs
from lakesink.driver.loop.action import CommitAction, Landing, Turn
from lakesink.errors import (
    PROGRAMMING_ERRORS,
    CatalogPermissionError,
    CatalogUnavailableError,
    CommitOutcomeUnknownError,
    InFlightTooLongError,
    LakesinkError,
    TableIdentityChangedError,
    UnitNotAtomicError,
)
from lakesink.faults import (
    DRIVER_AFTER_SWAP,
    DRIVER_BEFORE_CHECK,
    DRIVER_BEFORE_SWAP,
    DRIVER_BETWEEN_TABLE_COMMITS,
    fault_point,
)
from lakesink.redaction import redact_secrets_in
from lakesink.table import names
from lakesink.table.keys import UNIT_THREADS_FROM
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
    snapshot: Snapshot | None = None
    """The committed snapshot as the table read after the swap holds it (LANDED with a new snapshot): its summary and
    sequence number, for the commit's metrics (lakesink.driver.report.metrics)."""


class RetriesExhausted(LakesinkError):
    """Every attempt's swap conflicted with another writer (callers turn it into CommitConflictError)."""

    def __init__(
        self, attempts: int, last: BaseException | None, locked: int = 0, *, partial: dict[int, SwapResult] | None = None
    ):
        super().__init__(f"{attempts} attempt(s) conflicted")
        self.attempts = attempts
        self.last = last
        self.locked = locked
        self.partial = partial or {}
        """A unit committed one table after the other: the actions (by index) that landed before it gave up."""

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
    """Enter ``guard`` (if any: a maintenance attempt's turns); a CommitFailedException on entering it is a
    conflict, retried like a lost swap."""
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


def settle(action: CommitAction) -> tuple[Settled, Landing | None, Table | None]:
    """After a swap error: did ``action``'s commit land? Read its table (through a fresh connection) to find out."""
    for i in range(_SETTLE_ATTEMPTS):
        try:
            table = catalogs.reload_fresh(action.table)
        except Exception as e:
            log.info("lakesink: settling the %s: cannot read the table yet (%s)", action.what, type(e).__name__)
            time.sleep(min(0.2 * 2**i, 5.0))
            continue
        landing = action.landed(table)
        if landing is None:
            return Settled.NOT_LANDED, None, table
        return (Settled.LANDED if landing.mine else Settled.BY_OTHER), landing, table
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


def _all_or_none(
    actions: Sequence[CommitAction],
    group: list[int],
    outcomes: dict[int, tuple[Settled, Landing | None, Table | None]],
    what: str,
    error: str,
) -> dict[int, tuple[Settled, Landing | None, Table | None]]:
    """The settled outcomes of a unit swapped atomically (``group``: its actions, by index): this call's commit landed
    in every table, or in none. Tables read before the unit landed may show it not landed while those read after
    show it landed (a request the catalog applied late, between the settle reads): those are read once more, after
    the reads that found it. A unit still in some tables only is a catalog that broke atomicity: a loud
    :class:`UnitNotAtomicError`, never accepted as a finished unit nor completed table by table by the next attempt."""
    landed = [i for i in group if outcomes[i][0] is Settled.LANDED]
    missing = [i for i in group if outcomes[i][0] is Settled.NOT_LANDED]
    if not landed or not missing:
        return outcomes
    outcomes = {**outcomes, **{i: settle(actions[i]) for i in missing}}
    missing = [i for i in missing if outcomes[i][0] is not Settled.LANDED]
    if missing:
        raise UnitNotAtomicError(
            f"{what}: the catalog was sent the unit as one atomic commit and failed ({error}), and the unit landed in "
            f"{', '.join(actions[i].name for i in landed)} but not in {', '.join(actions[i].name for i in missing)}: "
            "the catalog does not commit all or nothing (a bug of the catalog server). No file was deleted; a restart "
            "completes the batch in the tables that miss it (readers may have seen it in some tables only); with this "
            "catalog, commit table by table (atomic=off) and report it to the catalog's maintainers"
        ) from None
    return outcomes


def _permission_error(action: CommitAction, refusal: str) -> CatalogPermissionError:
    """The loud error of a commit the catalog refused for lack of permission (settled: it did not land)."""
    catalog = action.table.catalog
    properties = getattr(catalog, "properties", None) or {}
    return CatalogPermissionError(
        f"{action.what}: the catalog {getattr(catalog, 'name', '?')!r} refused the commit for lack of permission "
        f"({redact_secrets_in(refusal, properties)}); nothing was committed (the table was read to make sure) and it "
        f"is not retried, since the same request gets the same answer. To fix: {action.permission_advice()}"
    )


def _reload(action: CommitAction) -> Table:
    """The one read of a table for an attempt: its catalog's pointer (parsed again only when it moved), riding out
    a briefly locked or unreachable catalog."""
    return read_patiently(
        lambda: seam_commit.reload(action.table),
        dropped=f"table {action.name} was dropped during the {action.what}; nothing was committed",
        unavailable=f"cannot read table {action.name} from its catalog for the {action.what}",
        redact=action.redact,
    )


# --- turns: the turns the commits of this process take on one table ---------------------------------------------------
#
# A batch commit holds its table's turn (Turns.batch) for its whole loop; batches never wait for each other. A
# maintenance attempt (read, prepare, swap) starts once no batch is inside (Turns.maintenance), and a batch arriving
# during it waits for that one attempt: a stream committing every second cannot starve maintenance (measured: when it
# only yielded, compaction never committed in 30 minutes; docs/maintenance.md). The loop enters them for every action
# by its Turn; no caller wires a guard in. (Once driver/loop/turns.py, entered by every commit: folded, issue 31.)

#: How long a maintenance commit attempt waits for its turn between the batches of its table.
TURN_WAIT_S = 30.0


class Turns:
    """The turn-taking of this process's commits on one table (:func:`table_turns`)."""

    def __init__(self) -> None:
        self._state = threading.Condition()
        self._batches = 0  # batch commits in progress
        self.maintaining = False
        """A maintenance attempt holds its turn."""

    @contextmanager
    def batch(self) -> Iterator[None]:
        with self._state:
            while self.maintaining:
                self._state.wait()
            self._batches += 1
        try:
            yield
        finally:
            with self._state:
                self._batches -= 1
                self._state.notify_all()

    @contextmanager
    def maintenance(self) -> Iterator[None]:
        """Around one maintenance commit attempt: waits until no batch of the table is committing (at most
        ``TURN_WAIT_S``; then it raises CommitFailedException, a conflict the loop retries later), and batches that
        arrive during the attempt wait for it. A batch waits at most for one attempt (a read of the catalog's
        pointer, the manifests of one snapshot, one swap); it always commits on top of it and never conflicts."""
        deadline = time.monotonic() + TURN_WAIT_S
        with self._state:
            while self._batches:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommitFailedException(
                        f"batches of this table kept committing for {TURN_WAIT_S:.0f} s: maintenance yields and retries later"
                    )
                self._state.wait(left)
            self.maintaining = True
        try:
            yield
        finally:
            with self._state:
                self.maintaining = False
                self._state.notify_all()


_lock = threading.Lock()
_turns: weakref.WeakValueDictionary[tuple[Any, ...], Turns] = weakref.WeakValueDictionary()
"""The turns of the tables whose commits are under way: a commit holds its table's :class:`Turns` for as long as it
takes part, and a table nobody commits has none (a routed stream may commit thousands of tables over a run)."""


def turns_key(table: Table) -> tuple[Any, ...]:
    """A table of this process, whichever catalog object read it: its catalog's name and properties, its name."""
    return _turns_key(table.catalog, tuple(table.name()))


def _turns_key(catalog: Catalog | None, identifier: tuple[str, ...]) -> tuple[Any, ...]:
    props = tuple(sorted((str(k), str(v)) for k, v in catalog.properties.items())) if catalog is not None else ()
    return (catalog.name if catalog is not None else None, props, tuple(identifier))


def table_turns(table: Table) -> Turns:
    """The process's one :class:`Turns` of ``table``."""
    return _turns_for(turns_key(table))


def turns_of_identifier(catalog: Catalog, identifier: tuple[str, ...]) -> Turns:
    """The process's one :class:`Turns` of the table ``identifier`` of ``catalog`` (before reading it: a batch's
    committer holds it from its first read)."""
    return _turns_for(_turns_key(catalog, identifier))


def _turns_for(k: tuple[Any, ...]) -> Turns:
    with _lock:
        found = _turns.get(k)
        if found is None:
            found = _turns[k] = Turns()
        return found


@contextmanager
def _batch_turns(actions: Sequence[CommitAction]) -> Iterator[None]:
    """The turns of the tables of the unit's batch actions, held for the whole loop."""
    with ExitStack() as stack:
        for held in _turns_of(a for a in actions if a.turn is Turn.BATCH):
            stack.enter_context(held.batch())
        yield


def _maintenance_turns(actions: Sequence[CommitAction]) -> Callable[[], AbstractContextManager[None]] | None:
    """Entered around each attempt of a unit of maintenance actions (none when the unit holds a batch)."""
    if any(a.turn is Turn.BATCH for a in actions):
        return None
    held = _turns_of(actions)

    @contextmanager
    def guard() -> Iterator[None]:
        with ExitStack() as stack:
            for t in held:
                stack.enter_context(t.maintenance())
            yield

    return guard


def _turns_of(actions: Iterable[CommitAction]) -> list[Turns]:
    found: dict[tuple[object, ...], Turns] = {}
    for a in actions:
        found.setdefault(turns_key(a.table), table_turns(a.table))
    return [found[k] for k in sorted(found, key=repr)]  # one order for every unit: no two units wait for each other


def _prepare(
    actions: Sequence[CommitAction], read: list[Table], todo: list[int], attempt: int, prepared: dict[int, PreparedCommit]
) -> None:
    """Every action of ``todo`` prepared against its table as read (into ``prepared``); the first error raised
    once every action finished (the caller discards what was prepared)."""
    threads = seam_threads.unit_threads([read[i] for i in todo]) if len(todo) >= UNIT_THREADS_FROM else 1
    if threads == 1:
        for i in todo:
            prepared[i] = actions[i].prepare(read[i], attempt)
        return
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=min(threads, len(todo)), thread_name_prefix="lakesink-prepare") as pool:
        futures = {i: pool.submit(actions[i].prepare, read[i], attempt) for i in todo}
    for i, future in futures.items():
        try:
            prepared[i] = future.result()
        except BaseException as e:
            errors.append(e)
    if errors:
        raise errors[0]


def run(action: CommitAction) -> SwapResult:
    """Commit ``action`` exactly once through the loop (:func:`run_unit` of one action)."""
    return run_unit([action])[0]


def run_unit(actions: Sequence[CommitAction], *, late_landing: bool | None = None, atomic: bool = True) -> list[SwapResult]:
    """Commit every action exactly once: per attempt, read every table, ask each action whether it landed, prepare
    the others and swap them -- as one unit where the catalog can (several tables of one pyiceberg SQL catalog: one
    database transaction, :func:`lakesink._pyiceberg.commit.commits_atomically`), else one table after the other,
    each exactly once (an action that landed is found landed by the next attempt, or by a replay). Retries while a
    swap conflicts; a swap that failed otherwise is settled per table by reading it (:func:`settle`).

    The first attempt swaps on the tables the actions were made with; later attempts read them again. Actions whose
    :class:`~lakesink.driver.loop.action.Turn` is MAINTENANCE read their tables again at every attempt, inside their turn
    (:class:`Turns`); BATCH actions hold their tables' turns for the whole loop.

    Returns one :class:`SwapResult` per action, in order. Raises :class:`RetriesExhausted` when every attempt
    conflicted (``partial``: the actions that landed meanwhile) and CommitOutcomeUnknownError when an outcome could
    not be settled (the table could not be read, or an attempt could still land: see :class:`_Pending`); in both
    cases what the attempts prepared was discarded or is unknown, and the caller decides about its data files.

    ``late_landing``: the catalog may apply a request after having answered it with an error (any catalog reached
    over HTTP: REST, Glue, and database servers); default: its swapper's ``may_apply_late`` of each
    action's catalog. ``atomic=False``: one table after the other even where the catalog could swap them as one unit
    (option ``atomic=off``).
    """
    if not actions:
        return []
    n = len(actions)
    what = actions[0].what if n == 1 else f"unit of {n} commits ({'; '.join(a.what for a in actions)})"
    retry = actions[0].retry(actions[0].table)
    pending = [
        _Pending(
            late_landing
            if late_landing is not None
            else a.table.catalog is None or seam_commit.swapper_of(a.table.catalog).may_apply_late()
        )
        for a in actions
    ]
    read = [a.table for a in actions]
    results: dict[int, SwapResult] = {}
    attempts = 0
    refused = 0  # attempts whose swap failed with an error (settled as not landed), not a clean conflict
    guard = _maintenance_turns(actions)

    def found(i: int, t: Table, landing: Landing | None) -> bool:
        if landing is None:
            return False
        if landing.mine:
            # an earlier attempt of this very call landed (its answer was lost, or a re-sent request got 409)
            pending[i].settle_on(t, landed=landing.snapshot_id)
            snapshot = t.metadata.snapshot_by_id(landing.snapshot_id) if landing.snapshot_id is not None else None
            results[i] = SwapResult(Status.LANDED, attempts, snapshot_id=landing.snapshot_id, snapshot=snapshot)
        else:
            pending[i].settle_on(t)
            results[i] = SwapResult(Status.ALREADY_COMMITTED, attempts, done=landing.done)
        return True

    def open_actions() -> list[int]:
        return [i for i in range(n) if i not in results]

    def swap(group: list[int], prepared: dict[int, PreparedCommit]) -> None:
        """Swap ``group`` (one table, or several committed atomically); raises _Conflict unless all landed."""
        label = actions[group[0]].what if len(group) == 1 else what
        nonlocal refused
        try:
            seam_commit.commit_together([prepared[i] for i in group])
        except CommitFailedException as e:
            for i in group:
                pending[i].add(prepared[i], may_land_later=False)  # discarded once the next read shows it did not land
            log.info("lakesink: %s conflicted (%s); re-checking and retrying", label, e)
            raise _Conflict(str(e)) from e
        except Exception as e:
            not_landed = False
            outcomes = {i: settle(actions[i]) for i in group}
            if len(group) > 1:
                outcomes = _all_or_none(actions, group, outcomes, label, actions[group[0]].redact(e))
            for i in group:
                settled, landing, t = outcomes[i]
                log.warning(
                    "lakesink: %s: the catalog failed (%s); settled by reading the table: %s",
                    actions[i].what,
                    actions[i].redact(e),
                    settled.value,
                )
                if settled is Settled.UNKNOWN:
                    raise CommitOutcomeUnknownError(
                        f"{actions[i].what}: the catalog failed ({actions[i].redact(e)}) and the table could not be "
                        "read to settle the outcome; no file was deleted, a restart settles it"
                    ) from None
                assert t is not None
                # the catalog's definite no (4xx) never lands later; a timeout, 5xx or reset may
                pending[i].add(prepared[i], may_land_later=not refused_by_the_catalog(e))
                if not found(i, t, landing):  # Settled.NOT_LANDED: not (yet) in the table
                    pending[i].settle_on(t)
                    not_landed = True
            if not_landed:
                refusal = seam_refusals.refused_for_permission(e)
                if refusal is not None:  # the same request with the same credentials gets the same answer: no retry
                    raise _permission_error(actions[group[0]], refusal) from e
                refused += 1
                raise _Conflict(f"commit failed and did not land: {actions[group[0]].redact(e)}") from e
        else:
            for i in group:
                seam_commit.remember(prepared[i].table)  # the next read of the unmoved table parses nothing
                pending[i].settle_on(prepared[i].table, landed=prepared[i].snapshot_id)
                p = prepared[i]
                results[i] = SwapResult(
                    Status.LANDED, attempts, snapshot_id=p.snapshot_id, snapshot=p.table.metadata.snapshot_by_id(p.snapshot_id)
                )

    try:
        with _batch_turns(actions):
            for attempt in _retrying(retry):
                with attempt, _entered(guard):
                    attempts += 1
                    todo = open_actions()
                    if attempts > 1 or guard is not None:
                        for i in todo:
                            read[i] = _reload(actions[i])
                    fault_point(DRIVER_BEFORE_CHECK)
                    todo = [i for i in todo if not found(i, read[i], actions[i].landed(read[i]))]
                    if not todo:
                        return [results[i] for i in range(n)]
                    for i in todo:
                        pending[i].settle_on(read[i])
                    prepared: dict[int, PreparedCommit] = {}
                    try:
                        _prepare(actions, read, todo, attempts, prepared)
                        fault_point(DRIVER_BEFORE_SWAP)
                        for i in todo:
                            refuse_stale_files(prepared[i], actions[i].what)
                    except BaseException:
                        for p in prepared.values():  # failed before the swap: certainly not committed
                            p.discard()
                        raise
                    together = len(todo) == 1 or (atomic and seam_commit.commits_atomically([prepared[i] for i in todo]))
                    groups = [todo] if together else [[i] for i in todo]  # else one table after the other
                    for k, group in enumerate(groups):
                        try:
                            if k:
                                fault_point(DRIVER_BETWEEN_TABLE_COMMITS)
                        except BaseException:
                            for later in groups[k:]:  # not swapped: certainly not committed
                                for i in later:
                                    prepared[i].discard()
                            raise
                        try:
                            swap(group, prepared)
                        except BaseException:
                            for later in groups[k + 1 :]:  # not swapped: certainly not committed
                                for i in later:
                                    prepared[i].discard()
                            raise
                    fault_point(DRIVER_AFTER_SWAP)
                    return [results[i] for i in range(n)]
    except RetryError as e:
        last = e.last_attempt.exception()
        if any(pending[i].attempts for i in open_actions()):  # the last answers were not clean: read once more
            for i in open_actions():
                if not pending[i].attempts:
                    continue
                try:
                    t = _reload(actions[i])
                except Exception as read_error:
                    raise CommitOutcomeUnknownError(
                        f"{what}: {attempts} attempt(s) failed (last: {actions[i].redact(last) if last else 'none'}) "
                        f"and the table could not be read to settle them ({actions[i].redact(read_error)}); no file "
                        "was deleted, a restart settles it"
                    ) from None
                if not found(i, t, actions[i].landed(t)):
                    pending[i].settle_on(t)
            if not open_actions():
                return [results[i] for i in range(n)]
            still = sum(len(pending[i].attempts) for i in open_actions())
            if still:
                raise CommitOutcomeUnknownError(
                    f"{what}: {attempts} attempt(s) failed (last: {actions[0].redact(last) if last else 'none'}); the "
                    f"catalog may still apply {still} of them (a request it has not answered yet): no file was "
                    "deleted, a restart settles it"
                ) from None
        raise RetriesExhausted(attempts, last, refused, partial=dict(results)) from None
    raise AssertionError("unreachable")  # pragma: no cover


#: How long a commit attempt's read rides out a locked or unreachable catalog.
CATALOG_READ_PATIENCE_S = 30.0


def read_patiently(load: Callable[[], Table], *, dropped: str, unavailable: str, redact: Callable[[BaseException], str]) -> Table:
    """``load()`` for a commit attempt, riding out a briefly locked or unreachable catalog for up to 30 s.

    A table that is gone raises TableIdentityChangedError(``dropped``); a catalog still failing after 30 s
    CatalogUnavailableError(``unavailable`` and the error); lakesink's own errors pass through.
    """
    retrying = Retrying(
        stop=stop_after_delay(CATALOG_READ_PATIENCE_S),
        wait=wait_exponential_jitter(initial=0.2, max=5.0),
        retry=retry_if_not_exception_type((NoSuchTableError, LakesinkError)),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                return load()
    except NoSuchTableError:
        raise TableIdentityChangedError(dropped) from None
    except LakesinkError:
        raise
    except PROGRAMMING_ERRORS:
        raise
    except Exception as e:
        raise CatalogUnavailableError(
            f"{unavailable} (tried for {CATALOG_READ_PATIENCE_S:.0f} s: {redact(e)}); nothing was committed; "
            "restart the query when the catalog is available"
        ) from None
    raise AssertionError("unreachable")  # pragma: no cover
