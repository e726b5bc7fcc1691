"""Atomic file writes: temp file in the same directory, fsync, rename, fsync dir.

A reader sees the old file or the new one, never a half-written one; a failure
removes the temp file and leaves the old file untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from crucible.core import canon
from crucible.core.errors import OperationalError
from crucible.core.fdio import write_all

__all__ = ["TMP_PREFIX", "abandon", "atomic_file", "fsync_dir", "write_bytes", "write_json"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: temp files are named with a short fixed prefix: a name derived from the target
#: would overflow the 255-byte file-name limit for long (escaped) target names
TMP_PREFIX = ".tmp-"


def abandon(tmp: str, target: object, exc: BaseException) -> None:
    """After a failed write of ``tmp`` (the temp file meant to replace
    ``target``): remove it, and raise an OSError as one OperationalError naming
    ``target``; any other ``exc`` the caller re-raises. Called only on failure,
    so a fast writer keeps its happy path free of another call."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    if isinstance(exc, OSError):
        raise OperationalError(f"cannot write {target}: {exc.strerror or exc}") from None


@contextlib.contextmanager
def _replacing(
    tmp: str, target: str | os.PathLike[str], directory: str | os.PathLike[str], durable: bool
) -> Iterator[None]:
    """The body fills ``tmp``; then it replaces ``target`` (and the directory entry
    is made durable). Any failure removes ``tmp``; an OSError becomes one
    OperationalError naming ``target``."""
    try:
        yield
        os.replace(tmp, target)
        if durable:
            fsync_dir(directory)
    except BaseException as exc:
        abandon(tmp, target, exc)
        raise


#: the flags of tempfile.mkstemp's file
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _mkstemp(directory: str | os.PathLike[str], prefix: str) -> tuple[int, str]:
    """``tempfile.mkstemp(prefix=prefix, dir=directory)``: a new file (O_EXCL,
    mode 0600, the same flags) at ``prefix`` + a random name, its fd and absolute
    path; without importing tempfile, which loads shutil, random, bz2 and lzma
    (~3 ms of every dispatch's start-up, whose admission writes with this)."""
    for _ in range(100):
        name = os.path.abspath(os.path.join(directory, prefix + os.urandom(6).hex()))
        try:
            return os.open(name, _TEMP_FLAGS, 0o600), name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "No usable temporary file name found")


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str],
    mode: int = 0o644,
    *,
    tmp_prefix: str = TMP_PREFIX,
    durable: bool = True,
) -> Iterator[IO[bytes]]:
    """Yield a binary file; on clean exit it replaces ``path`` atomically.

    ``durable=False`` skips both fsyncs, for files that are rewritten on every
    attempt and need only atomicity (a reader never sees half a file)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = _mkstemp(directory, tmp_prefix)
    except OSError as exc:
        raise OperationalError(f"cannot write {target}: {exc.strerror}") from None
    with _replacing(tmp, target, directory, durable):
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)


def write_bytes(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    if_changed: bool = False,
    mode: int = 0o644,
    tmp_prefix: str = TMP_PREFIX,
    durable: bool = True,
) -> bool:
    """Write ``data`` atomically. With ``if_changed``, an identical file is left
    untouched (its mtime too, so Makefiles do not rebuild). Returns True if written.

    The same steps as :func:`atomic_file`, on the bare descriptor (no buffered
    file object, ``fchmod`` instead of a chmod by path): a dispatcher writes one
    of these per task."""
    if if_changed:
        try:
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    return False
        except OSError:
            pass
    target = os.fspath(path)
    directory = os.path.dirname(target) or "."
    try:
        fd, tmp = _mkstemp(directory, tmp_prefix)
    except OSError as exc:
        raise OperationalError(f"cannot write {target}: {exc.strerror}") from None
    with _replacing(tmp, target, directory, durable):
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return True


def write_json(path: str | os.PathLike[str], value: Any, *, if_changed: bool = False) -> bool:
    """Write the canonical JSON bytes of ``value`` atomically."""
    return write_bytes(path, canon.dumps(value), if_changed=if_changed)
