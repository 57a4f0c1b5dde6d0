"""Wall-time guards of the tests, scaled with the machine's load.

A guard (pytest-timeout's limit of a test, a subprocess's ``timeout=``, :func:`tests.support.helpers.wait_until`)
is there to end a hang, never to assert a speed: on a loaded machine (``make test`` runs two pytest-xdist workers,
and a shared CI machine runs other jobs) it must not be what fails. :func:`guard` multiplies a guard's seconds by
:func:`scale`: the 1-minute load average per core, at least 2 (the two workers of ``make test`` alone keep both cores
busy) and at most 8 (a real hang still ends). ``LAKESINK_TEST_TIME_SCALE`` fixes the factor (e.g. ``1`` to debug a
hang quickly). tests/conftest.py fixes the factor at the start of each test (:func:`pin`), so that a test's pytest
limit and the guards inside it grow together, and pytest's limit stays the larger.
"""

from __future__ import annotations

import os

ENV_SCALE = "LAKESINK_TEST_TIME_SCALE"
MIN_SCALE = 2.0
MAX_SCALE = 8.0

_pinned: float | None = None


def measured_scale() -> float:
    """The factor for the load of this moment (or ``LAKESINK_TEST_TIME_SCALE``)."""
    fixed = os.environ.get(ENV_SCALE)
    if fixed:
        return float(fixed)
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # pragma: no cover - no load average on this platform
        per_core = MIN_SCALE
    return min(MAX_SCALE, max(MIN_SCALE, per_core))


def pin() -> float:
    """Fix the factor for the test that starts now (tests/conftest.py); returns it."""
    global _pinned
    _pinned = measured_scale()
    return _pinned


def scale() -> float:
    return _pinned if _pinned is not None else measured_scale()


def guard(seconds: float) -> float:
    """``seconds`` of a hang guard, scaled for the load (see the module's docstring)."""
    return seconds * scale()
