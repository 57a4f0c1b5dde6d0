"""Write-audit-publish: fast-forward ``main`` to an audited branch (:func:`publish`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pyiceberg.table import Table
from pyiceberg.table.snapshots import ancestors_of

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import producers as seam_producers
from lakesink.audit.completeness import first_snapshot_through
from lakesink.audit.invariants import VerifyReport, verify
from lakesink.audit.points import format_ms
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing
from lakesink.errors import AuditError, CommitConflictError, PublishRefusedError
from lakesink.table.keys import MAIN_BRANCH


@dataclass(frozen=True)
class PublishResult:
    """What :func:`publish` did."""

    branch: str
    main_before: int | None
    main_after: int
    forced: bool
    verify: VerifyReport
    through_ms: int | None = None
    """``through``: the watermark main was published through (the published snapshot's is at or past it)."""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verify": self.verify.to_dict()}


def publish(
    table: Table, *, branch: str, force: bool = False, show_progress: bool | None = None, through_ms: int | None = None
) -> PublishResult:
    """Fast-forward ``main`` to the head of ``branch`` once ``verify`` passes on the branch.

    ``through_ms``: not to the head, but to the oldest snapshot of the branch whose recorded watermark
    (lakesink.audit.completeness) is at or past it: main then holds every row with an earlier event time (as far as
    the watermark promises), and the fewest rows of later event times a fast-forward can leave -- not none: a batch
    mixes event times, so main may show part of the next hour (docs/auditing.md, "Publishing through a watermark").
    Refused when no snapshot of the branch reached it yet.

    Refused (:class:`PublishRefusedError`) when verification finds a violation or when ``main``'s head is not
    an ancestor of the branch head (main moved since the branch was made: not a fast-forward) -- unless
    ``force``, which sets ``main`` to the branch head anyway. The swap asserts ``main``'s head is still the one
    checked, so a commit to ``main`` in between makes it fail rather than be lost.
    """
    if branch == MAIN_BRANCH:
        raise AuditError("publish moves main to another branch; give that branch's name")
    target = table.metadata.snapshot_by_name(branch)
    if target is None:
        raise AuditError(f"branch {branch!r} does not exist or has no snapshot")
    main = table.metadata.snapshot_by_name(MAIN_BRANCH)
    if through_ms is not None:
        found, head_mark = first_snapshot_through(table, branch, through_ms, after=main.snapshot_id if main is not None else None)
        if found is None:
            raise PublishRefusedError(
                f"publish refused: no snapshot of branch {branch!r} newer than main's head has a watermark at or past "
                f"{format_ms(through_ms)} (the branch's watermark: "
                f"{format_ms(head_mark) if head_mark is not None else 'none recorded'}); wait for it (lakesink wait "
                f"--branch {branch} --watermark ...) and publish again"
            )
        target = table.metadata.snapshot_by_id(found)
        assert target is not None
    report = verify(table, branch=branch, show_progress=show_progress)
    problems = []
    if not report.ok:
        problems.append(f"verify found {len(report.violations)} violation(s) on branch {branch!r}:\n{report.human()}")
    if main is not None and main.snapshot_id not in {s.snapshot_id for s in ancestors_of(target, table.metadata)}:
        problems.append(
            f"main's head {main.snapshot_id} is not an ancestor of {branch!r}'s head {target.snapshot_id}: main has "
            "commits the branch does not, a fast-forward would drop them"
        )
    if problems and not force:
        raise PublishRefusedError("publish refused (--force publishes anyway): " + "; ".join(problems))
    action = _Publish(table, branch, target.snapshot_id, force=force)
    try:
        swap.run(action)
    except swap.RetriesExhausted as e:
        raise CommitConflictError(f"{action.what}: {e.attempts} attempt(s) {e.describe()}; main was not moved") from e
    return PublishResult(branch, main.snapshot_id if main else None, target.snapshot_id, bool(problems), report, through_ms)


class _Publish(CommitAction):
    """Moving ``main`` to the verified head of a branch, as a commit action: every attempt checks on the table as read
    then that it is still a fast-forward (``main``'s head an ancestor of the target; not with ``force``), and its swap
    asserts that head (a commit to ``main`` in between is a conflict, checked again, never lost)."""

    def __init__(self, table: Table, branch: str, target: int, *, force: bool):
        super().__init__(table, f"publish of branch {branch!r} of {'.'.join(table.name())} to main")
        self.branch = branch
        self.target = target
        self.force = force

    def landed(self, table: Table) -> Landing | None:
        main = table.metadata.snapshot_by_name(MAIN_BRANCH)
        return Landing(mine=True, snapshot_id=self.target) if main is not None and main.snapshot_id == self.target else None

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        main = table.metadata.snapshot_by_name(MAIN_BRANCH)
        target = table.metadata.snapshot_by_id(self.target)
        if target is None:
            raise PublishRefusedError(f"{self.what}: snapshot {self.target} was removed meanwhile (snapshot expiry?)")
        behind = main is None or main.snapshot_id in {s.snapshot_id for s in ancestors_of(target, table.metadata)}
        if not self.force and not behind:
            assert main is not None
            raise PublishRefusedError(
                f"{self.what} refused (--force publishes anyway): main moved to {main.snapshot_id} while publishing, a "
                f"commit the branch's head {self.target} does not have; a fast-forward would drop it"
            )
        return seam_producers.prepare_staged(
            table, lambda tx: seam_producers.manage_snapshots(tx).set_current_snapshot(snapshot_id=self.target).commit()
        )
