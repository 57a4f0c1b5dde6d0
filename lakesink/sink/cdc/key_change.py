"""Option cdc-format with upserts: a batch spanning a source's primary key change (docs/cdc.md, "a source's primary key
changes").

A table's records carry two keys in one batch (their Kafka keys' fields: the old key, then the new one), every record of
the old key before every record of the new one in the source log (lakesink.executor.payload.Found.key_spans). On the
driver, before the batch's tables are planned (no Spark: format("lakesink")'s commit runs without a session; both entry
points call it):

- the table exists, keyed by the old key: the batch is refused (SchemaMismatchError), nothing committed, naming both
  keys, the source position of the change and the way out; the change is recorded in a property of the table's namespace
  (:data:`PROPERTY`), which outlives the table;
- the table was dropped since (or renamed), or exists keyed by the new key, and the namespace records this very change
  (the same keys, the same position: the batch replayed): the table's changes before the change's position are not
  applied -- they were the old table's; the re-snapshot the error asks for brings the rows -- and its changes after it
  are, under the new key (the batch's carried keys: the new one only).

Any other batch carrying two keys for a table (keys interleaved, a record without a source position, no record of the
change) meets the refusals of lakesink.driver.tables.routed_keys. A table never takes changes of a key it is not keyed
by, and no change is skipped without the refusal that named it first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal

from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from lakesink.driver.committers.facts import BatchFacts
from lakesink.driver.committers.routed import RoutedCommitter
from lakesink.driver.tables.routed_keys import Key, history_way_out, identifier_fields
from lakesink.errors import SchemaMismatchError
from lakesink.executor.payload import Found
from lakesink.options import Routing
from lakesink.table.keys import PROPERTY_KEY_CHANGE_PREFIX
from lakesink.table.routes import Route, parse_route

PROPERTY = PROPERTY_KEY_CHANGE_PREFIX
"""The prefix of the namespace property recording a table's key change (then the table's name)."""


def cuts(
    routed: RoutedCommitter, routing: Routing, found: Mapping[object, Found], facts: BatchFacts
) -> tuple[dict[str, Decimal], BatchFacts]:
    """Per routing value of a table whose old-key changes are not applied (the table dropped or keyed by the new key
    after the refusal that recorded the change), the position from which its changes apply; ``facts`` carrying only the
    new key for those tables. Raises SchemaMismatchError for a table keyed by the old key (the change recorded first)."""
    if not routed.options.upserts:
        return {}, facts
    out: dict[str, Decimal] = {}
    carried = dict(facts.carried_keys)
    for value, f in sorted(((v, f) for v, f in found.items() if isinstance(v, str)), key=lambda vf: vf[0]):
        change = _change(f)
        target = parse_route(value, routing.namespace, routing.allowed_namespaces)
        if change is None or not isinstance(target, Route):
            continue
        old, new, at = change
        name = str(target)
        try:
            own: Key | None = identifier_fields(routed.committer(name).table.load().schema())
        except NoSuchTableError:
            own = None
        if own is not None and set(own) == set(old):
            _record(routed, target, old, new, at)
            history = routed.options.history
            raise SchemaMismatchError(_refusal(name, old, new, at, str(history.of(target)) if history is not None else None))
        if own is None or set(own) == set(new):
            if _recorded(routed, target) != (old, new, at):
                raise SchemaMismatchError(_unrecorded(name, target, old, new, at, exists=own is not None))
            out[value] = at
            carried[name] = {new}
    return out, replace(facts, carried_keys=carried)


def _change(f: Found) -> tuple[Key, Key, Decimal] | None:
    """(old key, new key, position of the first new-key change) when the records carry two keys, every one of the
    first before every one of the second; else None."""
    if len(f.keys) != 2:
        return None
    spans: list[tuple[Key, tuple[Decimal, Decimal]]] = []
    for k in f.keys:
        span = f.key_spans.get(k)
        if span is None:
            return None  # a record without a source position: no order to tell old from new
        spans.append((k, span))
    (a, first), (b, second) = sorted(spans, key=lambda ks: ks[1][0])
    if set(a) == set(b) or first[1] >= second[0]:
        return None  # interleaved: not one change of key
    return a, b, second[0]


def _namespace(routed: RoutedCommitter, target: Route) -> Mapping[str, str]:
    try:
        return routed.tables.catalog.load_namespace_properties(target.namespace)
    except NoSuchNamespaceError:
        return {}


def _recorded(routed: RoutedCommitter, target: Route) -> tuple[Key, Key, Decimal] | None:
    text = _namespace(routed, target).get(PROPERTY + target.name)
    if text is None:
        return None
    try:
        obj = json.loads(text)
        return tuple(obj["from"]), tuple(obj["to"]), Decimal(obj["at"])
    except (ValueError, KeyError, TypeError, ArithmeticError):
        return None


def _text(old: Key, new: Key, at: Decimal) -> str:
    return json.dumps({"from": list(old), "to": list(new), "at": str(at)})


def _record(routed: RoutedCommitter, target: Route, old: Key, new: Key, at: Decimal) -> None:
    text = _text(old, new, at)
    if _namespace(routed, target).get(PROPERTY + target.name) != text:
        routed.tables.catalog.update_namespace_properties(target.namespace, updates={PROPERTY + target.name: text})


def _unrecorded(name: str, target: Route, old: Key, new: Key, at: Decimal, *, exists: bool) -> str:
    o, n = ", ".join(old), ", ".join(new)
    namespace = ".".join(target.namespace)
    return (
        f"the changes of table {name} in this batch switch key: those under ({o}), then those under ({n}) from source "
        f"position {at} (the records' Kafka keys: the source's primary key changed within the batch). Table {name} "
        f"{f'is keyed by ({n})' if exists else 'does not exist'}, no table takes the old ones and lakesink does not "
        "re-key a table: nothing was committed. "
        f"Either start the stream after the change, or accept that the changes before it are not applied (a re-snapshot "
        f"of the source table brings the rows: Debezium's execute-snapshot signal) by recording the change in the "
        f"namespace -- ALTER NAMESPACE {namespace} SET PROPERTIES ('{PROPERTY}{target.name}' = '{_text(old, new, at)}') "
        f"(pyiceberg: catalog.update_namespace_properties; CREATE NAMESPACE IF NOT EXISTS {namespace} first) -- and "
        f"restart: table {name} is then keyed by ({n}). "
        'docs/cdc.md, "a source\'s primary key changes"'
    )


def _refusal(name: str, old: Key, new: Key, at: Decimal, history: str | None) -> str:
    o, n = ", ".join(old), ", ".join(new)
    namespace = name.rsplit(".", 1)[0]
    return (
        f"table {name} is keyed by ({o}) (its identifier fields), and this batch's changes of it switch key: those under "
        f"({o}) up to the source's primary key change, then those under ({n}) from source position {at} (the records' "
        f"Kafka keys). Upserting by ({o}) would merge rows the source keeps apart: nothing was committed. lakesink does "
        f"not re-key a table; the change is recorded (namespace {namespace}, property "
        f"{PROPERTY}{name.rsplit('.', 1)[1]}). Way out: stop the query, drop (or rename) table {name}"
        f"{history_way_out(history)}, and restart: the "
        f"restart makes {name} keyed by ({n}) from this batch's changes from position {at} on -- its changes before "
        f"it belong to the table you dropped and are not applied -- and goes on; then have Debezium re-snapshot the "
        "source table (the execute-snapshot signal) to bring the rows the new table lacks. docs/cdc.md, \"a source's "
        'primary key changes"'
    )


def merged(truncates: Mapping[str, Decimal], keyed: Mapping[str, Decimal]) -> dict[str, Decimal]:
    """The positions below which each routing value's changes are dropped: its last truncate's, or its key change's
    (:func:`cuts`), the greater."""
    out = dict(keyed)
    for value, position in truncates.items():
        out[value] = max(position, out.get(value, position))
    return out
