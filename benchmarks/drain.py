"""The floor of ``format("lakesink")``: a Python data source whose writer only drains the Arrow batches.

Spark moves the rows to it exactly as it does to lakesink (JVM rows -> Arrow -> a Python worker per task;
a Python worker on the driver for planning and one for the commit), and it writes nothing. The
throughput benchmark's ``drain`` path runs it beside the others: what ``format("lakesink")`` costs
beyond it is lakesink's own work (Parquet encoding, the table, the commit).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Drained(WriterCommitMessage):
    rows: int


class DrainDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lakesink-bench-drain"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DrainWriter:
        return DrainWriter()


class DrainWriter(DataSourceStreamArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> Drained:
        return Drained(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
