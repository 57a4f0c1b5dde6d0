"""One error hierarchy for lakesink.

Every error lakesink raises is a :class:`LakesinkError`. The ``retryable`` class attribute
says whether restarting the streaming query (from the same checkpoint) can help without
changing anything: a commit conflict or an unknown commit outcome can; an invalid option or
a schema mismatch cannot.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LakesinkError(Exception):
    """Base class of every error raised by lakesink."""

    retryable: bool = False


PROGRAMMING_ERRORS: tuple[type[Exception], ...] = (TypeError, AttributeError, NameError, AssertionError)
"""Exceptions that mean a bug (lakesink's, or a dependency whose API changed under it), never the user's input.

Where lakesink turns a dependency's failures into one of its error classes with a broad ``except Exception``
(a catalog that cannot be loaded, a table property pyiceberg rejects), it lets these through first, unchanged:
a ``TypeError`` from a changed signature reported as "cannot load table" or as a schema mismatch sends the
user after a problem they do not have (pyspark 4.1's ``to_arrow_schema`` was reported as a schema mismatch).
"""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the candidate nearest to ``word`` (difflib's ratio, case and ``_``/``-`` aside),
    or ``""`` when none is near: for a misspelled option, column or table name in an error message."""
    by_form = {_form(c): c for c in candidates}
    near = difflib.get_close_matches(_form(word), list(by_form), n=1, cutoff=0.75)
    return f" (did you mean {by_form[near[0]]!r}?)" if near else ""


def _form(name: str) -> str:
    return name.lower().replace("_", "-")


class InvalidOptionError(LakesinkError, ValueError):
    """An option has an unknown name or an invalid value. The message names the valid ones."""


class CatalogError(LakesinkError):
    """The catalog, namespace or table could not be resolved or created."""


class CatalogUnavailableError(CatalogError):
    """The catalog could not be read (locked, unreachable) even after retries; nothing was committed."""

    retryable = True


class CatalogPermissionError(CatalogError):
    """The catalog refused a commit for lack of permission (REST 403, or 401 after a token refresh; AWS
    ``AccessDenied``): sending it again with the same credentials cannot help, so it is not retried.

    Nothing of the commit landed (the table was read to make sure). The message names the catalog's refusal and what
    to do: give the catalog principal the privilege, or stop lakesink from making that commit (e.g. leave snapshot
    expiry to a catalog that keeps history by its own retention).
    """

    retryable = False


class TableLocationError(LakesinkError):
    """The table's location or data path is unsafe to write to (see :mod:`lakesink.table.locations`)."""


class SchemaMismatchError(LakesinkError):
    """The stream's schema or values do not fit the table. The message lists every column problem."""


class UpsertKeyError(LakesinkError):
    """A batch of an upsert sink has a null key or several rows of one key it cannot resolve; nothing was committed."""


class UnavailableValueError(UpsertKeyError):
    """Option cdc-format: changes holding Debezium's unavailable-value placeholder with no value to keep (the table
    holds no row of their key, and no earlier change of the batch gave one); nothing was committed. ``table`` and
    ``keys`` (each key as its sorted ``(column, value)`` pairs, column names lower-cased) say which: with option
    dead-letter-table the batch is written again with those changes as dead letters of kind ``unavailable-value``
    (lakesink.sink.commit.commit_routed)."""

    def __init__(self, message: str, *, table: str, keys: frozenset[tuple[tuple[str, object], ...]]):
        super().__init__(message)
        self.table = table
        self.keys = keys


class SourceRegressionError(LakesinkError):
    """A change source's positions went back (a MySQL/MariaDB binlog after ``RESET MASTER``, a restored server, a
    failover without GTIDs): its later changes would be dropped as older than what the table holds. Nothing was
    committed; the message names the table, the key, both positions and the recovery (docs/cdc.md)."""


class TooManyRejectedError(LakesinkError):
    """More of a batch's rows were dead letters than option ``max-rejected-fraction`` allows; nothing was committed."""


class CheckpointError(LakesinkError):
    """The streaming checkpoint could not be read (query id, source offsets) or cleaned."""


class CheckpointInUseError(CheckpointError):
    """``lakesink checkpoint-clean`` refused a checkpoint that changed recently: its query may still be running.

    Nothing was removed. Stop the query and wait, or pass ``--older-than 0`` when no process runs it any more.
    """

    retryable = True


class CommitConflictError(LakesinkError):
    """The snapshot commit kept conflicting with other writers until the retries ran out.

    Nothing of the batch was committed and its data files were deleted; a restart replays it.
    """

    retryable = True


class CommitOutcomeUnknownError(LakesinkError):
    """The catalog did not say whether the snapshot commit landed, and reading the table could not settle it.

    No data file was deleted. A restart settles the outcome by reading the table: the batch is
    either found committed (and skipped) or committed then.
    """

    retryable = True


class UnitNotAtomicError(CommitOutcomeUnknownError):
    """A unit of several tables sent to a catalog as one atomic commit (a SQL catalog's database transaction, a REST
    catalog's ``transactions/commit``) landed in some of its tables and not in others.

    The catalog broke its promise of all or nothing (a bug of the catalog server): readers may have seen the batch in
    some tables only. No file was deleted; a restart completes the batch in the tables that miss it (each table's
    replay marker says which) -- or use ``atomic=off`` with this catalog and report the bug to its maintainers.
    """


class InFlightTooLongError(LakesinkError):
    """A commit's files were written longer ago than lakesink's in-flight window lets a commit use them.

    The orphan-file clean-up keeps the files of a commit in flight for ``lakesink.table.names.IN_FLIGHT_WINDOW_MS``
    (3 days); a commit whose oldest file is older than ``lakesink.table.names.COMMIT_DEADLINE_MS`` (2 days) is never
    swapped, since some of its files may be gone. Nothing was committed; a restart writes the batch again.
    """

    retryable = True


class ConcurrentTableChangeError(LakesinkError):
    """The table's schema or partition spec changed while the batch was being written."""

    retryable = True


class RowDeltaConflictError(ConcurrentTableChangeError):
    """A row delta (position deletes with a batch's rows) conflicts with what was committed since the snapshot its
    positions were read from: a data file its deletes point at was removed or rewritten (a compaction, another
    engine's copy-on-write), another engine's delete files may delete the same rows, or new data files may hold rows
    the batch changes. The positions are no longer valid as they are: nothing was committed, and the files the batch
    wrote for this attempt are left to the caller, who finds the positions again on the new head (or a restart
    does). ``files``: the conflicting files."""

    def __init__(self, message: str, files: tuple[str, ...] = ()):
        super().__init__(message)
        self.files = files


class ReplayMismatchError(LakesinkError):
    """Spark replays a batch that the table already holds, but over other source offsets than the committed one.

    This happens when a checkpoint was repaired by hand (``offsets/N`` and ``commits/N`` deleted while more input
    arrived) or a source's rate limit changed: skipping the replay would drop the new rows silently, committing it
    would duplicate the old ones. Nothing was committed or deleted; the message says how to recover.
    """


class DuplicateSinkError(LakesinkError):
    """Two sinks of one streaming query wrote the same table in the same batch under the same ``sink_id``.

    The second would be taken for a replay of the first and skipped; give each sink its own ``sink_id``.
    """


class TableIdentityChangedError(ConcurrentTableChangeError):
    """The table was dropped and recreated, or the branch written was deleted, while the query ran.

    Nothing was committed (files written for the old table never enter the new one).
    """

    retryable = False


class CommitWorkerOrphaned(BaseException):
    """format("lakesink"): the Spark commit worker running a batch's commit found its JVM dead before the swap.

    Nothing was committed, and nothing may be: a job killed must not change a table afterwards (a reader or a restarted
    query may already be looking). A BaseException, like SystemExit: no retry loop catches it, the worker ends; the
    batch's files are left to the restarted query's replay and to the orphan clean-up."""


class InjectedFault(LakesinkError):
    """Raised by a fault point switched on by a test (see :mod:`lakesink.faults`)."""

    retryable = True


class AuditError(LakesinkError):
    """An audit question cannot be answered as asked: the point in time, batch or branch does not exist in the table."""


class PublishRefusedError(LakesinkError):
    """``publish`` refused to move ``main``: the branch failed verification or ``main`` is not its ancestor."""


class RoutingError(LakesinkError):
    """Option ``route-by``: a row's routing value names no table lakesink may write (null, empty, invalid), or two
    values of one batch name one table. The message names the value and the batch; nothing was committed."""
