"""Every key and default lakesink reads or writes, defined once; everything else imports them from here.

As pyiceberg's ``TableProperties`` (``KEY`` / ``KEY_DEFAULT`` pairs) and ``table/refs.py`` (``MAIN_BRANCH``), and
iceberg-rust's ``spec/table_properties.rs`` and ``spec/snapshot_summary.rs``. The option names of the entry points
(``table``, ``checkpointLocation``, ``upsert-key``, ...) are the option parser's own, in :mod:`lakesink.options`.

The environment variables lakesink reads (``LAKESINK_*``) and the defaults of its own operations live here too.

Plain constants only: every side (driver, Python workers, maintenance, audit, CLI) imports this module.
"""

from __future__ import annotations

from datetime import timedelta

# --- refs ------------------------------------------------------------------------------------------

MAIN_BRANCH = "main"
"""The branch lakesink writes, reads and audits by default (Iceberg's main branch)."""

# --- snapshot summary: lakesink's batch commits (string values) ------------------------------------

SUMMARY_QUERY_ID = "lakesink.query-id"
"""Spark's streaming query id, stable across restarts of one checkpoint."""
SUMMARY_BATCH_ID = "lakesink.batch-id"
"""The micro-batch id."""
SUMMARY_SOURCE_OFFSETS = "lakesink.source-offsets"
"""The batch's end offsets as Spark recorded them in the checkpoint's offset log (a JSON list, one entry per source)."""
SUMMARY_COMMIT_ID = "lakesink.commit-id"
"""A random id of the commit call (also of a maintenance commit), to settle unknown outcomes."""
SUMMARY_COMMIT_ATTEMPT = "lakesink.commit-attempt"
"""Which attempt of the compare-and-swap landed (1 when no other writer got in between; each conflict adds one)."""
SUMMARY_PREVIOUS_BATCH_ID = "lakesink.previous-batch-id"
"""The last batch id the query processed before this one, empty batches included (read from the replay marker);
batch ids between it and this batch's id were *lost*, batch ids up to it that have no snapshot were empty
(``lakesink verify`` tells the two apart)."""
SUMMARY_COMMIT_STARTED_MS = "lakesink.commit-started-ms"
"""Wall-clock time the driver started committing the batch (the snapshot's own timestamp minus this is the commit
latency that ``lakesink report`` plots)."""
SUMMARY_SINK_ID = "lakesink.sink-id"
"""The sink's ``sink_id`` when the query has several sinks writing this table (absent for the query's one default sink)."""
SUMMARY_RUN_ID = "lakesink.run-id"
"""Spark's run id of the query run that committed the batch (a new one at every restart; tells a replay from a
second sink of the same run)."""
SUMMARY_WATERMARK = "lakesink.watermark"
"""The batch's event-time watermark (ms since the epoch) as lakesink records it: Spark's watermark for the batch, kept
non-decreasing along the query's batches and never past the newest event time committed
(:mod:`lakesink.driver.actions.completeness`).
Written only when the query defines a watermark (``withWatermark``)."""
SUMMARY_SPARK_WATERMARK = "lakesink.spark-watermark"
"""Spark's own watermark for the batch (``batchWatermarkMs`` of ``<checkpoint>/offsets/<batch>``), when it differs from
the recorded one."""
SUMMARY_WATERMARK_NOTE = "lakesink.watermark-note"
"""Why the recorded watermark is not Spark's (Spark moved it back, or it is past the newest event time committed)."""
SUMMARY_EVENT_TIME_MIN = "lakesink.event-time-min"
"""Option ``event-time``: the smallest event time (ms since the epoch, rounded down) of the rows the snapshot adds."""
SUMMARY_EVENT_TIME_MAX = "lakesink.event-time-max"
"""Option ``event-time``: the largest event time (ms since the epoch, rounded down) of the rows the snapshot adds."""
SUMMARY_EVENT_TIME_COLUMN = "lakesink.event-time-column"
"""Option ``event-time``: the column the event times were read from."""
SUMMARY_DEAD_LETTERS = "lakesink.dead-letters"
"""Option ``dead-letter-table``: how many of the batch's rows went to the dead-letter table, in the same unit."""
SUMMARY_DEAD_LETTER_TABLE = "lakesink.dead-letter-table"
"""Option ``dead-letter-table``: the dead-letter table's name."""
SUMMARY_DEAD_LETTER_SINK = "lakesink.dead-letter-sink"
"""Option ``dead-letter-table``: the sink id the batch's dead letters are committed under in the dead-letter table
(its summary's ``lakesink.sink-id``), so that ``lakesink verify`` finds them."""
SUMMARY_BATCH_TABLES = "lakesink.batch-tables"
"""Option ``route-by``: how many tables the batch wrote (every table's snapshot of the batch carries it)."""
SUMMARY_BATCH_TABLES_DIGEST = "lakesink.batch-tables-digest"
"""Option ``route-by``: the digest of the names of the tables the batch wrote (lakesink.table.routes.tables_digest):
with the count, a reader of the catalog tells whether it found the batch in every table it wrote."""
SUMMARY_BATCH_ROWS_DIGEST = "lakesink.batch-rows-digest"
"""Option ``route-by``: ``<rows>:<hex>``, an order-independent digest of the rows the batch routed to this table
(lakesink.executor.row_digest); a replay that finds the batch in some of its tables only must route the same rows to
each of them (lakesink.driver.committers.routed)."""
ICEBERG_QUERY_ID = "spark.sql.streaming.queryId"
"""The key Iceberg's own Spark sink writes the query id under, for engines and tools that already know it."""
ICEBERG_EPOCH_ID = "spark.sql.streaming.epochId"
"""The key Iceberg's own Spark sink writes the batch id under."""

