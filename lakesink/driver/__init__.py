"""Driver side: everything lakesink does on the driver, never touching rows.

- :mod:`lakesink.driver.tables`: open (or create) and check the table, make the write plan;
- :mod:`lakesink.driver.swap`: the one compare-and-swap loop with the replay re-check on every attempt,
  and the settling of unknown outcomes;
- :mod:`lakesink.driver.commit`: what a batch's commit is, what a batch found committed means, abort;
- :mod:`lakesink.driver.guard`: an abort waits for a commit of the same sink still in flight;
- :mod:`lakesink.driver.validation`: what was committed to a branch since a commit's base snapshot, and
  which new delete files may apply to the files a commit replaces (checked on every attempt).

Executors never import this package (tests/test_boundaries.py holds that).
"""

from __future__ import annotations

from lakesink.driver.commit import BatchOutcome, Outcome, TableCommitter
from lakesink.driver.swap import Settled
from lakesink.driver.tables import BRANCH_BASE, MAIN_BRANCH, SinkTable

__all__ = ["BRANCH_BASE", "MAIN_BRANCH", "BatchOutcome", "Outcome", "Settled", "SinkTable", "TableCommitter"]
