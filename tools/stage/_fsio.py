"""Stage's own filesystem helpers: atomic writes with short temp names and
directory swaps. The hostile-path primitives capture and staging share
(open_regular, read_at_most, remove_tree, clear_path, walk_tree) are in
:mod:`crucible.core.fsio`.

Stage's temporaries start with ``@`` (never a task name, never an escaped key), so
the walkers over captured files skip them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from crucible.core import atomic
from crucible.core.atomic import fsync_dir
from crucible.core.errors import OperationalError
from crucible.core.fsio import remove_tree

__all__ = ["TMP_PREFIX", "swap_in_dir", "write_atomic"]

TMP_PREFIX = "@tmp-"


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644, durable: bool = True) -> None:
    """Temp file beside ``path`` (named ``@tmp-…``), fsync, rename, fsync the directory
    (``durable=False``: no fsync; the caller makes it durable).
    The parent is created only after a write fails (it exists for all but the
    first record of a run), and the write is then tried once more whatever made
    it fail: another worker may have created the parent in between."""
    try:
        atomic.write_bytes(path, data, mode=mode, tmp_prefix=TMP_PREFIX, durable=durable)
        return
    except OperationalError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
    atomic.write_bytes(path, data, mode=mode, tmp_prefix=TMP_PREFIX, durable=durable)


#: rename(2) of a directory onto something there: a non-empty directory
#: (ENOTEMPTY, or EEXIST elsewhere), a file or a symlink (ENOTDIR)
_OCCUPIED = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR)


def swap_in_dir(built: Path, target: Path, *, durable: bool = True) -> None:
    """Make ``built`` (a sibling of ``target``) become ``target`` atomically from a
    reader's view: the old tree (if any) is renamed aside, then removed.

    ``durable`` fsyncs the parent directory. Staged inputs skip it: they are laid
    down again for every attempt, and on ext4 a directory fsync would force out
    every file just written."""
    old: Path | None = None
    try:
        try:  # the common case: nothing there yet (an empty directory is replaced too)
            os.rename(built, target)
        except OSError as exc:
            if exc.errno not in _OCCUPIED:
                raise
            old = target.parent / f"{TMP_PREFIX}old-{os.getpid()}-{built.name[-8:]}"
            os.replace(target, old)
            os.replace(built, target)
        if durable:
            fsync_dir(target.parent)
    except OSError as exc:
        raise OperationalError(f"cannot replace {target}: {exc.strerror or exc}") from None
    if old is not None:
        remove_tree(old)
