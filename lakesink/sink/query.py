"""The streaming query a ``foreach_batch`` function runs in, as the driver finds it from the batch's SparkSession.

Its id (a local property of the batch's job, or under Spark Connect the checkpoint's metadata file), its run (Spark's
run id, or the Connect server's Python process), its checkpoint (found from the running query, checked lasting before
anything is written), and what a batch's commit records from that checkpoint: the source offsets and the batch time.
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql import DataFrame, SparkSession

from lakesink import _pyspark
from lakesink.driver.actions.completeness import BatchTime
from lakesink.errors import InvalidOptionError, LakesinkError
from lakesink.options import SinkOptions
from lakesink.sink.checkpoint import batch_time, not_found_by_a_restart, read_query_id, read_source_offsets, watermarked
from lakesink.table.keys import QUERY_ID_PROPERTY, RUN_ID_PROPERTY

log = logging.getLogger("lakesink")

#: Identifies this Python process (the run, under Spark Connect: see RunningQuery.run_id)
_PROCESS_TOKEN = uuid.uuid4().hex


def is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


class RunningQuery:
    """What a foreach_batch sink knows of the streaming queries that call it (their checkpoints, found once)."""

    def __init__(self, options: SinkOptions):
        self.options = options
        self._checkpoints: dict[str, str | None] = {}
        self._checked_queries: set[str] = set()  # queries whose checkpoint was checked (_check_checkpoint)

    def query_id(self, spark: SparkSession) -> str:
        """The streaming query's id (:meth:`_query_id`); a query's checkpoint is checked at its first batch."""
        query_id = self._query_id(spark)
        if query_id not in self._checked_queries:
            self._check_checkpoint(spark, query_id)
            self._checked_queries.add(query_id)
        return query_id

    def _check_checkpoint(self, spark: SparkSession, query_id: str) -> None:
        """Refuse (before anything is written) a query whose next start will not find its checkpoint: it would be a
        new query with a new id, whose replayed batches lakesink could not recognise. Under Spark Connect
        ``checkpoint_location`` is required anyway (:meth:`_query_id`)."""
        if is_connect(spark):
            return
        origin = _pyspark.running_query_checkpoint_origin(spark, query_id)
        reason = not_found_by_a_restart(origin) if origin is not None else None
        if reason is None:
            return
        if self.options.allow_temporary_checkpoint:
            log.warning(
                "lakesink: streaming query %s writing %s: %s; allow_temporary_checkpoint=True: a restart is a new query "
                "with a new id, and the batches it replays are committed again (no exactly-once across restarts)",
                query_id,
                self._target(),
                reason,
            )
            return
        raise InvalidOptionError(
            f"lakesink.foreach_batch refuses streaming query {query_id} writing {self._target()}: {reason}. A restart "
            "would be a new query with a new id, and lakesink could not recognise the batches it replays: they would "
            "be committed again. Give the query a lasting checkpoint: .option('checkpointLocation', "
            "'/path/to/checkpoint') on writeStream (or a queryName with spark.sql.streaming.checkpointLocation); or, "
            "for a throwaway query where that does not matter, pass allow_temporary_checkpoint=True to "
            "lakesink.foreach_batch"
        )

    def _target(self) -> str:
        if self.options.routing is not None:
            return f"the tables of route-by {self.options.routing.column!r}"
        return f"table {self.options.table}"

    def run_id(self, spark: SparkSession) -> str | None:
        """Spark's run id of the query (a new one at every start), which tells a replay (another run) from a second
        sink of the same run. Under Spark Connect the query's JVM objects are out of reach, but the server starts
        a Python process for the foreachBatch function at every start of the query and stops it with the query:
        that process stands for the run."""
        if is_connect(spark):
            return f"connect-process-{_PROCESS_TOKEN}"
        return spark.sparkContext.getLocalProperty(RUN_ID_PROPERTY) or None

    def _query_id(self, spark: SparkSession) -> str:
        """The streaming query's id: a local property of the batch's job (classic Spark), or, under Spark
        Connect, where this function runs in a server-side Python process without the query's JVM objects,
        the ``id`` in the metadata file of the checkpoint the user named."""
        if not is_connect(spark):
            query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
            if not query_id:
                raise LakesinkError("lakesink.foreach_batch(...) must be passed to writeStream.foreachBatch of a streaming query")
            return str(query_id)
        checkpoint = self.options.checkpoint_location
        if checkpoint is None:
            raise LakesinkError(
                "lakesink.foreach_batch runs under Spark Connect here: its function runs in a Python process of the "
                "Connect server, which cannot see the streaming query's id; pass checkpoint_location=<the query's "
                "checkpointLocation> to lakesink.foreach_batch (the id is read from that checkpoint's metadata file), "
                "or use writeStream.format('lakesink')"
            )
        query_id = read_query_id(checkpoint)
        if not query_id:
            raise LakesinkError(
                f"checkpoint_location={checkpoint!r} given to lakesink.foreach_batch has no metadata file with a query id: "
                "it must be the same folder as the query's checkpointLocation option"
            )
        return query_id

    def source_offsets(self, spark: SparkSession, query_id: str, batch_id: int) -> str | None:
        checkpoint = self.options.checkpoint_location or self._find_checkpoint(spark, query_id)
        if checkpoint is None:
            return None
        return read_source_offsets(checkpoint, batch_id)

    def batch_time(self, spark: SparkSession, df: DataFrame, query_id: str, batch_id: int) -> BatchTime | None:
        checkpoint = self.options.checkpoint_location or self._find_checkpoint(spark, query_id)
        return batch_time(self.options, checkpoint, batch_id, has_watermark=watermarked(df.schema))

    def _find_checkpoint(self, spark: SparkSession, query_id: str) -> str | None:
        if query_id not in self._checkpoints:
            self._checkpoints[query_id] = _pyspark.running_query_checkpoint(spark, query_id)
            if self._checkpoints[query_id] is None:
                log.warning(
                    "lakesink: cannot find the checkpoint of query %s; pass checkpoint_location= to "
                    "foreach_batch to record source offsets in the snapshot summary",
                    query_id,
                )
        return self._checkpoints[query_id]
