"""The ``lakesink`` command line (one click group, :data:`main`).

- :mod:`lakesink.cli.main`: the group and its commands (imported when used: `lakesink --help` loads none of them);
- :mod:`lakesink.cli.common`: the options and helpers every command shares (catalog, table, durations);
- :mod:`lakesink.cli.render`: the format chosen once per run (``lakesink --json``), exit codes, the JSON error object,
  progress and text tables (rich);
- :mod:`lakesink.cli.output`: the output, human or JSON (:class:`~lakesink.cli.output.Output`);
- :mod:`lakesink.cli.audit`: history, show, diff, which, verify, report, publish;
- :mod:`lakesink.cli.maintenance`: maintain, compact, expire-snapshots, rewrite-manifests, forget-query,
  remove-orphan-files;
- :mod:`lakesink.cli.report`: the HTML page of ``lakesink report``.
"""

from lakesink.cli.main import main

__all__ = ["main"]
