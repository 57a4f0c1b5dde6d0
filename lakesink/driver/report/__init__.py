"""A commit's numbers, after it landed (never failing it).

- :mod:`~lakesink.driver.report.metrics`: CommitMetrics, one batch's commit on one table as numbers; the REST spec's
  commit-report; where a commit's metrics go (the process's record, a REST catalog's metrics endpoint, Prometheus);
- :mod:`~lakesink.driver.report.prometheus`: option metrics=prometheus:[host:]port.
"""
