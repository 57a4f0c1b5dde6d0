"""The table model, shared by every side (driver, Python workers, maintenance, audit, CLI).

- :mod:`lakesink.table.keys`: every key and default lakesink reads or writes, defined once;
- :mod:`lakesink.table.settings`: the table properties lakesink acts on, parsed into one typed value;
- :mod:`lakesink.table.markers`: the replay-marker ledger (the markers, batch summaries, the branch walk);
- :mod:`lakesink.table.names`: the names of a table's files (lakesink's and Iceberg's);
- :mod:`lakesink.table.storage`: locations and files through a table's FileIO;
- :mod:`lakesink.table.locations`: where a table's files may be written;
- :mod:`lakesink.table.partitioning`: the ``partitioned-by`` option, parsed and resolved;
- :mod:`lakesink.table.parquet_layout`: row groups and dictionary encoding of the Parquet files lakesink writes.
- :mod:`lakesink.table.numbering`: rows numbered 0..n-1 (a file's row positions, rows' original order).

Plain Python, pyarrow, fsspec and pyiceberg's public models only: the package imports nothing else of lakesink
but :mod:`lakesink.errors` (import contracts in ``make lint``).
"""
