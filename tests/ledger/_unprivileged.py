"""Run a function in a forked child as a user that obeys file permissions.

Root ignores permission bits, so tests of a read-only directory or an unreadable
file drop to ``nobody`` in a forked child (the interpreter and crucible are
already loaded, so the child needs no access to the venv under /root).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534


@dataclass(frozen=True)
class Finished:
    code: int
    stdout: str
    stderr: str


def shared_tempdir() -> Path:
    """A temp directory every user can traverse (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="ledger-test-"))
    d.chmod(0o755)
    return d


def run_unprivileged(func: Callable[[], int | None]) -> Finished:
    """``func()`` in a child (as ``nobody`` when we are root) with fd 1 and 2
    captured; its return value (or SystemExit code) is the exit code."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 70
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                # pytest's capture replaced sys.stdout/err; talk to the real fds
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(NOBODY)
                    os.setuid(NOBODY)
                try:
                    code = func() or 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return Finished(
            os.waitstatus_to_exitcode(status),
            out.read().decode("utf-8", "replace"),
            err.read().decode("utf-8", "replace"),
        )
