"""The seed of a short kill test's random choices (the moment of a random kill): a new one per run, printed.

A short test in ``make test`` hits every fault point once; where the kill moment is random, each run draws it from
a seed of its own, so that repeated runs (and CI) land the kill at different moments instead of the same one. The
seed is printed (pytest shows it with a failure's output) and named in the failure's message; ``LAKESINK_TEST_SEED``
replays it::

    LAKESINK_TEST_SEED=123456 .venv/bin/python -m pytest tests/sink/test_upserts_spark.py -k sigkill

The long soaks (``make soak``, ``make soak-routing``) take their seeds from their own options.
"""

from __future__ import annotations

import os
import random

ENV = "LAKESINK_TEST_SEED"


def run_seed(what: str) -> int:
    """``$LAKESINK_TEST_SEED`` when set (to reproduce a failure), else a new seed; printed with ``what``."""
    text = os.environ.get(ENV, "").strip()
    seed = int(text) if text else random.SystemRandom().randrange(1, 1_000_000)
    print(f"{what}: seed {seed} (reproduce: {ENV}={seed})", flush=True)
    return seed