# upserts (option upsert-key): the batch's snapshot summary
SUMMARY_UPSERT_INSERTED = "lakesink.upsert.inserted-rows"
SUMMARY_UPSERT_UPDATED = "lakesink.upsert.updated-rows"
SUMMARY_UPSERT_DELETED = "lakesink.upsert.deleted-rows"
SUMMARY_UPSERT_FILES_READ = "lakesink.upsert.rewritten-files"
SUMMARY_UPSERT_BYTES_READ = "lakesink.upsert.rewritten-bytes-read"
SUMMARY_UPSERT_STALE = "lakesink.upsert.stale-changes"
"""With option order-by: the batch's changes that lost to a newer order value the table held (not applied)."""
SUMMARY_UPSERT_ORDER_FILE = "lakesink.upsert.order-file"
"""With option order-by: the order file the batch's snapshot goes with (lakesink.driver.actions.upsert_order)."""
SUMMARY_UPSERT_MODE = "lakesink.upsert.mode"
"""How the batch applied its changes: :data:`MERGE_ON_READ` (position delete files for the rows it replaces) or
:data:`COPY_ON_WRITE` (the files holding them rewritten), as the table's write modes chose
(lakesink.table.settings.UpsertMode)."""
# history tables (option history): the columns a history table adds to its table's, and its snapshot summary
HISTORY_VALID_FROM = "valid_from"
"""When the version began: the change's source time (Debezium's ``source.ts_ms``, or option ``history-time``'s column)."""
HISTORY_VALID_TO = "valid_to"
"""When the next version of the key began (null: the key's latest version)."""
HISTORY_IS_CURRENT = "is_current"
"""Whether the version is the row the table holds now (the key's latest version, unless that is a delete)."""
HISTORY_OPERATION = "operation"
"""``insert`` (the key's first version, or its first after a delete), ``update`` or ``delete``."""
HISTORY_CHANGE_ORDER = "change_order"
"""The change's order value (option order-by's column, Debezium's source position; else the batch id): the order
of the key's versions."""
HISTORY_COLUMNS = (HISTORY_VALID_FROM, HISTORY_VALID_TO, HISTORY_IS_CURRENT, HISTORY_OPERATION, HISTORY_CHANGE_ORDER)
HISTORY_INSERT, HISTORY_UPDATE, HISTORY_DELETE = "insert", "update", "delete"
HISTORY_SUFFIX = "__history"
"""Option ``history=on``: the history table of ``ns.t`` is ``ns.t__history``."""
SUMMARY_HISTORY_ADDED = "lakesink.history.versions-added"
"""The versions a batch added to a history table."""
SUMMARY_HISTORY_CHANGED = "lakesink.history.versions-changed"
"""The stored versions the batch's commit rewrote (closed by a newer change, or re-linked around a late one)."""
SUMMARY_HISTORY_REDELIVERED = "lakesink.history.changes-redelivered"
"""Changes the history held already (same key and order value: a redelivery), not added again."""
SUMMARY_HISTORY_SEEDED = "lakesink.history.versions-seeded"
"""The versions a history's first commit took from its table's rows (the history started after the table held rows:
each live row's version, :data:`PROPERTY_HISTORY_COMPLETE`)."""
SUMMARY_HISTORY_OF = "lakesink.history.of"
"""The table whose history the snapshot's table is."""
PROPERTY_HISTORY_TABLE_UUID = "lakesink.history.table-uuid"
"""A history table's property: the uuid of the table whose versions it holds (set by its first commit, checked by every
later one: a table dropped and created again under its name is another table)."""
PROPERTY_HISTORY_COMPLETE = "lakesink.history.complete"
"""A history table's property: ``true`` when a change of a key it holds no version of is always a new key's -- it
started with its table (its first versions were committed when the table held no row), or its first commit took a
version of each of the table's live rows (:data:`SUMMARY_HISTORY_SEEDED`) when the table held no deleted key's order
value; else ``false`` (each batch reads the table's order values for such keys' changes)."""
PROPERTY_HISTORY_KEY = "lakesink.history.key"
"""A history table's property: the key its versions are keyed by (comma-separated, as option upsert-key gave it)."""

