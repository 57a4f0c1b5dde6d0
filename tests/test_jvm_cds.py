"""The class data sharing archive of the tests' short-lived job JVMs (tests/jobs/jvm.py): mapped into every job when
there is one, never when it is turned off, and never a reason for a job to fail."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.jobs import jvm
from tests.support.timeouts import guard


class Builder:
    """Records what :func:`jvm.short_lived` configures (a SparkSession.Builder, before getOrCreate)."""

    def __init__(self) -> None:
        self.conf: dict[str, str] = {}

    def config(self, key: str, value: str) -> Builder:
        self.conf[key] = value
        return self


def options_of_a_job() -> tuple[str, str]:
    builder: Any = Builder()
    pythons = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    try:
        jvm.short_lived(builder)
        # and the job's Spark Python processes run without pyspark.zip (tests/sink/test_worker_imports.py)
        assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == jvm.worker_python()
    finally:  # this process's own Spark session keeps its Python
        for key, value in pythons.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return builder.conf["spark.driver.extraJavaOptions"], jvm.submit_args()


@pytest.fixture
def cds_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(jvm.ENV_CDS_DIR, str(tmp_path / "cds"))
    monkeypatch.delenv(jvm.ENV_CDS, raising=False)
    monkeypatch.delenv(jvm.ENV_CDS_DUMP, raising=False)
    return tmp_path / "cds"


def test_the_jobs_options_map_the_archive_when_there_is_one_and_not_when_turned_off(
    cds_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = jvm.archive_path()
    assert archive is not None and archive.parent == cds_dir and archive.name.endswith(".jsa")
    for options in options_of_a_job():  # no archive yet: the options of before
        assert jvm.JAVA_OPTIONS in options and "SharedArchiveFile" not in options
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"an archive")
    driver_options, submit = options_of_a_job()
    assert driver_options == f"{jvm.JAVA_OPTIONS} -XX:SharedArchiveFile={archive} {jvm.QUIET}"
    assert submit == f'--driver-java-options "{driver_options}" pyspark-shell'
    monkeypatch.setenv(jvm.ENV_CDS, "0")
    assert jvm.archive_path() is None
    assert options_of_a_job() == (jvm.JAVA_OPTIONS, f'--driver-java-options "{jvm.JAVA_OPTIONS}" pyspark-shell')
    assert jvm.start_background_build() is None  # turned off: nothing to write


def test_the_one_job_that_writes_the_archive_dumps_it_at_exit(cds_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.ENV_CDS_DUMP, str(cds_dir / "x.partial"))
    assert jvm.java_options() == f"{jvm.JAVA_OPTIONS} -XX:ArchiveClassesAtExit={cds_dir / 'x.partial'} {jvm.QUIET}"


def test_a_second_process_never_writes_the_archive_while_another_does(cds_dir: Path) -> None:
    """The other pytest-xdist worker: the lock is held, ensure_archive returns at once, without a job and without an
    archive (its jobs run as before)."""
    archive = jvm.archive_path()
    assert archive is not None
    archive.parent.mkdir(parents=True)
    with open(f"{archive}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        started = time.monotonic()
        assert jvm.ensure_archive() is None
        assert time.monotonic() - started < 5
    assert sorted(p.name for p in archive.parent.iterdir()) == [f"{archive.name}.lock"]


@pytest.mark.parametrize("archive", ["garbage", "missing"])
def test_java_starts_with_an_archive_it_cannot_use(tmp_path: Path, archive: str) -> None:
    """The JVM falls back to the jars, silently (-Xshare:auto): a broken or vanished archive never fails a job."""
    path = tmp_path / "spark.jsa"
    if archive == "garbage":
        path.write_bytes(os.urandom(4096))
    java = jvm._java()
    assert java is not None
    options = f"{jvm.JAVA_OPTIONS} -XX:SharedArchiveFile={path} {jvm.QUIET}".split()
    run = subprocess.run([java, *options, "-version"], capture_output=True, text=True, timeout=guard(60))
    assert run.returncode == 0, run.stderr
    assert "shar" not in run.stdout.lower() + run.stderr.replace("sharing)", "").lower(), run.stderr


@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_a_job_runs_with_the_archive_mapped_into_its_jvm(tmp_path: Path) -> None:
    """The soak's job (tests/soak/job.py) with the machine's archive (written first when there is none; or by this
    session's background build, waited for): its JVM maps the archive, and it writes every row once."""
    from examples.demo import session_members
    from tests.support.helpers import table_ids, write_json_input

    deadline = time.monotonic() + guard(450)
    archive = jvm.ensure_archive()
    while archive is None and time.monotonic() < deadline:  # the background build of this session holds the lock
        time.sleep(2)
        archive = jvm.ensure_archive()
    assert archive is not None, "the archive could not be written: run python -m tests.jobs.jvm to see why"
    ids = write_json_input(tmp_path / "input", files=4, rows_per_file=25)
    env = dict(os.environ, LAKESINK_HOME=str(tmp_path / "lakehouse"))
    # the job is this repository's module (tests.soak.job), run from tmp_path: the repository on its path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(jvm.REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    cmd = [sys.executable, "-m", "tests.soak.job", "--input", str(tmp_path / "input")]
    cmd += ["--checkpoint", str(tmp_path / "ck"), "--table", "cds.events"]
    with open(tmp_path / "job.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=log, start_new_session=True)
    mapped = False
    try:
        while proc.poll() is None:
            for pid in session_members(proc.pid):
                try:
                    mapped = mapped or str(archive) in Path(f"/proc/{pid}/maps").read_text()
                except OSError:
                    pass
            time.sleep(0.5)
        proc.wait(timeout=guard(300))
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "job.log").read_text()[-4000:]
    assert mapped, f"no process of the job mapped {archive}"
    from lakesink.driver import catalogs

    home = tmp_path / "lakehouse"
    props = {"type": "sql", "uri": f"sqlite:///{home}/catalog.db", "warehouse": f"file://{home}/warehouse"}
    table = catalogs.load("lakesink", props).load_table(("cds", "events"))
    assert sorted(table_ids(table).elements()) == sorted(ids), json.dumps(sorted(table_ids(table)))[:500]


# the job modules whose Spark session is no short-lived local driver JVM of this environment's Spark
NOT_SHORT_LIVED = {
    "connect_job.py": "a Spark Connect client: the server's JVM is started by tests/support/connect.py",
    "java_engine_server.py": "Spark 3.5 in a virtual environment of its own (other jars: the archive is not its own)",
}


def test_every_job_builds_its_session_with_the_short_lived_options() -> None:
    """Each Spark job the tests start in a process of its own (tests/jobs/) starts its driver JVM with :func:`jvm.short_lived`
    (the quick JIT, the serial GC, the archive): a job without it costs its full start-up on every run (issue 34)."""
    folder = Path(jvm.__file__).parent
    builds = [path for path in sorted(folder.glob("*.py")) if "SparkSession.builder" in path.read_text()]
    missing = [path.name for path in builds if "short_lived(" not in path.read_text() and path.name not in NOT_SHORT_LIVED]
    assert missing == [], f"tests/jobs/ modules that build a Spark session without jvm.short_lived(): {missing}"


@pytest.mark.spark
def test_the_test_processs_own_session_runs_with_the_short_lived_options(spark: Any) -> None:
    """Each pytest worker's own Spark session (tests/conftest.py) runs its JVM with the jobs' options and its Python
    workers without pyspark.zip: without them the tests of that session cost about a third more CPU (issue 34)."""
    arguments = [
        str(a) for a in spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    ]
    assert set(jvm.JAVA_OPTIONS.split()) <= set(arguments), arguments
    assert spark.sparkContext.pythonExec == jvm.worker_python()
