"""Driver side: what one commit is, to the one compare-and-swap loop (:mod:`lakesink.driver.loop.swap`).

A :class:`CommitAction` is a commit that can be prepared again: every attempt of the loop reads the table afresh,
asks the action whether it has already landed (:meth:`CommitAction.landed`: the replay marker, or the commit id of a
maintenance commit, among what the table holds now), and, when it has not, asks it to prepare itself against the
table as read now (:meth:`CommitAction.prepare`: a snapshot's manifests, and every validation the commit needs
against what was committed since its base -- issue 20 -- on every attempt). The loop swaps what the attempt
prepared and retries while the swap conflicts. The model is iceberg-rust's ``TransactionAction::commit(&Table)``
re-applied on the refreshed table by ``Transaction::do_commit``, and pyiceberg's ``ExpireSnapshots``, an update
like an append.

Every kind of commit lakesink makes is one: a batch's append, upsert, complete-mode overwrite and marker-only
commit, and a batch found committed when it was planned (:mod:`lakesink.driver.committers.table`); compaction, snapshot
expiry and manifest rewrite (:mod:`lakesink.maintenance`). Several actions on several tables can run as one unit
(:func:`lakesink.driver.loop.swap.run_unit`).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from pyiceberg.table import Table

from lakesink._pyiceberg.commit import PreparedCommit
from lakesink.table.markers import CommittedBatch
from lakesink.table.settings import CommitRetry, TableSettings


class Turn(enum.Enum):
    """How an action takes turns with the other commits of this process on its table (lakesink.driver.loop.swap.Turns)."""

    BATCH = "batch"
    """A sink's batch: it holds its table for its whole loop; batches never wait for each other, and wait for at
    most one maintenance attempt."""
    MAINTENANCE = "maintenance"
    """A maintenance commit: each attempt (read, prepare, swap) waits until no batch of the table is committing."""


@dataclass(frozen=True)
class Landing:
    """What the table says about an action that has landed (:meth:`CommitAction.landed`)."""

    mine: bool
    """This very action's commit (its commit id) is in the table; False: an equivalent commit by another writer
    (a zombie driver, an earlier run of the query)."""
    snapshot_id: int | None = None
    """The snapshot that landed (None: a commit that adds none, e.g. an expiry)."""
    done: CommittedBatch | None = None
    """A batch: the sink's last committed batch as found."""


class CommitAction(abc.ABC):
    """One commit of one table, prepared again on every attempt of the loop (see the module's docstring).

    ``table`` is the table as the caller read it (the first attempt of a batch uses it; a maintenance attempt reads
    it again inside its turn). ``what`` names the commit in messages and logs. A subclass may set the two itself
    instead of calling ``__init__`` (a batch's actions do: lakesink.driver.actions.batch).
    """

    turn: Turn = Turn.MAINTENANCE
    table: Table
    what: str

    def __init__(self, table: Table, what: str):
        self.table = table
        self.what = what

    @property
    def name(self) -> str:
        return ".".join(self.table.name())

    @abc.abstractmethod
    def landed(self, table: Table) -> Landing | None:
        """Whether this commit (or an equivalent one) is in ``table``; None: not (yet)."""

    @abc.abstractmethod
    def prepare(self, table: Table, attempt: int) -> PreparedCommit:
        """The commit prepared against ``table`` as read by this attempt (``attempt``: 1, 2, ...), validated against
        everything committed since its base; raising ends the loop (what the attempt prepared is discarded)."""

    def retry(self, table: Table) -> CommitRetry:
        """The table's ``commit.retry.*`` settings."""
        return TableSettings.parse(".".join(table.name()), table.properties).commit_retry

    def redact(self, error: BaseException) -> str:
        """``error`` as it may be logged (a maintenance commit says only its type)."""
        return type(error).__name__

    def permission_advice(self) -> str:
        """What to do when the catalog refuses this commit for lack of permission (the end of the error's message)."""
        return (
            f"give the principal lakesink's catalog connection uses the privilege to commit to table {self.name} "
            "(a REST catalog: its table write/commit privilege; AWS Glue: glue:UpdateTable and glue:GetTable), then "
            "run again"
        )
