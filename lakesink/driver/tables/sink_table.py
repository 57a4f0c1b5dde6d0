"""Driver side, a sink's table: open (or create) it, check the stream against it, make the write plan.

Runs on the driver only (never touches rows). A plan carries the table's uuid, its schema and spec ids
and its typed settings: the commit refuses files written for another table, schema or spec.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.types import DoubleType, FloatType, NestedField
from tenacity import Retrying, retry_if_not_exception_type, stop_after_delay, wait_exponential_jitter

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam
from lakesink._pyiceberg import producers as seam_producers
from lakesink._pyiceberg.commit import is_sql_catalog
from lakesink._pyiceberg.io import metadata as seam_metadata
from lakesink._pyiceberg.io.metadata import NewTable
from lakesink.driver import catalog_scans, catalogs
from lakesink.driver.loop import swap
from lakesink.driver.loop.action import CommitAction, Landing, Turn
from lakesink.driver.tables.schema import SchemaChange, check_writable
from lakesink.errors import (
    PROGRAMMING_ERRORS,
    CatalogError,
    CommitConflictError,
    InvalidOptionError,
    LakesinkError,
    TableIdentityChangedError,
    TableLocationError,
)
from lakesink.executor.messages import WritePlan
from lakesink.options import DEFAULT_FORMAT_VERSION, TABLE_PROPERTY_PREFIX, UPSERT_KEY, SinkOptions
from lakesink.table import locations, names, partitioning, storage
from lakesink.table.keys import BOUNDED_TABLE_DEFAULTS, BRANCH_BASE, FORMAT_VERSION, LAST_BATCH_PREFIX, MAIN_BRANCH
from lakesink.table.markers import CommittedBatch, SnapshotIndex, last_committed_batch, last_committed_on_branch
from lakesink.table.settings import TableSettings

log = logging.getLogger("lakesink")

_namespaces_made: set[tuple[int, tuple[str, ...]]] = set()
"""The namespaces this process made or found when it created a table (catalog by id): a routed batch creating many
tables in one namespace asks the catalog for it once (a namespace dropped since: made again when a creation says so)."""

Sibling = tuple[str, str, str]
"""Another table of a namespace, for the location-overlap check: its name, location and UUID."""


def sibling(identifier: tuple[str, ...], table: Table) -> Sibling:
    return ".".join(identifier), table.location(), str(table.metadata.table_uuid)


T = TypeVar("T")


MAX_SIBLINGS_CHECKED = 500
"""A new table's location is checked against this many tables of its namespace (the first ones the catalog lists)."""


def read_siblings(
    catalog: Catalog, identifiers: Sequence[tuple[str, ...]], read: Mapping[tuple[str, ...], Table] | None = None
) -> list[Sibling]:
    """The name, location and UUID of the first :data:`MAX_SIBLINGS_CHECKED` tables of ``identifiers`` (a namespace's,
    for the location check). ``read``: those tables as the caller read them just now; else they are read here, in one
    catalog query where the catalog answers one. Either way they are not kept for a next read (the driver keeps the
    tables it writes, not every table of their namespaces); a table dropped meanwhile, or not an Iceberg table, is
    left out."""
    checked = [tuple(ident) for ident in identifiers[:MAX_SIBLINGS_CHECKED]]
    if read is None:
        read = seam_commit.read_at_once(catalog, checked, keep=False)
    out = []
    for ident in checked:
        try:
            table = read.get(ident) if read is not None else seam_commit.load_table(catalog, ident, keep=False)
        except Exception:
            continue
        if table is not None:
            out.append(sibling(ident, table))
    return out


