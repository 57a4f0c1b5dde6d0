"""A sink's table: opened or created, checked against the stream, planned.

- :mod:`~lakesink.driver.tables.sink_table`: SinkTable: open or create the table, check it, make the write plan;
- :mod:`~lakesink.driver.tables.schema`: the stream's schema against the table's (checked at query start).

The catalogs they are opened in: :mod:`lakesink.driver.catalogs`.
"""
