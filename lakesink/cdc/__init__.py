"""Change data capture: change events of a database (Debezium's envelope) turned into flat columns.

- :mod:`lakesink.cdc.debezium`: :func:`~lakesink.cdc.debezium.parse`, a Debezium JSON value column (Kafka's
  ``value``, with or without the JsonConverter's ``schemas.enable`` wrapper) into route, op, order, before/after.

Spark SQL expressions only (no Python UDF): the parsing runs in Spark's JVM, and the module is built on the driver
(``foreach_batch``) or anywhere a DataFrame is at hand. It imports nothing of lakesink but :mod:`lakesink.errors`
(import contracts in ``make lint``), so the sink's entry points and its executor side may both use it.
docs/cdc.md says what is built and what is not yet (issue 32).
"""
