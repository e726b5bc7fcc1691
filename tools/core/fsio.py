"""Hostile-path primitives: files and trees a tool reads or clears on behalf of
code it does not trust (a task's workspace, a state dir someone edited).

Open a regular file without following a final link and without blocking
(:func:`open_regular`), read at most N bytes (:func:`read_at_most`), remove a
whole tree, read-only directories included, at any depth (:func:`remove_tree`),
clear whatever occupies a path (:func:`clear_path`), list a tree with a depth
bound (:func:`walk_tree`). None recurses: a tree nested thousands deep costs a
list, never the interpreter's stack. Stage (capture, staging, the shared copies)
is their first user; any tool that must not trust a path can use them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from crucible.core.errors import OperationalError, UsageError

__all__ = [
    "NotRegular",
    "TooDeep",
    "clear_path",
    "kind_of",
    "make_dirs",
    "open_regular",
    "read_at_most",
    "read_named",
    "remove_tree",
    "walk_tree",
    "which",
]


def _open_up(directory: str) -> None:
    """Let us list and unlink in ``directory`` (it may have been left read-only).
    Never chmod a file: a staged file may be a hard link shared with other
    consumers, and unlinking it needs only its directory's permission."""
    with contextlib.suppress(OSError):
        os.chmod(directory, stat.S_IRWXU)


def _unlink(path: str, parent: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        _open_up(parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


#: times a directory is listed again when entries appeared in it after it was
#: listed (a process still writing, a daemon renaming entries within the tree)
_RELIST = 3


def _rmdir(directory: str) -> bool:
    """Remove an emptied directory; False when entries appeared in it since."""
    try:
        os.rmdir(directory)
    except FileNotFoundError:
        pass
    except PermissionError:  # its parent is read-only (rmtree's onerror did the same)
        _open_up(os.path.dirname(directory) or ".")
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(directory)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        return False
    return True


def remove_tree(path: Path | str) -> None:
    """Remove a file, a symlink (never followed) or a whole tree, read-only
    directories included; what is already gone is no error. Iterative: each
    directory is listed once, its files unlinked, its subdirectories pushed, and
    it is removed after them. Raises OSError for what cannot be removed even
    after its directory was opened up."""
    top = os.fspath(path)
    try:
        st = os.lstat(top)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(top)  # the top's own directory is not ours to open up
        return
    stack: list[tuple[str, bool]] = [(top, False)]
    relisted: dict[str, int] = {}
    while stack:
        directory, listed = stack.pop()
        if listed:
            if not _rmdir(directory):
                relisted[directory] = relisted.get(directory, 0) + 1
                if relisted[directory] > _RELIST:
                    os.rmdir(directory)  # raises: it keeps filling
                stack.append((directory, False))
            continue
        try:
            entries = _entries(directory)
        except FileNotFoundError:
            continue
        stack.append((directory, True))
        for name, is_dir in entries:
            child = os.path.join(directory, name)
            if is_dir:
                stack.append((child, False))
            else:
                _unlink(child, directory)


def _entries(directory: str) -> list[tuple[str, bool]]:
    """(name, is a directory, links not followed) of each entry; a directory we
    may not list or change is opened up first."""
    if not os.access(directory, os.R_OK | os.W_OK | os.X_OK, follow_symlinks=False):
        _open_up(directory)
    with os.scandir(directory) as it:
        return [(e.name, e.is_dir(follow_symlinks=False)) for e in it]


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


def make_dirs(path: Path, what: str | None = None) -> None:
    """``mkdir -p path``; an OSError as one OperationalError at ``path``:
    ``cannot create WHAT: reason`` (``cannot create: reason`` without ``what``)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        label = f"cannot create {what}" if what else "cannot create"
        raise OperationalError(f"{label}: {exc.strerror}", where=str(path)) from None


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


def read_named(
    path: Path,
    where: str,
    *,
    missing: str = "no such file",
    directory: str = "is a directory, not a file",
    cannot: str = "cannot read",
) -> bytes:
    """A whole input file the user named: missing or a directory is a usage error
    (exit 2), any other failure operational (exit 3), each one line at ``where``."""

    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UsageError(missing, where=where) from None
    except IsADirectoryError:
        raise UsageError(directory, where=where) from None
    except OSError as exc:
        raise OperationalError(f"{cannot}: {exc.strerror}", where=where) from None


def clear_path(path: Path) -> None:
    """Remove whatever occupies ``path`` (a file, a symlink — never followed —, a
    FIFO, or a whole directory tree a previous attempt left there): what
    :func:`remove_tree` does, its OSError one OperationalError."""
    try:
        remove_tree(path)
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


def which(name: str, path: str) -> str | None:
    """``shutil.which(name, path=path)`` on POSIX, without importing shutil (it
    loads zlib, bz2 and lzma: ~2 ms of each dispatcher worker's first task): the
    first ``dir/name`` along ``path`` that exists, is executable and is not a
    directory; ``name`` itself when it holds a ``/``; None if none is."""

    def usable(candidate: str) -> bool:
        return (
            os.path.exists(candidate)
            and os.access(candidate, os.F_OK | os.X_OK)
            and not os.path.isdir(candidate)
        )

    if os.path.dirname(name):
        return name if usable(name) else None
    if not path:
        return None
    seen: set[str] = set()
    for directory in path.split(os.pathsep):
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, name)
        if usable(candidate):
            return candidate
    return None
