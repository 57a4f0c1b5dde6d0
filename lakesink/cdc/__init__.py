"""Change data capture: change events of a database (Debezium's envelope) turned into flat columns.

- :mod:`lakesink.cdc.debezium`: :func:`~lakesink.cdc.debezium.parse`, a Debezium JSON value column (Kafka's
  ``value``, with or without the JsonConverter's ``schemas.enable`` wrapper) into route, op, order, before/after:
  Spark SQL expressions only (no Python UDF), built on the driver (``foreach_batch``) or anywhere a DataFrame is at
  hand;
- :mod:`lakesink.cdc.envelope`: the same envelope parsed in plain Python over Arrow batches, for format("lakesink")'s
  writers (no Spark SQL in a Python worker); tests hold its rows equal to ``parse``'s;
- :mod:`lakesink.cdc.connect`: typed values decoded by a record's Kafka Connect schema (plain Python).

The package imports no driver-side code (import contracts in ``make lint``), so the sink's entry points and its
executor side may both use it.
docs/cdc.md says what each option does, its guarantees and its limits.
"""
