"""``python -m tests.soak``: the kill -9 soak (see docs/soak.md)."""

from __future__ import annotations

import signal
import sys
from types import FrameType

from tests.soak.runner import main


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # like Ctrl-C: the running job (a session of its own) is killed on the way out


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
