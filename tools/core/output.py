"""Writing a command's output: all of it or a failure, never a hang.

Two primitives every tool's output goes through (docs/spec/cli.md, "Output"):

- :func:`write_stream` writes bytes to an open stream (stdout) with the
  short-write loop on its descriptor. A buffered ``write`` of a large buffer
  reports a short count when the disk fills and the rest is lost silently;
  here the failure is an :class:`OperationalError` (exit 3).
- :func:`write_output` writes bytes to a path the user named (``-o FILE``,
  ``--html FILE``): a regular file (or a new one) is replaced atomically; a
  device, a FIFO or a socket is written through as a stream, never renamed
  over; a FIFO with no reader is refused instead of blocking (exit 2).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import IO

from crucible.core.errors import OperationalError, UsageError
from crucible.core.fdio import write_all

__all__ = ["write_output", "write_stream"]


def write_stream(out: IO[bytes], data: bytes, *, name: str = "<stdout>") -> None:
    """Write all of ``data`` to ``out`` or raise: EPIPE stays a
    :class:`BrokenPipeError` (the edge ends quietly), any other failure is an
    :class:`OperationalError` naming ``name``.

    ``BufferedWriter.write`` hands a buffer larger than its own straight to one
    ``write(2)`` and returns that call's short count (a full disk, a file-size
    limit) without raising: ``> f`` would end truncated and exit 0. So the
    stream's buffer is flushed and the bytes go through :func:`fdio.write_all`
    on its descriptor; a stream without one (a test's BytesIO) is written as it
    is, and a short count from it is a failure too."""
    try:
        try:
            fd = out.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            fd = -1
        if fd < 0:
            if out.write(data) not in (None, len(data)):
                raise OSError(errno.EIO, "short write")
            out.flush()
        else:
            out.flush()
            write_all(fd, data)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OperationalError(f"I/O error: {exc.strerror or exc}", where=name) from None


def write_output(path: str, data: bytes, *, if_changed: bool = False, mode: int = 0o644) -> bool:
    """Write ``data`` to the file the user named ``path``; True if written.

    - missing, or a regular file: atomic replace (temp file, fsync, rename); with
      ``if_changed`` an identical file is left untouched. A symbolic link to a
      regular file replaces the link's target, so the link stays a link.
    - a character device, a FIFO or a socket (``/dev/null``, ``/dev/stdout`` on
      a pipe, ``>(wc -c)``): written through as a stream, never replaced; a FIFO
      nobody reads is refused (:class:`UsageError`) instead of waiting.
    - a directory, a block device, a dangling link: refused (:class:`UsageError`).
    """
    # lazy: core.atomic is not loaded with this module; only write_output() needs it
    from crucible.core import atomic

    try:
        st = os.stat(path)  # follows links: what the name leads to decides
    except FileNotFoundError:
        if os.path.islink(path):
            raise UsageError(
                "is a dangling symbolic link; links to nothing are not followed", where=path
            ) from None
        st = None
    except OSError as exc:
        raise OperationalError(f"cannot write: {exc.strerror or exc}", where=path) from None
    if st is None or stat.S_ISREG(st.st_mode):
        target = os.path.realpath(path) if st is not None and os.path.islink(path) else path
        if if_changed and st is not None and st.st_size == len(data) and _same(target, data):
            return False
        return atomic.write_bytes(target, data, mode=mode)
    if stat.S_ISDIR(st.st_mode):
        raise UsageError("is a directory, not a file", where=path)
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        raise UsageError("is a block device; write to a file or a stream", where=path)
    _write_through(path, data)
    return True


def _same(path: str, data: bytes) -> bool:
    """Whether the regular file ``path`` holds exactly ``data`` (read without
    blocking: the name may have been swapped for a FIFO since it was checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return os.read(fd, len(data) + 1) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def _write_through(path: str, data: bytes) -> None:
    try:
        # O_NONBLOCK: opening a FIFO for writing waits for a reader otherwise
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UsageError(
                "is a FIFO with no reader; nothing would read the output", where=path
            ) from None
        raise OperationalError(f"cannot write: {exc.strerror or exc}", where=path) from None
    try:
        # a reader exists: block on a full pipe like any writer, not spin on EAGAIN
        os.set_blocking(fd, True)
        write_all(fd, data)
    except BrokenPipeError:
        raise OperationalError(
            "cannot write: the reader went away (broken pipe)", where=path
        ) from None
    except OSError as exc:
        raise OperationalError(f"cannot write: {exc.strerror or exc}", where=path) from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
