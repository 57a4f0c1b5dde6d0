"""Table maintenance (driver side, or the ``lakesink`` command line).

- :mod:`lakesink.maintenance.routine`: ``maintain`` (the whole routine) and ``forget_query``;
- :mod:`lakesink.maintenance.auto`: the sink's automatic maintenance (option ``maintenance=auto``), a
  post-commit hook the entry points pass into the driver's committer;
- :mod:`lakesink.maintenance.compaction`: small data files bin-packed into a replace snapshot;
- :mod:`lakesink.maintenance.position_deletes`: small position delete files merged, dangling deletes dropped;
- :mod:`lakesink.maintenance.expiry`: snapshot expiry as the table's ``history.expire.*`` properties say;
- :mod:`lakesink.maintenance.manifest_rewrite`: a branch head's small manifests merged;
- :mod:`lakesink.maintenance.orphans`: orphan-file clean-up.

Every maintenance commit goes through the driver's one compare-and-swap loop (:mod:`lakesink.driver.loop.swap`);
the driver never imports this package.
"""
