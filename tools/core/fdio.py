"""Whole-file reads and whole-buffer writes on bare descriptors.

``os.write`` may write less than it is given (a pipe, a signal, a full disk
reached mid-way); every writer in the toolkit needs the same loop, so it lives
here once. Writing to an open stream (stdout) is :func:`crucible.core.output.write_stream`,
over :func:`write_all`.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegularFile", "read_file", "read_regular", "write_all"]


class NotRegularFile(OSError):
    """The path names a FIFO, a socket or a device where a file was expected."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; raises OSError as ``os.write`` does."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_file(path: str | os.PathLike[str]) -> bytes:
    """A whole file's bytes in four syscalls (open, fstat, read, close), where
    ``Path.read_bytes`` makes nine: small files read on every task add up."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)
        if len(data) == size and size:
            return data  # asked for one byte more than its size: it is whole
        # Empty, special (size 0 in /proc), growing, or over one read's 2 GiB
        # limit: read to the end.
        chunks = [data]
        while chunk := os.read(fd, max(size - len(data), 1 << 20)):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike[str], *, follow: bool = True) -> bytes:
    """A regular file's bytes, opened without blocking: a FIFO, a socket or a
    device raises :class:`NotRegularFile` instead of waiting for a writer (or
    reading /dev/zero forever); a directory raises :class:`IsADirectoryError`.
    ``follow=False`` refuses a symbolic link (``ELOOP``)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", os.fspath(path))
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
