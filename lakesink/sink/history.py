"""foreach_batch with option history: the batch's changes for its table's history table (lakesink.driver.actions.history).

Every change of the batch -- not only the one per key the upsert applies -- with its delete flag (option delete-when),
its order value (option order-by's column, else the batch id: without order-by a batch holds one change per key and a
later batch's change is newer) and its source time (option history-time's column), collected from Spark as one Arrow
table in the same job shape as the upsert's resolution. A null key, order value or time fails the batch before anything
is written, naming the column.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from lakesink.driver.actions.history import HistoryChanges, checked_changes
from lakesink.errors import LakesinkError
from lakesink.options import SinkOptions
from lakesink.sink import driver_write, upsert_batch
from lakesink.table.keys import DELETED, HISTORY_CHANGE_ORDER, HISTORY_VALID_FROM


def changes(df: DataFrame, batch_id: int, options: SinkOptions, table: str) -> HistoryChanges:
    """The batch's changes for the history of ``table`` (the module's description)."""
    assert options.history_time is not None
    keys = upsert_batch.key_columns(df, options.upsert_key)
    flag = F.lit(False)
    if options.delete_when is not None:
        flag = F.coalesce(F.expr(options.delete_when).cast("boolean"), F.lit(False))
    order = F.col(f"`{options.order_by}`") if options.order_by is not None else F.lit(batch_id).cast("long")
    time = F.col(f"`{options.history_time}`")
    selected = df.select(
        *[F.col(f"`{c}`") for c in df.columns],
        flag.alias(DELETED),
        order.alias(HISTORY_CHANGE_ORDER),
        time.alias(HISTORY_VALID_FROM),
    )
    rows = driver_write.collect(selected, table=table, batch_id=batch_id)
    if rows is None:
        raise LakesinkError(
            f"batch {batch_id}: its changes for the history of {table} do not fit on the driver (spark.driver.maxResultSize); "
            "nothing was committed. Raise spark.driver.maxResultSize or make batches smaller (maxOffsetsPerTrigger)"
        )
    return checked_changes(rows, keys, options, batch_id=batch_id, table=table)
