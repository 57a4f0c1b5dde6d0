"""Batches of a routed query (option ``route-by``) across the catalog: is each batch in every table it wrote?

Every table's snapshot of a routed batch records how many tables the batch wrote and their digest
(``lakesink.batch-tables``, ``lakesink.batch-tables-digest``, lakesink.table.routes.tables_digest). Reading the
catalog's tables finds where each batch is; a batch found in fewer tables (or other ones) than it records is
incomplete: on a catalog that commits a batch's tables atomically that never happens, elsewhere it is a batch a crash
left in some tables that the query's next run completes (:func:`verify_query`, and :func:`lakesink.audit.verify` on
one table).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from lakesink.audit.snapshots import ancestry, lakesink_key, match_query_id, opt_int_property, sink_of, summary_of
from lakesink.errors import PROGRAMMING_ERRORS
from lakesink.table.keys import (
    MAIN_BRANCH,
    SUMMARY_BATCH_TABLES,
    SUMMARY_BATCH_TABLES_DIGEST,
    SUMMARY_DEAD_LETTER_SINK,
    SUMMARY_DEAD_LETTER_TABLE,
    SUMMARY_PREVIOUS_BATCH_ID,
)
from lakesink.table.markers import last_committed_batch
from lakesink.table.routes import tables_digest

BATCH_INCOMPLETE = "batch-incomplete"


@dataclass(frozen=True)
class BatchTables:
    """Where one batch of a routed query is."""

    query_id: str
    sink_id: str | None
    batch_id: int
    expected: int
    """How many tables the batch wrote (its snapshots' ``lakesink.batch-tables``)."""
    digest: str
    found: tuple[str, ...]
    """The tables whose history holds a snapshot of the batch."""

    @property
    def complete(self) -> bool:
        return len(self.found) == self.expected and tables_digest(self.found) == self.digest

    def describe(self) -> str:
        who = self.query_id + (f" (sink {self.sink_id})" if self.sink_id else "")
        return (
            f"batch {self.batch_id} of query {who} wrote {self.expected} table(s) but is in {len(self.found)}: "
            f"{', '.join(self.found)}"
            + ("" if len(self.found) == self.expected else " (the others miss it)")
            + ". On a catalog that commits a batch's tables one after the other, the query's next run completes it"
        )


@dataclass
class QueryReport:
    """The result of :func:`verify_query`: every routed batch of a query, complete or not."""

    query_id: str
    tables: list[str] = field(default_factory=list)
    """The tables holding snapshots of the query."""
    batches: int = 0
    incomplete: list[BatchTables] = field(default_factory=list)
    known_queries: list[str] = field(default_factory=list)
    """Every query id found in the tables read (to name them when ``query_id`` is none of them); not in to_dict."""

    @property
    def ok(self) -> bool:
        return bool(self.tables) and not self.incomplete

    def to_dict(self) -> dict[str, Any]:
        return {
            "query_id": self.query_id,
            "tables": self.tables,
            "batches": self.batches,
            "incomplete": [{**asdict(b), "complete": False} for b in self.incomplete],
            "ok": self.ok,
        }

    def human(self) -> str:
        if not self.tables:
            known = ", ".join(self.known_queries[:20]) + (" ..." if len(self.known_queries) > 20 else "")
            return (
                f"ERROR: no table read holds a snapshot of query {self.query_id!r} (a query id, or its first characters "
                f"as lakesink history prints them); the queries found: {known or 'none'}"
            )
        lines = [
            f"{'OK' if self.ok else 'FAILED'}: query {self.query_id}: {self.batches} routed batch(es) in "
            f"{len(self.tables)} table(s), {len(self.incomplete)} incomplete"
        ]
        lines += [f"  {BATCH_INCOMPLETE}: {b.describe()}" for b in self.incomplete]
        return "\n".join(lines)


def catalog_tables(catalog: Catalog, namespaces: Sequence[tuple[str, ...]] | None = None) -> Iterator[tuple[str, ...]]:
    """Every table of the catalog (of ``namespaces`` and the namespaces below them, when given)."""
    todo = list(namespaces) if namespaces is not None else [tuple(ns) for ns in catalog.list_namespaces()]
    seen: set[tuple[str, ...]] = set()
    while todo:
        ns = todo.pop()
        if ns in seen:
            continue
        seen.add(ns)
        try:
            yield from (tuple(t) for t in catalog.list_tables(ns))
            todo += [tuple(child) for child in catalog.list_namespaces(ns) if tuple(child) != ns]
        except PROGRAMMING_ERRORS:
            raise
        except Exception:
            continue  # dropped meanwhile, or a catalog without nested namespaces


def histories(tables: Iterable[Table]) -> Iterator[tuple[str, Sequence[Snapshot]]]:
    """Each table's name and snapshots (what :func:`routed_batches` reads)."""
    for table in tables:
        yield ".".join(table.name()), table.snapshots()


def holds_query(table: Table, queries: Iterable[str]) -> bool:
    wanted = set(queries)
    return any((k := lakesink_key(s)) is not None and k[0] in wanted for s in table.snapshots())


def routed_batches(
    tables: Iterable[tuple[str, Sequence[Snapshot]]], query_id: str | None = None
) -> dict[tuple[str, str | None, int], BatchTables]:
    """The routed batches found in ``tables`` (name and snapshots: :func:`histories`), of ``query_id`` or of every
    query, by (query id, sink id, batch id)."""
    found: dict[tuple[str, str | None, int], tuple[int, str, set[str]]] = {}
    for name, snapshots in tables:
        for s in snapshots:
            key = lakesink_key(s)
            if key is None or (query_id is not None and key[0] != query_id):
                continue
            props = summary_of(s)
            count = opt_int_property(props, SUMMARY_BATCH_TABLES)
            if count is None:
                continue  # a batch of a single-table sink
            entry = found.setdefault((key[0], sink_of(s), key[1]), (count, props.get(SUMMARY_BATCH_TABLES_DIGEST, ""), set()))
            entry[2].add(name)
    return {k: BatchTables(k[0], k[1], k[2], count, digest, tuple(sorted(names))) for k, (count, digest, names) in found.items()}


def load_tables(catalog: Catalog, namespaces: Sequence[tuple[str, ...]] | None = None) -> Iterator[Table]:
    for ident in catalog_tables(catalog, namespaces):
        try:
            yield catalog.load_table(ident)
        except PROGRAMMING_ERRORS:
            raise
        except Exception:
            continue  # dropped meanwhile, or not an Iceberg table


def verify_query(catalog: Catalog, query_id: str, namespaces: Sequence[tuple[str, ...]] | None = None) -> QueryReport:
    """Read every table of the catalog (or of ``namespaces``): is each routed batch of ``query_id`` in all the
    tables it wrote?"""
    every = list(load_tables(catalog, namespaces))
    known = {k[0] for table in every for s in table.snapshots() if (k := lakesink_key(s)) is not None}
    query_id = match_query_id(query_id, known) or query_id  # the id, or the one id that starts with it
    report = QueryReport(query_id, known_queries=sorted(known))
    holding: set[str] = set()
    loaded: list[Table] = []
    for table in every:
        if holds_query(table, [query_id]):
            holding.add(".".join(table.name()))
            loaded.append(table)
    batches = routed_batches(histories(loaded), query_id)
    report.tables = sorted(holding)
    report.batches = len(batches)
    report.incomplete = [batches[k] for k in sorted(batches, key=order) if not batches[k].complete]
    return report


def order(key: tuple[str, str | None, int]) -> tuple[str, str, int]:
    return key[0], key[1] or "", key[2]


class OtherTables:
    """The catalog's other tables of a routed query, read once (lazily) by ``lakesink verify`` of one table: which of
    the batch ids missing from that table's history the query's other tables account for.

    A routed batch writes only the tables its rows name, and a table's next snapshot records the table's own previous
    batch (its replay marker): batch ids in between are batches that wrote other tables, or empty batches, whose
    marker-only commit moves the markers of the previous batch's tables only (lakesink.driver.committers.routed). Neither
    leaves a trace in this table; the other tables have them:

    - a routed batch found in other tables, **complete** there (found in as many tables as its
      ``lakesink.batch-tables`` count says, their names matching its ``lakesink.batch-tables-digest``) and not naming
      this table: this table was not in it;
    - a batch id another table of the same sink accounts as empty (its snapshot's ``lakesink.previous-batch-id``, or its
      marker recording an empty batch, with no snapshot of its own in between): the batch routed no row.

    The dead-letter table of a routed query (its own sink, named by the routed tables' ``lakesink.dead-letter-sink``)
    takes part in every batch with rows, never in an empty one: only the second kind accounts for its missing ids.
    Anything else -- a batch found nowhere, or one whose digest names this table -- stays a gap (lost)."""

    def __init__(self, table: Table, branch: str):
        self.name = ".".join(table.name())
        self.branch = branch
        self._catalog = table.catalog
        self._tables: dict[str, list[Table]] = {}

    def _others(self, query_id: str) -> list[Table]:
        if query_id not in self._tables:
            found: list[Table] = []
            if self._catalog is not None:
                found = [t for t in load_tables(self._catalog) if ".".join(t.name()) != self.name and holds_query(t, [query_id])]
            self._tables[query_id] = found
        return self._tables[query_id]

    def accounted(self, query_id: str, sink_id: str | None, missing: Sequence[int]) -> set[int]:
        """The ids of ``missing`` (batch ids of ``query_id``'s sink ``sink_id`` absent from this table's history) that
        the query's other tables account for (the class's docstring)."""
        others = self._others(query_id)
        if not others or not missing:
            return set()
        owners = self._dead_letter_owners(others, query_id, sink_id)
        routed = {} if owners else routed_batches(histories(others), query_id)
        sinks = owners or {sink_id}
        out: set[int] = set()
        for batch_id in missing:
            found = routed.get((query_id, sink_id, batch_id))
            if found is not None and found.complete and self.name not in found.found:
                out.add(batch_id)
            elif any(self._empty_in(t, query_id, s, batch_id) for t in others for s in sinks):
                out.add(batch_id)
        return out

    def _dead_letter_owners(self, others: Sequence[Table], query_id: str, sink_id: str | None) -> set[str | None]:
        """The routed sinks of ``query_id`` whose dead-letter table this table is, under sink ``sink_id`` (empty: it is
        not a routed query's dead-letter table)."""
        owners: set[str | None] = set()
        for t in others:
            for s in t.snapshots():
                props, key = summary_of(s), lakesink_key(s)
                if (
                    key is not None
                    and key[0] == query_id
                    and SUMMARY_BATCH_TABLES in props
                    and props.get(SUMMARY_DEAD_LETTER_TABLE) == self.name
                    and (props.get(SUMMARY_DEAD_LETTER_SINK) or None) == sink_id
                ):
                    owners.add(sink_of(s))
        return owners

    def _empty_in(self, table: Table, query_id: str, sink_id: str | None, batch_id: int) -> bool:
        """Whether ``table`` accounts ``batch_id`` of the sink as an empty batch on the branch (as its own verify does)."""
        if self.branch != MAIN_BRANCH and self.branch not in table.metadata.refs:
            return False
        seen_last: int | None = None
        for s in ancestry(table, self.branch):
            key = lakesink_key(s)
            if key is None or key[0] != query_id or sink_of(s) != sink_id:
                continue
            previous = opt_int_property(summary_of(s), SUMMARY_PREVIOUS_BATCH_ID)
            if previous is not None and (seen_last if seen_last is not None else -1) < batch_id <= previous < key[1]:
                return True
            seen_last = key[1] if seen_last is None else max(seen_last, key[1])
        marker = last_committed_batch(table.properties, query_id, sink_id)
        return (
            marker is not None
            and marker.branch == self.branch
            and marker.empty
            and (seen_last if seen_last is not None else -1) < batch_id <= marker.batch_id
        )
