"""Option route-by with upserts: the key of each routed table (docs/routing.md, "keys per table").

A change stream of a whole database carries tables with different primary keys, so a routed upsert takes its key
per table, when the table is first opened in a run:

- **a table that exists**: its Iceberg identifier fields, whatever option ``upsert-key`` says (a table without
  identifier fields is a loud error: lakesink never guesses which columns make a row's identity);
- **a table lakesink creates**: the key the batch's changes carry for it -- with ``cdc-format=debezium`` the fields
  of the Debezium record's Kafka key (the source table's primary key) -- else option ``upsert-key``; the key becomes
  the new table's identifier fields (NOT NULL). Without either: a loud error naming the table.

Every batch, whichever way the key was decided: the keys the batch's changes carry must be the table's key
(:func:`check_carried`). A source whose primary key changed (``ALTER TABLE ... ADD PRIMARY KEY``, Debezium's Kafka
key then names other columns) is a loud error naming both keys: upserting by the table's key would merge rows the
source keeps apart, or split one the source keeps whole (docs/cdc.md, "a source's primary key changes"). A batch whose
records switch from the old key to the new one is decided before, by lakesink.sink.cdc.key_change (refused and recorded;
once the table is dropped, its changes from the switch on make the table under the new key).

Plain data, no Spark: the driver's routed committer (lakesink.driver.committers.routed) calls :func:`table_key` and
:func:`check_carried`.
"""

from __future__ import annotations

from collections.abc import Collection

from pyiceberg.schema import Schema

from lakesink.errors import InvalidOptionError, SchemaMismatchError
from lakesink.options import UPSERT_KEY

Key = tuple[str, ...]


def identifier_fields(schema: Schema) -> Key:
    """The schema's identifier fields, in the order the schema lists them."""
    return tuple(schema.find_column_name(i) or str(i) for i in schema.identifier_field_ids)


def table_key(name: str, schema: Schema | None, carried: Collection[Key], stream_key: Key) -> Key:
    """The upsert key of routed table ``name``: ``schema`` is the existing table's (None: lakesink creates it),
    ``carried`` the distinct keys the batch's changes of the table carry (the Debezium record keys' fields),
    ``stream_key`` option upsert-key (empty: not given)."""
    if schema is not None:
        own = identifier_fields(schema)
        if own:
            return own
        hint = next(iter(carried), None) or stream_key or ("<key columns>",)
        raise InvalidOptionError(
            f"table {name} exists and has no identifier fields: with route-by and upserts each table's key is its "
            f"identifier fields (the changes of this batch carry key {', '.join(carried_names(carried)) or 'none'}; "
            f"option '{UPSERT_KEY}' is {', '.join(stream_key) or 'not set'}). Nothing was committed. Set the table's "
            f"key (ALTER TABLE {name} SET IDENTIFIER FIELDS {', '.join(hint)}, or pyiceberg's "
            "update_schema().set_identifier_fields(...); the columns must be NOT NULL), or route no change to it"
        )
    if len(carried) > 1:
        raise InvalidOptionError(
            f"the changes of table {name} in one batch carry different keys ({'; '.join(carried_names(carried))}): a "
            "table lakesink creates takes one key. Nothing was committed. Create the table yourself with its identifier "
            "fields, or send one key shape per table"
        )
    if carried:
        return next(iter(carried))
    if stream_key:
        return stream_key
    raise InvalidOptionError(
        f"table {name} does not exist and no key is known for it: its changes carry none (Debezium records without "
        f"a Kafka key) and option '{UPSERT_KEY}' is not set. Nothing was committed. Give option '{UPSERT_KEY}' (the "
        "key of tables lakesink creates), send the records with their keys, or create the table with identifier fields"
    )


def check_carried(
    name: str, key: Key, carried: Collection[Key], batch_id: int | None = None, *, history: str | None = None
) -> None:
    """The keys a batch's changes of table ``name`` carry (``carried``: the Debezium records' Kafka keys' fields) are
    all the table's ``key`` (compared as sets of column names: Iceberg's identifier fields are a set), else a
    SchemaMismatchError naming the table, both keys and the way out -- before anything of the batch is written.
    ``history``: the table's history table (option history), which the way out drops too."""
    other = [k for k in carried if set(k) != set(key)]
    if not other:
        return
    batch = f"batch {batch_id}'s" if batch_id is not None else "the batch's"
    mixed = " and the table's own" if len(other) < len(carried) else ""
    raise SchemaMismatchError(
        f"table {name} is keyed by ({', '.join(key)}) (its identifier fields), but {batch} changes of it carry key "
        f"{'; '.join(carried_names(other))}{mixed} (the records' Kafka keys: the source table's primary key changed). "
        f"Upserting by ({', '.join(key)}) would merge rows the source keeps apart (or split one it keeps whole): "
        "nothing was committed. lakesink does not re-key a table: rebuild it under the new key -- stop the query, "
        f"drop or rename table {name}{history_way_out(history)}, and re-snapshot the source table (Debezium's "
        'incremental snapshot); docs/cdc.md, "a source\'s primary key changes"'
    )


def history_way_out(history: str | None) -> str:
    """The part of a key change's way out for the table's history table ``history`` (option history; None: none)."""
    if history is None:
        return ""
    return (
        f" and drop its history table {history} too (its versions are keyed by the old key: left there, the rows the "
        "source had before the change would stay current in it; copy it first to keep them, docs/history.md)"
    )


def carried_names(carried: Collection[Key]) -> list[str]:
    return sorted("(" + ", ".join(k) + ")" for k in carried)
