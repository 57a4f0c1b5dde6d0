"""Driver side: everything lakesink does on the driver to commit a batch, never touching rows.

Runs in the driver process (``foreach_batch``) or in the Python workers Spark starts on the driver machine for
``format("lakesink")``'s ``streamWriter()``/``commit()``/``abort()``; never on executors.

- :mod:`lakesink.driver.catalogs`: resolve and open the catalog (the embedded default, named catalogs);
- :mod:`lakesink.driver.schema`: the stream's schema against the table's (checked at query start);
- :mod:`lakesink.driver.tables`: open (or create) and check the table, make the write plan;
- :mod:`lakesink.driver.swap`: the one compare-and-swap loop with the replay re-check on every attempt,
  and the settling of unknown outcomes;
- :mod:`lakesink.driver.commit`: what a batch's commit is, what a batch found committed means, abort;
  post-commit hooks (automatic maintenance) are passed in by the entry point;
- :mod:`lakesink.driver.upsert`: the copy-on-write of the files that hold an upsert batch's keys;
- :mod:`lakesink.driver.guard`: an abort waits for a commit of the same sink still in flight;
- :mod:`lakesink.driver.indoubt`: the files of commits whose outcome is in doubt, kept until it is settled;
- :mod:`lakesink.driver.validation`: what was committed to a branch since a commit's base snapshot, and
  which new delete files may apply to the files a commit replaces (checked on every attempt).

Executors never import this package (the import contracts of ``make lint`` and tests/executor/test_boundary.py
hold that). This ``__init__`` imports nothing, so that importing one module does not load the others.
"""
