"""Option ``route-by`` with format("lakesink") on a catalog that places its tables itself (a REST server): the query's
staging area, where the executors write the rows of a table the run has not opened yet (lakesink.driver.tables.
routed_tables.places_tables_itself says which catalogs).

A staged file is never committed: the driver rewrites its rows into the table, created where the catalog places it
(lakesink.driver.committers.routed), then deletes it. :class:`StagingArea` is the area's life: checked writable when a
run starts, a batch's files deleted once rewritten, every file of a settled batch (and of earlier ones) swept. Where the
executors write is the template's (lakesink.driver.tables.routed_tables.RoutedTables.template).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO, load_file_io

from lakesink.errors import InvalidOptionError
from lakesink.executor.messages import TaskResult
from lakesink.table import names as file_names
from lakesink.table import storage

log = logging.getLogger("lakesink")

STAGING_FOLDER = "lakesink/staging"
"""Where format("lakesink") stages the files of tables a run had not opened, under the query's checkpoint, on a
catalog that places its tables itself."""


def staging_root(checkpoint_location: str) -> str:
    """The query's staging area: ``<checkpoint>/lakesink/staging`` (a relative checkpoint path made absolute, as
    Spark resolves it against the driver's working folder)."""
    root = checkpoint_location
    if "://" not in root and not root.startswith(("/", "file:")):
        root = os.path.abspath(root)
    return f"{root.rstrip('/')}/{STAGING_FOLDER}"


@dataclass(frozen=True)
class StagingArea:
    """The query's staging area (``<checkpoint>/lakesink/staging``, :func:`staging_root`) and its storage."""

    root: str
    io: FileIO = field(repr=False)
    catalog: str
    """The catalog's name (for the error that refuses an area it cannot write)."""
    describe: Callable[[BaseException], str] = field(repr=False)
    """An error as it may be shown (the catalog's secrets redacted: lakesink.driver.catalogs.redacted)."""

    @classmethod
    def of(cls, catalog: Catalog, checkpoint_location: str, describe: Callable[[BaseException], str]) -> StagingArea:
        """The staging area of the query checkpointed at ``checkpoint_location``, written with ``catalog``'s storage
        properties."""
        root = staging_root(checkpoint_location)
        return cls(root, load_file_io(dict(catalog.properties), root), catalog.name, describe)

    def check(self) -> None:
        """format("lakesink") at the start of a run: the area must be writable with the catalog's storage properties
        (a probe file written and deleted), else InvalidOptionError naming the catalog and the folder, before any
        batch runs."""
        probe = f"{self.root}/.probe-{file_names.new_token()}"
        try:
            with self.io.new_output(probe).create(overwrite=True) as f:
                f.write(b"lakesink")
            storage.delete_file(self.io, probe)
        except Exception as e:
            raise InvalidOptionError(
                f"format('lakesink') with option 'route-by' writes the rows of a table it has not opened into the "
                f"query's staging area {self.root} (catalog {self.catalog!r} places its tables itself), and "
                f"cannot write there: {self.describe(e)}. Give a checkpoint location that the catalog's storage "
                "properties can write, or use lakesink.foreach_batch(route_by=...)"
            ) from None

    def delete(self, results: Sequence[TaskResult]) -> None:
        """The staged files of ``results`` deleted (rewritten into their table, or the table holds the batch)."""
        for r in results:
            for f in r.files:
                try:
                    storage.delete_file(self.io, f.path)
                except Exception:
                    log.warning("lakesink: could not delete staged file %s; the next batch's commit collects it", f.path)

    def sweep(self, batch_id: int) -> None:
        """Batch ``batch_id`` is settled in every table (committed, or found committed): every staged file of it and
        of earlier batches is dead (a staged file is never committed; Spark runs a query's batches in order, and a
        crashed batch is replayed with its own id before the next), so they are deleted, leftovers of killed runs
        included. Files of later batches (a zombie run ahead of this one) are kept."""
        storage.delete_settled_staging(self.io, self.root, batch_id, self.describe)
