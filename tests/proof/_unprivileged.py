"""Run a command's ``main`` in a forked child as a user that obeys file permissions.

The pattern of tests/ledger/_unprivileged.py: root ignores permission bits, so a
test of an unreadable bundle drops to ``nobody`` in a forked child (the interpreter
and crucible are already loaded; the child needs no access to the venv under /root).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.ledger._unprivileged import Finished, run_unprivileged

__all__ = ["Finished", "run_unprivileged", "shared_tempdir"]


@contextmanager
def shared_tempdir() -> Iterator[Path]:
    """A temp directory every user can traverse (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="proof-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        for dirpath, dirs, _files in os.walk(d):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)  # so rmtree can enter
        shutil.rmtree(d, ignore_errors=True)
