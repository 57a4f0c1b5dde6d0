"""Healthy defaults (docs/maintenance.md, "What the defaults do"): a table lakesink creates gets bounding table
properties (lakesink.table.keys.BOUNDED_TABLE_DEFAULTS: snapshot retention, old metadata.json files deleted), each
overridable by an option ``table-property.<key>``; an existing table is never changed, and with ``maintenance=auto``
a warning names the properties it lacks. A stream of many batches with the defaults keeps its snapshots, metadata
files and data files bounded, and its replay markers still detect a replay after expiry.

Real SQLite catalogs, real Parquet files, the sink's committer with its automatic maintenance.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest
from pyiceberg.table import Table

from lakesink.driver import catalogs
from lakesink.driver.actions.batch import Outcome
from lakesink.driver.committers.table import TableCommitter
from lakesink.errors import CatalogPermissionError
from lakesink.maintenance import expiry
from lakesink.options import SinkOptions, TableName
from lakesink.table.keys import (
    BOUNDED_TABLE_DEFAULTS,
    MAX_SNAPSHOT_AGE_MS,
    METADATA_DELETE_AFTER_COMMIT,
    METADATA_PREVIOUS_VERSIONS_MAX,
    MIN_SNAPSHOTS_TO_KEEP,
)
from lakesink.table.markers import last_committed_batch
from tests.support.helpers import (
    arrow_rows,
    assert_snapshot_invariants,
    commit,
    data_files_on_disk,
    load,
    maintainer,
    open_committer,
    referenced_data_files,
    sink_committer,
    table_ids,
    write_task,
)

SCHEMA = arrow_rows([]).schema
Q = "99999999-dddd-4000-8000-000000000033"


def _committer(props: dict[str, str], **table_properties: str) -> TableCommitter:
    return open_committer(props, table_properties=table_properties)


def live_data_files(table: Table) -> set[str]:
    """The data files some kept snapshot reads (entries ADDED or EXISTING in its manifests)."""
    table.refresh()
    return {
        entry.data_file.file_path
        for snap in table.snapshots()
        for manifest in snap.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    }


def _metadata_files(c: TableCommitter) -> list[Path]:
    return sorted((Path(load(c).location().removeprefix("file://")) / "metadata").glob("*.metadata.json"))


def test_a_table_lakesink_creates_gets_the_bounded_defaults(catalog_properties: dict[str, str]) -> None:
    properties = load(_committer(catalog_properties)).properties
    assert {k: properties.get(k) for k in BOUNDED_TABLE_DEFAULTS} == BOUNDED_TABLE_DEFAULTS
    assert BOUNDED_TABLE_DEFAULTS == {
        METADATA_DELETE_AFTER_COMMIT: "true",
        METADATA_PREVIOUS_VERSIONS_MAX: "100",
        MAX_SNAPSHOT_AGE_MS: "86400000",  # a day of history (docs/auditing.md)
        MIN_SNAPSHOTS_TO_KEEP: "100",
    }


def test_a_table_property_option_overrides_each_default(catalog_properties: dict[str, str]) -> None:
    mine = {MAX_SNAPSHOT_AGE_MS: str(30 * 24 * 3600 * 1000), METADATA_DELETE_AFTER_COMMIT: "false"}
    properties = load(_committer(catalog_properties, **mine)).properties
    assert {k: properties.get(k) for k in BOUNDED_TABLE_DEFAULTS} == {**BOUNDED_TABLE_DEFAULTS, **mine}


def test_an_existing_table_is_untouched_and_the_missing_properties_are_named_once(
    catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    catalog = catalogs.load(None, dict(catalog_properties))
    catalog.create_namespace("db")
    catalog.create_table(("db", "events"), schema=SCHEMA, properties={MIN_SNAPSHOTS_TO_KEEP: "10"})
    c = sink_committer(SinkOptions(table=TableName(("db",), "events"), catalog_properties=catalog_properties))
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        for b in range(3):
            assert commit(c, Q, b, [write_task(c, Q, b, [b])]).outcome is Outcome.COMMITTED
    table = load(c)
    assert {k: table.properties.get(k) for k in BOUNDED_TABLE_DEFAULTS} == {
        METADATA_DELETE_AFTER_COMMIT: None,
        METADATA_PREVIOUS_VERSIONS_MAX: None,
        MAX_SNAPSHOT_AGE_MS: None,
        MIN_SNAPSHOTS_TO_KEEP: "10",
    }
    warnings = [r.getMessage() for r in caplog.records if "does not set" in r.getMessage()]
    assert len(warnings) == 1, warnings
    for key in (METADATA_DELETE_AFTER_COMMIT, METADATA_PREVIOUS_VERSIONS_MAX, MAX_SNAPSHOT_AGE_MS):
        assert key in warnings[0]
    assert "db.events" in warnings[0] and "ALTER TABLE db.events SET TBLPROPERTIES" in warnings[0]
    assert f"{MIN_SNAPSHOTS_TO_KEEP}'" not in warnings[0]  # set on the table: not named


def test_a_table_lakesink_created_is_not_warned_about(
    catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    c = _committer(catalog_properties)
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        assert commit(c, Q, 0, [write_task(c, Q, 0, [0])]).outcome is Outcome.COMMITTED
    assert not [r for r in caplog.records if "does not set" in r.getMessage()]


def test_a_long_stream_with_the_defaults_stays_bounded_and_still_detects_replays(catalog_properties: dict[str, str]) -> None:
    """150 batches, maintenance after every one (interval 0), snapshots older than 0 ms eligible: everything else is
    the default. Without the defaults this table ends with 150+ snapshots and 150+ metadata files."""
    batches = 150
    c = _committer(catalog_properties, **{MAX_SNAPSHOT_AGE_MS: "0", "write.lakesink.maintenance.interval-ms": "0"})
    sent: list[int] = []
    for b in range(batches):
        ids = [b * 10 + i for i in range(3)]
        assert commit(c, Q, b, [write_task(c, Q, b, ids)]).outcome is Outcome.COMMITTED
        sent += ids
        if b % 10 == 9:
            maintainer(c).wait(120)
    maintainer(c).wait(120)
    assert maintainer(c).last_error is None and maintainer(c).runs > 0
    table = load(c)
    kept = int(BOUNDED_TABLE_DEFAULTS[MIN_SNAPSHOTS_TO_KEEP])
    # the last expiry kept the newest 100; the batches and maintenance commits since then add a few
    assert len(table.snapshots()) <= kept + 15, len(table.snapshots())
    previous = int(BOUNDED_TABLE_DEFAULTS[METADATA_PREVIOUS_VERSIONS_MAX])
    assert len(table.metadata.metadata_log) <= previous
    assert len(_metadata_files(c)) <= previous + 1, len(_metadata_files(c))  # the log's files and the current one
    # data files: compacted, and the files only expired snapshots referenced are deleted. Every file live in a kept
    # snapshot exists; a file on disk is one a kept snapshot lists. (A kept snapshot may still list, as DELETED, a
    # file whose last live snapshot expired: expiry removed it rightly -- no reader reads a DELETED entry.)
    on_disk = data_files_on_disk(table)
    assert live_data_files(table) <= on_disk, sorted(live_data_files(table) - on_disk)
    assert on_disk <= referenced_data_files(table), sorted(on_disk - referenced_data_files(table))
    assert len(data_files_on_disk(table)) < batches
    assert table_ids(table) == Counter(sent)
    assert_snapshot_invariants(table)
    # the replay markers are table properties: expiry keeps them, a replay of an expired batch is still detected
    marker = last_committed_batch(table.properties, Q)
    assert marker is not None and marker.batch_id == batches - 1
    for b in (0, batches - 1):
        assert commit(c, Q, b, [write_task(c, Q, b, [10**6 + b], attempt=7)]).outcome is Outcome.REPLAY_SKIPPED
    assert table_ids(load(c)) == Counter(sent)


def test_a_catalog_that_refuses_expiry_is_asked_once_and_maintenance_goes_on(
    catalog_properties: dict[str, str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A REST catalog keeping history by its own retention answers 403 to an expiry (CatalogPermissionError; lakana
    does, docs/maintenance.md): with the defaults every table lakesink creates asks for expiry, so the sink's
    maintenance must not fail every run on it. The refusal is injected at the expiry call."""
    calls: list[str] = []

    def refuse(table: object, **_: object) -> None:
        calls.append("expire")
        raise CatalogPermissionError("the catalog refused the commit: 403 Forbidden (injected)")

    monkeypatch.setattr(expiry, "expire_snapshots", refuse)
    c = _committer(catalog_properties, **{"write.lakesink.maintenance.interval-ms": "0"})
    with caplog.at_level(logging.WARNING, logger="lakesink"):
        for b in range(4):
            assert commit(c, Q, b, [write_task(c, Q, b, [b])]).outcome is Outcome.COMMITTED
            maintainer(c).wait(60)
    assert calls == ["expire"] and maintainer(c).runs >= 3 and maintainer(c).last_error is None
    refusals = [r.getMessage() for r in caplog.records if "refuses snapshot expiry" in r.getMessage()]
    assert len(refusals) == 1 and "history.expire.*" in refusals[0]