WRITE_UPDATE_MODE = "write.update.mode"
WRITE_DELETE_MODE = "write.delete.mode"
WRITE_MERGE_MODE = "write.merge.mode"
"""Iceberg's row-level write modes (Java's ``TableProperties.UPDATE_MODE``/``DELETE_MODE``/``MERGE_MODE``): an upsert
batch is a ``MERGE`` -- ``write.merge.mode`` chooses; without it, merge-on-read only when both ``write.update.mode``
and ``write.delete.mode`` say so. Iceberg's default, and lakesink's: copy-on-write."""
COPY_ON_WRITE = "copy-on-write"
MERGE_ON_READ = "merge-on-read"
PROPERTY_UPSERT_ORDER_FILE = "lakesink.upsert.order-file"
"""Table property (``.<branch>`` appended for a branch other than main), option order-by: the Parquet file that keeps
the order value of every key the table deleted (and of every key, when the table has no order-by column), set in the
same atomic commit as the snapshot it goes with (lakesink.driver.actions.upsert_order)."""
PROPERTY_CDC_HELD_PREFIX = "lakesink.cdc-held."
"""Table property ``<prefix><query id>[.<sink id>]``, option cdc-transactions=hold: the changes a sink's batch held
back (a source transaction not yet whole, and every change after it), as JSON: the batch, the Parquet file of the held
records, their count, the oldest one's time, the last released transaction's commit time, and the same of the batch
before (a replay of the batch starts from those). Set in every table of the batch's unit, in the same atomic commit
(lakesink.driver.actions.held)."""
PROPERTY_KEY_CHANGE_PREFIX = "lakesink.key-change."
"""Namespace property (then the table's name): a routed table's source primary key change a batch spans, recorded when
the batch was refused (JSON: the old key ``from``, the new one ``to``, the source position ``at`` of the first change
under the new key); lakesink.sink.cdc.key_change."""
PROPERTY_CDC_BINLOG_EPOCH = "lakesink.cdc.binlog-epoch"
"""Table property, option cdc-format (docs/cdc.md, "MySQL without GTIDs, MariaDB: coordinates that go back"): an
integer ``E`` (0 to 999999, default 0) set by the user after the source's binlog went back; every binlog-coordinates order
``C`` (< 10^22) of the table's later changes becomes ``E * 10^22 + C``, above every change committed in a lower epoch
(lakesink.cdc.binlog). Raise it by one per regression; never lower or remove it."""
PROPERTY_CDC_BINLOG_REDELIVERY_FILES = "lakesink.cdc.binlog-redelivery-files"
"""Table property, option cdc-format: how many binlog files back (default 1) a change below what the table holds for
its key may be and still be taken for a redelivery (Kafka Connect re-sends from its last flushed offset); a change
further back fails the batch (lakesink.cdc.binlog)."""
PROPERTY_CDC_BINLOG_REDELIVERY_FILES_DEFAULT = 1
PROPERTY_CDC_BINLOG_HIGH = "lakesink.cdc.binlog-high"
"""Table property, option cdc-format, set by lakesink in a batch's commit: ``<coordinates> at <ms>``, the greatest
binlog coordinates (epoch added) of any change a committed batch of the table carried, and the driver's wall clock (ms
since the epoch) when the attempt that raised it was prepared: every change below those coordinates was made before
then, so a later-made one below them proves the binlog went back (lakesink.cdc.binlog.HighWater)."""
PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS = "lakesink.cdc.binlog-clock-skew-seconds"
"""Table property, option cdc-format: how far (seconds, default 60) the source database's clock may run ahead of the
driver's before a change below the table's binlog high-water mark, made after it was raised, fails the batch as a
binlog that went back (lakesink.cdc.binlog.HighWater)."""
PROPERTY_CDC_BINLOG_CLOCK_SKEW_SECONDS_DEFAULT = 60
STATE_PROPERTY_PREFIXES = (PROPERTY_UPSERT_ORDER_FILE, PROPERTY_CDC_HELD_PREFIX)
"""The table properties that name state files a table depends on (lakesink.table.state_files: a commit of a table
without any of them attaches no state file and reads nothing)."""
SUMMARY_CDC_HELD_CHANGES = "lakesink.cdc.held-changes"
"""Option cdc-transactions=hold: how many changes the batch held back (not in any table yet)."""
SUMMARY_CDC_HELD_OLDEST_MS = "lakesink.cdc.held-oldest-ms"
"""Option cdc-transactions=hold: when the oldest change held back was made (its event's ``ts_ms``)."""
SUMMARY_CDC_COMMITTED_MS = "lakesink.cdc.committed-ms"
"""Option cdc-transactions=hold: the commit time (``END``'s ``ts_ms``) of the last source transaction released: every
table holds every transaction committed up to it (the completeness watermark of a change stream)."""
SUMMARY_CDC_HELD_FILE = "lakesink.cdc.held-file"
"""Option cdc-transactions=hold: the file of the changes the batch held back (none when it held none)."""
SUMMARY_CDC_REDELIVERED = "lakesink.cdc.redelivered-changes"
"""Option cdc-transactions=hold: change records the batch dropped because an earlier batch released their transaction
(Kafka Connect's redelivery after a connector restart)."""
SUMMARY_CDC_RELEASED_INCOMPLETE = "lakesink.cdc.released-incomplete"
"""Option cdc-transactions=hold: transactions the batch released as they stood after waiting option
``cdc-transaction-wait`` for changes that never came (a compacted topic, a topic not read, a lost ``END``)."""
CDC_TRANSACTION_WAIT_S_DEFAULT = 600.0
"""Option ``cdc-transaction-wait``'s default: how long (seconds) a held transaction that is not whole and not open
waits before it is released as it stands."""
PROPERTY_STATE_FILE = "lakesink.state-file"
"""Table property: the table's state file (a Puffin file next to its metadata, lakesink.table.state_files) as JSON --
its path, size, footer size and the state files it holds a copy of (the order files and held files the table's
properties name that live in its metadata folder). Every lakesink commit attaches it as the statistics file of its new
snapshot, so that every engine's orphan removal and snapshot expiry sees it live."""
ORDER_FILE_FLOOR = "lakesink.order-floor"
"""Key of the order file's Parquet metadata, option order-by with cdc-format's truncates: the source position of the
table's last truncate (a decimal, as text). Every change below it is older than the truncate and stale, for any key
(lakesink.driver.actions.upsert_order.truncated)."""

