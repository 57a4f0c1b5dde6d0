# The two commands of the README. Both create .venv (Python >= 3.10, Java 17+ needed) on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(abspath $(VENV))/bin/python
# Spark's Python workers must run the same interpreter as the driver (see docs/quickstart.md)
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)

.PHONY: demo test test-fast test-deploy jdbc-drivers lint soak soak-concurrency bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# make demo DEMO_ARGS=--s3: the same demo with the warehouse on a local S3-compatible server (moto)
demo: $(VENV)/.installed
	$(PY) examples/demo.py $(DEMO_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# the fast lane (about 2 minutes: 554 tests, 85 s of CPU): no Spark, no PostgreSQL server, no waiting out timeouts --
# unit, commit (SQLite), audit, maintenance, seam contract and executor/driver boundary tests.
# `make test` runs everything it skips.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not spark and not postgres and not slow and not soak and not benchmark and not deploy" $(PYTEST_ARGS)

# The deployment tests (docs/deployment.md, marker "deploy"): Iceberg's Java engine (Spark 3.5 with
# Iceberg's own runtime, in a second virtual environment), a Spark standalone cluster, Spark Connect.
JAVA_VENV ?= .venv-iceberg-java
$(JAVA_VENV)/.installed:
	$(PYTHON) -m venv $(JAVA_VENV)
	$(JAVA_VENV)/bin/python -m pip install -q 'pyspark==3.5.8' 'snowpark-connect-deps-iceberg==1.0.1'
	touch $@

# Iceberg's JdbcCatalog needs the JDBC drivers: Debian's packages (installed when missing, as root)
jdbc-drivers:
	@test -f /usr/share/java/postgresql.jar -a -f /usr/share/java/sqlite-jdbc.jar || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java libxerial-sqlite-jdbc-java)

test-deploy: $(VENV)/.installed $(JAVA_VENV)/.installed jdbc-drivers
	$(PY) -m pytest -m deploy $(PYTEST_ARGS)

# the long kill -9 soak (docs/soak.md); the short version runs inside `make test`
soak: $(VENV)/.installed
	$(PY) -m tests.soak --rounds 50 --seeds 1,2,3 --entry both $(SOAK_ARGS)

# the concurrency soak (docs/soak.md): per entry point, 20 minutes of a stream with maintenance=auto beside a
# pyiceberg writer, merge-on-read deletes, tags and remove-orphan-files --older-than 0 (about 50 minutes in all)
soak-concurrency: $(VENV)/.installed
	$(PY) -m tests.soak.concurrency --minutes 20 --entry both $(SOAK_ARGS)

# the benchmarks (docs/performance.md); e.g. make bench BENCH_ARGS="throughput --rows 1000000 --reps 5"
BENCH_ARGS ?= all
bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	PYTHONPATH=$(CURDIR) $(PY) -m benchmarks $(BENCH_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check lakesink tests examples benchmarks
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(JAVA_VENV) lakehouse demo-run .pytest_cache .mypy_cache .ruff_cache
