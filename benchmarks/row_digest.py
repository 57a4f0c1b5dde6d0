"""The routed row digest (lakesink.executor.row_digest) against writing the same rows as Parquet (zstd), in one
process: 500,000 rows of the tests' five columns, 7 repetitions, medians and range. Run:
``python -m benchmarks.row_digest``."""

from __future__ import annotations

import io
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lakesink.executor.row_digest import digest

ROWS = 500_000
REPS = 7


def rows() -> pa.RecordBatch:
    rng = np.random.default_rng(1)
    return pa.record_batch(
        {
            "id": pa.array(np.arange(ROWS)),
            "ts": pa.array(rng.integers(0, 10**15, ROWS)).cast(pa.timestamp("us", tz="UTC")),
            "user": pa.array([f"user-{i % 9973}" for i in range(ROWS)]),
            "amount": pa.array(rng.random(ROWS)),
            "kind": pa.array(rng.integers(0, 9, ROWS).astype(np.int32)),
        }
    )


def timed(work: object, batch: pa.RecordBatch) -> float:
    start = time.perf_counter()
    if work == "digest":
        digest(batch)
    else:
        pq.write_table(pa.Table.from_batches([batch]), io.BytesIO(), compression="zstd")
    return time.perf_counter() - start


def main() -> None:
    batch = rows()
    runs: dict[str, list[float]] = {"digest": [], "parquet": []}
    for _ in range(REPS):  # interleaved, so that a noisy moment hits both
        for work, times in runs.items():
            times.append(timed(work, batch))
    for work, times in runs.items():
        low, high = min(times) * 1000, max(times) * 1000
        print(f"{work:8} median {statistics.median(times) * 1000:.0f} ms (min {low:.0f}, max {high:.0f})")
    print(f"ratio digest/parquet {statistics.median(runs['digest']) / statistics.median(runs['parquet']):.2f}")


if __name__ == "__main__":
    main()
