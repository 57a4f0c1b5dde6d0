"""The committers: where a batch gets committed (the entry points call them, lakesink.sink).

- :mod:`~lakesink.driver.committers.table`: TableCommitter, one table's sink: plan, commit (which action a batch is,
  with its dead letters in the same unit), a replay checked, abort;
- :mod:`~lakesink.driver.committers.facts`: BatchFacts, what a routed batch's changes carry beside its rows;
- :mod:`~lakesink.driver.committers.routed`: RoutedCommitter, a routed batch committed as one unit of its tables'
  actions, abort.
"""
