"""Where a merge-on-read lookup runs (lakesink.sink.merge_on_read): sized by the bytes it reads -- the candidates' key
and order-by column chunks as their manifest entries record them (``column_sizes``) -- never less than that: a file
whose entry records no size for a column counts whole."""

from __future__ import annotations

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

from lakesink.sink import merge_on_read


def _file(column_sizes: dict[int, int] | None) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path="s3://bucket/t/data/a.parquet",
        file_format=FileFormat.PARQUET,
        record_count=1_000_000,
        file_size_in_bytes=90_000_000,
        column_sizes=column_sizes,
    )


def test_a_lookup_reads_the_key_column_chunks_its_manifest_entry_records() -> None:
    f = _file({1: 4_000_000, 2: 3_000_000, 3: 80_000_000})
    assert merge_on_read._column_bytes(f, [1]) == 4_000_000
    assert merge_on_read._column_bytes(f, [1, 2]) == 7_000_000


def test_a_file_without_the_size_of_a_column_it_reads_counts_whole() -> None:
    assert merge_on_read._column_bytes(_file({1: 4_000_000}), [1, 2]) == 90_000_000
    assert merge_on_read._column_bytes(_file(None), [1]) == 90_000_000
