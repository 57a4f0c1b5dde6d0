"""Read lakesink tables back through engines that are not pyiceberg (checks, demos, audits).

- DuckDB's C++ Iceberg reader (``duckdb`` + ``duckdb-extension-iceberg`` + ``duckdb-extension-avro``
  from PyPI; the extensions are loaded from their wheels, no extension server needed);
- iceberg-rust through DataFusion (``pyiceberg-core`` + ``datafusion``);
- ClickHouse's Iceberg reader, embedded (``chdb``, ``icebergLocal``): it takes the table's folder and
  reads the metadata file with the highest version number there, not the catalog's pointer (a commit
  that lost its swap can leave a newer, never-committed metadata file: use it on quiet tables only).

Install them with ``pip install 'lakesink[readers]'``. Both read the table's current
``metadata.json`` straight from storage, independent of pyiceberg's reader.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pyarrow as pa


def _extension_path(package: str, name: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed: pip install 'lakesink[readers]'")
    root = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    found = sorted(root.glob(f"*/{name}.duckdb_extension"))
    if not found:
        raise ImportError(f"no {name}.duckdb_extension inside {root}")
    return str(found[-1])


def duckdb_connection() -> Any:
    """A DuckDB connection with the Iceberg extension loaded from its PyPI wheel."""
    import duckdb

    con = duckdb.connect()
    for package, name in (("duckdb_extension_avro", "avro"), ("duckdb_extension_iceberg", "iceberg")):
        con.execute(f"LOAD '{_extension_path(package, name)}'")
    return con


def _local(metadata_location: str) -> str:
    return metadata_location[len("file://") :] if metadata_location.startswith("file://") else metadata_location


def duckdb_query(metadata_location: str, sql: str = "SELECT * FROM t") -> pa.Table:
    """Run ``sql`` with ``t`` bound to the table at ``metadata_location`` (a metadata.json) in DuckDB."""
    con = duckdb_connection()
    try:
        path = _local(metadata_location).replace("'", "''")
        con.execute(f"CREATE VIEW t AS SELECT * FROM iceberg_scan('{path}')")
        result: pa.Table = con.execute(sql).fetch_arrow_table()
        return result
    finally:
        con.close()


def duckdb_read(metadata_location: str) -> pa.Table:
    return duckdb_query(metadata_location)


def iceberg_rust_query(
    metadata_location: str, sql: str = "SELECT * FROM t", *, identifier: tuple[str, ...] = ("lakesink", "t")
) -> pa.Table:
    """Run ``sql`` with ``t`` bound to the table in DataFusion through iceberg-rust (pyiceberg-core)."""
    from datafusion import SessionContext
    from pyiceberg_core.datafusion import IcebergDataFusionTable

    provider = IcebergDataFusionTable(identifier=list(identifier), metadata_location=metadata_location, file_io_properties={})
    ctx = SessionContext()
    ctx.register_table_provider("t", provider)
    batches = ctx.sql(sql).collect()
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


def iceberg_rust_read(metadata_location: str) -> pa.Table:
    return iceberg_rust_query(metadata_location)


# chdb reads local files only inside its working folder ("File path ... is not inside ."), and its
# connection options do not change that: the query runs in a child process started in the root folder.
_CHDB_SCRIPT = """
import sys
import chdb
path, sql = sys.argv[1], sys.argv[2]
view = "CREATE VIEW t AS SELECT * FROM icebergLocal('" + path.replace("'", "''") + "')"
with chdb.session.Session() as s:
    s.query(view)
    sys.stdout.buffer.write(s.query(sql, "Arrow").bytes())
"""


def chdb_query(table_location: str, sql: str = "SELECT * FROM t") -> pa.Table:
    """Run ``sql`` with ``t`` bound to the table at ``table_location`` (its folder) in chdb (ClickHouse)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CHDB_SCRIPT, _local(table_location), sql], cwd="/", capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"chdb failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return pa.ipc.open_file(pa.BufferReader(done.stdout)).read_all()


def chdb_read(table_location: str) -> pa.Table:
    return chdb_query(table_location)