# --- snapshot summary: lakesink's other commits ----------------------------------------------------

SUMMARY_OPERATION = "lakesink.operation"
"""Summary key of lakesink's maintenance commits; its values are the ``OPERATION_*`` below."""
OPERATION_COMPACT = "compact"
OPERATION_REWRITE_MANIFESTS = "rewrite-manifests"
OPERATION_REWRITE_POSITION_DELETES = "rewrite-position-deletes"
BRANCH_BASE = "lakesink.branch-base"
"""Summary key of the empty snapshot lakesink commits to ``main`` of an empty table to start a branch from."""
SUMMARY_RESTORED_FROM = "lakesink.restored-from-snapshot-id"
"""Summary key of a snapshot that puts back a ref snapshot expiry dropped (``_pyiceberg.maintenance.prepare_restore_refs``):
the snapshot whose manifests it carries."""
SUMMARY_RESTORED_REF = "lakesink.restored-ref"
"""Summary key of such a snapshot: the ref(s) it was made for (comma-separated)."""

# --- table properties lakesink writes --------------------------------------------------------------

LAST_BATCH_PREFIX = "lakesink.last-batch."
"""``lakesink.last-batch.<query-id>`` (``...<query-id>.<sink-id>`` for a sink with a ``sink_id``): the replay marker
of a sink, updated in the same atomic commit as the batch's snapshot (:mod:`lakesink.table.markers`)."""

