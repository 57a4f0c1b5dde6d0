"""docs/architecture.md's module map ("## The packages") is the package tree: every module of ``lakesink/`` has its line,
and every line names a module or package that exists. Fast, no Spark.

The map is the first ```` ```text ```` block under "## The packages". Its entry lines are indented by two spaces per
level below ``lakesink/`` (``  sink/``, ``    foreach.py``), a package ends in ``/`` and stands for its
``__init__.py``; a line indented deeper than any entry (more than 8 spaces) continues the description above it, and an
entry's description follows its name after a space. A failure says which line to add or remove, and where.

The walk counts of "Where a batch gets committed" are the ones tests/test_walk.py holds.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import lakesink

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = Path(lakesink.__file__).parent
ENTRY = re.compile(r"(?P<indent>(?:  )+)(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.py|/))(?: .*)?")
DEEPEST_ENTRY = 8  # lakesink/_pyiceberg/io/schemas.py: three levels below lakesink/


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def map_block(text: str) -> list[str]:
    """The lines of the module map: the first ```text block of "## The packages", from its ``lakesink/`` line on."""
    section = _section(text, "## The packages")
    block = section.split("```text\n", 1)[1].split("\n```", 1)[0]
    lines = block.splitlines()
    assert lines and lines[0].rstrip() == "lakesink/", "the module map must start with a line 'lakesink/'"
    return lines[1:]


def mapped(lines: list[str]) -> tuple[dict[str, int], list[str]]:
    """The paths the map names (relative to lakesink/, a package as 'x/y/'), each with its line, and the lines that
    are neither an entry nor a continuation."""
    paths: dict[str, int] = {}
    malformed: list[str] = []
    stack: list[str] = []
    for number, line in enumerate(lines, start=2):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent > DEEPEST_ENTRY:
            continue  # a description's continuation
        m = ENTRY.fullmatch(line.rstrip())
        if not m or indent % 2 or indent // 2 > len(stack) + 1:
            malformed.append(f"line {number} of the map: {line.strip()!r}")
            continue
        depth = indent // 2 - 1
        del stack[depth:]
        path = "".join(stack) + m["name"]
        paths[path] = number
        if m["name"].endswith("/"):
            stack.append(m["name"])
    return paths, malformed


def existing() -> set[str]:
    """Every module of lakesink/ (relative, 'x/y.py') and every package ('x/'); a package's __init__.py is its
    package entry, except the top-level one, which the map lists as ``__init__.py``."""
    out: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            out.add(rel[: -len("__init__.py")])
        else:
            out.add(rel)
    return out


def _where(path: str) -> str:
    parent = path.rstrip("/").rpartition("/")[0]
    depth = path.rstrip("/").count("/") + 1
    name = path.rstrip("/").rpartition("/")[2] + ("/" if path.endswith("/") else "")
    under = f"under '{'  ' * (depth - 1)}{parent.rpartition('/')[2]}/'" if parent else "at the top level"
    return f"add the line '{'  ' * depth}{name}  <what it holds>' {under} (lakesink/{path})"


def test_the_module_map_lists_every_module_and_only_those() -> None:
    paths, malformed = mapped(map_block(PAGE.read_text(encoding="utf-8")))
    real = existing()
    missing = sorted(real - set(paths))
    extra = sorted(set(paths) - real)
    problems = [f"docs/architecture.md, '## The packages': {_where(p)}" for p in missing]
    problems += [
        f"docs/architecture.md, '## The packages', line {paths[p]} of the map names lakesink/{p}, which does not "
        "exist: remove or rename that line"
        for p in extra
    ]
    problems += [
        f"docs/architecture.md, '## The packages': {m}: not an entry ('  name.py' or '  name/', two spaces "
        "a level) nor a continuation (indented more than 8 spaces)"
        for m in malformed
    ]
    assert problems == [], "the module map and lakesink/ differ:\n" + "\n".join(problems)


def test_the_map_parser_sees_what_is_missing_and_what_is_extra() -> None:
    lines = [
        "  errors.py        one error hierarchy",
        "  sink/            the entry points",
        "    foreach.py     foreach_batch()",
        "                   continued",
        "    gone.py        removed",
        "  table/",
        "    keys.py",
    ]
    paths, malformed = mapped(lines)
    assert set(paths) == {"errors.py", "sink/", "sink/foreach.py", "sink/gone.py", "table/", "table/keys.py"}
    assert malformed == []
    assert mapped(["   odd.py"])[1] and mapped(["      too_deep.py"])[1]
    assert _where("sink/spark_split.py") == (
        "add the line '    spark_split.py  <what it holds>' under '  sink/' (lakesink/sink/spark_split.py)"
    )


def _walks_in_test() -> dict[tuple[str, str], int]:
    tree = ast.parse((ROOT / "tests" / "test_walk.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WALKS" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, dict)
            return value
    raise AssertionError("tests/test_walk.py has no WALKS")


def test_the_walk_counts_on_the_page_are_the_tests() -> None:
    section = _section(PAGE.read_text(encoding="utf-8"), "## Where a batch gets committed")
    rows = {
        (m["entry"], m["kind"]): int(m["count"])
        for m in re.finditer(
            r"^\| `(?P<entry>format|foreach_batch)[^`]*`, (?P<kind>one table|route-by)[^|]*\| \*\*(?P<count>\d+)\*\* \|$",
            section,
            re.M,
        )
    }
    assert rows == _walks_in_test(), (
        "docs/architecture.md ('Where a batch gets committed', the walk table) must give tests/test_walk.py's WALKS: "
        f"page {rows}, test {_walks_in_test()}"
    )
