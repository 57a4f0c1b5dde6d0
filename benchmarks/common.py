"""What every benchmark shares: the machine description, statistics, JSON output, a Spark session."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "performance"
PACKAGES = ("pyspark", "pyiceberg", "pyarrow", "duckdb", "matplotlib")


def machine() -> dict[str, Any]:
    """Cores, RAM, load average and versions: printed next to every number."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "java": _java_version(),
        "versions": versions,
    }


def _java_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    first = (out.stderr or out.stdout).splitlines()
    return first[0].strip() if first else None


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Median and spread (min, max) of repeated measurements."""
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def write_json(out: Path, name: str, result: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return path


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def spark_session(*, cores: int = 2, extra: dict[str, str] | None = None) -> Any:
    """A ``local[cores]`` session whose Python workers run this interpreter (and import this checkout)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    root = str(Path(__file__).resolve().parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    from pyspark.sql import SparkSession

    import lakesink

    builder = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("lakesink-benchmarks")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
    )
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)
    return spark


def lakesink_stream(df: Any, table: str, props: Mapping[str, str]) -> Any:
    """``df.writeStream.format("lakesink")`` into ``table`` of the catalog that ``props`` describe."""
    from lakesink.options import CATALOG_PROPERTY_PREFIX

    w = df.writeStream.format("lakesink").option("table", table)
    return w.options(**{CATALOG_PROPERTY_PREFIX + k: v for k, v in props.items()})


def catalog_properties(root: Path) -> dict[str, str]:
    (root / "warehouse").mkdir(parents=True, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/warehouse"}


def duckdb_connection() -> Any:
    """A DuckDB connection with the Iceberg and Avro extensions loaded from their PyPI packages (no extension server
    here: ``INSTALL iceberg`` fails)."""
    import importlib.util

    import duckdb

    con = duckdb.connect()
    for ext in ("avro", "iceberg"):
        spec = importlib.util.find_spec(f"duckdb_extension_{ext}")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"duckdb-extension-{ext} is not installed")
        found = sorted(Path(next(iter(spec.submodule_search_locations))).rglob(f"{ext}.duckdb_extension"))
        con.execute(f"LOAD '{found[0]}'")
    return con