# --- Parquet footer keys (key-value metadata) lakesink writes --------------------------------------

ROW_ORIGINS = "lakesink.row-origins"
"""A compacted file's row provenance (:mod:`lakesink.audit.origins`)."""
WRITE_ID = "lakesink.write-id"
"""The Spark path's write id, in the first column's field metadata of the files it writes
(:mod:`lakesink.sink.spark.write`)."""

# --- table properties lakesink reads: Iceberg's keys and defaults (the Java library's), and write.lakesink.* ---

FORMAT_VERSION = "format-version"
TARGET_FILE_SIZE = "write.target-file-size-bytes"
TARGET_FILE_SIZE_DEFAULT = 512 * 1024 * 1024
DELETE_TARGET_FILE_SIZE = "write.delete.target-file-size-bytes"
DELETE_TARGET_FILE_SIZE_DEFAULT = 64 * 1024 * 1024
ROW_GROUP_ROWS = "write.parquet.row-group-limit"
ROW_GROUP_ROWS_DEFAULT = 1_048_576
ROW_GROUP_BYTES = "write.parquet.row-group-size-bytes"
ROW_GROUP_BYTES_DEFAULT = 128 * 1024 * 1024
MAX_OPEN_FILES = "write.lakesink.max-open-files"
MAX_OPEN_FILES_DEFAULT = 100
CODEC = "write.parquet.compression-codec"
CODEC_DEFAULT = "zstd"
COMPRESSION_LEVEL = "write.parquet.compression-level"
ZSTD_LEVEL_DEFAULT = 3  # parquet-mr's and Iceberg's
PAGE_SIZE = "write.parquet.page-size-bytes"
PAGE_SIZE_DEFAULT = 1048576
PAGE_ROW_LIMIT = "write.parquet.page-row-limit"
PAGE_ROW_LIMIT_DEFAULT = 20000
DICT_SIZE = "write.parquet.dict-size-bytes"
DICT_SIZE_DEFAULT = 2 * 1024 * 1024
AVRO_CODEC = "write.avro.compression-codec"
AVRO_CODEC_DEFAULT = "gzip"
MANIFEST_MERGE_ENABLED = "commit.manifest-merge.enabled"
MANIFEST_TARGET_SIZE = "commit.manifest.target-size-bytes"
MANIFEST_TARGET_SIZE_DEFAULT = 8 * 1024 * 1024
MANIFEST_MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
MANIFEST_MIN_COUNT_TO_MERGE_DEFAULT = 100
COMMIT_NUM_RETRIES = "commit.retry.num-retries"
COMMIT_NUM_RETRIES_DEFAULT = 4
COMMIT_MIN_WAIT_MS = "commit.retry.min-wait-ms"
COMMIT_MIN_WAIT_MS_DEFAULT = 100
COMMIT_MAX_WAIT_MS = "commit.retry.max-wait-ms"
COMMIT_MAX_WAIT_MS_DEFAULT = 60_000
COMMIT_TOTAL_TIMEOUT_MS = "commit.retry.total-timeout-ms"
COMMIT_TOTAL_TIMEOUT_MS_DEFAULT = 1_800_000

