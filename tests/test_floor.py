"""The declared dependency floor: constraints-floor.txt pins exactly the lower bounds pyproject.toml declares.

``make test-floor`` installs those pins into a virtual environment of its own and runs the fast lane and a
Spark exactly-once test there; with ``LAKESINK_FLOOR_VENV=1`` (set by that target) this file also checks that
the environment really holds the floor (pip did not pick something else).
"""

from __future__ import annotations

import os
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


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra]
    return [r for r in reqs if canonicalize_name(r.name) != "lakesink"]


def floors() -> dict[str, str]:
    """Package -> the lower bound pyproject.toml declares for it (``>=``); exact pins (``==``) are left out."""
    out: dict[str, str] = {}
    for req in declared_requirements():
        lower = [s.version for s in req.specifier if s.operator == ">="]
        if any(s.operator == "==" for s in req.specifier):
            continue
        assert len(lower) == 1, f"{req}: every range in pyproject.toml needs one lower bound (>=), so that it can be tested"
        name = canonicalize_name(req.name)
        assert out.get(name, lower[0]) == lower[0], f"{req.name}: two different lower bounds in pyproject.toml"
        out[name] = lower[0]
    return out


def constraints() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (ROOT / "constraints-floor.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints-floor.txt: {line} is not a pin (==)"
            out[canonicalize_name(req.name)] = spec.version
    return out


def same_version(a: str, b: str) -> bool:
    """``4.1`` and ``4.1.0`` are the same release."""
    pa_, pb = (a.split("."), b.split("."))
    width = max(len(pa_), len(pb))
    return pa_ + ["0"] * (width - len(pa_)) == pb + ["0"] * (width - len(pb))


def test_the_constraints_pin_every_declared_lower_bound() -> None:
    declared, pinned = floors(), constraints()
    assert sorted(pinned) == sorted(declared), "constraints-floor.txt and pyproject.toml name different packages"
    wrong = {n: (declared[n], pinned[n]) for n in declared if not same_version(declared[n], pinned[n])}
    assert wrong == {}, f"(declared floor, pinned) differ: {wrong}"


@pytest.mark.skipif(os.environ.get("LAKESINK_FLOOR_VENV") != "1", reason="only in make test-floor's environment")
def test_the_floor_environment_holds_the_floor() -> None:
    installed = {n: metadata.version(n) for n in constraints()}
    wrong = {n: (v, installed[n]) for n, v in constraints().items() if not same_version(installed[n], v)}
    assert wrong == {}, f"(pinned, installed) differ: {wrong}"


def test_the_license_is_an_spdx_expression_the_build_backend_reads() -> None:
    """``project.license`` as a TOML table makes setuptools print a deprecation at every install (three times); the
    SPDX string needs setuptools 77 or later (PEP 639), which the build system then requires."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    (setuptools,) = [Requirement(r) for r in pyproject["build-system"]["requires"] if Requirement(r).name == "setuptools"]
    assert setuptools.specifier.contains("77.0.0") and not setuptools.specifier.contains("76.1.0"), setuptools
