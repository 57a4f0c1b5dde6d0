"""A real Iceberg REST catalog server for the tests: ``lakana-server==0.20.0`` on 127.0.0.1, a free port.

lakana is a FastAPI Iceberg REST catalog that enforces every commit requirement with one compare-and-swap
(stale commits get 409). It needs its own virtual environment (its pins differ from lakesink's): the first
use builds it in a folder of the user's cache that every checkout on the machine shares (:func:`venv_dir`; ``make
lakana-server`` builds ``.venv-lakana`` beside the repository, which the tests then use; override the folder with
``LAKESINK_LAKANA_VENV``), then runs its database migrations once and keeps the migrated SQLite
file as a template, so that later test sessions copy it instead of migrating again.

What the server needs (found by starting it as a new user would): ``LAKANA_DATABASE__URL``, ``lakana-server
migrate`` before the first start, ``LAKANA_HOST``/``LAKANA_PORT``, a bootstrap credential
(``LAKANA_BOOTSTRAP_PAT_KEY_ID`` without ``_``, ``LAKANA_BOOTSTRAP_PAT_SECRET``; the client token is
``lakana_pat_<id>_<secret>``) and an *environment* (``POST /api/v1/environments``), whose name is the REST
``prefix`` the client passes. Its limits: tables only in namespaces ``bronze``/``silver``/``gold``, no
client-chosen locations, no staged creates, no ``transactions/commit``, no vended credentials, an empty
``/v1/config`` (no endpoint list), 500 instead of 409 when its SQLite is locked for more than 5 s.

Run ``python -m tests.support.rest_server`` to build the environment and measure a start (``--install`` only builds).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port
from tests.support.timeouts import guard

REPO = Path(__file__).resolve().parents[2]
LAKANA_REQUIREMENT = "lakana-server==0.20.0"
ENV_VENV = "LAKESINK_LAKANA_VENV"
KEY_ID = "lakesinktests"
# not a real credential: a fixed bootstrap token of a throw-away server on loopback
SECRET = "lakesink-rest-SECRET-5a4b3c2d1e"
TOKEN = f"lakana_pat_{KEY_ID}_{SECRET}"
#: lakana accepts tables only in these namespaces
NAMESPACE = "bronze"
START_TIMEOUT_S = 300.0  # a hang guard, scaled with the load (tests/support/timeouts.py)
PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """The server could not bind the port it was given."""


def venv_dir() -> Path:
    """``$LAKESINK_LAKANA_VENV``; else ``.venv-lakana`` beside the repository when it was built (``make
    lakana-server``); else a folder of the user's cache (``$XDG_CACHE_HOME/lakesink``, default ``~/.cache/lakesink``)
    that every checkout on this machine shares, named after the requirement and the Python it is built with: a fresh
    clone does not pay the build again (54 s of pip on the 2-core machine, 85 s at load 3-5 inside make test)."""
    if os.environ.get(ENV_VENV):
        return Path(os.environ[ENV_VENV])
    local = REPO / ".venv-lakana"
    if (local / ".installed").exists():
        return local
    base = os.path.realpath(_base_python())
    key = hashlib.sha256(f"{LAKANA_REQUIREMENT}\0{base}\0{_python_version(base)}".encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lakesink"
    return cache / f"venv-{LAKANA_REQUIREMENT.replace('==', '-')}-{key}"


def _base_python() -> str:
    """The Python the server's virtual environment is built with."""
    return shutil.which("python3") or sys.executable


@functools.cache
def _python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True, text=True).stdout.strip()


def _python() -> Path:
    return venv_dir() / "bin" / "python"


def ensure_installed() -> Path:
    """Build the server's virtual environment (once; a file lock keeps parallel test runs from racing)."""
    folder = venv_dir()
    marker = folder / ".installed"
    if marker.exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not marker.exists():
            subprocess.run([_base_python(), "-m", "venv", "--clear", str(folder)], check=True)
            subprocess.run(
                [str(_python()), "-m", "pip", "install", "-q", LAKANA_REQUIREMENT], check=True, stdout=subprocess.DEVNULL
            )
            marker.touch()
    return folder


