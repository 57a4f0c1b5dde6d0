"""A Spark Connect client job, run as a child process by tests/deploy/test_connect.py (a process of its own: the
test process holds a classic session). Prints one JSON line: ``{"ok": true}`` or ``{"ok": false, "error": ...}``.

argv[1]: JSON object with ``url`` (sc://...), ``entry`` (``format``/``foreach``), ``input``, ``checkpoint``,
``table``, ``catalog_properties`` and ``pass_checkpoint`` (give foreach_batch its checkpoint_location).
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    cfg = json.loads(sys.argv[1])
    from pyspark.sql import SparkSession

    import lakesink
    from tests.support.helpers import SCHEMA_DDL

    spark = SparkSession.builder.remote(cfg["url"]).getOrCreate()
    try:
        events = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).json(cfg["input"])
        if cfg["entry"] == "format":
            lakesink.register(spark)
            writer = events.writeStream.format("lakesink").option("table", cfg["table"])
            for k, v in cfg["catalog_properties"].items():
                writer = writer.option(f"catalog.{k}", v)
        else:
            extra = {"checkpoint_location": cfg["checkpoint"]} if cfg.get("pass_checkpoint") else {}
            sink = lakesink.foreach_batch(cfg["table"], catalog_properties=cfg["catalog_properties"], **extra)
            writer = events.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
        query = writer.option("checkpointLocation", cfg["checkpoint"]).trigger(availableNow=True).start()
        query.awaitTermination()
        print(json.dumps({"ok": True}), flush=True)
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
