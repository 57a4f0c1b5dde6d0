"""What a Spark Python worker of the data source loads before it knows its step (lakesink.sink.source), and what a
process that commits loads of the catalog kinds it does not use (lakesink._pyiceberg.commit.is_sql_catalog).

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
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from lakesink.sink.source import LakesinkDataSource
from tests.support.timeouts import guard
from tests.support.txn_rest_server import TxnRestServer

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


# what a process that commits (a driver-side Python worker of format("lakesink"), the driver of foreach_batch) imports
# first, then what it does: open the sink's table and commit two batches through the driver's committer
_COMMITTING_CHILD = textwrap.dedent(
    """
    import json, sys
    props, forbidden, expected = json.loads(sys.argv[1])
    import lakesink.sink.datasource, lakesink.sink.foreach  # the modules of the commit worker and of foreach_batch
    from tests.support.helpers import commit_batches, load, open_committer
    committer = open_committer(props)
    sent = commit_batches(committer, 2)
    ids = sorted(load(committer).scan().to_arrow().column("id").to_pylist())
    print(json.dumps({
        "committed": ids == sorted(sent) and len(ids) == 20,
        "forbidden": sorted(m for m in sys.modules if m in forbidden),
        "expected": sorted(m for m in expected if m in sys.modules),
    }))
    """
)

# the modules of the REST catalog kind: pyiceberg's client (requests and its models) and lakesink's REST seams
REST_KIND = ("pyiceberg.catalog.rest", "lakesink._pyiceberg.rest", "lakesink._pyiceberg.rest_metrics")
# the modules of the SQL catalog kind: SQLAlchemy, pyiceberg's SqlCatalog and lakesink's SQL seam
SQL_KIND = ("sqlalchemy", "pyiceberg.catalog.sql", "lakesink._pyiceberg.sql_catalog")


def _commit_in_a_fresh_process(props: dict[str, str], forbidden: tuple[str, ...], expected: tuple[str, ...]) -> Any:
    payload = json.dumps([props, list(forbidden), list(expected)])
    out = subprocess.run([sys.executable, "-c", _COMMITTING_CHILD, payload], capture_output=True, text=True, timeout=guard(300))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_committing_to_a_sql_catalog_loads_no_rest_client(catalog_properties: dict[str, str]) -> None:
    """Fails when a module of the commit path imports pyiceberg's REST catalog, or lakesink's REST seams, at module
    level (lakesink._pyiceberg.commit did for isinstance checks, lakesink.driver.catalogs for the request timeout,
    lakesink.driver.report.metrics for the commit report: main 6c0af56): 0.2-0.4 s of CPU in every process that
    commits, measured under load."""
    result = _commit_in_a_fresh_process(catalog_properties, REST_KIND, ("lakesink._pyiceberg.sql_catalog",))
    assert result["committed"]
    assert result["expected"] == ["lakesink._pyiceberg.sql_catalog"]  # the commits went through the SQL catalog's swap
    assert result["forbidden"] == [], f"committing to a SQL catalog loaded the REST catalog kind: {result['forbidden']}"


@pytest.mark.parametrize("txn_server_options", [{"metrics": True}], indirect=True)
def test_committing_to_a_rest_catalog_loads_no_sqlalchemy(
    txn_server: TxnRestServer, txn_catalog_properties: dict[str, str]
) -> None:
    """The other way round (the REST server, a SQLite-backed fixture, runs in this process; the child is the client
    only). Fails when a module of the commit path imports SQLAlchemy, pyiceberg's SqlCatalog or lakesink's SQL seam at
    module level (lakesink._pyiceberg.commit, lakesink.driver.catalogs and lakesink.driver.tables.sink_table did:
    main 6c0af56): 0.3-0.6 s of CPU in every process that commits, measured under load."""
    expected = ("lakesink._pyiceberg.rest", "lakesink._pyiceberg.rest_metrics")
    result = _commit_in_a_fresh_process(txn_catalog_properties, SQL_KIND, expected)
    assert result["committed"]
    assert result["expected"] == sorted(expected)  # the REST seams were used: commits, their reports
    assert len(txn_server.reports) >= 2  # a commit report per batch reached the server
    assert result["forbidden"] == [], f"committing to a REST catalog loaded the SQL catalog kind: {result['forbidden']}"


# Spark starts every Python process of a job (each worker module's daemon, the workers it forks) with its own
# pyspark.zip first on PYTHONPATH; a module imported from a zip has no cached bytecode, so each process compiled
# pyspark from source (0.8-0.9 CPU-s more per daemon, five daemons in a run of the soak's job)
_WHERE_PYSPARK = "import json, sys, pyspark; print(json.dumps([pyspark.__file__, pyspark.__version__, sys.path]))"


def test_short_lived_jobs_workers_import_the_installed_pyspark(tmp_path: Path) -> None:
    """tests/jobs/jvm.py's worker_python, run as Spark runs a worker (Spark's PYTHONPATH: pyspark.zip, py4j's zip, the
    user's entries), imports pyspark from the installed package, of the same version, and keeps every other entry of
    the path. Fails when the short-lived jobs' workers run the plain interpreter (main 987a169: no worker_python): the
    control below shows that interpreter importing pyspark from the zip."""
    import pyspark

    from tests.jobs.jvm import worker_python

    lib = Path(pyspark.__file__).parent / "python" / "lib"  # as Spark writes it (its home: pyspark.find_spark_home)
    spark_zip = lib / "pyspark.zip"
    if not spark_zip.is_file():
        pytest.skip("pyspark is not a pip install with its own pyspark.zip")
    py4j = sorted(lib.glob("py4j-*-src.zip"))
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(spark_zip), *map(str, py4j), str(tmp_path)])

    def where(python: str) -> list[Any]:
        out = subprocess.run(
            [python, "-c", _WHERE_PYSPARK], env=env, capture_output=True, text=True, timeout=guard(120), check=True
        )
        return list(json.loads(out.stdout))

    plain_file, _, _ = where(sys.executable)  # the control: Spark's path, the plain interpreter
    assert str(spark_zip) in plain_file

    file, version, path = where(worker_python())
    assert ".zip" not in file and Path(file).resolve().parent == Path(pyspark.__file__).resolve().parent
    assert version == pyspark.__version__
    assert str(tmp_path) in path and all(str(p) in path for p in py4j)  # the other entries kept
    assert str(spark_zip) not in path


@pytest.mark.spark
def test_register_refuses_workers_that_cannot_import_lakesink(
    spark: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 54: without PYSPARK_PYTHON the workers run ``python3`` from PATH; format("lakesink") then failed at its first
    batch with ``ModuleNotFoundError: No module named 'lakesink'`` inside PYTHON_DATA_SOURCE_ERROR, nothing pointing at
    the fix. register() checks the interpreter the session's workers run (a real one without lakesink here: a fresh
    virtual environment) and says the fix."""
    import lakesink
    from lakesink.sink import source

    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=guard(120))
    python = str(bare / "bin" / "python")
    monkeypatch.chdir(tmp_path)  # the workers' folder: no checkout of lakesink in it
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    with pytest.raises(lakesink.LakesinkError) as e:
        lakesink.register(spark)
    message = str(e.value)
    assert f"Spark starts its Python workers with {python!r}" in message, message
    assert "cannot import lakesink, pyiceberg, pyarrow, pyspark" in message, message
    assert "os.environ['PYSPARK_PYTHON'] = sys.executable" in message and "before the SparkSession starts" in message, message
    monkeypatch.setattr(spark.sparkContext, "pythonExec", "no-such-python-3")
    with pytest.raises(lakesink.LakesinkError, match="'no-such-python-3' \\(PYSPARK_PYTHON\\), which is not found"):
        lakesink.register(spark)
    monkeypatch.undo()
    lakesink.register(spark)  # the session's own workers: fine
    assert source._CHECKED or spark.sparkContext.pythonExec == sys.executable