# column metrics (pyiceberg reads them; lakesink adds Java's inferred-column limit, lakesink._pyiceberg.io)
METRICS_PREFIX = "write.metadata.metrics."
"""Every metrics property starts so (the statistics plan is kept per schema and these properties alone)."""
METRICS_DEFAULT = "write.metadata.metrics.default"
METRICS_COLUMN_PREFIX = "write.metadata.metrics.column."
METRICS_MAX_INFERRED = "write.metadata.metrics.max-inferred-column-defaults"
METRICS_MAX_INFERRED_DEFAULT = 100
METRICS_MODE_DEFAULT = "truncate(16)"

# where files go (checked by lakesink.table.locations)
DATA_PATH_PROPERTIES = ("write.data.path", "write.object-storage.path", "write.folder-storage.path")
METADATA_PATH_PROPERTIES = ("write.metadata.path",)

# snapshot expiry (Iceberg's keys and defaults) and lakesink's maintenance
MAX_SNAPSHOT_AGE_MS = "history.expire.max-snapshot-age-ms"
MAX_SNAPSHOT_AGE_MS_DEFAULT = 5 * 24 * 3600 * 1000
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
MIN_SNAPSHOTS_TO_KEEP_DEFAULT = 1
MAX_REF_AGE_MS = "history.expire.max-ref-age-ms"
MAX_REF_AGE_MS_DEFAULT = 2**63 - 1
COMPACT_MIN_INPUT_FILES = "write.lakesink.compact.min-input-files"
COMPACT_MIN_INPUT_FILES_DEFAULT = 5
REWRITE_DELETES_MIN_INPUT_FILES = "write.lakesink.rewrite-position-deletes.min-input-files"
"""Small position delete files of one partition needed to rewrite them into one (lakesink.maintenance.position_deletes;
Java's ``min-input-files`` of ``rewrite_position_delete_files``); the sink's automatic maintenance runs the rewrite
only when the table holds at least this many live position delete files."""
REWRITE_DELETES_MIN_INPUT_FILES_DEFAULT = 5
MAINTENANCE_INTERVAL_MS = "write.lakesink.maintenance.interval-ms"
MAINTENANCE_INTERVAL_MS_DEFAULT = 60_000
# merge-on-read: a lookup that reads at most this many bytes (key column chunks, delete files) runs where the batch
# commits, not in a Spark job (lakesink.sink.merge_on_read: a Spark job's fixed cost exceeds such a read)
DRIVER_LOOKUP_BYTES = "write.lakesink.merge-on-read.driver-lookup-bytes"
DRIVER_LOOKUP_BYTES_DEFAULT = 8 * 1024 * 1024
# old metadata.json files: deleted at every commit beyond the newest N (Iceberg's keys; its defaults keep all)
METADATA_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
METADATA_PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"

#: The properties every table lakesink creates gets, unless an option ``table-property.<key>`` sets the key: a
#: stream left running keeps its table bounded (docs/maintenance.md, "What the defaults do"). Snapshots older than a
#: day are expired by ``maintenance=auto`` (at least the newest 100 are kept; replay markers are table properties and
#: survive expiry), and every commit deletes the metadata.json files beyond the newest 100. They are written into the
#: table, so every engine and the user see them and can change them. lakesink never sets them on a table it did not
#: create: with ``maintenance=auto`` it warns once about the missing ones (lakesink.maintenance.auto).
BOUNDED_TABLE_DEFAULTS: dict[str, str] = {
    METADATA_DELETE_AFTER_COMMIT: "true",
    METADATA_PREVIOUS_VERSIONS_MAX: "100",
    MAX_SNAPSHOT_AGE_MS: str(24 * 3600 * 1000),
    MIN_SNAPSHOTS_TO_KEEP: "100",
}

# --- catalog properties lakesink reads (besides pyiceberg's own) -----------------------------------

