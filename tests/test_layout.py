"""The house rules of the package layout (issue 21), checked on the source itself.

- every key lakesink reads or writes (``lakesink.*`` summary, property and footer keys, Iceberg's table property
  keys, ``main``, the ``__lakesink_*`` columns, Spark's local property names) has one home,
  :mod:`lakesink.table.keys`: no other module spells one;
- no module-level import cycle anywhere in ``lakesink`` (``make lint`` also runs import-linter's contracts,
  which forbid cycles between packages and check the layers);
- no function-local import of lakesink, SQLAlchemy, tenacity or pyiceberg's catalogs (the package boundary keeps
  the driver off executors, not imports hidden in functions), except in the lazy public API of ``lakesink/__init__``;
- the command line renders through one output object: no command branches on ``--json`` itself;
- no class extends a concrete class of another lakesink module (composition), but the known ones that may only go.
"""

from __future__ import annotations

import abc
import ast
import enum
import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import lakesink

PACKAGE = Path(lakesink.__file__).parent
KEYS = PACKAGE / "table" / "keys.py"
MODULES = {m.name for m in pkgutil.walk_packages([str(PACKAGE)], "lakesink.")} | {"lakesink"}

# what a key looks like: lakesink's keys, Iceberg's table property keys, refs, lakesink's columns, Spark's local properties
KEY = re.compile(
    r"lakesink\.[a-z][a-z0-9.-]*"
    r"|(write|commit|history)\.[a-z][a-z0-9.-]*"
    r"|format-version|main|__lakesink_[a-z]+"
    r"|sql\.streaming\.queryId|streaming\.sql\.batchId|spark\.jobGroup\.id|spark\.sql\.streaming\.(queryId|epochId)"
)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the Constant nodes that are docstrings (module, class, function, attribute docstrings) or names in
    ``__all__``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            out |= {id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    out.add(id(stmt.value))
    return out


def _string_constants(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_every_key_is_spelled_only_in_table_keys() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}"
        for path in _sources()
        if path != KEYS
        for line, value in _string_constants(path)
        if KEY.fullmatch(value) and value not in MODULES
    ]
    assert spelled == [], "keys spelled outside lakesink/table/keys.py (import them from there):\n" + "\n".join(spelled)
    assert any(KEY.fullmatch(v) for _, v in _string_constants(KEYS))  # the pattern does find keys where they live


#: ``LAKESINK_*`` strings that are not environment variables: the message marker of the Spark path's null check
ENV_LIKE_MARKERS = {"LAKESINK_NOT_NULL_VIOLATION"}


def test_every_environment_variable_is_named_only_in_table_keys() -> None:
    """The ``LAKESINK_*`` variables lakesink reads (issue 31: they were spread over four modules) and their defaults
    live in lakesink.table.keys, beside the keys."""
    spelled = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}"
        for path in _sources()
        if path != KEYS
        for line, value in _string_constants(path)
        if re.fullmatch(r"LAKESINK_[A-Z_]+", value) and value not in ENV_LIKE_MARKERS
    ]
    assert spelled == [], "environment variables named outside lakesink/table/keys.py:\n" + "\n".join(spelled)
    assert {"LAKESINK_HOME", "LAKESINK_LOG_LEVEL", "LAKESINK_LOCK_DIR", "LAKESINK_FAULTS_DIR"} <= {
        v for _, v in _string_constants(KEYS)
    }


