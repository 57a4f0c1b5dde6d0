"""What a Spark Python worker of the data source loads before it knows its step (lakesink.sink.source).

Spark pickles the registered class, ``LakesinkDataSource``, by reference into every Python worker it starts for the
data source on the driver machine -- the one that only makes the instance from the options, the one that calls
``streamWriter()``, each one that commits or aborts a batch, the one that plans a read -- and each of them imports
the class's module first. Before the class had a module of its own, that import loaded the driver's committers,
the catalogs (SQLAlchemy), automatic maintenance and the audit package: about 2 s of CPU in every such worker of
every query start, which the soak jobs and Spark tests pay again at each restart of the JVM. Checked in a fresh
interpreter, as Spark does it: the class and an instance pickled here with pyspark's cloudpickle, unpickled there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from pyspark import cloudpickle

from lakesink.sink.source import LakesinkDataSource
from tests.support.timeouts import guard

_dumps: Callable[[object], bytes] = cloudpickle.dumps  # what Spark pickles with (untyped in pyspark)

# what a worker that has only unpickled the data source must not have loaded (prefixes of module names)
NOT_BEFORE_THE_STEP = (
    "lakesink.sink.datasource",  # the stream writer's step: the driver's committers
    "lakesink.sink.read",  # the batch read's step
    "lakesink.sink.foreach",
    "lakesink.driver",
    "lakesink.maintenance",
    "lakesink.audit",
    "lakesink.executor",
    "lakesink._pyiceberg",
    "pyiceberg.catalog",
    "pyiceberg.table",
    "pyiceberg.io",
    "sqlalchemy",
    "tenacity",
    "pandas",
    "pyarrow.dataset",
)

_CHILD = textwrap.dedent(
    """
    import json, pickle, sys
    paths, forbidden = json.loads(sys.argv[1])
    loaded = [pickle.loads(open(path, "rb").read()) for path in paths]
    names = [getattr(o, "__qualname__", type(o).__qualname__) for o in loaded]
    print(json.dumps({"loaded": names, "forbidden": sorted(m for m in sys.modules if m.startswith(tuple(forbidden)))}))
    """
)


def test_unpickling_the_data_source_loads_no_step_of_it(tmp_path: Path) -> None:
    """Fails when lakesink.sink.source imports (at module level) the stream writer's or the read's module, as
    lakesink.sink.datasource did when it held the class (commit 61f3c07)."""
    options = {"table": "db.events", "checkpointLocation": str(tmp_path / "checkpoint")}
    pickles = {"class.pkl": LakesinkDataSource, "instance.pkl": LakesinkDataSource(options)}
    for name, obj in pickles.items():
        (tmp_path / name).write_bytes(_dumps(obj))
    payload = json.dumps([[str(tmp_path / name) for name in pickles], list(NOT_BEFORE_THE_STEP)])

    out = subprocess.run([sys.executable, "-c", _CHILD, payload], capture_output=True, text=True, timeout=guard(300), check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])

    assert result["loaded"] == ["LakesinkDataSource", "LakesinkDataSource"]
    assert result["forbidden"] == [], f"unpickling the data source loaded the modules of its steps: {result['forbidden']}"


def test_the_registered_class_is_the_light_one() -> None:
    """lakesink.register(spark) registers (and so pickles by reference) the class of lakesink.sink.source."""
    import lakesink

    assert lakesink.LakesinkDataSource is LakesinkDataSource
    assert LakesinkDataSource.__module__ == "lakesink.sink.source"
