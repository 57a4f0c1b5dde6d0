"""Fixtures of the catalogs people run in production: an Iceberg REST catalog server (lakana) behind the HTTP
fault layer, and AWS Glue (moto's server) with moto's S3. Loaded by tests/conftest.py as a pytest plugin.

``lakana`` starts one real REST server per test session (tests/support/rest_server.py builds its virtual environment
on first use); ``rest_proxy`` puts a fresh fault proxy (tests/support/http_faults.py) in front of it for one test, and
``rest_catalog_properties`` gives the test a new environment of its own, reached through that proxy. ``txn_server``,
``txn_proxy`` and ``txn_catalog_properties`` do the same with the tests' own REST server with ``transactions/commit``
(tests/support/txn_rest_server.py, in this process: no ``rest`` marker). Tests that
use the server are marked ``rest`` automatically (``make test-fast`` skips them: the first start builds the
server's environment).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.support.http_faults import FaultProxy
from tests.support.rest_server import LakanaServer
from tests.support.txn_rest_server import TxnRestServer

REST_FIXTURE = "lakana"


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)


def serving(server: S) -> Iterator[S]:
    """A fixture's started server (or proxy): yielded to the test, stopped after it, whatever the test did."""
    try:
        yield server
    finally:
        server.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REST_FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.rest)


@pytest.fixture(scope="session")
def lakana() -> Iterator[LakanaServer]:
    """One lakana REST catalog server for the test session (each test gets an environment of its own)."""
    yield from serving(LakanaServer.start())


@pytest.fixture
def rest_proxy(lakana: LakanaServer) -> Iterator[FaultProxy]:
    """The HTTP fault layer in front of the session's REST server, for one test."""
    yield from serving(FaultProxy(lakana.uri).start())


@pytest.fixture
def rest_catalog_properties(lakana: LakanaServer, rest_proxy: FaultProxy, tmp_path: Path) -> dict[str, str]:
    """pyiceberg properties of a new REST environment (tables under ``tmp_path/warehouse``), through the proxy."""
    return lakana.catalog_properties(tmp_path / "warehouse", uri=rest_proxy.uri)


# --- the REST catalog fixture server with transactions/commit (tests/support/txn_rest_server.py) -------------------


@pytest.fixture
def txn_server_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Keyword arguments of the ``txn_server`` (``@pytest.mark.parametrize("txn_server_options", [...], indirect=True)``)."""
    return dict(getattr(request, "param", {}))


@pytest.fixture
def txn_server(tmp_path: Path, txn_server_options: dict[str, Any]) -> Iterator[TxnRestServer]:
    """The tests' own REST catalog server (in this process) for one test: the ``transactions/commit`` that lakana lacks."""
    yield from serving(TxnRestServer(tmp_path / "txn-server", **txn_server_options).start())


@pytest.fixture
def txn_proxy(txn_server: TxnRestServer) -> Iterator[FaultProxy]:
    """The HTTP fault layer in front of the ``txn_server``."""
    yield from serving(FaultProxy(txn_server.uri).start())


@pytest.fixture
def txn_catalog_properties(txn_server: TxnRestServer, txn_proxy: FaultProxy) -> dict[str, str]:
    """pyiceberg properties of the ``txn_server``'s catalog, reached through the ``txn_proxy``."""
    return txn_server.catalog_properties(uri=txn_proxy.uri)


# --- AWS Glue: moto's server (Glue and S3 on one port), a fault proxy in front of its Glue -------------------------


@pytest.fixture(scope="session")
def moto_server() -> Iterator[Any]:
    """moto's server on 127.0.0.1 (S3 and Glue) for the test session."""
    from tests.support.s3 import S3Server

    yield from serving(S3Server.start())


def moto_proxy(moto_server: Any, check: Callable[[FaultProxy], None]) -> Iterator[FaultProxy]:
    """For a fixture: the HTTP fault layer in front of moto's server (Glue and S3), making one ``check`` moto does not."""
    proxy = FaultProxy(moto_server.endpoint).start()
    check(proxy)
    yield from serving(proxy)


@pytest.fixture
def glue_proxy(moto_server: Any) -> Iterator[FaultProxy]:
    """The HTTP fault layer in front of moto's Glue, enforcing Glue's optimistic lock (VersionId), which moto does not."""
    yield from moto_proxy(moto_server, FaultProxy.enforce_glue_version_id)


def glue_properties(moto_server: Any, glue_uri: str, **extra: str) -> dict[str, str]:
    """pyiceberg GlueCatalog properties: Glue at ``glue_uri``, the warehouse in a new bucket of moto's S3."""
    from tests.support.s3 import ACCESS_KEY, REGION, SECRET_KEY

    bucket = moto_server.create_bucket()
    return {
        "type": "glue",
        "glue.endpoint": glue_uri,
        "glue.region": REGION,
        "glue.access-key-id": ACCESS_KEY,
        "glue.secret-access-key": SECRET_KEY,
        "warehouse": f"s3://{bucket}/warehouse",
        **moto_server.properties(),
        **extra,
    }


@pytest.fixture
def glue_catalog_properties(moto_server: Any, glue_proxy: FaultProxy) -> dict[str, str]:
    return glue_properties(moto_server, glue_proxy.uri)
