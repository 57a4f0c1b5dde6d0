"""Fixtures of the catalogs people run in production: an Iceberg REST catalog server (lakana) behind the HTTP
fault layer, and AWS Glue (moto's server) with moto's S3. Loaded by tests/conftest.py as a pytest plugin.

``lakana`` starts one real REST server per test session (tests/rest_server.py builds its virtual environment
on first use); ``rest_proxy`` puts a fresh fault proxy (tests/http_faults.py) in front of it for one test, and
``rest_catalog_properties`` gives the test a new environment of its own, reached through that proxy. Tests that
use the server are marked ``rest`` automatically (``make test-fast`` skips them: the first start builds the
server's environment).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http_faults import FaultProxy
from tests.rest_server import LakanaServer

REST_FIXTURE = "lakana"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REST_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rest)


@pytest.fixture(scope="session")
def lakana() -> Iterator[LakanaServer]:
    """One lakana REST catalog server for the test session (each test gets an environment of its own)."""
    server = LakanaServer.start()
    yield server
    server.stop()


@pytest.fixture
def rest_proxy(lakana: LakanaServer) -> Iterator[FaultProxy]:
    """The HTTP fault layer in front of the session's REST server, for one test."""
    proxy = FaultProxy(lakana.uri).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def rest_catalog_properties(lakana: LakanaServer, rest_proxy: FaultProxy, tmp_path: Path) -> dict[str, str]:
    """pyiceberg properties of a new REST environment (tables under ``tmp_path/warehouse``), through the proxy."""
    return lakana.catalog_properties(tmp_path / "warehouse", uri=rest_proxy.uri)