REQUEST_TIMEOUT = "lakesink.request-timeout-s"
"""The timeout of every HTTP request to a REST catalog, in seconds (0: none, pyiceberg's default)."""
REQUEST_TIMEOUT_DEFAULT = 120.0

# --- columns lakesink adds to an upsert batch while it resolves it --------------------------------

DELETED = "__lakesink_deleted"
"""The flag column of a batch's keys: true for a key the batch deletes (driver, executors and Spark agree on it)."""
ROW_COLUMN = "__lakesink_row"
"""A row's position, while a batch or a rewritten file is resolved to one row per key."""
ORDER_COLUMN = "__lakesink_order"
"""The order-by value of each key of a batch's keys (option order-by; a change older than the table's does not apply)."""
HELD_COLUMN = "__lakesink_held"
"""The order value the table holds for a key, while a batch's keys are compared with it."""
UNAVAILABLE_COLUMN = "__lakesink_unavailable"
"""Option cdc-format: per change, the columns whose value its source did not send (Debezium's unavailable-value
placeholder: PostgreSQL's unchanged TOASTed values), kept from the row the table (or the batch) holds for the key
(lakesink.cdc.unavailable); in a batch's keys, those the commit fills from the table."""
UNDONE_COLUMN = "__lakesink_undone"
"""Option history with cdc-format: true for a change the batch's later truncate of its table undoes -- a version in the
history, never applied to the table (lakesink.sink.cdc.truncates; lakesink.executor.task_writer)."""
#: Columns of the rows a merge-on-read lookup hands its tasks (lakesink.sink.merge_on_read): the data file (its path as
#: the table's manifests spell it), the row's position in it, and whether the change that matched it is stale (older
#: than the row: the row stays, no delete is written).
LOOKUP_PATH = "__lakesink_path"
LOOKUP_POS = "__lakesink_pos"
LOOKUP_STALE = "__lakesink_stale"
LOOKUP_SPARK_PATH = "__lakesink_spark_path"
"""The data file as Spark names it (``_metadata.file_path``): :data:`LOOKUP_PATH` is null when no candidate file
matched that name, a loud error."""
LOOKUP_BRANCH = "__lakesink_lookup"
"""Which table's lookup a task result belongs to, when a routed batch's lookups run as one Spark job (a union)."""
WINS_COLUMN = "__lakesink_wins"
"""Option history on foreach_batch: whether a change wins its key (the greatest order-by value), while the batch's
changes are collected whole (lakesink.sink.upsert_batch)."""
TOP_COLUMN = "__lakesink_top"
"""The greatest ``order-by`` value of a key, while a batch is resolved to one row per key."""
REJECT_COLUMN = "__lakesink_reject"
"""foreach_batch with option reject-when: the boolean column Spark computes from it before the rows reach the writer
(lakesink.executor.dead_letters)."""
INDEX_COLUMN = "__lakesink_index"
"""The verdict column of an expression evaluated on a batch (lakesink._pyiceberg.io.matching_rows)."""
COUNT_COLUMN = "__lakesink_rows"
"""The number of rows of a key, while a batch is resolved to one row per key (in Spark)."""
PAYLOAD_COLUMN = "__lakesink_payload"
"""A Debezium value's envelope as JSON text (the ``schemas.enable`` wrapper removed), while lakesink.cdc.debezium parses it."""
ENVELOPE_COLUMN = "__lakesink_envelope"
"""A Debezium value's envelope as a struct, while lakesink.cdc.debezium parses it."""

# --- Spark local properties (TaskContext / SparkContext.getLocalProperty) --------------------------

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The streaming query id, on executors and in foreachBatch's function."""
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The micro-batch id, on executors."""
RUN_ID_PROPERTY = "spark.jobGroup.id"
"""The query run's id (a new one at every restart)."""

# --- an Iceberg REST commit report's metadata (lakesink.driver.report.metrics.commit_report) ------------------------------
# the query id, batch id and dead letters use the snapshot summary's keys (SUMMARY_QUERY_ID, SUMMARY_BATCH_ID, ...)

