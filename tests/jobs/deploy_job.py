"""A streaming job run as a child process by the deployment tests (tests/deploy/test_s3.py, tests/deploy/test_cluster.py),
which SIGKILL it or its executors and start it again on the same checkpoint.

argv[1]: JSON object with ``input``, ``checkpoint``, ``table``, ``entry`` (``format`` or ``foreach``),
``catalog_properties``, ``master`` (``local[2,4]``, ``spark://127.0.0.1:PORT``), optional ``writer``,
``conf`` (more Spark configuration), ``max_files`` (maxFilesPerTrigger) and ``upsert`` (entry ``foreach`` only: the
table's properties, e.g. merge-on-read; the input is then a change stream of ``tests.jobs.upsert_job.EVENTS_DDL`` events
upserted by key ``id``, deleted where ``op = 'd'``, ordered by ``seq``).
Input: JSON files of ``tests.support.helpers.SCHEMA_DDL`` rows with unique ids; trigger availableNow.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    cfg = json.loads(sys.argv[1])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import lakesink
    from tests.jobs.jvm import short_lived
    from tests.jobs.upsert_job import EVENTS_DDL
    from tests.support.helpers import SCHEMA_DDL

    builder = (
        short_lived(SparkSession.builder.master(cfg["master"]))
        .appName("lakesink-deploy-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for k, v in cfg.get("conf", {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)
    upsert = cfg.get("upsert")
    ddl = EVENTS_DDL if upsert is not None else SCHEMA_DDL
    events = spark.readStream.schema(ddl).option("maxFilesPerTrigger", cfg.get("max_files", 1)).json(cfg["input"])
    if cfg["entry"] == "format":
        writer = events.writeStream.format("lakesink").option("table", cfg["table"])
        for k, v in cfg["catalog_properties"].items():
            writer = writer.option(f"catalog.{k}", v)
    else:
        sink = lakesink.foreach_batch(
            cfg["table"],
            catalog_properties=cfg["catalog_properties"],
            checkpoint_location=cfg["checkpoint"],
            writer=cfg.get("writer", "auto"),
            **(
                {"upsert_key": "id", "delete_when": "op = 'd'", "order_by": "seq", "table_properties": upsert}
                if upsert is not None
                else {}
            ),
        )
        writer = events.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
    query = writer.option("checkpointLocation", cfg["checkpoint"]).trigger(availableNow=True).start()
    print(f"deploy_job: started query {query.id}", flush=True)
    query.awaitTermination()
    print("deploy_job: all input consumed", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
