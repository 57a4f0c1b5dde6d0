"""The JVM options of the short-lived Spark jobs the tests start as child processes (a job SIGKILLed and restarted), and
of each pytest worker's own Spark session (tests/conftest.py, the ``spark`` fixture).

Each such job is a fresh JVM that runs a few small micro-batches and dies: most of its CPU goes into Java's
start-up and the JIT compiling Spark's code paths once. ``-XX:TieredStopAtLevel=1`` (the quick C1 compiler only, no
C2) and the serial garbage collector (no parallel GC threads on 2 cores) cut the CPU time of one run of the soak's
job by about a third (tests/soak/job.py, 8 files of 50 rows: 34.7 s of CPU -> 23.7 s, measured on the loaded 2-core
machine with the process tree's rusage). What the job does, and every fault point it passes, is the same.

The test process's own session runs for the whole ``make test`` but spends it the same way: hundreds of small
streaming queries, each planned, code-generated and run once over a few rows, so the C2 compiler's work rarely pays
back. With these options (and :func:`worker_python`) two Spark test files ran in 85 CPU-s instead of 120-139 (the
process tree's CPU in a cgroup, 2026-11-25); a whole ``make test`` on the same machine, back to back: 21.5 minutes and
2,203 CPU-s before, 19.9-20.0 minutes and 2,006 CPU-s with them (-9 %).

Class data sharing (AppCDS): loading and verifying Spark's ~10,000 classes from its jars is most of the rest of a
start. :func:`ensure_archive` runs the soak's job once over a few small files with ``-XX:ArchiveClassesAtExit`` and
keeps the archive in a cache folder (``LAKESINK_JVM_CDS_DIR``, default ``<tmp>/lakesink-jvm-cds``), keyed by the java
binary, the Spark jars and :data:`JAVA_OPTIONS`; from then on :func:`short_lived` and :func:`submit_args` map it into
every job's JVM (``-XX:SharedArchiveFile``). A test session that has Spark tests writes it in the background at its
start (tests/conftest.py, :func:`start_background_build`; one process at a time: a lock file), and the jobs started
before it is there run without it. ``python -m tests.jobs.jvm`` writes it ahead. A job started while there is no
archive (or one the JVM cannot use: another classpath, java or jar) runs as before -- the JVM loads the classes from
the jars, silently (``-Xshare:auto``, the default); ``LAKESINK_JVM_CDS=0`` turns the archive off. Measurements: the
comments at :data:`JAVA_OPTIONS` and docs/soak.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ENV_CDS = "LAKESINK_JVM_CDS"  # "0": no class data sharing archive
ENV_CDS_DIR = "LAKESINK_JVM_CDS_DIR"  # where the archives are kept
ENV_CDS_DUMP = "LAKESINK_JVM_CDS_DUMP"  # set by ensure_archive for its one job: write the archive here at exit
# the JVM says nothing about the archive (a missing or unusable one included): the job's output stays as without it
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
REPO = Path(__file__).resolve().parents[2]
DUMP_TIMEOUT_S = 450.0  # a hang guard of the one job that writes the archive, scaled with the load


def _java() -> str | None:
    """The java binary spark-submit runs (bin/spark-class: $JAVA_HOME/bin/java, else java on the PATH)."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def archive_path() -> Path | None:
    """The archive of this java, these Spark jars and :data:`JAVA_OPTIONS` (None: archives off, or no java/Spark)."""
    if os.environ.get(ENV_CDS, "1") == "0":
        return None
    java = _java()
    try:
        import pyspark
    except ImportError:  # pragma: no cover - the jobs need pyspark anyway
        return None
    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if java is None or not jars.is_dir():
        return None
    key = hashlib.sha256()
    for path in (Path(java), *sorted(jars.iterdir())):
        st = path.stat()
        key.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    key.update(JAVA_OPTIONS.encode())
    folder = Path(os.environ.get(ENV_CDS_DIR) or Path(tempfile.gettempdir()) / "lakesink-jvm-cds")
    return folder / f"spark-{key.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """:data:`JAVA_OPTIONS`, plus the class data sharing archive when there is one (or the dump of ensure_archive)."""
    dump = os.environ.get(ENV_CDS_DUMP)
    if dump:
        return f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={dump} {QUIET}"
    try:
        archive = archive_path()
    except OSError:  # a jar or the java binary vanished while hashing: no archive, the job runs as before
        return JAVA_OPTIONS
    if archive is not None and archive.is_file():
        return f"{JAVA_OPTIONS} -XX:SharedArchiveFile={archive} {QUIET}"
    return JAVA_OPTIONS


def short_lived(builder: SparkSession.Builder) -> SparkSession.Builder:
    """``builder`` (a SparkSession.Builder, before getOrCreate) with the options of a short-lived driver JVM: PySpark
    starts the JVM with the builder's configuration, so the driver's Java options take effect (local mode: the
    executors are in the driver's JVM). Spark's Python processes run :func:`worker_python`: ``PYSPARK_PYTHON`` (the
    workers of executors, of the data source's planning and commits; PySpark reads it when the session starts) and
    ``PYSPARK_DRIVER_PYTHON`` (the JVM's look-up of data sources; this process is the driver already)."""
    os.environ.update(python_env())
    return builder.config("spark.driver.extraJavaOptions", java_options())


def python_env() -> dict[str, str]:
    """``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` of a Spark the tests start: :func:`worker_python` for both."""
    python = worker_python()
    return {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}


_WORKER_PYTHON = """#!/bin/sh
# Spark's Python processes of the tests' short-lived jobs, without Spark's pyspark.zip on their path
# (tests/jobs/jvm.py, worker_python): the installed pyspark, the same files, with their cached bytecode.
set -f
P=
IFS=:
for e in $PYTHONPATH; do
  case "$e" in
    {zip}) ;;
    *) P="${{P:+$P:}}$e" ;;
  esac
done
unset IFS
PYTHONPATH=$P
export PYTHONPATH
exec {python} "$@"
"""


def worker_python() -> str:
    """The Python of Spark's workers in a short-lived job: this interpreter, started without ``pyspark.zip`` on its
    path when that zip is the installed pyspark's own (a pip install: ``SPARK_HOME`` is the package's folder).

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on the path of every Python process it starts -- the
    daemon of each worker module (five in a run of the soak's job: the executors', the planners' and the commit
    runner's) and the workers it forks. Python cannot cache the bytecode of modules imported from a zip: each such
    process compiled pyspark's ~280 modules from source, 0.8-0.9 s of CPU more than from the installed package (0.2 s),
    about 4 CPU-s per run of the soak's job. A small shell script drops the zip and runs this interpreter; elsewhere
    (another Spark home) the workers run ``sys.executable`` as before."""
    try:
        import pyspark
    except ImportError:  # pragma: no cover - the jobs need pyspark anyway
        return sys.executable
    home = Path(pyspark.__file__).parent  # PySpark's Spark home (pyspark.find_spark_home), as Spark writes the path
    zip_path = home / "python" / "lib" / "pyspark.zip"
    spark_home = os.environ.get("SPARK_HOME")
    if not zip_path.is_file() or (spark_home and Path(spark_home).resolve() != home.resolve()):
        return sys.executable
    # the installed package's zip only (a standalone cluster's worker of another Spark home keeps its own)
    zips = "|".join(sorted({shlex.quote(str(zip_path)), shlex.quote(str(zip_path.resolve()))}))
    text = _WORKER_PYTHON.format(zip=zips, python=shlex.quote(sys.executable))
    folder = Path(tempfile.gettempdir()) / "lakesink-worker-python"
    script = folder / f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}.sh"
    if not script.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        partial = script.with_name(f"{script.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(script)  # whole or absent: another job may read it at once
    return str(script)


def local_session(conf: dict[str, str] | None = None) -> SparkSession:
    """The Spark session of a test's job process: local[2] with two shuffle partitions, no UI, the short-lived driver
    JVM's options; ``conf``: more of Spark's settings."""
    from pyspark.sql import SparkSession  # here: this module is imported where pyspark is not (tests/test_examples.py)

    builder = short_lived(SparkSession.builder.master("local[2]")).config("spark.ui.enabled", "false")
    for k, v in {"spark.sql.shuffle.partitions": "2", **(conf or {})}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def submit_args() -> str:
    """``PYSPARK_SUBMIT_ARGS`` that start the driver JVM with the same options, for a child process whose own code
    builds its session (a docs page's script, tests/test_docs.py): PySpark hands them to spark-submit."""
    return f'--driver-java-options "{java_options()}" pyspark-shell'


def ensure_archive() -> Path | None:
    """The class data sharing archive of the jobs, written first when there is none: the soak's job (tests/soak/job.py)
    run once over a few small files with ``-XX:ArchiveClassesAtExit``. Never waits for another process that is writing
    it (the other pytest-xdist worker): returns None at once. A failed dump leaves no archive (the jobs run as before)
    and is not retried in this process."""
    global _dump_failed
    archive = archive_path()
    if archive is None or archive.is_file() or _dump_failed:
        return archive if archive is not None and archive.is_file() else None
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{archive}.lock", "w") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another process writes it
        if archive.is_file():
            return archive
        _dump_failed = not _dump(archive)
    return archive if archive.is_file() else None


_dump_failed = False


def _dump(archive: Path) -> bool:
    from examples.demo import session_members
    from tests.support.helpers import write_json_input
    from tests.support.timeouts import guard

    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="lakesink-jvm-cds-") as tmp:
        folder = Path(tmp)
        write_json_input(folder / "input", files=4, rows_per_file=20)
        (folder / "faults").mkdir()
        env = dict(os.environ)
        env.update(
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            LAKESINK_HOME=str(folder / "lakehouse"),
            LAKESINK_FAULTS_DIR=str(folder / "faults"),
            LAKESINK_LOCK_DIR=str(folder / "locks"),
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
        )
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        env[ENV_CDS_DUMP] = str(partial)
        cmd = [sys.executable, "-m", "tests.soak.job", "--input", str(folder / "input")]
        cmd += ["--checkpoint", str(folder / "checkpoint"), "--table", "cds.events"]
        with open(folder / "job.log", "wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + guard(DUMP_TIMEOUT_S)
        try:
            # the JVM writes the archive when it exits, after the job's Python process: wait for the whole session
            while proc.poll() is None or session_members(proc.pid):
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
            ok = proc.returncode == 0 and partial.is_file() and partial.stat().st_size > 0
            if ok:
                partial.rename(archive)  # atomic: a job started meanwhile sees no archive or the whole one
            return ok
        finally:
            if proc.poll() is None or session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with contextlib.suppress(OSError):
                partial.unlink()


def start_background_build() -> subprocess.Popen[bytes] | None:
    """``python -m tests.jobs.jvm`` as a background process when there is no archive yet (None: there is one, or
    archives are off); :func:`stop_background_build` ends it. Its lock keeps a second one (the other worker) from
    writing too."""
    try:
        archive = archive_path()
    except OSError:
        return None
    if archive is None or archive.is_file():
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.jobs.jvm"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_background_build(proc: subprocess.Popen[bytes] | None) -> None:
    """End a build still running (SIGTERM: it kills its job and removes its partial archive, see :func:`main`)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    """Write the archive (when there is none), print where it is. SIGTERM ends it cleanly (its job killed)."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    archive = ensure_archive()
    took = time.monotonic() - started
    print(archive or "no archive (LAKESINK_JVM_CDS=0, no java/Spark, another process writes it, or the dump failed)")
    print(f"{took:.1f} s, load average {os.getloadavg()[0]:.1f}")
    return 0 if archive is not None else 1


if __name__ == "__main__":  # python -m tests.jobs.jvm
    sys.exit(main())
