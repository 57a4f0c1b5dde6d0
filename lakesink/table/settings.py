"""The table properties lakesink acts on, read once into one typed value.

The driver parses them when it makes a write plan (:meth:`TableSettings.parse`), so a bad value is an
:class:`~lakesink.errors.InvalidOptionError` naming the property and the table, raised before any task
runs; executors and the commit only read the typed fields. Keys and defaults are Iceberg's own (the
Java library's), except ``write.lakesink.*``; they are defined in :mod:`lakesink.table.keys`.

Imported by executors: only the standard library, lakesink.errors and lakesink.table.keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from lakesink.errors import InvalidOptionError
from lakesink.table.keys import (
    CODEC,
    CODEC_DEFAULT,
    COMMIT_MAX_WAIT_MS,
    COMMIT_MAX_WAIT_MS_DEFAULT,
    COMMIT_MIN_WAIT_MS,
    COMMIT_MIN_WAIT_MS_DEFAULT,
    COMMIT_NUM_RETRIES,
    COMMIT_NUM_RETRIES_DEFAULT,
    COMMIT_TOTAL_TIMEOUT_MS,
    COMMIT_TOTAL_TIMEOUT_MS_DEFAULT,
    COMPACT_MIN_INPUT_FILES,
    COMPACT_MIN_INPUT_FILES_DEFAULT,
    COMPRESSION_LEVEL,
    COPY_ON_WRITE,
    DELETE_TARGET_FILE_SIZE,
    DELETE_TARGET_FILE_SIZE_DEFAULT,
    DICT_SIZE,
    DRIVER_LOOKUP_BYTES,
    DRIVER_LOOKUP_BYTES_DEFAULT,
    MAINTENANCE_INTERVAL_MS,
    MAINTENANCE_INTERVAL_MS_DEFAULT,
    MANIFEST_MERGE_ENABLED,
    MANIFEST_MIN_COUNT_TO_MERGE,
    MANIFEST_MIN_COUNT_TO_MERGE_DEFAULT,
    MANIFEST_TARGET_SIZE,
    MANIFEST_TARGET_SIZE_DEFAULT,
    MAX_OPEN_FILES,
    MAX_OPEN_FILES_DEFAULT,
    MAX_REF_AGE_MS,
    MAX_REF_AGE_MS_DEFAULT,
    MAX_SNAPSHOT_AGE_MS,
    MAX_SNAPSHOT_AGE_MS_DEFAULT,
    MERGE_ON_READ,
    MIN_SNAPSHOTS_TO_KEEP,
    MIN_SNAPSHOTS_TO_KEEP_DEFAULT,
    PAGE_ROW_LIMIT,
    PAGE_SIZE,
    REWRITE_DELETES_MIN_INPUT_FILES,
    REWRITE_DELETES_MIN_INPUT_FILES_DEFAULT,
    ROW_GROUP_BYTES,
    ROW_GROUP_BYTES_DEFAULT,
    ROW_GROUP_ROWS,
    ROW_GROUP_ROWS_DEFAULT,
    TARGET_FILE_SIZE,
    TARGET_FILE_SIZE_DEFAULT,
    WRITE_DELETE_MODE,
    WRITE_MERGE_MODE,
    WRITE_UPDATE_MODE,
)

#: Codecs the Parquet writers know (Iceberg's names; ``none`` is ``uncompressed``).
CODECS = ("zstd", "snappy", "gzip", "brotli", "lz4", "uncompressed", "none")


@dataclass(frozen=True)
class CommitRetry:
    """Iceberg's ``commit.retry.*`` table properties (defaults as in Iceberg's Java library)."""

    num_retries: int = COMMIT_NUM_RETRIES_DEFAULT
    min_wait_ms: int = COMMIT_MIN_WAIT_MS_DEFAULT
    max_wait_ms: int = COMMIT_MAX_WAIT_MS_DEFAULT
    total_timeout_ms: int = COMMIT_TOTAL_TIMEOUT_MS_DEFAULT


@dataclass(frozen=True)
class Retention:
    """Iceberg's ``history.expire.*`` table properties (defaults as in Iceberg's Java library)."""

    max_snapshot_age_ms: int = MAX_SNAPSHOT_AGE_MS_DEFAULT
    min_snapshots_to_keep: int = MIN_SNAPSHOTS_TO_KEEP_DEFAULT
    max_ref_age_ms: int = MAX_REF_AGE_MS_DEFAULT
    configured: bool = False
    """Whether the table sets any ``history.expire.*`` property: the sink's automatic maintenance expires
    snapshots only then (an expiry nobody asked for would surprise an auditor; docs/maintenance.md)."""


@dataclass(frozen=True)
class TableSettings:
    """Every table property lakesink's writers and committer act on, validated."""

    target_file_size: int = TARGET_FILE_SIZE_DEFAULT
    row_group_rows: int = ROW_GROUP_ROWS_DEFAULT
    row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT
    max_open_files: int = MAX_OPEN_FILES_DEFAULT
    codec: str = CODEC_DEFAULT
    compression_level: int | None = None
    page_size: int | None = None
    page_row_limit: int | None = None
    dict_size: int | None = None
    manifest_merge: bool = True
    """``commit.manifest-merge.enabled``: Iceberg's default is true (pyiceberg's false)."""
    manifest_target_size: int = MANIFEST_TARGET_SIZE_DEFAULT
    """``commit.manifest.target-size-bytes``: the size a manifest rewrite packs manifests into."""
    manifest_min_count_to_merge: int = MANIFEST_MIN_COUNT_TO_MERGE_DEFAULT
    """``commit.manifest.min-count-to-merge``: automatic maintenance rewrites a branch head's manifests from this many."""
    commit_retry: CommitRetry = CommitRetry()
    retention: Retention = Retention()
    compact_min_input_files: int = COMPACT_MIN_INPUT_FILES_DEFAULT
    delete_target_file_size: int = DELETE_TARGET_FILE_SIZE_DEFAULT
    """``write.delete.target-file-size-bytes``: the size a rewrite of position deletes packs delete files into."""
    rewrite_deletes_min_input_files: int = REWRITE_DELETES_MIN_INPUT_FILES_DEFAULT
    maintenance_interval_ms: int = MAINTENANCE_INTERVAL_MS_DEFAULT
    driver_lookup_bytes: int = DRIVER_LOOKUP_BYTES_DEFAULT
    """Merge-on-read: a batch's lookup in this table that reads at most this many bytes (the candidates' key column
    chunks, the applying delete files) runs where the batch commits, not in a Spark job (0: always Spark's executors,
    on foreach_batch)."""

    @classmethod
    def parse(cls, table: str, properties: Mapping[str, str]) -> TableSettings:
        """Read the properties of ``table``; raise InvalidOptionError listing every bad value."""
        problems: list[str] = []

        def integer(key: str, default: int | None, *, minimum: int) -> int | None:
            raw = properties.get(key)
            if raw is None:
                return default
            try:
                value = int(str(raw).strip())
            except ValueError:
                problems.append(f"{key}={raw!r} is not an integer")
                return default
            if value < minimum:
                problems.append(f"{key}={raw!r} must be at least {minimum}")
                return default
            return value

        def boolean(key: str, default: bool) -> bool:
            raw = properties.get(key)
            if raw is None:
                return default
            v = str(raw).strip().lower()
            if v not in ("true", "false"):
                problems.append(f"{key}={raw!r} must be 'true' or 'false'")
                return default
            return v == "true"

        codec = str(properties.get(CODEC, CODEC_DEFAULT)).strip().lower()
        if codec not in CODECS:
            problems.append(f"{CODEC}={codec!r} is not a known codec (known: {', '.join(CODECS)})")
            codec = CODEC_DEFAULT
        settings = cls(
            target_file_size=integer(TARGET_FILE_SIZE, TARGET_FILE_SIZE_DEFAULT, minimum=1) or TARGET_FILE_SIZE_DEFAULT,
            row_group_rows=integer(ROW_GROUP_ROWS, ROW_GROUP_ROWS_DEFAULT, minimum=1) or ROW_GROUP_ROWS_DEFAULT,
            row_group_bytes=integer(ROW_GROUP_BYTES, ROW_GROUP_BYTES_DEFAULT, minimum=1) or ROW_GROUP_BYTES_DEFAULT,
            max_open_files=integer(MAX_OPEN_FILES, MAX_OPEN_FILES_DEFAULT, minimum=1) or MAX_OPEN_FILES_DEFAULT,
            codec="uncompressed" if codec == "none" else codec,
            compression_level=integer(COMPRESSION_LEVEL, None, minimum=-(2**31)),
            page_size=integer(PAGE_SIZE, None, minimum=1),
            page_row_limit=integer(PAGE_ROW_LIMIT, None, minimum=1),
            dict_size=integer(DICT_SIZE, None, minimum=1),
            manifest_merge=boolean(MANIFEST_MERGE_ENABLED, True),
            manifest_target_size=_int(integer(MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT, minimum=1)),
            manifest_min_count_to_merge=_int(
                integer(MANIFEST_MIN_COUNT_TO_MERGE, MANIFEST_MIN_COUNT_TO_MERGE_DEFAULT, minimum=1)
            ),
            commit_retry=CommitRetry(
                num_retries=_int(integer(COMMIT_NUM_RETRIES, CommitRetry.num_retries, minimum=0)),
                min_wait_ms=_int(integer(COMMIT_MIN_WAIT_MS, CommitRetry.min_wait_ms, minimum=0)),
                max_wait_ms=_int(integer(COMMIT_MAX_WAIT_MS, CommitRetry.max_wait_ms, minimum=0)),
                total_timeout_ms=_int(integer(COMMIT_TOTAL_TIMEOUT_MS, CommitRetry.total_timeout_ms, minimum=0)),
            ),
        )
        settings = replace(
            settings,
            retention=Retention(
                max_snapshot_age_ms=_int(integer(MAX_SNAPSHOT_AGE_MS, MAX_SNAPSHOT_AGE_MS_DEFAULT, minimum=0)),
                min_snapshots_to_keep=_int(integer(MIN_SNAPSHOTS_TO_KEEP, MIN_SNAPSHOTS_TO_KEEP_DEFAULT, minimum=1)),
                max_ref_age_ms=_int(integer(MAX_REF_AGE_MS, MAX_REF_AGE_MS_DEFAULT, minimum=0)),
                configured=any(k in properties for k in (MAX_SNAPSHOT_AGE_MS, MIN_SNAPSHOTS_TO_KEEP, MAX_REF_AGE_MS)),
            ),
            compact_min_input_files=_int(integer(COMPACT_MIN_INPUT_FILES, COMPACT_MIN_INPUT_FILES_DEFAULT, minimum=2)),
            delete_target_file_size=_int(integer(DELETE_TARGET_FILE_SIZE, DELETE_TARGET_FILE_SIZE_DEFAULT, minimum=1)),
            rewrite_deletes_min_input_files=_int(
                integer(REWRITE_DELETES_MIN_INPUT_FILES, REWRITE_DELETES_MIN_INPUT_FILES_DEFAULT, minimum=2)
            ),
            maintenance_interval_ms=_int(integer(MAINTENANCE_INTERVAL_MS, MAINTENANCE_INTERVAL_MS_DEFAULT, minimum=0)),
            driver_lookup_bytes=_int(integer(DRIVER_LOOKUP_BYTES, DRIVER_LOOKUP_BYTES_DEFAULT, minimum=0)),
        )
        if problems:
            raise InvalidOptionError(
                f"table {table} has invalid table properties: {'; '.join(problems)}. Fix them with "
                f"ALTER TABLE {table} SET TBLPROPERTIES (...) or pyiceberg's table.transaction().set_properties(...) "
                "(docs/options.md lists the properties lakesink reads)"
            )
        return settings