def _env(db: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKANA_", "PYICEBERG_", "VIRTUAL_ENV"))}
    env.update(
        LAKANA_DATABASE__URL=f"sqlite:///{db}",
        LAKANA_HOST="127.0.0.1",
        LAKANA_PORT=str(port),
        LAKANA_BOOTSTRAP_PAT_KEY_ID=KEY_ID,
        LAKANA_BOOTSTRAP_PAT_SECRET=SECRET,
        LAKANA_LOG__ACCESS="false",
        LAKANA_LOG__LEVEL="WARNING",
    )
    return env


def migrated_template() -> Path:
    """A migrated, empty server database (made once per virtual environment)."""
    template = venv_dir() / "migrated.db"
    if template.exists():
        return template
    with open(f"{venv_dir()}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not template.exists():
            partial = template.with_suffix(".partial")
            partial.unlink(missing_ok=True)
            subprocess.run(
                [str(venv_dir() / "bin" / "lakana-server"), "migrate"],
                env=_env(partial, 0),
                check=True,
                capture_output=True,
            )
            partial.rename(template)
    return template


@dataclass
class LakanaServer:
    """One running lakana server; each test gets an environment (REST prefix) of its own."""

    folder: Path
    port: int
    process: subprocess.Popen[bytes]
    start_s: float
    """Seconds from the process start to its first answer to ``GET /v1/config``."""
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> LakanaServer:
        ensure_installed()
        template = migrated_template()
        for attempt in range(PORT_ATTEMPTS):
            try:
                return cls._start_once(template)
            except PortTaken:
                # the free port was taken by another process between free_port() and the server's bind (a shared
                # machine, two pytest-xdist workers starting their servers): another port
                if attempt == PORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(cls, template: Path) -> LakanaServer:
        folder = Path(tempfile.mkdtemp(prefix="lakesink-lakana-"))
        db = folder / "lakana.db"
        shutil.copyfile(template, db)
        port = free_port()
        log = open(folder / "server.log", "wb")
        started = time.monotonic()
        process = subprocess.Popen(
            [str(venv_dir() / "bin" / "lakana-server")], env=_env(db, port), stdout=log, stderr=subprocess.STDOUT, cwd=folder
        )
        server = cls(folder=folder, port=port, process=process, start_s=0.0)
        limit = guard(START_TIMEOUT_S)
        deadline = started + limit
        while True:
            if process.poll() is not None:
                tail = server.log_tail()
                server.stop()
                if "address already in use" in tail.lower():
                    raise PortTaken(tail)
                raise RuntimeError(f"lakana-server exited with {process.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{server.uri}/v1/config", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                tail = server.log_tail()
                server.stop()
                raise RuntimeError(f"lakana-server did not answer within {limit:.0f} s: {tail}")
            time.sleep(0.1)
        server.start_s = time.monotonic() - started
        return server

    def log_tail(self, chars: int = 3000) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def _request(self, method: str, path: str, body: object | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.uri}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")

    def new_environment(self, warehouse: Path) -> str:
        """A new environment (the REST ``prefix``) whose tables live under ``warehouse`` (a local folder)."""
        warehouse.mkdir(parents=True, exist_ok=True)
        name = f"t{next(self._counter)}"
        self._request(
            "POST", "/api/v1/environments", {"name": name, "storage": {"scheme": "file", "root": f"file://{warehouse}"}}
        )
        return name

    def new_s3_environment(self, bucket: str, s3_properties: dict[str, str]) -> str:
        """A new environment whose tables live in ``s3://<bucket>/lake``; the server reaches S3 with ``s3_properties``."""
        name = f"t{next(self._counter)}"
        options = {k: v for k, v in s3_properties.items() if k.startswith("s3.")}
        self._request(
            "POST",
            "/api/v1/environments",
            {"name": name, "storage": {"scheme": "s3", "root": f"s3://{bucket}/lake", "options": options}},
        )
        return name

    def catalog_properties(self, warehouse: Path, *, uri: str | None = None) -> dict[str, str]:
        """pyiceberg catalog properties of a new environment (through ``uri``, e.g. a fault proxy, when given)."""
        prefix = self.new_environment(warehouse)
        return {"type": "rest", "uri": uri or self.uri, "token": TOKEN, "prefix": prefix}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.folder)


@contextlib.contextmanager
def running() -> Iterator[LakanaServer]:
    server = LakanaServer.start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    t0 = time.monotonic()
    ensure_installed()
    print(f"lakana-server environment: {venv_dir()} ({time.monotonic() - t0:.1f} s)")
    if "--install" in args:
        return 0
    t0 = time.monotonic()
    migrated_template()
    print(f"migrated template database: {time.monotonic() - t0:.1f} s")
    with running() as server:
        print(f"lakana-server answered after {server.start_s:.1f} s on {server.uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
