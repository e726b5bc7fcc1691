"""Filesystem helpers: atomic writes with short temp names, read-only trees,
directory swaps, and the hostile-path primitives capture and staging share:
open a regular file without following links and without blocking
(:func:`open_regular`), read at most N bytes (:func:`read_at_most`), clear
whatever occupies a path (:func:`clear_path`), walk a tree iteratively with a
depth bound (:func:`walk_tree`).

Stage's temporaries start with ``@`` (never a task name, never an escaped key), so
the walkers over captured files skip them.

``open_regular``, ``read_at_most`` and ``clear_path`` belong in ``crucible.core``
once its owner takes them (compile ``-o``, ledger and report need the same).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from crucible.core import atomic
from crucible.core.atomic import fsync_dir
from crucible.core.errors import OperationalError

__all__ = [
    "TMP_PREFIX",
    "NotRegular",
    "TooDeep",
    "clear_path",
    "kind_of",
    "open_regular",
    "read_at_most",
    "remove_tree",
    "swap_in_dir",
    "walk_tree",
    "write_atomic",
]

TMP_PREFIX = "@tmp-"


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Temp file beside ``path`` (named ``@tmp-…``), fsync, rename, fsync the directory.
    The parent is created only after a write fails (it exists for all but the
    first record of a run), and the write is then tried once more whatever made
    it fail: another worker may have created the parent in between."""
    try:
        atomic.write_bytes(path, data, mode=mode, tmp_prefix=TMP_PREFIX)
        return
    except OperationalError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
    atomic.write_bytes(path, data, mode=mode, tmp_prefix=TMP_PREFIX)


def _make_writable(func: object, path: str, exc: object) -> None:
    # rmtree onerror: a read-only directory cannot lose entries; open it up, retry.
    # Never chmod a file: a staged file may be a hard link shared with other
    # consumers, and unlinking it needs only its directory's permission.
    parent = os.path.dirname(path)
    is_dir = os.path.isdir(path) and not os.path.islink(path)
    with contextlib.suppress(OSError):
        os.chmod(parent, stat.S_IRWXU)
        if is_dir:
            os.chmod(path, stat.S_IRWXU)
    if is_dir:
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


# -- hostile paths ---------------------------------------------------------------


class NotRegular(Exception):
    """A path that must be a regular file is not one (or could not be opened as
    one); ``why`` says what it is, e.g. ``"is a FIFO, not a regular file"``."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def kind_of(mode: int) -> str:
    """``"a FIFO"``, ``"a directory"``, … for a non-regular ``st_mode``."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "a special file"


#: never follow a final symlink, never wait for a FIFO's writer or a device,
#: never acquire a controlling terminal
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def open_regular(path: str | os.PathLike[str]) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading only if it is a regular file: a final symlink is
    not followed, a FIFO or device is never opened (lstat first) and never waited
    on (O_NONBLOCK, for one swapped in after the lstat), and what was opened is
    checked again with fstat. Returns (fd, its stat); raises :class:`NotRegular`
    (what the path is) or OSError (FileNotFoundError when it is missing)."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"is {kind_of(st.st_mode)}, not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # swapped for a symlink after the lstat
            raise NotRegular("is a symlink, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"is {kind_of(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_at_most(fd: int, limit: int) -> bytes:
    """Everything ``fd`` holds, if that is at most ``limit`` bytes; otherwise
    OverflowError. Reads at most ``limit + 1`` bytes whatever the file claims its
    size is (a file that grows, a /proc file that says 0)."""
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        chunk = os.read(fd, min(limit + 1 - got, 1 << 20))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
    raise OverflowError(f"holds more than {limit} bytes")


def clear_path(path: Path) -> None:
    """Remove whatever occupies ``path`` (a file, a symlink — never followed —, a
    FIFO, or a whole directory tree a previous attempt left there)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OperationalError(f"cannot clear {path}: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(st.st_mode):
            remove_tree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OperationalError(f"cannot clear {path}: {exc.strerror or exc}") from None


class TooDeep(Exception):
    """A tree nested deeper than a walk's bound; ``rel`` is where it went too deep."""

    def __init__(self, rel: str, bound: int) -> None:
        super().__init__(rel)
        self.rel = rel
        self.bound = bound


def walk_tree(
    top: str, *, max_depth: int, prune_top: Callable[[str], bool] | None = None
) -> list[str]:
    """Relative paths of every entry under ``top`` (directories before their
    contents, names sorted), never following symlinks, without recursion (so a
    tree nested thousands deep costs a list, not the interpreter's stack).

    ``prune_top`` says which top-level names not to list or enter. Raises
    :class:`TooDeep` past ``max_depth`` levels and OSError when a directory
    cannot be listed (e.g. renamed away mid-walk)."""
    out: list[str] = []
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        rel_dir, depth = stack.pop()
        path = os.path.join(top, rel_dir) if rel_dir else top
        with os.scandir(path) as it:
            entries = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
        subdirs: list[str] = []
        for name, is_dir in entries:
            if not rel_dir and prune_top is not None and prune_top(name):
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            out.append(rel)
            if is_dir:
                if depth + 1 >= max_depth:
                    raise TooDeep(rel, max_depth)
                subdirs.append(rel)
        stack.extend((d, depth + 1) for d in reversed(subdirs))
    return out
