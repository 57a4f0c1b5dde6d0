"""The executor/driver boundary, held by the code: what a Spark Python worker unpickles imports executor code only.

Spark pickles the data source writer (:class:`lakesink.datasource.LakesinkStreamWriter`),
foreachBatch's ``mapInArrow`` function (:class:`lakesink.executor.PartitionWriter`) and the batch
reader (:class:`lakesink.reader.LakesinkReader`) to its Python workers. Unpickling them there must not
load the driver (commit, retries), the catalogs, the audit package, SQLAlchemy or tenacity. Checked in
a fresh interpreter, which unpickles real pickles made here with pyspark's own cloudpickle (what Spark
uses), then imports the executor modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lakesink.executor.reader import LakesinkReader
from lakesink.executor.task_writer import PartitionWriter
from lakesink.options import ReadOptions, SinkOptions, TableName
from lakesink.sink.datasource import LakesinkStreamWriter

_dumps: Callable[[object], bytes] = cloudpickle.dumps  # what Spark pickles with (untyped in pyspark)

# what an executor must never import (prefixes of module names)
DRIVER_SIDE = ("lakesink.driver", "lakesink.catalogs", "lakesink.audit", "tenacity", "pyiceberg.catalog.sql", "sqlalchemy")
EXECUTOR_MODULES = (
    "lakesink.bucketing",
    "lakesink.datasource",
    "lakesink.executor",
    "lakesink.messages",
    "lakesink.options",
    "lakesink.parquetlayout",
    "lakesink.reader",
    "lakesink.schema",
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
    out = subprocess.run([sys.executable, "-c", _CHILD, payload], capture_output=True, text=True, timeout=300, check=True)
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
    writer = LakesinkStreamWriter(options, schema)  # on the driver: opens (creates) the table, makes the write plan
    assert writer._plan is not None
    reader = LakesinkReader(ReadOptions(table=TableName(("db",), "events"), catalog_properties=catalog_properties), schema)
    pickles = {
        "stream_writer.pkl": writer,
        "partition_writer.pkl": PartitionWriter(writer._plan, 3),
        "reader.pkl": reader,  # spark.read.format("lakesink"): its read() runs on executors
    }
    for name, obj in pickles.items():
        (tmp_path / name).write_bytes(_dumps(obj))

    result = _in_fresh_interpreter(EXECUTOR_MODULES, [tmp_path / name for name in pickles])

    assert result["loaded"] == ["LakesinkStreamWriter", "PartitionWriter", "LakesinkReader"]
    assert result["after_unpickling"] == [], (
        f"unpickling the executor-side writers loaded driver-side modules: {result['after_unpickling']}"
    )
    assert result["after_imports"] == [], f"importing the executor modules loaded driver-side modules: {result['after_imports']}"
