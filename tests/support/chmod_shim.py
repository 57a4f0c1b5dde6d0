"""Kill Spark's JVM at the exact moment it writes a given checkpoint file (a real SIGKILL, no mock).

pip's pyspark ships no ``libhadoop.so``, so Hadoop's local filesystem sets the permission of every file
it creates by forking ``chmod <mode> <path>`` (found through the JVM's ``PATH``; FACTS.md measures the
cost). Spark writes each checkpoint file as a temp file ``.<name>.<uuid>.tmp`` plus its checksum file
``..<name>.<uuid>.tmp.crc`` and renames both afterwards, so the ``chmod`` of the checksum file runs while
both temp files exist and before the rename. A ``chmod`` of our own first on the JVM's ``PATH`` can
therefore SIGKILL its parent (the JVM) right there, the way a crash at that moment would.

The shim is armed by a file: :func:`arm` writes a shell ``case`` pattern into it; the first ``chmod``
of a path matching it SIGKILLs the JVM, removes the arm file and leaves ``<arm>.fired`` holding the
path. Unarmed, it is a plain ``chmod``. The test that relies on it fails loudly when the shim never
fires (a pyspark with native Hadoop libraries would not fork ``chmod``).
"""

from __future__ import annotations

import os
from pathlib import Path

_SCRIPT = """#!/bin/sh
# lakesink tests: Hadoop forks chmod for every file it creates; SIGKILL the JVM at an armed path
arm="$LAKESINK_CHMOD_SHIM_ARM"
if [ -n "$arm" ] && [ -f "$arm" ]; then
  pattern=$(cat "$arm")
  for target in "$@"; do
    case "$target" in
      $pattern)
        if mv "$arm" "$arm.firing" 2>/dev/null; then
          printf '%s\\n' "$target" > "$arm.fired"
          rm -f "$arm.firing"
          kill -9 "$PPID"
          exit 1
        fi
        ;;
    esac
  done
fi
exec /bin/chmod "$@"
"""

ENV_ARM = "LAKESINK_CHMOD_SHIM_ARM"

# the checksum of a temp file of the offset log: both temp files exist, neither is renamed yet
OFFSET_LOG_WRITE = "*/offsets/..[0-9]*.tmp.crc"
FIRST_OFFSET_LOG_WRITE = "*/offsets/..0.*.tmp.crc"


def install(folder: Path) -> Path:
    """Write the shim into ``folder/bin`` and return that folder (to put first on the JVM's ``PATH``)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "chmod"
    script.write_text(_SCRIPT)
    script.chmod(0o755)
    return bin_dir


def environment(env: dict[str, str], bin_dir: Path, arm_file: Path) -> dict[str, str]:
    """``env`` with the shim first on ``PATH`` and armed by ``arm_file`` (when that file exists)."""
    out = dict(env)
    out["PATH"] = os.pathsep.join([str(bin_dir), out.get("PATH", os.defpath)])
    out[ENV_ARM] = str(arm_file)
    return out


def arm(arm_file: Path, pattern: str) -> None:
    """SIGKILL the JVM at the first ``chmod`` of a path matching the shell pattern ``pattern``."""
    Path(f"{arm_file}.fired").unlink(missing_ok=True)
    arm_file.write_text(pattern)


def fired(arm_file: Path) -> str | None:
    """The path at which the shim killed the JVM, or None."""
    marker = Path(f"{arm_file}.fired")
    return marker.read_text().strip() if marker.exists() else None