def merge_on_read(table: str, properties: Mapping[str, str]) -> bool:
    """Whether an upsert batch into ``table`` writes position deletes (merge-on-read) rather than rewriting the files
    that hold its keys (copy-on-write), as Iceberg's row-level write modes say: a batch of upserts and deletes is a
    ``MERGE``, so ``write.merge.mode`` decides; a table without it is merge-on-read only when both
    ``write.update.mode`` and ``write.delete.mode`` are (a batch both updates and deletes). Raises InvalidOptionError
    naming the property and the valid values for any other value."""
    modes: dict[str, str] = {}
    for key in (WRITE_MERGE_MODE, WRITE_UPDATE_MODE, WRITE_DELETE_MODE):
        raw = properties.get(key)
        if raw is None:
            continue
        value = str(raw).strip().lower()
        if value not in (COPY_ON_WRITE, MERGE_ON_READ):
            raise InvalidOptionError(
                f"table {table} has table property {key}={raw!r}; valid values: {COPY_ON_WRITE!r}, {MERGE_ON_READ!r} "
                f"(Iceberg's row-level write modes; fix it with ALTER TABLE {table} SET TBLPROPERTIES ('{key}'='...'))"
            )
        modes[key] = value
    if WRITE_MERGE_MODE in modes:
        return modes[WRITE_MERGE_MODE] == MERGE_ON_READ
    return modes.get(WRITE_UPDATE_MODE) == MERGE_ON_READ and modes.get(WRITE_DELETE_MODE) == MERGE_ON_READ


def _int(value: int | None) -> int:
    assert value is not None
    return value