class SinkTable:
    """The table one lakesink sink writes (one table, one set of options), as the driver sees it; its committer
    (lakesink.driver.committers.table.TableCommitter) holds it as ``table`` and it knows nothing of the committer."""

    def __init__(self, options: SinkOptions):
        if options.routing is not None:
            raise AssertionError("a routed sink's options name no table: open each table with options.for_table(...)")
        self.options = options
        self.catalog: Catalog = catalogs.load(options.catalog_name, options.catalog_properties)
        self.table_name = str(options.table)

    # --- start of a query -------------------------------------------------------------------------

    def open_table(self, stream_schema: pa.Schema) -> Table:
        """At the start of a query: load the table (creating it and its namespace if missing and allowed),
        check the stream fits it and that its location overlaps no other table's."""
        table, created = self._load_or_create(stream_schema)
        self._check(table, stream_schema)
        self._check_requested_properties(table)
        self._check_no_overlap(table, self._sibling_locations(), created=created)
        return self._ensure_branch(table)

    def _ensure_branch(self, table: Table) -> Table:
        """With option ``branch``: create the branch from ``main``'s head when no lakesink query wrote it yet.

        A branch that lakesink queries committed to and that is gone was deleted by someone: recreating it from
        ``main`` would hide that its batches are gone, so that is a loud error.
        """
        branch = self.options.branch
        if branch == MAIN_BRANCH or branch in table.metadata.refs:
            return table
        writers = sorted(
            key[len(LAST_BATCH_PREFIX) :]
            for key in table.properties
            if key.startswith(LAST_BATCH_PREFIX) and _marker_branch(table, key) == branch
        )
        if writers:
            raise TableIdentityChangedError(
                f"branch {branch!r} of table {self.table_name} does not exist, but lakesink queries committed batches to it "
                f"(replay markers of {', '.join(writers[:3])}{' ...' if len(writers) > 3 else ''}): it was deleted. "
                "lakesink does not recreate it from main on its own, since the batches it held would be gone unnoticed. "
                f"Recreate it deliberately (ALTER TABLE {self.table_name} CREATE BRANCH `{branch}`, or pyiceberg's "
                "manage_snapshots().create_branch(...)) and restart, or write to another branch (option 'branch')"
            )
        for action in (_BranchBase(table, branch), _CreateBranch(table, branch)):
            try:
                swap.run(action)
            except swap.RetriesExhausted as e:
                raise CommitConflictError(f"{action.what}: {e.attempts} attempt(s) {e.describe()}") from e
            table = seam_commit.load_table(self.catalog, self.options.table.identifier)
        return table

    def open_routed(
        self,
        stream_schema: pa.Schema,
        *,
        location: str | None,
        siblings: Callable[[], list[Sibling]],
        read: Table | None = None,
        absent: bool = False,
        created: bool = False,
    ) -> tuple[Table, pa.Schema]:
        """Option route-by, a table seen for the first time in a run: load it, or create it (and its namespace) at
        ``location`` with the stream's schema; check the stream's columns the table has (all of them with
        ``merge-schema``) and its location against ``siblings`` (the other tables of its namespace). Returns the
        table and the stream schema it takes. ``read``: the table as the caller read it just now (with the batch's
        other tables, in one catalog query); ``absent``: the caller found no such table just now; ``created``: ``read``
        is a table the caller created just now (lakesink.driver.catalogs.create_at_once, with :meth:`new_table`)."""
        if read is not None:
            table = read
        else:
            table, created = self._load_or_create(stream_schema, location=location, absent=absent)
        columns = self.columns_taken(table, stream_schema)
        self._check(table, columns)
        self._check_requested_properties(table)
        self._check_no_overlap(table, [s for s in siblings() if s[0] != self.table_name], created=created)
        return self._ensure_branch(table), columns

    def _check_no_overlap(self, table: Table, siblings: list[Sibling], *, created: bool) -> None:
        """TableLocationError when the table's location overlaps another table's. A table lakesink created a moment
        ago at such a location (the catalog's default location of a renamed table's old name: the renamed table
        keeps its files there) is dropped again, without its files -- they may be the other table's -- so that no
        table is left sharing another's location, where an orphan-file clean-up of one would delete the other's.

        A sibling with this table's UUID is this table under another spelling (a case-insensitive catalog, Glue or
        Hive, lists ``orders`` for the ``Orders`` lakesink opened): not another table."""
        own = str(table.metadata.table_uuid)
        others = [(name, location) for name, location, uuid in siblings if uuid != own]
        try:
            locations.check_no_overlap(self.table_name, table.location(), others)
            if created:
                self._check_metadata_folder_is_its_own(table)
        except TableLocationError as e:
            if not created:
                raise
            dropped = self._drop_if_still_empty(table)
            raise TableLocationError(
                f"{e}. lakesink had just created {self.table_name} there (the catalog's default location); "
                + (
                    "it was dropped again (its files were left: they may be the other table's)"
                    if dropped
                    else "it was NOT dropped again (someone wrote to it meanwhile, or it could not be dropped)"
                )
                + f". Create {self.table_name} yourself with a location of its own, then restart"
            ) from None

    def _check_metadata_folder_is_its_own(self, table: Table) -> None:
        """A table just created: TableLocationError when its metadata folder holds the metadata of another live table
        of the catalog (:func:`lakesink.driver.catalog_scans.live_table_sharing_folder`) -- one renamed into another
        namespace, which the check against the namespace's tables does not see. Files of a table that no longer
        exists (dropped without its files, then created again here) are left to the orphan-file clean-up."""
        folder = table.metadata_location.rsplit("/", 1)[0]
        try:
            unreferenced = [
                path
                for path in (f"{folder}/{f.relative}" for f in storage.list_files(table.io, folder))
                if path.endswith(".metadata.json") and path != table.metadata_location
            ]
            found = catalog_scans.live_table_sharing_folder(table, unreferenced)
        except Exception as e:
            log.warning(
                "lakesink: table %s: cannot tell whether another table keeps its metadata in %s (%s); not checked",
                self.table_name,
                folder,
                self.redact(e),
            )
            return
        if found is not None:
            other, _, path = found
            raise TableLocationError(
                f"table {self.table_name} at {table.location()!r} overlaps table {other}: its metadata file {path} is "
                f"in {self.table_name}'s metadata folder: lakesink refuses to write where another table's files are"
            )

    def _drop_if_still_empty(self, table: Table) -> bool:
        """Drop ``table`` (not its files) if it is still the table lakesink created and has no snapshot: on a SQL
        catalog with a compare-and-swap on its metadata pointer (a commit landing meanwhile is never dropped);
        elsewhere (no catalog offers a conditional drop) after reading it, milliseconds after its creation."""
        ident = self.options.table.identifier
        try:
            now = seam_commit.load_table(self.catalog, ident)
            if now.metadata.table_uuid != table.metadata.table_uuid or now.metadata.snapshots:
                return False
            dropped = None  # not a SQL catalog
            if is_sql_catalog(self.catalog):
                from lakesink._pyiceberg.sql_catalog import drop_unchanged_on_sql_catalog  # the kind in use only

                dropped = drop_unchanged_on_sql_catalog(self.catalog, ident, now.metadata_location)
            if dropped is False:
                return False
            if dropped is None:
                self.catalog.drop_table(ident)
            log.warning("lakesink: dropped table %s again: its location overlaps another table's", self.table_name)
            return True
        except Exception as e:
            log.warning("lakesink: could not drop table %s again: %s", self.table_name, self.redact(e))
            return False

    def columns_taken(self, table: Table, stream_schema: pa.Schema) -> pa.Schema:
        """Option route-by: the stream columns this table takes (by name), all of them with ``merge-schema``; a
        column it lacks must be null in the rows routed to it (lakesink.executor.routed_writer checks)."""
        if self.options.merge_schema:
            return stream_schema
        have = set(table.schema().column_names)
        return pa.schema([f for f in stream_schema if f.name in have], metadata=stream_schema.metadata)

    def new_table(self, stream_schema: pa.Schema, location: str | None) -> NewTable:
        """What a table lakesink creates from ``stream_schema`` is created with (option upsert-key: its identifier
        fields; option partition-by: its spec; the creation properties), at ``location`` (None: the catalog's)."""
        schema = seam.new_table_schema(stream_schema)
        if self.options.upsert_key:
            schema = with_identifier_fields(schema, self.options.upsert_key, self.table_name)
        spec = partitioning.to_spec(self.options.partitioned_by, schema, self.table_name)
        return NewTable(self.options.table.identifier, schema, spec, self.creation_properties(), location)

    def make_namespace(self, *, again: bool = False) -> None:
        """Create the table's namespace unless it exists (asked once a process; ``again``: it was dropped since)."""
        made = (id(self.catalog), tuple(self.options.table.namespace))
        if again:
            _namespaces_made.discard(made)
        if made not in _namespaces_made:  # made (or found) by this process before: not asked again
            self._patiently(lambda: self.catalog.create_namespace_if_not_exists(self.options.table.namespace))
            _namespaces_made.add(made)

    def _load_or_create(
        self, stream_schema: pa.Schema, *, location: str | None = None, absent: bool = False
    ) -> tuple[Table, bool]:
        """The table, and whether this call created it (``absent``: :meth:`open_routed`'s)."""
        ident = self.options.table.identifier
        try:
            if not absent:
                return self._patiently(lambda: seam_commit.load_table(self.catalog, ident)), False
        except NoSuchTableError:
            pass
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:
            raise CatalogError(f"cannot load table {self.table_name}: {self.redact(e)}") from None
        if not self.options.create_table:
            raise CatalogError(
                f"table {self.table_name} does not exist in catalog {self.catalog.name!r} (option create-table is false)"
            )
        new = self.new_table(stream_schema, location)

        def create() -> Table:
            return self.catalog.create_table(
                ident, schema=new.schema, partition_spec=new.spec, properties=new.properties, location=location
            )

        try:
            try:
                self.make_namespace()
                table = self._patiently(create)
            except NoSuchNamespaceError:  # dropped since this process made it
                self.make_namespace(again=True)
                table = self._patiently(create)
            log.info("lakesink: created table %s in catalog %r", self.table_name, self.catalog.name)
            return table, True
        except TableAlreadyExistsError:  # another query created it first
            return self._patiently(lambda: seam_commit.load_table(self.catalog, ident)), False
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:
            raise CatalogError(f"cannot create table {self.table_name}: {self.redact(e)}") from None

    def creation_properties(self) -> dict[str, str]:
        """The properties of a table lakesink creates (:func:`creation_properties`)."""
        return creation_properties(self.options, self.table_name)

    def _check_requested_properties(self, table: Table) -> None:
        """An existing table must already have the properties (and format version) the options ask for:
        lakesink never changes the properties of a table it did not create."""
        wrong = [
            f"{key}={value!r} (table has {table.properties.get(key)!r})"
            for key, value in self.options.table_properties.items()
            if table.properties.get(key) != value
        ]
        if self.options.format_version is not None and table.metadata.format_version != self.options.format_version:
            wrong.append(f"{FORMAT_VERSION}={self.options.format_version} (table has {table.metadata.format_version})")
        if wrong:
            raise InvalidOptionError(
                f"table {self.table_name} exists and does not have the table properties the options ask for: "
                f"{'; '.join(wrong)}. Options '{TABLE_PROPERTY_PREFIX}<name>' and '{FORMAT_VERSION}' only set the "
                "properties of a table lakesink creates: set them on the table yourself (ALTER TABLE "
                f"{self.table_name} SET TBLPROPERTIES (...), pyiceberg's transaction().set_properties(...), "
                "upgrade_table_version(...)) or drop the options"
            )

    def _check(self, table: Table, stream_schema: pa.Schema) -> tuple[SchemaChange, ...]:
        """Check the stream against the table (listing every problem); return the ``merge-schema`` changes."""
        changes = check_writable(self.table_name, table.schema(), stream_schema, merge_schema=self.options.merge_schema)
        terms = self.options.partitioned_by
        if terms and not partitioning.same_terms(table.spec(), terms, table.schema()):
            raise InvalidOptionError(
                f"option '{partitioning.PARTITIONED_BY}' is {', '.join(map(str, terms))!r} but table {self.table_name} "
                f"is partitioned by {partitioning.describe(table.spec(), table.schema())!r}; the option only applies "
                "when lakesink creates the table: drop the option (lakesink writes with the table's current spec) or "
                "evolve the table's spec (ALTER TABLE ... ADD/DROP PARTITION FIELD, or pyiceberg's update_spec())"
            )
        locations.data_prefix(self.table_name, table.location(), table.properties)
        if self.options.upsert_key:
            self._check_identifier_fields(table)
        return changes

    def _check_identifier_fields(self, table: Table) -> None:
        """With ``upsert-key``: the table's identifier fields are the key columns (what makes a row's identity)."""
        schema = table.schema()
        have = sorted(schema.identifier_field_names())
        want = self.options.upsert_key
        columns = {n.lower() for n in schema.column_names}
        missing = [k for k in want if k.lower() not in columns]
        if missing:
            raise InvalidOptionError(
                f"option '{UPSERT_KEY}' is {', '.join(want)!r} but table {self.table_name} has no column "
                f"{missing[0]!r}: every table an upsert writes needs the key columns as its identifier fields. Add the "
                f"column to the table (NOT NULL) and set its identifier fields (ALTER TABLE {self.table_name} SET "
                f"IDENTIFIER FIELDS {', '.join(want)}), or write no row to this table"
            )
        if {n.lower() for n in have} != {n.lower() for n in want}:
            raise InvalidOptionError(
                f"option '{UPSERT_KEY}' is {', '.join(want)!r} but table {self.table_name} has "
                f"{'identifier fields ' + repr(', '.join(have)) if have else 'no identifier fields'}; an upsert key must be "
                f"the table's identifier fields. Set them (ALTER TABLE {self.table_name} SET IDENTIFIER FIELDS "
                f"{', '.join(want)}, or pyiceberg's update_schema().set_identifier_fields(...); the columns must be NOT NULL) "
                "or use the table's identifier fields as the key"
            )

    def _sibling_locations(self) -> list[Sibling]:
        """Locations of the other tables of the namespace (read once, at the start of a query)."""
        ident = self.options.table.identifier
        try:
            siblings = [t for t in self.catalog.list_tables(self.options.table.namespace) if tuple(t) != ident]
        except Exception as e:
            log.warning("lakesink: cannot list the tables of %s (%s); location overlap not checked", ident[:-1], e)
            return []
        if len(siblings) > MAX_SIBLINGS_CHECKED:
            log.warning(
                "lakesink: namespace of %s has %s tables; location overlap checked against the first %s",
                self.table_name,
                len(siblings),
                MAX_SIBLINGS_CHECKED,
            )
        return read_siblings(self.catalog, siblings)

    # --- every batch ------------------------------------------------------------------------------

    def reload_table(self) -> Table:
        """For a later batch of a query already opened: the current table (the stream is checked against
        it by :meth:`write_plan`)."""
        try:
            table = self._patiently(lambda: seam_commit.load_table(self.catalog, self.options.table.identifier))
        except NoSuchTableError:
            raise TableIdentityChangedError(
                f"table {self.table_name} was dropped while the query ran; nothing was written. Restart the query "
                "to write into a table of that name again (a new table starts without the query's earlier batches)"
            ) from None
        except PROGRAMMING_ERRORS:
            raise
        except Exception as e:
            raise CatalogError(f"cannot load table {self.table_name}: {self.redact(e)}") from None
        return table

    def settings(self, table: Table) -> TableSettings:
        """The table's properties lakesink acts on (InvalidOptionError naming each bad one)."""
        return TableSettings.parse(self.table_name, table.properties)

    def write_plan(
        self, table: Table, query_id: str | None, stream_schema: pa.Schema | None = None, *, expected_uuid: str | None = None
    ) -> WritePlan:
        """What executors need to write a batch into ``table``; with ``merge-schema`` and a stream that
        needs it, the files are written with the evolved schema (committed with the batch).

        Everything that could fail on an executor is checked here first: the table properties (parsed
        once), pyiceberg's own Parquet and metrics properties, the branch written.
        """
        if expected_uuid is not None and str(table.metadata.table_uuid) != expected_uuid:
            raise self.identity_changed(expected_uuid, str(table.metadata.table_uuid))
        self.check_branch(table)
        settings = self.settings(table)
        last = self.last(table, query_id) if query_id else None
        changes = self._check(table, stream_schema) if stream_schema is not None else ()
        if changes:
            log.info(
                "lakesink: table=%s merge-schema: the next commit will %s",
                self.table_name,
                "; ".join(str(c) for c in changes),
            )
        schema = seam_producers.evolved_schema(table, changes) if changes else table.schema()
        seam.check_write_properties(self.table_name, schema, table.properties)
        return WritePlan(
            table=self.table_name,
            location=table.location(),
            data_prefix=locations.data_prefix(self.table_name, table.location(), table.properties),
            properties=dict(table.properties),
            settings=settings,
            table_uuid=str(table.metadata.table_uuid),
            schema=schema,
            schema_id=table.metadata.current_schema_id,
            spec_id=table.metadata.default_spec_id,
            io=table.io,
            query_id=query_id,
            last_committed_batch=last.batch_id if last else None,
            spec=table.spec(),
            schema_changes=changes,
            sink_id=self.options.sink_id,
        )

    def check_branch(self, table: Table) -> None:
        """The branch written still exists (a branch deleted while the query runs is never recreated silently)."""
        branch = self.options.branch
        if branch != MAIN_BRANCH and branch not in table.metadata.refs:
            raise TableIdentityChangedError(
                f"branch {branch!r} of table {self.table_name} was deleted while the query wrote to it; nothing was "
                "committed. lakesink does not recreate it (as a root with no history, or from main) on its own: "
                f"recreate it deliberately (ALTER TABLE {self.table_name} CREATE BRANCH `{branch}`) and restart the "
                "query, or write to another branch"
            )

    def identity_changed(self, expected: str, found: str) -> TableIdentityChangedError:
        return TableIdentityChangedError(
            f"table {self.table_name} is not the table the batch was written for (uuid {found}, the files were "
            f"written for uuid {expected}): it was dropped and recreated while the query ran. Nothing was committed "
            "into the new table. Restart the query to write into the new table (it starts without the earlier batches)"
        )

    def last(self, table: Table, query_id: str, *, index: SnapshotIndex | None = None) -> CommittedBatch | None:
        """The sink's last batch on the branch written (the replay check)."""
        return last_committed_on_branch(table.metadata, query_id, self.options.branch, self.options.sink_id, index=index)

    def last_committed(self, query_id: str) -> CommittedBatch | None:
        return self.last(seam_commit.load_table(self.catalog, self.options.table.identifier), query_id)

    def load_patiently(self, batch_id: int, *, load: Callable[[], Table] | None = None) -> Table:
        """Read the table for a commit of batch ``batch_id``, riding out a briefly locked or unreachable catalog."""
        return swap.read_patiently(
            load or self.load,
            dropped=f"table {self.table_name} was dropped while batch {batch_id} was written; nothing was committed",
            unavailable=(f"cannot read table {self.table_name} from catalog {self.catalog.name!r} to commit batch {batch_id}"),
            redact=self.redact,
        )

    def _patiently(self, call: Callable[[], T]) -> T:
        """Run a catalog call, riding out a briefly locked or unreachable catalog for up to 30 s (a SQLite catalog
        file another process is committing to answers "database is locked"); pyiceberg's answers (no such table,
        already exists) and lakesink's errors are not retried."""
        retrying = Retrying(
            stop=stop_after_delay(swap.CATALOG_READ_PATIENCE_S),
            wait=wait_exponential_jitter(initial=0.2, max=5.0),
            retry=retry_if_not_exception_type((NoSuchTableError, NoSuchNamespaceError, TableAlreadyExistsError, LakesinkError)),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                return call()
        raise AssertionError("unreachable")  # pragma: no cover

    def load(self) -> Table:
        """Read the table (through the process's catalog connection; no retry)."""
        return seam_commit.load_table(self.catalog, self.options.table.identifier)

    def load_fresh(self) -> Table:
        """Read the table through a connection that cannot hold a write of ours whose outcome is unknown
        (settling an unknown commit outcome must never read our own uncommitted write)."""
        return catalogs.load_table_fresh(
            self.options.catalog_name, self.options.catalog_properties, self.options.table.identifier
        )

    def redact(self, e: BaseException) -> str:
        return catalogs.redacted(e, self.options.catalog_name, self.options.catalog_properties)


def creation_properties(options: SinkOptions, table_name: str) -> dict[str, str]:
    """The properties of a table lakesink creates (options ``table-property.*`` and ``format-version``, over the
    bounded defaults :data:`~lakesink.table.keys.BOUNDED_TABLE_DEFAULTS`), validated first so that a bad value
    creates no table."""
    version = options.format_version or DEFAULT_FORMAT_VERSION
    if not seam_metadata.writes_format_version(version):
        raise InvalidOptionError(
            f"option '{FORMAT_VERSION}' is {version}, but the installed pyiceberg cannot write format version "
            f"{version} tables (apache/iceberg-python#1551); table {table_name} was not created: use "
            f"'{FORMAT_VERSION}' {DEFAULT_FORMAT_VERSION} (the default)"
        )
    properties = {**BOUNDED_TABLE_DEFAULTS, **options.table_properties, FORMAT_VERSION: str(version)}
    TableSettings.parse(table_name, properties)
    return properties


def with_identifier_fields(schema: Schema, key: tuple[str, ...], table_name: str) -> Schema:
    """A new table's schema with the key columns NOT NULL and as its identifier fields."""
    by_name = {f.name.lower(): f for f in schema.fields}
    missing = [k for k in key if k.lower() not in by_name]
    if missing:
        raise InvalidOptionError(
            f"option '{UPSERT_KEY}' names column(s) {', '.join(map(repr, missing))} that the stream does not have "
            f"(columns: {', '.join(f.name for f in schema.fields)}); table {table_name} was not created"
        )
    unkeyable = [by_name[k.lower()] for k in key if isinstance(by_name[k.lower()].field_type, (FloatType, DoubleType))]
    unkeyable += [by_name[k.lower()] for k in key if not by_name[k.lower()].field_type.is_primitive]
    if unkeyable:
        f = unkeyable[0]
        raise InvalidOptionError(
            f"option '{UPSERT_KEY}': column {f.name!r} has type {f.field_type}, which cannot be a key (Iceberg identifier "
            f"fields are primitive columns other than float and double: -0.0/0.0 and NaN make float equality ambiguous); "
            f"table {table_name} was not created. Key the rows by another column, or by a cast of this one (e.g. a string "
            "or a decimal)"
        )
    ids = {by_name[k.lower()].field_id for k in key}
    fields = [
        NestedField(f.field_id, f.name, f.field_type, required=True, doc=f.doc) if f.field_id in ids else f for f in schema.fields
    ]
    return Schema(*fields, schema_id=schema.schema_id, identifier_field_ids=[by_name[k.lower()].field_id for k in key])


def _marker_branch(table: Table, key: str) -> str | None:
    query_and_sink = key[len(LAST_BATCH_PREFIX) :]
    query_id, _, sink_id = query_and_sink.partition(".")
    try:
        marker = last_committed_batch(table.properties, query_id, sink_id or None)
    except (ValueError, KeyError, TypeError):
        return None
    return marker.branch if marker else None


class _BranchBase(CommitAction):
    """Iceberg makes a branch only from a snapshot: an empty table gets an empty snapshot on ``main`` to branch from
    (its manifest list named by lakesink, so that the orphan clean-up keeps it while it may land). Landed once
    ``main`` has a snapshot, whoever made it."""

    turn = Turn.BATCH  # part of a sink's set-up: it never waits for this process's maintenance

    def __init__(self, table: Table, branch: str):
        super().__init__(table, f"empty base snapshot of branch {branch!r} of {'.'.join(table.name())}")
        self.branch = branch

    def landed(self, table: Table) -> Landing | None:
        head = table.metadata.snapshot_by_name(MAIN_BRANCH)
        return None if head is None else Landing(mine=True, snapshot_id=head.snapshot_id)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        return seam_producers.prepare_snapshot(
            table,
            data_files=[],
            overwrite=False,
            summary={BRANCH_BASE: self.branch},
            properties=lambda _: {},
            branch=MAIN_BRANCH,
            commit=names.commit_name(names.BRANCH),
        )


class _CreateBranch(CommitAction):
    """A branch made from ``main``'s head as read by the attempt; landed once the branch exists (another query of the
    same sink may have made it meanwhile)."""

    turn = Turn.BATCH

    def __init__(self, table: Table, branch: str):
        super().__init__(table, f"creation of branch {branch!r} of {'.'.join(table.name())}")
        self.branch = branch

    def landed(self, table: Table) -> Landing | None:
        ref = table.metadata.refs.get(self.branch)
        return None if ref is None else Landing(mine=True, snapshot_id=ref.snapshot_id)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        head = table.metadata.snapshot_by_name(MAIN_BRANCH)
        if head is None:
            raise TableIdentityChangedError(f"{self.what}: main has no snapshot any more (the table was replaced?)")
        prepared = seam_producers.prepare_staged(
            table, lambda tx: seam_producers.manage_snapshots(tx).create_branch(head.snapshot_id, self.branch).commit()
        )
        log.info("lakesink: creating branch %s of %s at snapshot %s", self.branch, self.name, head.snapshot_id)
        return prepared


class OptionalColumn(CommitAction):
    """A required top-level column made optional (a compatible schema change), as a commit action: every attempt
    stages it on the table as read (the swap asserts the schema it read), landed once the column is optional."""

    turn = Turn.BATCH  # part of a sink's set-up: it never waits for this process's maintenance

    def __init__(self, table: Table, column: str):
        super().__init__(table, f"making column {column!r} of {'.'.join(table.name())} optional")
        self.column = column

    def landed(self, table: Table) -> Landing | None:
        return None if table.schema().find_field(self.column).required else Landing(mine=True)

    def prepare(self, table: Table, attempt: int) -> seam_commit.PreparedCommit:
        def stage(tx: Transaction) -> None:
            with tx.update_schema() as update:
                update.update_column(self.column, required=False)

        return seam_producers.prepare_staged(table, stage)
