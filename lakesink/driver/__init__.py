"""Driver side: everything lakesink does on the driver to commit a batch, never touching rows.

Runs in the driver process (``foreach_batch``) or in the Python workers Spark starts on the driver machine for
``format("lakesink")``'s ``streamWriter()``/``commit()``/``abort()``; never on executors. Its sub-packages follow a
batch's commit, top to bottom (a package imports only those below it):

- :mod:`lakesink.driver.committers`: where a batch gets committed: TableCommitter (one table), RoutedCommitter
  (option route-by: a batch's tables as one unit); post-commit hooks (automatic maintenance) are passed in by the
  entry point;
- :mod:`lakesink.driver.actions`: what a batch commits into one table, as commit actions (append, overwrite, upsert,
  an empty batch, a replay found at plan time, a routed unit's member), event time, dead letters;
- :mod:`lakesink.driver.report`: a commit's metrics and where they go;
- :mod:`lakesink.driver.tables`: open (or create) and check a table, make the write plan; the stream's schema;
- :mod:`lakesink.driver.loop`: the one compare-and-swap loop with the replay re-check on every attempt, the settling
  of unknown outcomes, turns, the commit/abort guard, the files in doubt;
- :mod:`lakesink.driver.catalogs`: resolve and open the catalog (the embedded default, named catalogs).

Executors never import this package (the import contracts of ``make lint`` and tests/executor/test_boundary.py
hold that). This ``__init__`` imports nothing, so that importing one module does not load the others.
"""
