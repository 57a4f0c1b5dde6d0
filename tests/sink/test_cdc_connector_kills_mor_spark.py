"""The production change streams of tests/sink/test_cdc_connector_kills_spark.py through the same SIGKILLs on both entry
points, into tables lakesink creates merge-on-read (issue 52, "the per-connector streams pass on both entry points with
merge-on-read tables through SIGKILLs"): entries ``...-mor`` (tests/jobs/cdc_oracle_job.py: the tables' write.merge.mode),
the batches' upserts and deletes written as position deletes, looked up where the batch commits. Each case checks the
mode it ran (check_write_mode). A file of its own: make test-long's workers take a file each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.sink import test_cdc_connector_kills_spark as kills

pytestmark = pytest.mark.spark


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach-mor", "format-mor"])
def test_a_mysql_stream_into_merge_on_read_tables_through_sigkills_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    kills.test_a_mysql_stream_through_sigkills_equals_the_model(spark, tmp_path, catalog_properties, faults, entry)


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["foreach-mor-history", "format-mor-history"])
def test_a_postgresql_stream_with_toast_placeholders_into_merge_on_read_tables_through_sigkills_equals_the_model(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    kills.test_a_postgresql_stream_with_toast_placeholders_through_sigkills_equals_the_model(
        spark, tmp_path, catalog_properties, faults, entry
    )


@pytest.mark.long
@pytest.mark.timeout(900)
@pytest.mark.parametrize("entry", ["hold-mor", "hold-format-mor"])
def test_a_mysql_stream_held_back_by_transaction_into_merge_on_read_tables_through_sigkills_shows_whole_transactions(
    spark: Any, tmp_path: Path, catalog_properties: dict[str, str], faults: Any, entry: str
) -> None:
    kills.test_a_mysql_stream_held_back_by_transaction_through_sigkills_shows_whole_transactions(
        spark, tmp_path, catalog_properties, faults, entry
    )
