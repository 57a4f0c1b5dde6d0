"""A real PostgreSQL server for the tests, started from the installed binaries in a temporary folder.

The server runs as the ``postgres`` user when the tests run as root (initdb refuses root), listens on
127.0.0.1 only, and is stopped (immediate mode) at the end of the test session.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise RuntimeError(
        "PostgreSQL server binaries not found (looked in /usr/lib/postgresql/*/bin and PATH): "
        "install them with 'apt-get install postgresql' (.ci/run does)"
    )


@dataclass
class PostgresServer:
    folder: Path
    port: int
    bin_dir: Path
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def _run(self, *args: str) -> None:
        cmd = [str(self.bin_dir / args[0]), *args[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, cwd="/")

    @classmethod
    def start(cls) -> PostgresServer:
        folder = Path(tempfile.mkdtemp(prefix="lakesink-pg-"))
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        server = cls(folder=folder, port=free_port(), bin_dir=_bin_dir())
        server._run("initdb", "-D", str(folder / "data"), "-A", "trust", "-U", "postgres")
        log = folder / "server.log"
        for attempt in range(5):
            # wal_level=logical: the change-data tests (tests/cdc) read a logical replication slot of their database
            options = (
                f"-p {server.port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
                " -c wal_level=logical -c max_replication_slots=20"
            )
            try:
                server._run("pg_ctl", "-D", str(folder / "data"), "-o", options, "-l", str(log), "-w", "start")
                break
            except subprocess.CalledProcessError:
                # the free port was taken by another process between free_port() and the bind (seen on a shared
                # machine: "could not bind IPv4 address: Address already in use"): another port
                if attempt == 4 or "Address already in use" not in log.read_text(errors="replace"):
                    raise
                server.port = free_port()
        return server

    def create_database(self) -> str:
        """A fresh database; returns its SQLAlchemy URI."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.new_database()}"

    def new_database(self) -> str:
        """A fresh database; returns its name."""
        name = f"lakesink_{next(self._counter)}"
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return name

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.folder / "data"), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
