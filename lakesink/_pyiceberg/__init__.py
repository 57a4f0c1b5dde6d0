"""The one seam to pyiceberg's private API, in two parts by where they run.

pyiceberg has no public "write data files now, commit them later" API, and its commit loop retries a
conflicting snapshot by rebasing it without asking us (which would skip lakesink's replay re-check, the way
iceberg#14425 duplicated data). Everything lakesink needs beyond pyiceberg's public surface is in this package,
so that a pyiceberg upgrade touches these files only (tests/seam/test_contract.py pins each hook). Tested
against pyiceberg 0.12.

- :mod:`lakesink._pyiceberg.io`: executor-safe: Arrow in, Parquet out (schemas, projection, partitions, writer
  options, statistics, locations), Iceberg's metadata files (a commit's table metadata from one parse, manifests and
  manifest lists written and read by pyiceberg's Avro encoder and decoder), reading data files and manifests as
  pyiceberg's scan does, and the corrections of pyiceberg's float/double bugs in manifests;
- the driver side, by what each module talks to: :mod:`~lakesink._pyiceberg.commit` (a prepared commit's one
  compare-and-swap, a unit of tables committed together), :mod:`~lakesink._pyiceberg.producers` (pyiceberg's
  snapshot producers: a batch's snapshot, a compaction's replace, metadata-only commits ``prepare_staged``, schema
  evolution), :mod:`~lakesink._pyiceberg.maintenance` (manifest rewrite, expiry, the refs an expiry dropped put
  back), :mod:`~lakesink._pyiceberg.sql_catalog` (the SQL catalog's rows: swap, reload, pointers),
  :mod:`~lakesink._pyiceberg.rest` (the REST catalog's HTTP session: transactions/commit, request timeout,
  Idempotency-Key), :mod:`~lakesink._pyiceberg.refusals` (which errors are the catalog's definite "no") and
  :mod:`~lakesink._pyiceberg.threads` (the threads a unit of tables is prepared on). ``commit`` also chooses a
  catalog's ``Swapper`` (SQL, REST, any other) once, telling the kinds apart without importing either, so that a process
  that commits imports the seam of the kind it uses only (``sql_catalog``, ``rest``, ``rest_metrics``: where used,
  tests/test_layout.py ``LAZY_SEAMS``).

This ``__init__`` imports nothing: an executor importing the io part never loads the driver side (nor SQLAlchemy).
A module imports the part it uses as ``seam``; a driver module that uses several imports the io part as ``seam``
and each driver-side module as ``seam_<name>`` (``seam_commit``, ``seam_producers``, ``seam_sql``, ...).
"""