REPORT_ROWS_IN = "lakesink.rows-in"
"""The rows the batch's tasks received for the table (written and dead letters)."""
REPORT_WATERMARK_LAG_MS = "lakesink.watermark-lag-ms"
"""How far Spark's watermark for the batch was behind the driver's clock at the commit, in ms."""

# --- environment variables lakesink reads ----------------------------------------------------------

ENV_HOME = "LAKESINK_HOME"
"""The folder of the embedded default catalog (``catalog.db``, ``warehouse/``) and the value of ``${LAKESINK_HOME}`` in
catalog properties (lakesink.driver.catalogs)."""
HOME_DEFAULT = "lakehouse"
"""``$LAKESINK_HOME`` when unset: this folder under the working folder."""
ENV_LOG_LEVEL = "LAKESINK_LOG_LEVEL"
"""The level of the stderr handler lakesink installs in Spark's Python workers (lakesink.sink.source)."""
LOG_LEVEL_DEFAULT = "INFO"
ENV_LOCK_DIR = "LAKESINK_LOCK_DIR"
"""The folder of the commit locks and in-doubt records of this host (lakesink.driver.loop.guard)."""
LOCK_DIR_DEFAULT = "lakesink-commit-locks"
"""``$LAKESINK_LOCK_DIR`` when unset: this folder under the system's temporary folder."""
ENV_KEPT_BYTES = "LAKESINK_KEPT_BYTES"
"""How many bytes a process keeps between batches (lakesink.table.kept): a whole number, 0 keeps nothing."""
KEPT_BYTES_DEFAULT = 512 * 1024 * 1024
"""``$LAKESINK_KEPT_BYTES`` when unset: the decoded key and ``order-by`` columns of ten tables of a million rows (16
bytes a row) with room to spare. At 128 MiB those tables' lookups, each batch reading every table's files in turn,
found none of them kept (the least recently used is the next one read) and read them all again: ~0.2 s a batch of the
cdc-scale benchmark at 1,000,000 rows a table (docs/performance.md)."""
ENV_FAULTS_DIR = "LAKESINK_FAULTS_DIR"
"""Tests only: the folder that switches fault points on (lakesink.faults)."""

# --- defaults of lakesink's own operations ---------------------------------------------------------

ORPHAN_OLDER_THAN_DEFAULT = timedelta(days=3)
"""Orphan files younger than this are never removed (Iceberg's default for ``deleteOrphanFiles``): the default of
``remove_orphan_files``, of ``maintain`` and of the CLI's ``--older-than``."""
UNIT_THREADS_FROM = 4
"""A unit of at least this many tables (or commit actions) is prepared, and its metadata files staged, on a pool of
threads (:func:`lakesink._pyiceberg.commit.unit_threads` of them) that lives for one attempt; a smaller one on the
calling thread."""


# --- columns and markers of a batch's Spark jobs and Arrow tables (never written into a table) ---------------------

ORDER_PRESENT_COLUMN = "__lakesink_present"
"""Option order-by: whether a key of the order file is present (lakesink.driver.actions.upsert_order)."""
ROUTE_PARTITION_COLUMN = "__lakesink_route"
"""route-by with writer='spark': the partition column of a routed write job, the table's number in its group
(lakesink.sink.spark.routed; not written into the files)."""
ROUTED_TABLE_COLUMN = "__lakesink_table"
"""route-by with writer='spark' and upserts: each row's table as its number among the batch's tables, while the batch is
resolved to one row per (table, key) in Spark (lakesink.sink.upsert_batch.resolve_routed; not written into the files)."""
SPLIT_VALUE_COLUMN = "__lakesink_value"
"""route-by with writer='spark', appends: the partition column of the split job, ``v`` and the routing value's bytes in
hex, or ``h`` and their SHA-256 (lakesink.sink.spark.split; a folder name, not written into the files)."""
ROUTED_NO_COLUMN_MARKER = "LAKESINK_ROUTED_NO_COLUMN"
"""route-by with writer='spark': the marker of the error a row raises with a value in a column its table lacks."""
ROUTED_UNKNOWN_ROUTE_MARKER = "LAKESINK_ROUTED_UNKNOWN_ROUTE"
"""route-by with writer='spark': the marker of the error a row raises whose route is not among the batch's tables."""
