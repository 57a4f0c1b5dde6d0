"""A real Spark standalone cluster on 127.0.0.1 for the tests: one master, two workers (1 core, 1g each).

pyspark ships no ``sbin/start-master.sh``; the daemons are started the way that script would, through
``$SPARK_HOME/bin/spark-class`` (SPARK_HOME: the installed pyspark package), each in its own process
group (niced: the machine is shared) and stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def daemon_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,  # executors' Python workers: the interpreter that has lakesink
        }
    )
    return env


@dataclass
class StandaloneCluster:
    folder: Path
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        cmd = ["nice", "-n", "10", str(spark_home() / "bin" / "spark-class"), *args]
        self.procs.append(
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=daemon_env(), cwd=self.folder, start_new_session=True)
        )

    @classmethod
    def start(cls, folder: Path, workers: int = 2, timeout: float = 300) -> StandaloneCluster:
        cluster = cls(folder=folder, port=free_port())
        cluster._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(cluster.port),
            "--webui-port",
            str(free_port()),
        )
        for i in range(workers):
            work = folder / f"work-{i}"
            work.mkdir()
            cluster._spawn(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                cluster.url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(work),
            )
        deadline = time.monotonic() + timeout
        while (folder / "master.log").read_text(errors="replace").count("Registering worker") < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in cluster.procs):
                logs = cluster.log_tails()
                cluster.stop()
                raise RuntimeError(f"the standalone cluster did not come up: {logs}")
            time.sleep(0.5)
        return cluster

    def log_tails(self) -> dict[str, str]:
        """The end of the master's and each worker's log, for a failure's message."""
        return {p.name: p.read_text(errors="replace")[-2000:] for p in self.folder.glob("*.log")}

    def executor_pids(self) -> list[int]:
        """Process ids of the executor JVMs the workers started (CoarseGrainedExecutorBackend)."""
        out = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    cmdline = (proc / "cmdline").read_bytes()
                    cwd = os.readlink(proc / "cwd")  # the worker starts its executors in its work dir
                except OSError:
                    continue
                if b"CoarseGrainedExecutorBackend" in cmdline and cwd.startswith(str(self.folder)):
                    out.append(int(proc.name))
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for pid in self.executor_pids():  # executors outlive a worker killed hard
            os.kill(pid, signal.SIGKILL)


def ancestors(pid: int) -> list[int]:
    """``pid`` and its parents, up to init."""
    out = []
    while pid > 1:
        out.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out
