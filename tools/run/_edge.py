"""What every ``crucible-dispatch`` verb shares at its edge: the program's name
and the warning writer (run/commands.py and run/_commands_state.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TextIO

__all__ = ["PROG", "warner"]

PROG = "crucible-dispatch"


def warner(err: TextIO) -> Callable[[str], None]:
    """One warning line on ``err``, written so that a stderr nobody reads drops
    it instead of holding the dispatcher (crucible.run.session._mirror)."""
    # lazy: run.session._mirror is not loaded with this module; only warner() needs it
    from crucible.run.session._mirror import BoundedOut

    bounded: list[BoundedOut] = []

    def warn(message: str) -> None:
        line = f"{PROG}: warning: {message}\n"
        try:
            fd = err.fileno()
        except (AttributeError, OSError, ValueError):  # not a descriptor (a test's stream)
            err.write(line)
            err.flush()
            return
        err.flush()
        if not bounded:
            bounded.append(BoundedOut(fd))
        with contextlib.suppress(OSError):  # stalled or closed: the line is dropped
            bounded[0].write(line.encode("utf-8", "backslashreplace"))

    return warn
