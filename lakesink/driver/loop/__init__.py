"""The one commit-action loop: every commit lakesink makes runs here.

- :mod:`~lakesink.driver.loop.action`: CommitAction, a commit that can be prepared again ("has it landed?",
  "prepare against this table");
- :mod:`~lakesink.driver.loop.swap`: the loop that runs commit actions (alone, or several tables as one unit), the
  settling of unknown outcomes, and the turns this process's batches and maintenance commits take on a table;
- :mod:`~lakesink.driver.loop.validation`: what was committed to a branch since a commit's base snapshot;
- :mod:`~lakesink.driver.loop.guard`: what an abort keeps: it waits for a commit of the same sink still in flight, and
  keeps the files of commits whose outcome is in doubt.
"""
