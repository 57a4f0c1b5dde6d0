# The two commands of the README. Both create .venv (Python >= 3.10, Java 17+ needed) on first use.
VENV ?= .venv
PYTHON ?= python3
PY := $(abspath $(VENV))/bin/python
# Spark's Python workers must run the same interpreter as the driver (see docs/quickstart.md)
export PYSPARK_PYTHON := $(PY)
export PYSPARK_DRIVER_PYTHON := $(PY)

.PHONY: demo test test-fast lint soak bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) examples/demo.py

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

# the fast lane (under a minute on a quiet machine): no Spark, no PostgreSQL server, no waiting out timeouts --
# unit, commit (SQLite), audit, maintenance, seam contract and executor/driver boundary tests.
# `make test` runs everything it skips.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -m "not spark and not postgres and not slow and not soak and not benchmark" $(PYTEST_ARGS)

# the long kill -9 soak (docs/soak.md); the short version runs inside `make test`
soak: $(VENV)/.installed
	$(PY) -m tests.soak --rounds 50 --seeds 1,2,3 --entry both $(SOAK_ARGS)

# the benchmarks (docs/performance.md); e.g. make bench BENCH_ARGS="throughput --rows 1000000 --reps 5"
BENCH_ARGS ?= all
bench: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[bench]'
	PYTHONPATH=$(CURDIR) $(PY) -m benchmarks $(BENCH_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check lakesink tests examples benchmarks
	$(PY) -m mypy

clean:
	rm -rf $(VENV) lakehouse demo-run .pytest_cache .mypy_cache .ruff_cache
