"""Filesystem helpers: atomic writes with short temp names, read-only trees,
directory swaps.

``crucible.core.atomic`` names its temp file after the target, which overflows
NAME_MAX for a 250-byte escaped key; these helpers use short temp names that
start with ``@`` (never a task name, never an escaped key).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from crucible.core.atomic import fsync_dir
from crucible.core.errors import OperationalError

__all__ = ["TMP_PREFIX", "remove_tree", "swap_in_dir", "write_atomic"]

TMP_PREFIX = "@tmp-"


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Temp file beside ``path``, fsync, rename, fsync the directory."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=directory)
    except OSError as exc:
        raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        fsync_dir(directory)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise


def _make_writable(func: object, path: str, exc: object) -> None:
    # rmtree onerror: a read-only directory cannot lose entries; open it up, retry.
    parent = os.path.dirname(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        os.chmod(path, stat.S_IRWXU)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def remove_tree(path: Path) -> None:
    """Remove a file or a tree, read-only directories included."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    elif sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=_make_writable)
    else:
        shutil.rmtree(path, onerror=_make_writable)


def swap_in_dir(built: Path, target: Path, *, durable: bool = True) -> None:
    """Make ``built`` (a sibling of ``target``) become ``target`` atomically from a
    reader's view: the old tree (if any) is renamed aside, then removed.

    ``durable`` fsyncs the parent directory. Staged inputs skip it: they are laid
    down again for every attempt, and on ext4 a directory fsync would force out
    every file just written."""
    old: Path | None = None
    try:
        if target.exists() or target.is_symlink():
            old = target.parent / f"{TMP_PREFIX}old-{os.getpid()}-{built.name[-8:]}"
            os.replace(target, old)
        os.replace(built, target)
        if durable:
            fsync_dir(target.parent)
    except OSError as exc:
        raise OperationalError(f"cannot replace {target}: {exc.strerror or exc}") from None
    if old is not None:
        remove_tree(old)
