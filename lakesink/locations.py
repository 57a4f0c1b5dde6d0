"""Where a table's files may be written: checked on the driver before any write.

Rejected, with a message naming the table and the location:

- a table location that is not an absolute URL or path, that has ``.``/``..``/empty path segments, or
  that is the root of a filesystem or bucket;
- a data path (``write.data.path``, or the legacy ``write.object-storage.path`` and
  ``write.folder-storage.path``) or a metadata path (``write.metadata.path``) outside the table
  location, or on another scheme or bucket;
- a table location equal to, inside, or around another table's location in the same namespace (its
  files would mix with that table's: an orphan-file clean-up of one would delete the other's data).

The executors then refuse to create a data file outside the checked data prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from lakesink.errors import TableLocationError

DATA_PATH_PROPERTIES = ("write.data.path", "write.object-storage.path", "write.folder-storage.path")
METADATA_PATH_PROPERTIES = ("write.metadata.path",)


def _parts(url: str) -> tuple[str, str, list[str]]:
    """(scheme, authority, path segments) of a location; a bare absolute path is a ``file`` URL."""
    if "://" not in url:
        if not url.startswith("/"):
            raise ValueError("not an absolute URL or path")
        return "file", "", url.rstrip("/").split("/")[1:]
    split = urlsplit(url)
    if not split.scheme:
        raise ValueError("no scheme")
    path = split.path.rstrip("/")
    segments = path.split("/")[1:] if path else []
    return split.scheme.lower(), split.netloc, segments


def _check_segments(segments: list[str]) -> None:
    bad = [s for s in segments if s in ("", ".", "..")]
    if bad:
        raise ValueError(f"path segment {bad[0]!r} is not allowed")


def is_under(child: str, parent: str) -> bool:
    """True when ``child`` is ``parent`` or a location inside it (segment-wise, same scheme and authority)."""
    cs, ca, cp = _parts(child)
    ps, pa, pp = _parts(parent)
    return (cs, ca) == (ps, pa) and cp[: len(pp)] == pp


def check_table_location(table_name: str, location: str, properties: Mapping[str, str]) -> None:
    """Refuse an unsafe table location, or data and metadata paths outside it (lakesink writes and
    cleans only under the table's own location)."""
    try:
        _, _, segments = _parts(location)
        _check_segments(segments)
        if not segments:
            raise ValueError("it is the root of a filesystem or bucket")
    except ValueError as e:
        raise TableLocationError(f"table {table_name} has location {location!r}, which lakesink refuses: {e}") from None
    for key in (*DATA_PATH_PROPERTIES, *METADATA_PATH_PROPERTIES):
        value = properties.get(key)
        if not value:
            continue
        try:
            _, _, segments = _parts(value)
            _check_segments(segments)
            inside = is_under(value, location)
        except ValueError as e:
            raise TableLocationError(f"table {table_name} has {key}={value!r}, which lakesink refuses: {e}") from None
        if not inside:
            raise TableLocationError(
                f"table {table_name} has {key}={value!r}, outside its location {location!r}: lakesink writes and "
                "cleans only under the table's own location (same scheme, same bucket or host)"
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
