"""lakesink's benchmark harness (issue 5): ``python -m benchmarks throughput|commit-path|memory|rate|all``.

Not part of the default tests (see docs/performance.md for the commands and the current numbers).
Each benchmark writes ``docs/performance/<name>.json`` (and PNG plots); ``report`` renders
``docs/performance.md`` from whatever JSON files are there.
"""
