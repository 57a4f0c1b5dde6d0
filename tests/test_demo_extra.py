"""``make demo`` installs the demo extra only (pyproject.toml), not the test extra: the extra must hold every package
the examples the README runs on that environment import (examples/demo.py and its stream job, ``make routing-demo``,
``make cdc-demo``), every package the ``lakesink`` command line imports (its commands import theirs when they run:
``report --html`` needs matplotlib), and what lakesink's modules on their path import at module level (checked
statically here with ``ast``, no install); the README's prerequisites name what .ci/run installs itself.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = [ROOT / "examples" / name for name in ("demo.py", "stream_job.py", "routing_demo.py", "cdc_database.py")]
# the command line's modules, every import (a command imports its packages when it runs)
CLI = sorted((ROOT / "lakesink" / "cli").glob("*.py"))
# the functions of lakesink.audit.interop the demo may call: DuckDB's reader (the demo extra holds DuckDB only)
INTEROP_FUNCTIONS = {"duckdb_query", "duckdb_connection"}


def _requirements(extras: set[str]) -> list[Requirement]:
    """lakesink's dependencies plus those of ``extras``, self-references (``lakesink[duckdb]``) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "lakesink":
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def _closure(reqs: list[Requirement]) -> set[str]:
    """The distributions ``reqs`` bring, transitively, as installed here (their Requires-Dist, extras honoured)."""
    found: set[str] = set()
    todo = list(reqs)
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in done:
            continue
        done.add(key)
        found.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a marker-guarded dependency of another platform or Python; the import check below decides
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(sub)
    return found


def _imports(tree: ast.AST, *, module: str | None, module_level_only: bool) -> set[str]:
    """The absolute module names ``tree`` imports (``from x import y`` gives x and x.y; y may be a module)."""
    out: set[str] = set()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # type checking only, never imported at run time
            if isinstance(child, ast.Import):
                out.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    assert module is not None
                    parts = module.split(".")[: -child.level]
                    base = ".".join([*parts, base] if base else parts)
                out.add(base)
                out.update(f"{base}.{alias.name}" for alias in child.names)
            if not (module_level_only and nested):
                visit(child, top and not nested)

    visit(tree, True)
    return out


def _lakesink_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def demo_imports() -> set[str]:
    """Top-level packages (not lakesink, not the standard library) the demo's path imports."""
    names: set[str] = set()
    for script in SCRIPTS:
        tree = ast.parse(script.read_text())
        names |= _imports(tree, module=None, module_level_only=False)
        if script.name == "demo.py":
            used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "interop"}
            extra = used - INTEROP_FUNCTIONS
            assert not extra, f"demo.py calls interop.{extra}: add their packages to the demo extra, then here"
    for cli_module in CLI:
        tree = ast.parse(cli_module.read_text())
        names |= _imports(tree, module=f"lakesink.cli.{cli_module.stem}", module_level_only=False)
    interop_tree = ast.parse((ROOT / "lakesink" / "audit" / "interop.py").read_text())
    for fn in ast.walk(interop_tree):
        if isinstance(fn, ast.FunctionDef) and fn.name in INTEROP_FUNCTIONS:
            names |= _imports(fn, module=None, module_level_only=False)
            # the DuckDB extensions are found by package name (importlib.util.find_spec), not imported
            constants = [c.value for c in ast.walk(fn) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            names |= {c for c in constants if re.fullmatch(r"duckdb_extension_\w+", c)}
    # lakesink's modules on the way, with what they import at module level (a function's own imports run only if called)
    seen: set[str] = set()
    todo = [n for n in names if n.split(".")[0] == "lakesink"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # importing a.b.c runs a and a.b first
        path = _lakesink_file(name)
        if path is None:
            continue  # a name inside a module (from lakesink.x import NAME)
        module = name if path.name != "__init__.py" else f"{name}.__init__"
        found = _imports(ast.parse(path.read_text()), module=module, module_level_only=True)
        names |= found
        todo += [n for n in found if n.split(".")[0] == "lakesink"]
    examples = {script.stem for script in SCRIPTS}  # routing_demo.py imports demo.py's helpers
    return {n.split(".")[0] for n in names if n} - set(sys.stdlib_module_names) - {"lakesink", "__future__"} - examples


def test_demo_extra_covers_every_import_of_the_demo() -> None:
    closure = _closure(_requirements({"demo"}))
    providers = metadata.packages_distributions()
    missing = {}
    for top in sorted(demo_imports()):
        dists = {canonicalize_name(d) for d in providers.get(top, [])}
        if not dists & closure:
            missing[top] = sorted(dists) or "not installed here"
    assert not missing, f"packages the demo imports that lakesink[demo] does not bring (pyproject.toml, extra demo): {missing}"


def test_demo_extra_leaves_out_the_heavy_readers() -> None:
    closure = _closure(_requirements({"demo"}))
    assert "duckdb" in closure and "moto" in closure
    # the point of the extra: ClickHouse (chdb, 534 MB), DataFusion, the lint tools stay in the test extra
    assert not closure & {"chdb", "datafusion", "mypy", "pytest"}, closure & {"chdb", "datafusion", "mypy", "pytest"}


def test_test_extra_holds_the_demo_extra() -> None:
    """`make demo` after `make test` installs nothing more (the Makefile relies on it)."""
    assert {str(r) for r in _requirements({"demo"})} <= {str(r) for r in _requirements({"test"})}


@pytest.mark.parametrize("target", ["demo", "routing-demo", "cdc-demo"])
def test_makefile_demos_install_the_demo_extra_only(target: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(rf"^{target}: (.*)$", makefile, re.M)
    assert rule is not None and rule.group(1).strip() == "$(VENV)/.installed-demo", f"make {target}: not on the demo extra"
    assert "-e '.[demo]'" in makefile


def test_readme_prerequisites_name_what_ci_installs() -> None:
    """.ci/run installs Debian packages when missing (PostgreSQL's server binaries, Chromium): the README says so."""
    ci = (ROOT / ".ci" / "run").read_text()
    packages = set(re.findall(r"apt-get install -y -qq (\S+)", ci))
    assert packages >= {"postgresql", "chromium"}
    readme = (ROOT / "README.md").read_text()
    prerequisites = readme.split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    for package in sorted(packages):
        assert f"`{package}`" in prerequisites, f"README's prerequisites do not name the Debian package {package} (.ci/run)"
    assert "initdb" in prerequisites  # how the tests find PostgreSQL's server binaries
