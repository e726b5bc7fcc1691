"""The cache directory's file primitives, shared by the store
(:mod:`crucible.run.cache._store`) and the declared-reads keyer
(:mod:`crucible.run.cache._reads`): a store file's digest read without
following a link, and directories made one real component at a time."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path

from crucible.core import digest

__all__ = ["READ", "file_digest", "real_dirs"]

#: store files up to this size are read with one read(2)
_SMALL = 1 << 16
#: O_NOFOLLOW: a symlink is never a store file (ELOOP); O_NONBLOCK: a FIFO
#: planted in the store must not hang the reader
READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_NOATIME = getattr(os, "O_NOATIME", 0)


def file_digest(path: str | os.PathLike[str]) -> str:
    """``digest.of_file`` of a regular file, with one ``read`` for a small one:
    most store files (every restored record) are a few hundred bytes, and a
    buffered read of the 1 MiB chunks of_file asks for allocates (and faults
    in) 1 MiB each time: ~50 us per hit, measured. Opened with O_NOATIME where
    the owner may (a first read of a file would otherwise dirty its inode for
    atime, under relatime: ~20 us more, and one more inode for the group
    commit to write). A symlink, FIFO or directory at ``path`` is an OSError:
    a link planted in the store is never read, kept or laid as a store file."""
    try:
        fd = os.open(path, READ | _NOATIME)
    except PermissionError:  # O_NOATIME: not the file's owner
        fd = os.open(path, READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        size = st.st_size
        if size <= _SMALL:
            data = os.read(fd, size + 1)
            if len(data) == size:  # else it changed while read: the careful way
                return digest.of_bytes(data)
            os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "rb", closefd=False) as f:  # the fd opened O_NOFOLLOW
            return f"sha256:{hashlib.file_digest(f, 'sha256').hexdigest()}"
    finally:
        os.close(fd)


def real_dirs(base: Path, path: str | Path, made: set[str]) -> None:
    """``mkdir -p`` of ``path`` under the cache directory ``base``, one
    component at a time, each one a real directory before the next is made in
    it: a symlink planted at a component (``files``, ``files/sha256/ab``,
    ``last/<task>``) would take the writes outside the cache, so it is an
    OSError (ENOTDIR), not followed. Each component is checked once per
    process (``made`` holds the ones checked, as strings): a recording run
    makes one ``last/<task>`` per task, and walking ``last`` again for each
    (through pathlib) was a fifth of recording a unit. ValueError when
    ``path`` is not under ``base``."""
    target = str(path)
    if target in made:
        return
    root = str(base)
    if root not in made:
        base.mkdir(parents=True, exist_ok=True)  # the directory named: followed as named
        made.add(root)
    if target == root:
        return
    if not target.startswith(root + "/"):
        raise ValueError(f"{target} is not under {root}")
    current = root
    for part in target[len(root) + 1 :].split("/"):
        current = f"{current}/{part}"
        if current in made:
            continue
        with contextlib.suppress(FileExistsError):
            os.mkdir(current)
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            raise OSError(errno.ENOTDIR, "not a directory (a symlink is never followed)", current)
        made.add(current)
