"""Restaging a recycled workspace in place (docs/spec/inputs.md 3.8).

Dispatch hands a passed fan-out instance's (or loop revision's) workspace to
the next unit of the same task instead of making a new one (run.md, "State
directory"). Its ``inputs/`` tree then already holds almost everything the
next unit is handed — the same names, the same hard links to the published
ancestor files — so it is rewritten where it stands rather than built anew:
no directory made, no inode allocated, no link call for an unchanged
ancestor file.

The previous task ran as the same user and may have changed anything in the
tree, so nothing found there is trusted: a value file is rewritten through the
same inode only when it is still a regular file with exactly one link (lstat,
then opened with O_NOFOLLOW | O_NONBLOCK and fstat'd to the same inode: a
symlink is never followed, a FIFO never opened); anything else at a staged
name — a symlink, a FIFO, a hard link (to a store or any file), a directory —
is removed and replaced by a fresh file. A kept ancestor file is one that is
a hard link to the current published inode, which :func:`publish` has just
checked (3.4). Names no longer staged are removed. Any failure falls back to
the fresh writer (a new tree renamed over ``inputs/``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from crucible.core.errors import OperationalError
from crucible.core.fdio import write_all
from crucible.core.fsio import clear_path
from crucible.stage._described import Described
from crucible.stage._fsio import TMP_PREFIX
from crucible.stage._share import ensure_dir, restage_units

__all__ = ["restage_in_place"]

_READONLY = 0o444
_OPEN_W = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_OPEN_R = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def restage_in_place(state: Path, d: Described, inputs_dir: Path, bound: int) -> int | None:
    """Make ``inputs_dir`` hold exactly what ``d`` describes; returns the bytes
    of files staged, or None when the tree there cannot be restaged (none, not a
    directory, or a write failed): the caller then writes a fresh one."""
    try:
        st = os.lstat(inputs_dir)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    wanted: set[str] = set()
    try:
        for rel in d.roots:
            ensure_dir(inputs_dir, rel)
            wanted.add(rel)
        used, laid = restage_units(state, d.units, inputs_dir, 0, bound, inputs_dir.parent)
        wanted.update(laid)
        for rel in d.dirs:
            ensure_dir(inputs_dir, rel)
            wanted.add(rel)
        base = str(inputs_dir)
        for rel, data in d.files:
            rewrite(f"{base}/{rel}", data)
            wanted.add(rel)
        for rel in list(wanted):  # every parent of a staged path is staged
            while "/" in rel:
                rel = rel.rpartition("/")[0]
                wanted.add(rel)
        _prune(base, "", wanted)
    except (OSError, OperationalError):
        return None
    return used


def rewrite(path: str, data: bytes) -> None:
    """``path`` holds ``data``, read-only: the same inode when it is a regular
    file with one link, else a new file in place of whatever stands there."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        fd = _open_same(path, st)
        if fd is not None:
            try:
                write_all(fd, data)  # from offset 0, then cut: the block is kept
                os.ftruncate(fd, len(data))
                os.fchmod(fd, _READONLY)
            finally:
                os.close(fd)
            return
    _replace(path, data)


def _open_same(path: str, st: os.stat_result) -> int | None:
    """``path`` opened for writing, if it is still the regular, singly linked
    inode ``st`` describes; else None."""
    try:
        fd = os.open(path, _OPEN_W)
    except PermissionError:  # 0444 and not root: open it read-only, chmod, reopen
        try:
            rfd = os.open(path, _OPEN_R)
        except OSError:
            return None
        try:
            if not _same_inode(os.fstat(rfd), st):
                return None
            os.fchmod(rfd, 0o600)
            fd = os.open(f"/proc/self/fd/{rfd}", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return None
        finally:
            os.close(rfd)
    except OSError:
        return None
    if _same_inode(os.fstat(fd), st):
        return fd
    os.close(fd)
    return None


def _same_inode(now: os.stat_result, then: os.stat_result) -> bool:
    return (
        stat.S_ISREG(now.st_mode)
        and now.st_nlink == 1
        and now.st_ino == then.st_ino
        and now.st_dev == then.st_dev
    )


def _replace(path: str, data: bytes) -> None:
    """A new read-only file at ``path``, renamed over whatever stands there (a
    directory is removed first)."""
    clear_dir = False
    with contextlib.suppress(FileNotFoundError):
        clear_dir = stat.S_ISDIR(os.lstat(path).st_mode)
    if clear_dir:
        clear_path(Path(path))
    tmp = f"{path.rpartition('/')[0]}/{TMP_PREFIX}restage"
    clear_path(Path(tmp))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _READONLY)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise
        clear_path(Path(path))  # a directory appeared meanwhile
        os.replace(tmp, path)


def _prune(base: str, rel: str, wanted: set[str]) -> None:
    """Remove every entry under ``base/rel`` that is not staged (links never
    followed); descend into staged directories."""
    top = f"{base}/{rel}" if rel else base
    with os.scandir(top) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        sub = f"{rel}/{name}" if rel else name
        if sub not in wanted:
            clear_path(Path(f"{base}/{sub}"))
        elif is_dir:
            _prune(base, sub, wanted)
