"""Where a table's files may be written: checked on the driver before any write.

Rejected, with a message naming the table and the location:

- a table location that is not an absolute URL or path, that has ``.``/``..``/empty path segments, or
  that is the root of a filesystem or bucket;
- a data path (``write.data.path``, or the legacy ``write.object-storage.path`` and
  ``write.folder-storage.path``) or a metadata path (``write.metadata.path``) outside the table
  location, or on another store or bucket (``s3``/``s3a``/``s3n`` are one store, and so are
  ``abfs``/``abfss``/``wasb``/``wasbs`` with the same account: :mod:`lakesink.table.storage`);
- a table location equal to, inside, or around another table's location in the same namespace (its
  files would mix with that table's: an orphan-file clean-up of one would delete the other's data).

The executors then refuse to create a data file outside the checked data prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lakesink.errors import TableLocationError
from lakesink.table import storage
from lakesink.table.keys import DATA_PATH_PROPERTIES, METADATA_PATH_PROPERTIES


def _segments(location: str) -> list[str]:
    """The path segments of a location, refusing ``.``, ``..`` and empty ones (ValueError)."""
    segments = storage.parse(location).segments
    bad = [s for s in segments if s in ("", ".", "..")]
    if bad:
        raise ValueError(f"path segment {bad[0]!r} is not allowed")
    return segments


def is_under(child: str, parent: str) -> bool:
    """True when ``child`` is ``parent`` or a location inside it (segment-wise, same store and authority,
    scheme aliases folded as :mod:`lakesink.table.storage` folds them)."""
    return storage.is_under(child, parent)


def check_table_location(table_name: str, location: str, properties: Mapping[str, str]) -> None:
    """Refuse an unsafe table location, or data and metadata paths outside it (lakesink writes and
    cleans only under the table's own location)."""
    try:
        if not _segments(location):
            raise ValueError("it is the root of a filesystem or bucket")
    except ValueError as e:
        raise TableLocationError(f"table {table_name} has location {location!r}, which lakesink refuses: {e}") from None
    for key in (*DATA_PATH_PROPERTIES, *METADATA_PATH_PROPERTIES):
        value = properties.get(key)
        if not value:
            continue
        try:
            _segments(value)
            inside = is_under(value, location)
        except ValueError as e:
            raise TableLocationError(f"table {table_name} has {key}={value!r}, which lakesink refuses: {e}") from None
        if not inside:
            raise TableLocationError(
                f"table {table_name} has {key}={value!r}, outside its location {location!r}: lakesink writes and "
                "cleans only under the table's own location (same store, same bucket or host)"
            )


def data_prefix(table_name: str, location: str, properties: Mapping[str, str]) -> str:
    """Check the table's locations; return the prefix every new data file must start with."""
    check_table_location(table_name, location, properties)
    for key in DATA_PATH_PROPERTIES:
        if properties.get(key):
            return properties[key].rstrip("/")
    return f"{location.rstrip('/')}/data"


def check_no_overlap(table_name: str, location: str, others: Iterable[tuple[str, str]]) -> None:
    """Refuse a table location equal to, inside or around another table's location."""
    for other_name, other_location in others:
        try:
            overlap = is_under(location, other_location) or is_under(other_location, location)
        except ValueError:
            continue  # the other table's own location is not ours to judge
        if overlap:
            raise TableLocationError(
                f"table {table_name} at {location!r} overlaps table {other_name} at {other_location!r}: "
                "lakesink refuses to write where another table's files are"
            )
