"""Run by the *second* virtual environment (pyspark 3.5.8 + Iceberg's Java Spark runtime, see
tests/support/java_engine.py): a Spark 3.5 session with Iceberg's ``SparkCatalog`` that answers SQL statements.

Protocol, one JSON object per line: stdin ``{"sql": "...", "parquet": "/path or null"}``; stdout
``{"ok": true, "rows": [...]}`` (rows as lists of JSON-safe values, ``str`` for anything else) or,
with ``parquet`` set, writes the result as a Parquet folder there (Iceberg's reader's values, exactly,
for pyarrow to compare) and answers ``{"ok": true, "rows": null}``; an error answers
``{"ok": false, "error": "..."}``. The first line written is ``{"ready": true}``.

argv[1]: a JSON object of Spark configuration (``spark.jars``, ``spark.sql.catalog.*``, ...).
This file must run on pyspark 3.5 and import nothing from lakesink.
"""

from __future__ import annotations

import json
import sys


def _plain(v: object) -> object:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def main() -> int:
    conf = json.loads(sys.argv[1])
    out = sys.stdout
    sys.stdout = sys.stderr  # Spark's and py4j's chatter must not mix with the answers

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[1]").appName("iceberg-java-engine")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            df = spark.sql(request["sql"])
            if request.get("parquet"):
                df.write.mode("overwrite").parquet(request["parquet"])
                answer: dict[str, object] = {"ok": True, "rows": None}
            else:
                answer = {"ok": True, "rows": [_plain(list(r)) for r in df.collect()], "columns": df.columns}
        except Exception as e:  # the test decides what an error means
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"[:4000]}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
