"""The change-data tests' source: the oracle's workload (tests/support/cdc_oracle.py) run once per test session on the
session's PostgreSQL server (wal_level=logical), its change files shared by the tests that read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import cdc_oracle
from tests.support.pg import PostgresServer


@pytest.fixture(scope="session")
def captured(postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The workload, run once: (the database's DSN, the folder of its change files). Tests only read both."""
    dsn = f"postgresql://postgres@127.0.0.1:{postgres.port}/{postgres.new_database()}"
    folder = tmp_path_factory.mktemp("cdc")
    cdc_oracle.run_workload(dsn, folder, rounds=cdc_oracle.ROUNDS)
    return dsn, folder
