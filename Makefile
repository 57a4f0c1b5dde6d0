# The two commands of the README. Both create .venv (Python >= 3.10, Java 17+ needed) on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(abspath $(VENV))/bin/python
# Spark's Python workers must run the same interpreter as the driver (see docs/quickstart.md)
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)
# Python keeps the bytecode it compiles (__pycache__, git-ignored): an environment that sets PYTHONDONTWRITEBYTECODE
# (this machine's does) made every process of a test run -- each Spark Python worker of each SIGKILLed job included --
# compile lakesink and the tests from source again (~0.2 CPU-s per worker import of the executor's writer, h-imports)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo routing-demo cdc-demo test test-long test-serial durations test-fast test-floor test-deploy jdbc-drivers lakana-server lint soak soak-routing soak-concurrency bench clean

# the test extra (everything: readers, PostgreSQL, S3, Spark Connect, lint tools; ~2.3 GB)
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# the demo extra only (lakesink's dependencies, DuckDB, moto; pyproject.toml): a stamp of its own, so that `make test`
# after `make demo` still installs the test extra, and `make demo` after `make test` installs nothing (the test
# extra holds the demo extra)
$(VENV)/.installed-demo: pyproject.toml
	@if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ]; then \
	  echo "$(VENV): the test extra, installed, holds the demo extra"; \
	else \
	  set -e; $(PYTHON) -m venv $(VENV); $(PY) -m pip install -q --upgrade pip; $(PY) -m pip install -q -e '.[demo]'; \
	fi
	touch $@

# make demo DEMO_ARGS=--s3: the same demo with the warehouse on a local S3-compatible server (moto)
demo: $(VENV)/.installed-demo
	$(PY) examples/demo.py $(DEMO_ARGS)

# one stream into many tables, SIGKILLed inside the multi-table commit (docs/routing.md); on the demo's environment
routing-demo: $(VENV)/.installed-demo
	$(PY) examples/routing_demo.py

# a database's Debezium change stream into one Iceberg table per source table, restarted halfway, every table checked
# against the database row for row (docs/cdc.md); on the demo's environment
cdc-demo: $(VENV)/.installed-demo
	$(PY) examples/cdc_database.py

# make test: everything but the soak, benchmark and deploy suites, on two pytest-xdist workers (TEST_WORKERS). Each
# worker is its own pytest process with its own Spark session, PostgreSQL server, lakana REST server, fault-point,
# commit-lock and LAKESINK_HOME folders (tests/conftest.py); --dist loadfile gives a worker whole test files (a file's
# fixtures and order stay as written), the slowest files first (tests/file_seconds.json, measured), the next file to
# whichever worker is free. The wall-time guards of the tests (pytest-timeout's limit, subprocess timeouts, waits)
# grow with the load (tests/support/timeouts.py). --durations=25: the 25 slowest tests at the end; every run also
# writes each test's seconds to .pytest-durations/ (make durations: the sums per test folder).
TEST_WORKERS ?= 2
test: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

# the minutes-long end-to-end runs make test leaves out (marker long: SIGKILL rounds against the REST and Glue servers,
# the routed and commit-point soak rounds, the PostgreSQL oracles, the benchmarks at toy size), on the same workers;
# .ci/run runs it as its own step, so every test still runs before anything lands
test-long: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25 -m "long and not soak and not benchmark and not deploy" $(PYTEST_ARGS)

# the same tests in one process, in collection order (to debug a failure: -x, --pdb, no workers)
test-serial: $(VENV)/.installed
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)

# the seconds of the last run (make test, test-serial, test-fast) per test folder, per worker, the slowest files;
# DURATIONS_ARGS="--save-order" also writes tests/file_seconds.json, the order in which make test hands out files
durations:
	$(PY) -m tests.support.durations $(DURATIONS_ARGS)

# the fast lane (~900 tests; 818 took 15.8 min of wall time on a shared 2-core machine under load 5-12, 2026-11-23):
# no Spark, no PostgreSQL server, no REST catalog server (lakana, marker rest), no waiting out timeouts -- table, executor,
# driver (SQLite; AWS Glue on moto's server and the tests' own in-process REST fixture server with transactions/commit),
# maintenance, audit, CLI, seam contract, executor/driver boundary and layout tests. `make test` runs everything it skips.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not spark and not postgres and not rest and not slow and not soak and not benchmark and not deploy" $(PYTEST_ARGS)

# The declared dependency floor: a virtual environment of its own with the OLDEST version of every dependency
# pyproject.toml allows (constraints-floor.txt), then the fast lane and one Spark exactly-once test on both entry
# points. A floor that cannot be installed or does not run fails here, not on a user's machine. The fast lane runs on
# TEST_WORKERS pytest-xdist workers (--dist loadfile, as make test; pytest-xdist's floor 3.5.0 is in the floor
# environment). Measured on a machine at load average ~20 (2 cores), serially: the environment about 20 min (pyspark
# 4.1.0 is built from its sdist), the fast lane 17 min, the Spark test 7 min; a quiet machine needs a fraction of that.
# .ci/run builds the environment in the background while lint and make test run.
FLOOR_VENV ?= .venv-floor
FLOOR_PY := $(abspath $(FLOOR_VENV))/bin/python
FLOOR_SPARK_TESTS ?= tests/sink/test_spark_sink.py::test_append_exactly_once_across_restarts
$(FLOOR_VENV)/.installed: pyproject.toml constraints-floor.txt
	rm -rf $(FLOOR_VENV)
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PY) -m pip install -q --upgrade pip
	$(FLOOR_PY) -m pip install -q -c constraints-floor.txt -e '.[test]'
	$(FLOOR_PY) -m pip freeze --exclude-editable > $(FLOOR_VENV)/versions.txt
	touch $@

