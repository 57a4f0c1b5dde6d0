"""Option cdc-format: a batch's truncates (Debezium's op ``t``) applied at their position in the source log.

The payload inference job (lakesink.executor.payload) finds, per table, the position (``cdc_order``) of the batch's
last truncate. Here, on the driver, before the batch's tables are planned: every change of that table at an earlier
position is dropped from the batch (and the truncates themselves), and the table is marked for the unit
(``RoutedCommitter.truncating``), whose part for it then replaces everything live with the rows that remain
(actions.batch.action_for). A truncate of a table that does not exist, with no change after it, changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyiceberg.exceptions import NoSuchTableError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from lakesink._pyiceberg import io as seam
from lakesink.cdc import debezium
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.executor.payload import Found
from lakesink.options import CDC_PREFIX, Routing
from lakesink.table.routes import Route, parse_route

OP, ORDER = f"{CDC_PREFIX}{debezium.OP}", f"{CDC_PREFIX}{debezium.ORDER}"


def apply(
    df: DataFrame, routed: RoutedCommitter, routing: Routing, found: Mapping[object, Found], values: Sequence[object]
) -> tuple[DataFrame, list[object]]:
    """The batch without the changes its truncates undo, and the routing values left to plan; sets
    ``routed.truncating``."""
    routed.truncating = set()
    truncates = {v: f.truncate for v, f in found.items() if f.truncate is not None and isinstance(v, str)}
    if not truncates:
        return df, list(values)
    route, op, order = F.col(f"`{routing.column}`"), F.col(f"`{OP}`"), F.col(f"`{ORDER}`")
    drop: Column = F.lit(False)
    left = list(values)
    for value, position in sorted(truncates.items()):
        before = F.coalesce(order < F.lit(position).cast("decimal(38,0)"), F.lit(False))
        drop = drop | ((route == F.lit(value)) & ((op == F.lit("t")) | before))
        target = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if not isinstance(target, Route):
            continue
        name = str(target)
        columns = routed.table_columns.get(name)
        try:
            table = routed.committer(name).load()
        except NoSuchTableError:
            if columns is None or not columns.names:
                left.remove(value)  # nothing to truncate, nothing after it: the table is not made
            continue
        if columns is None or not columns.names:  # only truncates: the batch takes the table's own columns
            routed.table_columns[name] = seam.arrow_schema(table.schema())
        routed.truncating.add(name)
    return df.where(~drop), left
