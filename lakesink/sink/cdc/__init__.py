"""CDC orchestration on the entry points' side (driver side): the steps a batch of Debezium changes goes through
between Spark and the commit, each returning a new :class:`~lakesink.driver.committers.facts.BatchFacts`.

The parsing itself (the envelope, typed values, positions, transaction metadata) is :mod:`lakesink.cdc`, which runs
anywhere and imports no driver code; these steps open tables and call the committer, so they live above it.

- :mod:`lakesink.sink.cdc.truncates`: option cdc-format: a batch's changes before each table's truncate dropped (both
  entry points);
- :mod:`lakesink.sink.cdc.transactions`: option cdc-transactions=hold on ``foreach_batch``: a source transaction held
  back until whole (one Spark job decides);
- :mod:`lakesink.sink.cdc.staged_transactions`: the same on ``format("lakesink")``: staged and held records joined and
  split in plain Python.
"""
