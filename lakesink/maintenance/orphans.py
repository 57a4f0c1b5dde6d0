"""Orphan-file clean-up: remove the files under a table's location that no snapshot references.

Files become unreferenced when a task attempt is killed, a speculative task loses, a driver dies
between pre-commit and swap, a commit fails after writing its manifests, or a replay is written and
then skipped. :func:`remove_orphan_files` lists the table location, subtracts every file the table's
metadata can reach, and removes what is left, under two safety rules (see its docstring and
``docs/maintenance.md``):

- the **age rule** (Iceberg's ``deleteOrphanFiles``): only files modified before ``older_than`` ago, and, for a file
  that lakesink did not name (another writer's), before ``other_writers_older_than`` ago (default a day);
- the **in-flight guard**: whatever ``older_than`` says, a file that a lakesink commit in flight may still
  reference is kept for at least :data:`IN_FLIGHT_WINDOW`. Every file lakesink writes is named by
  :mod:`lakesink.table.names`, and the guard decides from the name (:func:`lakesink.table.names.classify`): a batch's data
  files and its commit's manifests while the batch is not committed (its replay marker), any other lakesink
  commit's files (a compaction, a manifest rewrite) for the whole window counted from the start its name carries;
  other writers' manifests by what they list, and a possible next metadata version of the table. The commit
  side keeps the window: no lakesink commit swaps files older than :data:`lakesink.table.names.COMMIT_DEADLINE_MS`.

Only pyiceberg's public API is used: the table metadata, ``Snapshot.manifests``,
``ManifestFile.from_args`` / ``fetch_manifest_entry``, ``read_manifest_list``,
``FromInputFile.table_metadata`` and the table's ``FileIO``. Listing, deleting and comparing
locations go through :mod:`lakesink.table.storage`; lakesink's file and directory names are recognised by
:mod:`lakesink.table.names`, which also makes them.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from pyiceberg.io import FileIO
from pyiceberg.table import Table

from lakesink.driver import catalog_scans
from lakesink.errors import CatalogError, InvalidOptionError, LakesinkError, TableLocationError
from lakesink.maintenance.orphan_guard import InFlightGuard, ago, referenced_keys, safe_error
from lakesink.table import locations, names, storage
from lakesink.table.keys import ORPHAN_OLDER_THAN_DEFAULT

log = logging.getLogger("lakesink")

OTHER_WRITERS_OLDER_THAN = timedelta(days=1)
"""Files lakesink did not name (other writers': pyiceberg, Spark, Trino, another engine's delete files) younger than
this are kept whatever ``older_than`` says: nothing but their age can tell that their commit is not still to come.
Iceberg's ``remove_orphan_files`` procedure refuses an interval shorter than a day for the same reason."""

IN_FLIGHT_WINDOW = timedelta(milliseconds=names.IN_FLIGHT_WINDOW_MS)
"""How long a file that a commit in flight may still reference is kept, even when ``older_than`` is shorter.

A lakesink batch that has not committed after this long is taken to be abandoned (its query was
killed and never restarted), and its files are removed like any other orphan. The commit side keeps the
contract: no lakesink commit swaps once the oldest file it wrote for it is older than
:data:`lakesink.table.names.COMMIT_DEADLINE_MS` (a day less)."""

# --- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrphanFile(storage.ListedFileRecord):
    """One file under the table location that no snapshot of the table references."""

    path: str
    size_in_bytes: int
    modified: datetime | None
    """Last modification time (UTC) as the storage reports it; None when it reports none."""
    kind: str
    """``data``, ``manifest``, ``manifest-list``, ``metadata``, ``statistics`` or ``other`` (from the name)."""
    reason: str = ""
    """Why the file was kept, skipped, or could not be removed (empty for removed files)."""


