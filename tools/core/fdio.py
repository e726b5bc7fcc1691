"""Whole-file reads and whole-buffer writes on bare descriptors.

``os.write`` may write less than it is given (a pipe, a signal, a full disk
reached mid-way); every writer in the toolkit needs the same loop, so it lives
here once.
"""

from __future__ import annotations

import os
from typing import IO

__all__ = ["read_file", "write_all", "write_stream"]


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


def write_stream(stream: IO[bytes], data: bytes) -> None:
    """Write all of ``data`` to a binary stream, or raise OSError.

    ``BufferedWriter.write`` hands a buffer larger than its own straight to one
    ``write(2)`` and returns that call's short count (a full disk, a file-size
    limit) without raising: ``> f`` would end truncated and exit 0. So the
    stream's buffer is flushed and the bytes go through :func:`write_all` on its
    descriptor; a stream without one (a test's BytesIO) is written as it is."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        fd = -1
    if fd < 0:
        stream.write(data)
        stream.flush()
        return
    stream.flush()
    write_all(fd, data)