test-floor: $(FLOOR_VENV)/.installed
	LAKESINK_FLOOR_VENV=1 $(FLOOR_PY) -m pytest -p no:cacheprovider tests/test_floor.py
	PYSPARK_PYTHON=$(FLOOR_PY) PYSPARK_DRIVER_PYTHON=$(FLOOR_PY) $(FLOOR_PY) -m pytest -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadfile \
	  -m "not spark and not postgres and not slow and not soak and not benchmark and not deploy" $(PYTEST_ARGS)
	PYSPARK_PYTHON=$(FLOOR_PY) PYSPARK_DRIVER_PYTHON=$(FLOOR_PY) $(FLOOR_PY) -m pytest -p no:cacheprovider \
	  -m spark $(FLOOR_SPARK_TESTS)

# The deployment tests (docs/deployment.md, marker "deploy"): Iceberg's Java engine (Spark 3.5 with
# Iceberg's own runtime, in a second virtual environment), a Spark standalone cluster, Spark Connect. On TEST_WORKERS
# pytest-xdist workers, --dist loadfile (a file's cluster, Connect server or Java engine serves its tests, as serially):
# each worker has its own PostgreSQL server and fault folder (tests/conftest.py); the cluster's master and workers,
# the Connect server and the Java engine's JVM listen on free ports of their own, in folders of their own.
JAVA_VENV ?= .venv-iceberg-java
$(JAVA_VENV)/.installed:
	$(PYTHON) -m venv $(JAVA_VENV)
	$(JAVA_VENV)/bin/python -m pip install -q 'pyspark==3.5.8' 'snowpark-connect-deps-iceberg==1.0.1'
	touch $@

# The Iceberg REST catalog server of the REST tests (tests/support/rest_server.py; marker "rest", part of `make test`):
# lakana-server in a virtual environment of its own. The tests build it themselves on first use; this target
# builds it ahead (about 2 minutes from pip's cache), migrates its template database and measures a start.
LAKANA_VENV ?= .venv-lakana
lakana-server: $(VENV)/.installed
	LAKESINK_LAKANA_VENV=$(abspath $(LAKANA_VENV)) $(PY) -m tests.support.rest_server

# Iceberg's JdbcCatalog needs the JDBC drivers: Debian's packages (installed when missing, as root)
jdbc-drivers:
	@test -f /usr/share/java/postgresql.jar -a -f /usr/share/java/sqlite-jdbc.jar || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)

test-deploy: $(VENV)/.installed $(JAVA_VENV)/.installed jdbc-drivers
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m deploy $(PYTEST_ARGS)

# the long kill -9 soak (docs/soak.md); the short version runs inside `make test`
soak: $(VENV)/.installed
	$(PY) -m tests.soak --rounds 50 --seeds 1,2,3 --entry both $(SOAK_ARGS)

# the kill -9 soak of option route-by (tests/soak/routing.py; its short version runs inside `make test`)
soak-routing: $(VENV)/.installed
	$(PY) -m tests.soak.routing --dir $(or $(SOAK_DIR),/tmp/lakesink-soak-routing) --entry both --rounds 12 $(SOAK_ARGS)
	$(PY) -m tests.soak.routing --dir $(or $(SOAK_DIR),/tmp/lakesink-soak-routing)-off --entry both --atomic off --rounds 8 $(SOAK_ARGS)
	$(PY) -m tests.soak.routing --dir $(or $(SOAK_DIR),/tmp/lakesink-soak-routing)-lookups --entry both --lookups \
	  --first-phase pause-kill@driver.after-swap --rounds 12 $(SOAK_ARGS)
	$(PY) -m tests.soak.routing --dir $(or $(SOAK_DIR),/tmp/lakesink-soak-routing)-upsert --entry both --upsert --rounds 8 $(SOAK_ARGS)

# the concurrency soak (docs/soak.md): per entry point, 20 minutes of a stream with maintenance=auto beside a
# pyiceberg writer, merge-on-read deletes, tags and remove-orphan-files --older-than 0 (about 50 minutes in all)
soak-concurrency: $(VENV)/.installed
	$(PY) -m tests.soak.concurrency --minutes 20 --entry both $(SOAK_ARGS)

# the benchmarks (docs/performance.md); e.g. make bench BENCH_ARGS="throughput --rows 1000000 --reps 5"
BENCH_ARGS ?= all
bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	PYTHONPATH=$(CURDIR) $(PY) -m benchmarks $(BENCH_ARGS)

# ruff, mypy strict, and the import contracts (import-linter, [tool.importlinter] in pyproject.toml: the layers,
# what Spark's Python workers may import, no import cycle, the driver's sub-packages, Spark-side writing commits
# nothing; docs/architecture.md)
lint: $(VENV)/.installed
	$(PY) -m ruff check lakesink tests examples benchmarks
	$(PY) -m mypy
	$(abspath $(VENV))/bin/lint-imports --no-cache --no-logo

clean:
	rm -rf $(VENV) $(JAVA_VENV) $(LAKANA_VENV) $(FLOOR_VENV) lakehouse demo-run routing-demo-run cdc-database-run .pytest_cache .pytest-durations .mypy_cache .ruff_cache