@dataclass(frozen=True)
class OrphanReport:
    """What :func:`remove_orphan_files` found, removed (or, with ``dry_run``, would remove) and kept."""

    table: str
    location: str
    dry_run: bool
    older_than: timedelta
    started: datetime
    """When the run started (UTC); files modified at or after ``started - older_than`` are too young."""
    listed: int
    """Files listed under the table location (hidden files excluded)."""
    referenced: int
    """Of them, files the table's metadata references."""
    removed: tuple[OrphanFile, ...] = ()
    """Unreferenced files removed (with ``dry_run``: that would be removed)."""
    kept_too_young: tuple[OrphanFile, ...] = ()
    """Unreferenced files modified less than ``older_than`` ago (or with no modification time)."""
    kept_in_flight: tuple[OrphanFile, ...] = ()
    """Unreferenced files old enough for ``older_than`` that a commit in flight may still reference."""
    failed: tuple[OrphanFile, ...] = ()
    """Unreferenced files whose removal failed (``reason`` holds the error)."""
    skipped: tuple[OrphanFile, ...] = ()
    """Listed files never considered: inside another table's location, or resolving outside this one."""
    skipped_hidden: int = 0
    """Listed files under a name starting with ``.`` or ``_`` (never considered, as in Iceberg)."""
    other_writers_older_than: timedelta = OTHER_WRITERS_OLDER_THAN
    """Files lakesink did not name modified less than this long ago are too young (never less than ``older_than``)."""

    @property
    def cutoff(self) -> datetime:
        """Files modified at or after this time are too young to be removed."""
        return self.started - self.older_than

    @property
    def removed_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.removed)

    @property
    def kept_too_young_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.kept_too_young)

    @property
    def kept_in_flight_bytes(self) -> int:
        return sum(f.size_in_bytes for f in self.kept_in_flight)

    @property
    def ok(self) -> bool:
        """True when every file selected for removal was removed."""
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (times in ISO 8601, ``older_than`` in seconds)."""
        return {
            "table": self.table,
            "location": self.location,
            "dry_run": self.dry_run,
            "older_than_seconds": self.older_than.total_seconds(),
            "other_writers_older_than_seconds": self.other_writers_older_than.total_seconds(),
            "started": self.started.isoformat(),
            "cutoff": self.cutoff.isoformat(),
            "listed": self.listed,
            "referenced": self.referenced,
            "removed_count": len(self.removed),
            "removed_bytes": self.removed_bytes,
            "kept_too_young_count": len(self.kept_too_young),
            "kept_too_young_bytes": self.kept_too_young_bytes,
            "kept_in_flight_count": len(self.kept_in_flight),
            "kept_in_flight_bytes": self.kept_in_flight_bytes,
            "failed_count": len(self.failed),
            "skipped_hidden": self.skipped_hidden,
            "removed": [f.to_dict() for f in self.removed],
            "kept_too_young": [f.to_dict() for f in self.kept_too_young],
            "kept_in_flight": [f.to_dict() for f in self.kept_in_flight],
            "failed": [f.to_dict() for f in self.failed],
            "skipped": [f.to_dict() for f in self.skipped],
        }


# --- the clean-up -------------------------------------------------------------------------------


def remove_orphan_files(
    table: Table,
    *,
    older_than: timedelta = ORPHAN_OLDER_THAN_DEFAULT,
    other_writers_older_than: timedelta = OTHER_WRITERS_OLDER_THAN,
    dry_run: bool = False,
) -> OrphanReport:
    """Remove the files under ``table``'s location that no snapshot of the table references.

    Referenced files are those of every snapshot still in the table metadata (of every branch and
    tag): data and delete files of all manifests, the manifests, the manifest lists, the current
    metadata file and the previous ones in its metadata log, statistics and partition statistics
    files, and ``metadata/version-hint.text``. Everything else under the table location is an
    orphan, except hidden names (``.``/``_``) and the subtree of another table nested in this one.

    An orphan is removed only when **both** rules allow it:

    1. *Age*: it was last modified before ``older_than`` ago (default 3 days, as Iceberg's
       ``deleteOrphanFiles``), and a file whose name lakesink did not make (another writer's) before
       ``max(older_than, other_writers_older_than)`` ago (default a day). This is what protects the files of
       other writers whose commit is still to come: nothing else can tell them apart from leftovers. Give
       ``other_writers_older_than`` below their longest write plus commit only when no other writer writes
       the table while the clean-up runs.
    2. *In-flight guard*: it is not a file that a commit in flight may still reference, as far as
       the table's metadata can tell, unless it is older than :data:`IN_FLIGHT_WINDOW`. Kept are
       a lakesink data file whose batch is not known to be committed (its query-id prefix matches
       no replay marker, or several queries, or a marker with an earlier batch), an unreferenced
       manifest or manifest list that lists such a file or cannot be read, and a metadata file
       that may be the table's next version (its metadata log ends with the current one). This
       makes an ``older_than`` shorter than a lakesink batch safe for lakesink's own commits, with
       one exception: a new query whose id starts with the same 8 characters as a query that has
       a marker, while its first batch is in flight (about one chance in 2**32 per pair of
       queries of the table). Other writers' commits in flight are protected by the age rule only
       (``other_writers_older_than``).

    Files of a lakesink batch that its query has already committed (batch id at or below the
    query's ``lakesink.last-batch.<query id>`` marker) are **not** removed while they are young
    (there is no rule "removable at any age"): the marker proves that no commit of *that query's*
    batch can land any more (every commit attempt re-checks the marker, and swaps only if ``main``
    has not moved since its read, while the marker only moves together with ``main``), but a file
    name carries only the first 8 characters of the query id, so a file cannot be proven to belong
    to that query rather than to a new query sharing the prefix whose first batch is in flight;
    and a rollback of ``main`` to an older snapshot while a zombie driver holds a prepared commit
    would let that commit land. The marker is used only to decide what the in-flight guard keeps.

    The table location must be the table's own: a location with ``.``/``..`` segments or at the
    root of a filesystem or bucket, a data or metadata path (``write.data.path``,
    ``write.metadata.path``, the legacy ``write.object-storage.path`` and
    ``write.folder-storage.path``) outside the table location, or a table whose location or UUID
    changes while the clean-up runs is refused
    with :class:`~lakesink.errors.LakesinkError` before anything is removed; so is a location another live table of
    the catalog writes files into (its metadata in this table's metadata folder; or, when some file would be
    removed, its location, data path or metadata path at or inside this location, every table of the catalog read
    once), except a table nested in this one with its own ``metadata/`` folder, whose subtree is skipped. Nothing outside the
    table location is ever listed or removed.

    The files are listed first and the table is re-read from its catalog afterwards, so a commit
    that lands during the listing is seen. If any manifest list or manifest of the table cannot be
    read, the run fails before removing anything.

    Args:
        table: a table loaded from a catalog (it is re-loaded from the same catalog).
        older_than: only files last modified before ``now - older_than`` may be removed; >= 0.
        other_writers_older_than: files whose name lakesink did not make only when last modified before
            ``now - max(older_than, other_writers_older_than)``; >= 0.
        dry_run: remove nothing; the report lists what would be removed.

    Returns:
        An :class:`OrphanReport`. Removals that fail are listed in ``failed`` (the run goes on).
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise InvalidOptionError(f"older_than must be a timedelta >= 0 (for example timedelta(days=3)), got {older_than!r}")
    if not isinstance(other_writers_older_than, timedelta) or other_writers_older_than < timedelta(0):
        raise InvalidOptionError(
            f"other_writers_older_than must be a timedelta >= 0 (for example timedelta(days=1)), got {other_writers_older_than!r}"
        )
    others_age = max(older_than, other_writers_older_than)
    started = datetime.now(timezone.utc)
    name = ".".join(table.name())
    root = _table_root(table, name)

    listed = list(_list_files(table.io, root))  # first list, then read the table (a commit landing meanwhile is seen)
    fresh = _reload(table, name, root)
    referenced = referenced_keys(fresh, name)

    candidates: list[_Listed] = []
    skipped: list[OrphanFile] = []
    hidden = 0
    n_referenced = 0
    for f in listed:
        if f.hidden:
            hidden += 1
        elif storage.key(f.uri) in referenced:
            n_referenced += 1
        elif f.skip_reason:
            skipped.append(f.orphan(f.skip_reason))
        else:
            candidates.append(f)
    _refuse_a_shared_location(fresh, name, root, candidates)
    nested = _nested_table_roots(candidates, fresh)
    if nested:
        inside = [(f, _nested_root(f, nested)) for f in candidates]
        skipped.extend(f.orphan(f"inside another table nested in this one, at {root}/{r}") for f, r in inside if r)
        candidates = [f for f, r in inside if not r]

    cutoff = started - older_than
    others_cutoff = started - others_age
    window_cutoff = started - IN_FLIGHT_WINDOW
    guard = InFlightGuard(fresh, referenced, started)
    to_remove: list[OrphanFile] = []
    too_young: list[OrphanFile] = []
    in_flight: list[OrphanFile] = []
    for f in candidates:
        if f.modified is None:
            too_young.append(f.orphan("the storage reports no modification time"))
        elif f.modified >= cutoff:
            too_young.append(f.orphan(f"modified {ago(started - f.modified)} ago, less than {ago(older_than)}"))
        elif f.modified >= others_cutoff and not names.classify(f.relative).lakesinks:
            too_young.append(
                f.orphan(
                    f"not named by lakesink (another writer's commit may still reference it): modified "
                    f"{ago(started - f.modified)} ago, less than {ago(others_age)} (other_writers_older_than)"
                )
            )
        elif (why := guard.reason(f, window_cutoff)) is not None:
            in_flight.append(f.orphan(why))
        else:
            to_remove.append(f.orphan(""))

    if to_remove:  # (reading the catalog's tables only when something would be removed)
        _refuse_another_tables_files(fresh, name, root, nested)
    removed, failed = (to_remove, []) if dry_run else _remove(fresh, to_remove)
    report = OrphanReport(
        table=name,
        location=root,
        dry_run=dry_run,
        older_than=older_than,
        started=started,
        listed=len(listed) - hidden,
        referenced=n_referenced,
        removed=tuple(removed),
        kept_too_young=tuple(too_young),
        kept_in_flight=tuple(in_flight),
        failed=tuple(failed),
        skipped=tuple(skipped),
        skipped_hidden=hidden,
        other_writers_older_than=others_age,
    )
    log.info(
        "lakesink: table=%s orphan files %s=%s (%s bytes) kept_too_young=%s kept_in_flight=%s failed=%s",
        name,
        "would_remove" if dry_run else "removed",
        len(report.removed),
        report.removed_bytes,
        len(report.kept_too_young),
        len(report.kept_in_flight),
        len(report.failed),
    )
    return report


def _remove(table: Table, files: list[OrphanFile]) -> tuple[list[OrphanFile], list[OrphanFile]]:
    """Remove ``files`` through the table's FileIO: (removed, failed)."""
    removed: list[OrphanFile] = []
    failed: list[OrphanFile] = []
    for o in files:
        try:
            storage.delete_file(table.io, o.path)  # a file already gone (another clean-up, an abort) is no error
        except Exception as e:
            error = safe_error(table, e)
            log.warning("lakesink: could not remove orphan file %s: %s", o.path, error)
            failed.append(OrphanFile(o.path, o.size_in_bytes, o.modified, o.kind, error))
            continue
        log.debug("lakesink: removed orphan file %s", o.path)
        removed.append(o)
    return removed, failed


# --- locations ----------------------------------------------------------------------------------


def _table_root(table: Table, name: str) -> str:
    locations.check_table_location(name, table.location(), table.properties)
    return table.location().rstrip("/")


def _reload(table: Table, name: str, root: str) -> Table:
    try:
        fresh = table.catalog.load_table(table.name())
    except NotImplementedError:
        raise LakesinkError(
            f"table {name}: orphan files can only be removed from a table loaded from a catalog (it is re-read "
            "after listing, so that commits landing meanwhile are seen)"
        ) from None
    except Exception as e:
        raise CatalogError(f"cannot re-load table {name} after listing its files: {safe_error(table, e)}") from None
    if fresh.metadata.table_uuid != table.metadata.table_uuid or storage.key(fresh.location()) != storage.key(root):
        raise LakesinkError(
            f"table {name} changed while its files were listed (now UUID {fresh.metadata.table_uuid} at "
            f"{fresh.location()!r}); nothing was removed"
        )
    locations.check_table_location(name, root, fresh.properties)
    return fresh


# --- listing ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Listed:
    uri: str
    relative: str
    size: int
    modified: datetime | None
    hidden: bool
    skip_reason: str

    @property
    def name(self) -> str:
        return self.relative.rsplit("/", 1)[-1]

    def orphan(self, reason: str) -> OrphanFile:
        return OrphanFile(self.uri, self.size, self.modified, names.file_kind(self.name), reason)


def _list_files(io: FileIO, root: str) -> Iterator[_Listed]:
    """Every file under ``root``, through the filesystem behind the table's FileIO."""
    root_path = storage.local_path(root)
    real_root = os.path.realpath(root_path) if root_path is not None else ""
    for f in storage.list_files(io, root):
        segments = f.relative.split("/")
        reason = ""
        if any(s in ("", ".", "..") for s in segments):
            reason = "its path has empty, '.' or '..' segments"
        elif root_path is not None and not os.path.realpath(f"{root_path}/{f.relative}").startswith(real_root + os.sep):
            reason = "it resolves outside the table location (a symbolic link)"
        yield _Listed(
            uri=f"{root}/{f.relative}",
            relative=f.relative,
            size=f.size,
            modified=f.modified,
            hidden=names.is_hidden(f.relative),
            skip_reason=reason,
        )


def _refuse_a_shared_location(table: Table, name: str, root: str, candidates: list[_Listed]) -> None:
    """TableLocationError, before anything is removed, when another live table of the catalog keeps its metadata in
    this table's metadata folder (:func:`lakesink.driver.catalog_scans.live_table_sharing_folder`): the two share a location
    (a table renamed, then a new one created under its old name at the same default location; or two tables given
    one location), and every file of the other would look like an orphan of this one. The files of a table that no
    longer exists (dropped without its files, then created again) are this location's orphans, collected by the
    other rules."""
    own = posixpath.dirname(storage.key(table.metadata_location))
    unreferenced = [
        f.uri for f in candidates if f.relative.endswith(".metadata.json") and posixpath.dirname(storage.key(f.uri)) == own
    ]
    try:
        found = catalog_scans.live_table_sharing_folder(table, unreferenced)
    except Exception as e:
        raise TableLocationError(
            f"table {name}: its metadata folder holds metadata files it does not reference, and the catalog could not "
            f"be searched for another table keeping them there ({safe_error(table, e)}); nothing was removed"
        ) from None
    if found is not None:
        other, uuid, path = found
        raise TableLocationError(
            f"table {name} shares its location {root!r} with table {other}: metadata file {path} belongs to "
            f"{other} (UUID {uuid}; this table's is {table.metadata.table_uuid}), so that table's files would look "
            "like orphans of this one; nothing was removed. This happens when a table is renamed and a new one is "
            "created under its old name at the same default location. Give one of them a location of its own "
            "(create the new table with an explicit location) before removing orphan files"
        )


def _refuse_another_tables_files(table: Table, name: str, root: str, nested: set[str]) -> None:
    """TableLocationError, before anything is removed, when another live table of the catalog writes files inside this
    table's location (:func:`lakesink.driver.catalog_scans.live_tables_writing_under`) outside the nested tables whose
    subtrees are skipped: its files would look like orphans of this one, and its metadata need not be in this
    table's metadata folder for that (``write.metadata.path`` elsewhere, or its ``write.data.path`` inside this
    location), which :func:`_refuse_a_shared_location` looks at."""
    skipped = [f"{root}/{r}" for r in nested]
    try:
        found = next(
            (
                (other, uuid, what, folder)
                for other, uuid, what, folder in catalog_scans.live_tables_writing_under(table, root)
                if not any(storage.is_under(folder, s) for s in skipped)
            ),
            None,
        )
    except Exception as e:
        raise TableLocationError(
            f"table {name}: the catalog could not be searched for another table writing files inside its location "
            f"{root!r} ({safe_error(table, e)}); nothing was removed"
        ) from None
    if found is not None:
        other, uuid, what, folder = found
        raise TableLocationError(
            f"table {name}: table {other} (UUID {uuid}) writes files inside its location {root!r}: {other}'s {what} is "
            f"{folder!r}, so that table's files would look like orphans of {name}; nothing was removed. Give {other} "
            f"a location, write.data.path and write.metadata.path outside {root!r} (or drop it) before removing "
            f"orphan files of {name}"
        )


def _nested_table_roots(candidates: list[_Listed], table: Table) -> set[str]:
    """Relative folders under this location that hold another table (a ``metadata/*.metadata.json`` of their own)."""
    own = posixpath.dirname(storage.key(table.metadata_location))
    roots = set()
    for f in candidates:
        nested = names.nested_table_root(f.relative)
        if nested and posixpath.dirname(storage.key(f.uri)) != own:
            roots.add(nested)
    return roots


def _nested_root(f: _Listed, roots: set[str]) -> str:
    """The outermost nested table folder holding ``f``, or ""."""
    return min((r for r in roots if f.relative.startswith(f"{r}/")), key=len, default="")