def _module_level_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of the imports that run when the module is imported (not in functions, not TYPE_CHECKING)."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def walk(nodes: list[ast.stmt]) -> Iterator[tuple[int, str]]:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from walk(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    yield node.lineno, full if full in MODULES else base
            for field in ("body", "orelse", "finalbody"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from walk([n for n in inner if isinstance(n, ast.stmt)])
            for handler in getattr(node, "handlers", ()):
                yield from walk(handler.body)

    yield from walk(ast.parse(path.read_text()).body)


def import_graph() -> dict[str, set[str]]:
    """Module-level imports between lakesink's modules. Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b``
    first: those are edges too, except to the importer's own packages (already being imported when it runs)."""
    graph: dict[str, set[str]] = {}
    for path in _sources():
        importer = _name(path)
        own = {".".join(importer.split(".")[:i]) for i in range(1, len(importer.split(".")) + 1)}
        edges = graph.setdefault(importer, set())
        for _, target in _module_level_imports(path):
            if not target.startswith("lakesink"):
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                step = ".".join(parts[:i])
                if step in MODULES and step not in own:
                    edges.add(step)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycle() -> None:
    graph = import_graph()
    assert "lakesink.driver.committers.table" in graph and graph["lakesink.driver.committers.table"]  # the graph is not empty
    assert cycles(graph) == []


# the public API (PEP 562): Spark's workers import the package, never the driver behind it; the class Spark registers
# for format("lakesink"), which every data source worker imports before it knows its step (each method imports its
# step's module: tests/sink/test_worker_imports.py holds that unpickling it loads none)
LAZY_OK = {"lakesink", "lakesink.sink.source"}
DRIVER_LIBRARIES = ("lakesink", "sqlalchemy", "tenacity", "pyiceberg.catalog")
# the seam of one kind of catalog, imported inside a function once a catalog of that kind was found
# (lakesink._pyiceberg.commit.is_sql_catalog: asked from sys.modules): a process that commits to a SQL catalog never
# loads the REST client, one that commits to a REST catalog never SQLAlchemy (tests/sink/test_worker_imports.py holds both)
LAZY_SEAMS = {"lakesink._pyiceberg.sql_catalog", "lakesink._pyiceberg.rest", "lakesink._pyiceberg.rest_metrics"}


def test_no_function_local_import_of_lakesink_or_the_driver_libraries() -> None:
    hidden = []
    for path in _sources():
        if _name(path) in LAZY_OK:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if not isinstance(inner, (ast.Import, ast.ImportFrom)):
                    continue
                names = [a.name for a in inner.names] if isinstance(inner, ast.Import) else [inner.module or ""]
                relative = isinstance(inner, ast.ImportFrom) and bool(inner.level)
                allowed = LAZY_SEAMS
                hidden += [
                    f"{path.relative_to(PACKAGE.parent)}:{inner.lineno}: {n}"
                    for n in names
                    if relative or (n.startswith(DRIVER_LIBRARIES) and n not in allowed)
                ]
    assert hidden == [], "imports inside functions (import at module level; the package boundary does the rest):\n" + "\n".join(
        hidden
    )


@pytest.mark.parametrize("path", sorted((PACKAGE / "cli").glob("*.py")), ids=lambda p: p.name)
def test_cli_commands_do_not_branch_on_json(path: Path) -> None:
    """The renderer is chosen once (``--json`` gives a JSON output object); the commands only call it."""
    tree = ast.parse(path.read_text())
    branching = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "as_json") or (isinstance(node, ast.arg) and node.arg == "as_json")
    ]
    assert branching == []


BATCH_ACTIONS = {"AppendBatch", "OverwriteBatch", "UpsertBatch", "MarkEmptyBatch", "ReplayFoundAtPlan"}


def test_one_place_lists_a_batchs_actions() -> None:
    """Issue 31 (one path): what a batch commits into a table is decided in one function,
    lakesink.driver.actions.batch.action_for, for a table of its own, each table of a routed unit and each dead-letter
    table -- no committer makes a batch action itself (but ``TableCommitter.append_action``, which only the tests of the
    loop's units call to make an append by hand)."""
    made = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in BATCH_ACTIONS:
                    made.append(f"{path.relative_to(PACKAGE.parent)}:{call.lineno} {node.name}: {call.func.id}")
    outside = [m for m in made if " action_for: " not in m and " append_action: " not in m]
    assert made and outside == [], "batch actions made outside action_for:\n" + "\n".join(outside)


def _every_import(path: Path) -> Iterator[str]:
    """Every lakesink module ``path`` imports, at any level: module level, inside functions and classes, under
    ``TYPE_CHECKING`` (a circle hidden in a function or behind a type-only import is still a circle: issue 53)."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield full if full in MODULES else base


def full_import_graph() -> dict[str, set[str]]:
    """Imports between lakesink's modules at any level (:func:`_every_import`), each to the deepest module named."""
    graph: dict[str, set[str]] = {}
    for path in _sources():
        importer = _name(path)
        edges = graph.setdefault(importer, set())
        for target in _every_import(path):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != importer and not importer.startswith(f"{target}.") and target != "lakesink":
                edges.add(target)
    return graph


# Import circles hidden in functions or behind TYPE_CHECKING that are still to be taken apart (issue 53: "import circles
# ... at any level: 0"). The list may only shrink: a new circle fails, and so does one that is gone and still listed.
KNOWN_CIRCLES: list[list[str]] = []


def test_no_import_circle_at_any_level_but_the_known_ones() -> None:
    """What the old line cap (no driver module over 650 lines) stood for: modules cut by subject, not by length -- a
    module split to fit a cap, or two subjects in one module, show up as modules that import each other (the review
    checklist of docs/architecture.md, "Where a change goes", names the rest)."""
    graph = full_import_graph()
    assert "lakesink.driver.report.metrics" in graph["lakesink.driver.committers.table"]  # the graph is not empty
    assert cycles(graph) == KNOWN_CIRCLES


