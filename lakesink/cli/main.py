"""The ``lakesink`` command line: one click group, one sub-command per task.

    lakesink history | show | diff | which | verify | report | publish | wait   (lakesink.cli.audit)
    lakesink maintain | compact | expire-snapshots | rewrite-manifests |
             forget-query | remove-orphan-files | checkpoint-clean        (lakesink.cli.maintenance)

Tables are found the way the sink finds them (:mod:`lakesink.cli.common`). Output is for humans unless ``--json``
is given (:mod:`lakesink.cli.output`). Exit status: 0 on success, 1 when the command failed (a clear message on
stderr), 2 for a usage error. A new command is a function in the module of its kind, added to the group here.
"""

from __future__ import annotations

import click

from lakesink.cli import audit, maintenance


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lakesink")
def main() -> None:
    """Maintenance of the Iceberg tables lakesink writes."""


for _command in (
    audit.history_command,
    audit.show_command,
    audit.diff_command,
    audit.which_command,
    audit.verify_command,
    audit.report_command,
    audit.publish_command,
    audit.wait_command,
    maintenance.maintain_command,
    maintenance.compact_command,
    maintenance.expire_snapshots_command,
    maintenance.rewrite_manifests_command,
    maintenance.forget_query_command,
    maintenance.remove_orphan_files_command,
    maintenance.checkpoint_clean_command,
):
    main.add_command(_command)
