"""The one seam to pyiceberg's private API, in two parts by where they run.

pyiceberg has no public "write data files now, commit them later" API, and its commit loop retries a
conflicting snapshot by rebasing it without asking us (which would skip lakesink's replay re-check, the way
iceberg#14425 duplicated data). Everything lakesink needs beyond pyiceberg's public surface is in this package,
so that a pyiceberg upgrade touches these files only (tests/seam/test_contract.py pins each hook). Tested
against pyiceberg 0.12.

- :mod:`lakesink._pyiceberg.io`: executor-safe: Arrow in, Parquet out (schemas, projection, partitions, writer
  options, statistics, locations), reading data files and manifests as pyiceberg's scan does, and the
  corrections of pyiceberg's float/double bugs in manifests;
- :mod:`lakesink._pyiceberg.commit`: driver side: prepared commits for one compare-and-swap, the SQL catalog's
  swap and reload, schema evolution, the maintenance snapshot producers (replace, expire, manifest rewrite, the
  refs an expiry dropped put back), metadata-only commits (``prepare_staged``) and the REST catalog's
  request timeout.

This ``__init__`` imports nothing: an executor importing the io part never loads the commit part (nor SQLAlchemy).
A module imports the part it uses as ``seam``; a driver module that uses both imports the io part as ``seam``
and the commit part as ``seam_commit``.
"""
