"""A sink's table: opened or created, checked against the stream, planned.

- :mod:`~lakesink.driver.tables.sink_table`: SinkTable: open or create the table, check it, make the write plan;
- :mod:`~lakesink.driver.tables.schema`: the stream's schema against the table's (checked at query start);
- :mod:`~lakesink.driver.tables.routed_tables`: option route-by, a routed sink's tables: routes, plans (BatchPlans),
  the template of tables not opened yet;
- :mod:`~lakesink.driver.tables.staging`: the staging area of format("lakesink")'s tables not opened yet, on a catalog
  that places its tables itself;
- :mod:`~lakesink.driver.tables.routed_keys`: route-by with upserts, each table's key.

The catalogs they are opened in: :mod:`lakesink.driver.catalogs`.
"""
