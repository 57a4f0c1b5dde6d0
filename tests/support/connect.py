"""A real Spark Connect server on 127.0.0.1 for the tests, started with pyspark's own
``sbin/start-connect-server.sh --wait`` (foreground, in its own process group, niced).

The server's Python workers (foreachBatch functions, Python data sources) run ``PYSPARK_PYTHON``: the
interpreter that has lakesink. Stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.cluster import spark_home
from tests.support.net import free_port


@dataclass
class ConnectServer:
    folder: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, folder: Path, env: dict[str, str] | None = None, timeout: float = 300) -> ConnectServer:
        port = free_port()
        environment = {
            **os.environ,
            **(env or {}),
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(folder),
            "SPARK_PID_DIR": str(folder),
            "PYSPARK_PYTHON": sys.executable,
        }
        log = open(folder / "connect-server.log", "wb")  # noqa: SIM115 (closed with the process)
        cmd = [
            "nice",
            "-n",
            "10",
            str(spark_home() / "sbin" / "start-connect-server.sh"),
            "--wait",
            "--master",
            "local[2,4]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            "spark.driver.memory=1g",
            # the foreachBatch worker imports pyspark, pyiceberg and pyarrow before it connects back: on a
            # busy machine that takes longer than the default 15 s
            "--conf",
            "spark.python.authenticate.socketTimeout=180s",
        ]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=folder, start_new_session=True)
        server = cls(folder=folder, port=port, proc=proc)
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return server
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in folder.glob("*.log*"))
                raise RuntimeError(f"the Spark Connect server did not come up: {logs}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