def test_no_action_knows_its_committer() -> None:
    """A batch's commit actions are made from a frozen context (lakesink.driver.actions.batch.SinkContext), as
    iceberg-rust's ``TransactionAction::commit(&Table)`` knows nothing of its caller: no module of
    ``lakesink.driver.actions`` imports ``lakesink.driver.committers`` at any level, not even for a type (the layers
    contract of ``make lint`` does not see ``TYPE_CHECKING`` imports)."""
    graph = full_import_graph()
    assert "lakesink.driver.loop.swap" in graph["lakesink.driver.actions.batch"]  # the graph is not empty
    up = {m: sorted(t for t in graph[m] if t.startswith("lakesink.driver.committers")) for m in graph}
    assert {m: t for m, t in up.items() if m.startswith("lakesink.driver.actions") and t} == {}


# Classes that extend a concrete class of another lakesink module (issue 53, item 4: "composition where today there is
# inheritance across files"; TableCommitter(SinkTable) and RoutedCommitter(RoutedTables) are gone). An interface -- an
# ABC, a protocol, an abstract class -- may be extended anywhere, and so may an error or an enum. The list may only
# shrink: a new such class fails, and so does one that is gone and still listed.
KNOWN_CROSS_MODULE_SUBCLASSES = [
    "lakesink._pyiceberg.maintenance.PreparedManifestRewrite <- lakesink._pyiceberg.commit.PreparedCommit",
    "lakesink._pyiceberg.row_delta._RowDeltaProducer <- lakesink._pyiceberg.producers._MergeAppend",
    "lakesink.cli.output.ConsoleOutput <- lakesink.cli.render.TextRenderer",
    "lakesink.cli.output.JsonOutput <- lakesink.cli.render.JsonRenderer",
    "lakesink.driver.actions.history.HistoryBatch <- lakesink.driver.actions.batch.AppendBatch",
    "lakesink.driver.committers.facts.BatchFacts <- lakesink.driver.tables.routed_tables.TableFacts",
    "lakesink.maintenance.orphans.OrphanFile <- lakesink.table.storage.ListedFileRecord",
    "lakesink.options.values.TableName <- lakesink.table.routes.TableIdentifier",
    "lakesink.sink.checkpoint_cleanup.TempFile <- lakesink.table.storage.ListedFileRecord",
]


def _is_interface(base: type) -> bool:
    return inspect.isabstract(base) or abc.ABC in base.__bases__ or bool(getattr(base, "_is_protocol", False))


def test_no_class_extends_a_concrete_class_of_another_module_but_the_known_ones() -> None:
    found = []
    for name in sorted(MODULES):
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != name:
                continue
            found += [
                f"{name}.{cls.__qualname__} <- {b.__module__}.{b.__qualname__}"
                for b in cls.__bases__
                if b.__module__.startswith("lakesink")
                and b.__module__ != name
                and not issubclass(b, (BaseException, enum.Enum))
                and not _is_interface(b)
            ]
    assert "lakesink.driver.committers.table" in MODULES and found  # the walk saw the package
    assert sorted(found) == KNOWN_CROSS_MODULE_SUBCLASSES, "hold the other module's class as a member (composition)"


# The commit path: a table's swap, a unit of tables, settling an outcome left unknown (issue 53, item 3). The catalog's
# kind is asked once, where its swapper is chosen (lakesink._pyiceberg.commit.swapper_of); elsewhere in these modules
# no is_sql_*/is_rest_* call. Outside the commit path they stay: opening a catalog, creating tables, planning, metrics.
COMMIT_PATH = ["_pyiceberg/commit.py", "driver/loop/*.py", "driver/actions/*.py", "driver/committers/table.py",
               "driver/committers/routed.py", "driver/committers/interface.py"]
KIND_CHOSEN_IN = {("lakesink._pyiceberg.commit", "swapper_of")}


def test_the_commit_path_never_asks_the_catalogs_kind() -> None:
    asked = []
    for spec in COMMIT_PATH:
        pattern, _, function = spec.partition(":")
        paths = sorted(PACKAGE.glob(pattern))
        assert paths, spec
        for path in paths:
            tree = ast.parse(path.read_text())
            functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
            scopes = [f for f in functions if f.name == function] if function else [tree]
            assert scopes, spec
            chosen = {id(n) for f in functions if (_name(path), f.name) in KIND_CHOSEN_IN for n in ast.walk(f)}
            asked += [
                f"{path.relative_to(PACKAGE.parent)}:{call.lineno}"
                for scope in scopes
                for call in ast.walk(scope)
                if isinstance(call, ast.Call)
                and id(call) not in chosen
                and re.match(r"is_(sql|rest)_", ast.unparse(call.func).rpartition(".")[2])
            ]
    assert asked == [], "the commit path asks the catalog's swapper (lakesink._pyiceberg.commit.Swapper)"
