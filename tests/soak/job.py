"""The streaming job of the soak: run as a child process by tests/soak/runner.py, which SIGKILLs it.

JSON files in ``--input`` (unique ids, ``tests.support.stream_input.SCHEMA_DDL``) → a lakesink table, through
``writeStream.format("lakesink")`` or (``--entry foreach``) ``foreachBatch(lakesink.foreach_batch(...))``.
The catalog is the embedded default: SQLite + warehouse under ``$LAKESINK_HOME`` (the runner gives
every soak its own). The trigger is ``availableNow``: the job consumes what is in the input folder
when it starts, ``--max-files`` files per micro-batch, then exits with code 0. Started again on the
same ``--checkpoint``, it goes on where the checkpoint says.

The concurrency soak (``tests/soak/concurrency.py``) runs it with ``--trigger-seconds`` (a processing-time trigger:
the job runs until ``--stop-file`` appears, then stops its query and exits with 0) and ``--table-property`` (the
properties of the table lakesink creates: maintenance and expiry settings).

The session is ``local[2,4]`` by default: a task that fails (a Python worker SIGKILLed by a fault
point, an injected exception) is retried by Spark, up to 4 attempts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="folder of JSON files (one object per line)")
    p.add_argument("--checkpoint", required=True, help="the streaming query's checkpoint folder")
    p.add_argument("--table", default="soak.events", help="target table (default: %(default)s)")
    p.add_argument("--max-files", type=int, default=2, help="maxFilesPerTrigger (default: %(default)s)")
    p.add_argument("--entry", choices=("format", "foreach"), default="format", help="lakesink entry point")
    p.add_argument("--writer", choices=("auto", "spark", "arrow", "driver"), default="auto", help="foreach_batch's write path")
    p.add_argument("--master", default="local[2,4]", help="Spark master (default: %(default)s: task retries on)")
    p.add_argument(
        "--trigger-seconds",
        type=float,
        default=0.0,
        help="processing-time trigger interval in seconds (default: availableNow, the job exits when the input is consumed)",
    )
    p.add_argument(
        "--table-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a property of the table lakesink creates (repeatable)",
    )
    p.add_argument(
        "--route-by",
        action="store_true",
        help="option route-by (tests/soak/routing.py): each row to table soak.t<id % 5>, ids ending in 4 (mod 5) "
        "to other.t4; --table is not used",
    )
    p.add_argument(
        "--route-lookup",
        default=None,
        help='with --route-by: the table of a row is looked up by id %% 5 in this JSON file ({"version": n, '
        '"tables": {"0": "soak.t0", ...}}), read once at job start as a batch DataFrame and joined to the '
        "stream (tests/soak/routing.py --lookups rewrites it between runs)",
    )
    p.add_argument("--atomic", default="auto", help="with --route-by: option atomic (default: %(default)s)")
    p.add_argument(
        "--upsert",
        action="store_true",
        help="with --route-by: upserts (tests/soak/routing.py --upsert): key = id %% 40, op 'd' (a delete) when id %% 7 = 0, "
        "upsert-key key, delete-when op = 'd', order-by id; foreach_batch in update mode",
    )
    p.add_argument(
        "--route-namespaces",
        default="soak,other",
        help="with --route-by: option namespace, and the namespace of table t4 (default: %(default)s)",
    )
    p.add_argument(
        "--stop-file",
        default=None,
        help="with --trigger-seconds: stop the query (query.stop()) and exit with 0 once this file exists",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Spark's Python workers must run this interpreter (the one that can import lakesink).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from pyspark.sql import SparkSession

    import lakesink
    from tests.jobs.jvm import short_lived
    from tests.support.stream_input import SCHEMA_DDL

    spark = (
        short_lived(SparkSession.builder.master(args.master))
        .appName("lakesink-soak")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    lakesink.register(spark)

    properties = dict(kv.split("=", 1) for kv in args.table_property)
    events = spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", args.max_files).json(args.input)
    if args.route_by:
        from pyspark.sql import functions as F

        if args.route_lookup:
            # the routing column computed from a lookup: a static DataFrame of (key, route) joined to every micro-batch
            with open(args.route_lookup) as f:
                lookup = json.load(f)
            print(f"soak_job: route lookup version {lookup['version']}: {lookup['tables']}", flush=True)
            static = spark.createDataFrame(
                [(int(k), v) for k, v in sorted(lookup["tables"].items())], "route_key long, route string"
            )
            events = events.withColumn("route_key", F.col("id") % 5).join(F.broadcast(static), "route_key").drop("route_key")
        else:
            # the table of a row is a function of its id (tests/soak/routing.py checks every table against it)
            other = args.route_namespaces.split(",")[1]
            route = F.when(F.col("id") % 5 == 4, F.lit(f"{other}.t4")).otherwise(
                F.concat(F.lit("t"), (F.col("id") % 5).cast("string"))
            )
            events = events.withColumn("route", route)
    mode = "append"
    upsert: dict[str, str] = {}
    if args.route_by and args.upsert:
        from pyspark.sql import functions as F

        # a change stream: 40 keys (each in one table: id % 40 fixes id % 5), every key updated in every batch
        events = events.withColumn("key", F.col("id") % 40).withColumn(
            "op", F.when(F.col("id") % 7 == 0, F.lit("d")).otherwise(F.lit("u"))
        )
        upsert = {"upsert-key": "key", "delete-when": "op = 'd'", "order-by": "id"}
    if args.route_by and args.entry == "format":
        if upsert:  # each task resolves its rows: every row of a (table, key) in one task
            events = events.repartition(2, "route", "key")
        writer = (
            events.writeStream.format("lakesink")
            .option("route-by", "route")
            .option("namespace", args.route_namespaces.split(",")[0])
            .option("atomic", args.atomic)
        )
        for key, value in upsert.items():
            writer = writer.option(key, value)
    elif args.route_by:
        mode = "update" if upsert else "append"
        sink = lakesink.foreach_batch(
            route_by="route",
            namespace=args.route_namespaces.split(",")[0],
            atomic=args.atomic,
            checkpoint_location=args.checkpoint,
            upsert_key=upsert.get("upsert-key"),
            delete_when=upsert.get("delete-when"),
            order_by=upsert.get("order-by"),
            output_mode=mode,
        )
        writer = events.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
    elif args.entry == "format":
        writer = events.writeStream.format("lakesink").option("table", args.table)
        for key, value in properties.items():
            writer = writer.option(f"table-property.{key}", value)
    else:
        sink = lakesink.foreach_batch(
            args.table, checkpoint_location=args.checkpoint, writer=args.writer, table_properties=properties or None
        )
        writer = events.writeStream.foreachBatch(sink)  # type: ignore[arg-type]
    writer = writer.option("checkpointLocation", args.checkpoint).outputMode(mode).queryName("lakesink-soak")
    if args.trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    else:
        writer = writer.trigger(availableNow=True)
    query = writer.start()
    print(f"soak_job: query id {query.id}, run id {query.runId}, pid {os.getpid()}, entry {args.entry}", flush=True)
    if args.stop_file:
        while not query.awaitTermination(1):
            if os.path.exists(args.stop_file):
                print("soak_job: stop file found, stopping the query", flush=True)
                query.stop()
                break
    query.awaitTermination()
    last = query.lastProgress
    print(f"soak_job: all input consumed (last batch {last['batchId'] if last else 'none'})", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
