"""Catalog-wide scans: which other live tables of a catalog share a table's folders.

Maintenance asks before it deletes a file it found unreferenced in a table's folders: a file another live table of the
catalog references (a table renamed into another's location, a ``write.data.path`` inside another table's location) is
that table's, not an orphan (lakesink.maintenance.orphans, lakesink.driver.tables.sink_table's cleanup of a failed
create). On a SQL catalog one query says where every table's current metadata is
(:func:`lakesink.driver.catalogs.all_pointers_on_sql_catalog`); elsewhere the catalog's tables are read.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from lakesink._pyiceberg import commit as seam_commit
from lakesink._pyiceberg import io as seam_io
from lakesink.driver import catalogs
from lakesink.table import storage
from lakesink.table.keys import DATA_PATH_PROPERTIES, METADATA_PATH_PROPERTIES

#: At most this many of a folder's unreferenced metadata files are read to find another table's (one read each);
#: beyond, the catalog's tables are read instead (one load each), whichever is bounded by the catalog's size, not
#: the folder's: a streaming table without ``write.metadata.delete-after-commit.enabled`` keeps a metadata file per
#: commit for days.
READ_METADATA_FILES_AT_MOST = 1000


def live_table_sharing_folder(table: Table, unreferenced: Sequence[str]) -> tuple[str, str, str] | None:
    """Another table of ``table``'s catalog that keeps its metadata in ``table``'s metadata folder: (its name, its
    UUID, one of its metadata files), or None. ``unreferenced``: the metadata files (``*.metadata.json``) of that
    folder that ``table`` does not reference. On a SQL catalog its rows say where every table's current
    metadata file is (one query). Elsewhere, up to :data:`READ_METADATA_FILES_AT_MOST` of them, each is
    read for its table UUID and the catalog searched for the UUIDs that are not ``table``'s (a table dropped without
    its files has none: its files are nobody's); beyond, every table of the catalog is read and its current metadata
    file's folder compared. Errors of the catalog are raised (live cannot be told from dropped then)."""
    if not unreferenced:  # another live table's current metadata file would be one of them
        return None
    catalog = table.catalog
    own_uuid = str(table.metadata.table_uuid)
    folder = storage.key(posixpath.dirname(table.metadata_location))
    own = tuple(table.name())
    rows = catalogs.all_pointers_on_sql_catalog(catalog)
    if rows is not None:  # a SQL catalog: its rows say where every table's current metadata is, in one query
        for ident, location in rows:
            if ident != own and storage.key(posixpath.dirname(location)) == folder:
                other = catalog.load_table(ident)
                if str(other.metadata.table_uuid) != own_uuid:
                    return ".".join(ident), str(other.metadata.table_uuid), location
        return None
    if len(unreferenced) <= READ_METADATA_FILES_AT_MOST:
        foreign = seam_io.other_tables_metadata(table.io, unreferenced, own_uuid)
        if not foreign:
            return None
        for ident, other in _every_table(catalog):
            uuid = str(other.metadata.table_uuid)
            if uuid in foreign:
                return ".".join(ident), uuid, foreign[uuid]
        return None
    for ident, other in _every_table(catalog):
        if ident != own and other.metadata_location and storage.key(posixpath.dirname(other.metadata_location)) == folder:
            return ".".join(ident), str(other.metadata.table_uuid), other.metadata_location
    return None


def live_tables_writing_under(table: Table, root: str) -> Iterator[tuple[str, str, str, str]]:
    """Every other table of ``table``'s catalog that writes files at or inside ``root``, once for each of its folders
    there: (its name, its UUID, what puts its files there -- its location, a data or metadata path property, its
    current metadata file's folder -- and that folder). Its metadata need not be in ``root`` (``write.metadata.path``
    elsewhere) and its location need not be near ``root`` (``write.data.path`` inside ``root``): every table of the
    catalog is read (one load each; on a SQL catalog the tables whose pointer has not moved since this process read
    them are not parsed again). Errors of the catalog are raised (live cannot be told from dropped then)."""
    catalog = table.catalog
    own = tuple(table.name())
    rows = catalogs.all_pointers_on_sql_catalog(catalog)
    others: Iterator[tuple[tuple[str, ...], Table]] = (
        iter(seam_commit.load_tables(catalog, [ident for ident, _ in rows if ident != own]).items())
        if rows is not None
        else _every_table(catalog)
    )
    for ident, other in others:
        if ident == own:
            continue
        props = other.properties
        folders = [("location", other.location())]
        folders += [(key, props[key]) for key in (*DATA_PATH_PROPERTIES, *METADATA_PATH_PROPERTIES) if props.get(key)]
        if other.metadata_location:
            folders.append(("current metadata file's folder", posixpath.dirname(other.metadata_location)))
        for what, folder in folders:
            try:
                inside = storage.is_under(folder, root)
            except ValueError:
                continue  # not a location lakesink can compare: the other table's own to judge
            if inside:
                yield ".".join(ident), str(other.metadata.table_uuid), what, folder


def _every_table(catalog: Catalog) -> Iterator[tuple[tuple[str, ...], Table]]:
    """Every table of ``catalog``, loaded: every namespace listed, nested ones too (a table dropped meanwhile is
    passed over)."""
    seen: set[tuple[str, ...]] = set()
    todo: list[tuple[str, ...]] = [tuple(ns) for ns in catalog.list_namespaces()]
    while todo:
        ns = todo.pop()
        if ns in seen:
            continue
        seen.add(ns)
        todo.extend(tuple(child) for child in catalog.list_namespaces(ns) if len(child) > len(ns))
        for ident in catalog.list_tables(ns):
            try:
                yield tuple(ident), catalog.load_table(ident)
            except NoSuchTableError:
                continue
