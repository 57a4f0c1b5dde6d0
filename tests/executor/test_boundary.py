"""The executor/driver boundary, held by the code: what a Spark Python worker unpickles imports executor code only.

Spark pickles the data source writer (:class:`lakesink.executor.stream_writer.LakesinkStreamWriter`),
foreachBatch's ``mapInArrow`` function (:class:`lakesink.executor.task_writer.PartitionWriter`), the batch
reader (:class:`lakesink.executor.reader.LakesinkReader`) and the Spark path's bucket UDF
(:mod:`lakesink.executor.bucketing`) to its Python workers. Unpickling them there must not load any module of the
driver-side packages -- the driver (commit, retries, catalogs), the entry points (sink), maintenance, audit,
the CLI, the seam's commit part -- nor SQLAlchemy or tenacity. Checked in a fresh interpreter, which unpickles
real pickles made here with pyspark's own cloudpickle (what Spark uses), then imports every module of the
executor-side packages. (The import contracts of ``make lint`` check the same boundary statically.)
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from pyiceberg.types import LongType as IcebergLong
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType

import lakesink.executor
import lakesink.table
from lakesink.executor.bucketing import bucket_function
from lakesink.executor.messages import WritePlan
from lakesink.executor.reader import LakesinkReader
from lakesink.executor.routed_writer import RoutedPartitionWriter, RoutedPlan
from lakesink.executor.task_writer import PartitionWriter
from lakesink.options import ReadOptions, SinkOptions, TableName
from lakesink.sink.datasource import stream_writer
from lakesink.sink.read import open_read
from tests.support.timeouts import guard

_dumps: Callable[[object], bytes] = cloudpickle.dumps  # what Spark pickles with (untyped in pyspark)

# what an executor must never import: whole packages (prefixes of module names)
DRIVER_SIDE = (
    "lakesink.driver",
    "lakesink.sink",
    "lakesink.maintenance",
    "lakesink.audit",
    "lakesink.cli",
    "lakesink._pyiceberg.commit",
    "lakesink._pyiceberg.producers",
    "lakesink._pyiceberg.maintenance",
    "lakesink._pyiceberg.sql_catalog",
    "lakesink._pyiceberg.rest",
    "lakesink._pyiceberg.rest_metrics",
    "lakesink._pyiceberg.refusals",
    "lakesink._pyiceberg.threads",
    "tenacity",
    "pyiceberg.catalog.sql",
    "sqlalchemy",
)
# every module of the executor-side packages, and the shared modules they use
EXECUTOR_MODULES = tuple(
    sorted(
        {
            m.name
            for package in (lakesink.executor, lakesink.table)
            for m in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")
        }
        | {
            "lakesink._pyiceberg.io",
            "lakesink._pyspark",
            "lakesink.errors",
            "lakesink.faults",
            "lakesink.options",
            "lakesink.redaction",
        }
    )
)

_CHILD = textwrap.dedent(
    """
    import importlib, json, pickle, sys
    modules, pickles, forbidden = json.loads(sys.argv[1])
    def loaded_forbidden():
        return sorted(m for m in sys.modules if m.startswith(tuple(forbidden)))
    # first what a Python worker does: no import of its own, only the pickles (which import the package)
    loaded = [type(pickle.loads(open(path, "rb").read())).__qualname__ for path in pickles]
    after_unpickling = loaded_forbidden()
    for name in modules:
        importlib.import_module(name)
    print(json.dumps({"loaded": loaded, "after_unpickling": after_unpickling, "after_imports": loaded_forbidden()}))
    """
)


def _in_fresh_interpreter(modules: tuple[str, ...], pickles: list[Path]) -> dict[str, list[str]]:
    payload = json.dumps([list(modules), [str(p) for p in pickles], list(DRIVER_SIDE)])
    out = subprocess.run([sys.executable, "-c", _CHILD, payload], capture_output=True, text=True, timeout=guard(300), check=True)
    result: dict[str, list[str]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_unpickling_the_writers_and_importing_the_executor_side_load_no_driver_code(
    tmp_path: Path, catalog_properties: dict[str, str]
) -> None:
    options = SinkOptions(
        table=TableName(("db",), "events"),
        catalog_properties=catalog_properties,
        checkpoint_location=str(tmp_path / "checkpoint"),
    )
    schema = StructType([StructField("id", LongType()), StructField("user", StringType())])
    writer = stream_writer(options, schema)  # on the driver: opens (creates) the table, makes the write plan
    assert isinstance(writer._plan, WritePlan) and writer._commits is not None
    read_options = ReadOptions(table=TableName(("db",), "events"), catalog_properties=catalog_properties)
    reader = LakesinkReader(read_options, schema, open_read(read_options))
    pickles = {
        "stream_writer.pkl": writer,
        "partition_writer.pkl": PartitionWriter(writer._plan, 3),
        # option route-by: a plan per table (and foreach_batch's mapInArrow function)
        "routed_writer.pkl": RoutedPartitionWriter(RoutedPlan("route", ("db",), {"db.events": writer._plan}), 3),
        "reader.pkl": reader,  # spark.read.format("lakesink"): its read() runs on executors
        "bucket_udf.pkl": bucket_function(16, IcebergLong()),  # the Spark path's bucket column, an Arrow UDF
    }
    for name, obj in pickles.items():
        (tmp_path / name).write_bytes(_dumps(obj))

    result = _in_fresh_interpreter(EXECUTOR_MODULES, [tmp_path / name for name in pickles])

    assert result["loaded"] == ["LakesinkStreamWriter", "PartitionWriter", "RoutedPartitionWriter", "LakesinkReader", "function"]
    assert {"lakesink.executor.task_writer", "lakesink.table.storage", "lakesink._pyiceberg.io"} <= set(EXECUTOR_MODULES)
    assert result["after_unpickling"] == [], (
        f"unpickling the executor-side writers loaded driver-side modules: {result['after_unpickling']}"
    )
    assert result["after_imports"] == [], f"importing the executor modules loaded driver-side modules: {result['after_imports']}"
