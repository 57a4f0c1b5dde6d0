"""Kill -9 soak: a streaming job into a lakesink table, SIGKILLed at random moments and restarted.

Run it with ``python -m tests.soak --rounds 50 --seeds 1,2,3`` (see docs/soak.md). The short
version runs inside the normal test command (tests/test_soak.py).
"""
