"""Units of several tables' commits built by hand (what a routed batch runs as one unit: lakesink.driver.loop.swap.run_unit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lakesink.driver.actions.batch import BatchCall
from lakesink.driver.committers.table import TableCommitter
from lakesink.options import SinkOptions, TableName
from tests.support.helpers import arrow_rows, write_task


def table_committers(props: Mapping[str, str], names: Sequence[str], **table_properties: str) -> tuple[TableCommitter, ...]:
    """A committer of table ``db.<name>`` for every one of ``names`` (``table_properties`` set on each), its table
    opened (created with :func:`arrow_rows`' schema when missing)."""
    made = []
    for name in names:
        c = TableCommitter(
            SinkOptions(table=TableName(("db",), name), catalog_properties=dict(props), table_properties=table_properties)
        )
        c.table.open_table(arrow_rows([]).schema)
        made.append(c)
    return tuple(made)


def unit_actions(cs: Sequence[TableCommitter], call: BatchCall, ids: Mapping[str, list[int]]) -> list[Any]:
    """The actions appending ``ids[table]`` to each table, as the batch ``call`` of one query."""
    actions = []
    for c in cs:
        result = write_task(c, call.query_id, call.batch_id, ids[c.options.table.name])
        actions.append(c.append_action(c.table.load(), call, [result]))
    return actions
