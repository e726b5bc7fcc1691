"""A directory on a tmpfs for a benchmark: one mounted for the run where that
is allowed (root), else one under /dev/shm (shared with the machine)."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs_dir(prefix: str) -> Iterator[tuple[Path, str]]:
    """Yields (directory, how it was had: for the printed figures)."""
    with tempfile.TemporaryDirectory(prefix=f"{prefix}tmpfs-") as tmp:
        mounted = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=8g", prefix.rstrip("-"), tmp],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        )
        if mounted:
            try:
                yield Path(tmp), "tmpfs mounted for the run"
            finally:
                subprocess.run(["umount", "-l", tmp], capture_output=True, check=False)
            return
    with tempfile.TemporaryDirectory(prefix=prefix, dir="/dev/shm") as tmp:
        yield Path(tmp), "tmpfs /dev/shm"
