"""File mechanics: the lock, locked appends, the generation token, quarantine.

Every change to ``steps.jsonl`` — an append, a quarantine rename, a compaction
rename — happens while holding an exclusive ``flock`` on ``steps.lock`` (a
separate file, so that renaming the ledger never changes the lock's inode). Whoever
replaces the file (compaction, quarantine) first writes a fresh generation token
into the lock file; an appender compares the token, under the lock, with the one
it saw when it opened ``steps.jsonl`` and re-opens the path when it changed (or
when its file was deleted).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import os
import stat
import struct
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from xxhash import xxh3_64_intdigest

from crucible.core.atomic import fsync_dir
from crucible.core.fdio import write_all
from crucible.ledger._index import (
    FINGERPRINT,
    GENERATION_SIZE,
    HEADER_SIZE,
    LOCK_NAME,
    MAGIC,
    SLOT,
    Summary,
    Table,
    catch_up,
    fingerprint,
    grow,
    identity_hash,
    write_table,
)
from crucible.ledger._index import remove as remove_index

__all__ = [
    "GENERATION_SIZE",
    "LEDGER_NAME",
    "LOCK_NAME",
    "Appender",
    "exclusive_lock",
    "open_regular_file",
    "quarantine",
    "read_all",
    "read_regular_file",
]

LEDGER_NAME = "steps.jsonl"
#: an appender that alone appends re-reads the index header this often
RECHECK_EVERY = 64


#: never follow a link planted at one of our names (a write through it would land
#: outside the directory); never block on a FIFO planted there
_NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def refused_link(path: Path, exc: OSError) -> OSError:
    """``exc`` (ELOOP from ``O_NOFOLLOW``) said the way people read it."""
    return OSError(exc.errno, "a symlink, and links are not followed", str(path))


def open_lock(path: Path) -> int:
    """The lock file's descriptor, created if missing; a symlink or anything but a
    regular file at ``path`` is refused (OSError naming ``path``)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NO_LINK, 0o644)
    except PermissionError as denied:
        # an existing lock file in a read-only place can still be locked
        try:
            fd = os.open(path, os.O_RDONLY | _NO_LINK)
        except FileNotFoundError:
            # the cause is that it cannot be created: say so (EACCES), not ENOENT
            raise OSError(denied.errno, denied.strerror, str(path)) from None
        except OSError as exc:
            raise _named(path, exc) from None
    except OSError as exc:
        raise _named(path, exc) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _named(path: Path, exc: OSError) -> OSError:
    if exc.errno == errno.ELOOP:
        return refused_link(path, exc)
    return OSError(exc.errno, exc.strerror, str(path))


def describe(exc: OSError) -> str:
    """``PATH: reason`` when the error names a file, else the reason."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename else reason


@contextlib.contextmanager
def exclusive_lock(directory: Path, *, create: bool = True) -> Iterator[int]:
    """Hold ``flock(LOCK_EX)`` on ``<directory>/steps.lock`` (created if missing,
    unless ``create`` is false); yields the lock file's descriptor."""
    path = directory / LOCK_NAME
    if create:
        fd = open_lock(path)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | _NO_LINK)
        except OSError as exc:
            raise _named(path, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing releases the flock


def bump_generation(lock_fd: int) -> None:
    """Tell appenders (under the lock) that ``steps.jsonl`` is about to be replaced:
    the lock file holds a generation token; an appender whose token differs
    re-opens the path. (A token, not a stat of the path: on ext4 a path stat
    before each append measurably slows the fsync that follows.)"""
    os.pwrite(lock_fd, os.urandom(GENERATION_SIZE), 0)


def open_regular_file(path: Path) -> int | None:
    """A read-only descriptor of the regular file at ``path``, None if it does not
    exist. Raises OSError if it cannot be opened, ValueError if it is not a
    regular file (a symlink, a directory, a FIFO: opened non-blocking, never hangs)."""
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang us; O_NOFOLLOW: a
        # symlinked ledger is not ours to read (or, later, to write through)
        fd = os.open(path, os.O_RDONLY | _NO_LINK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a symlink, and links are not followed") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_all(fd: int) -> bytes:
    """Every byte of the regular file open at ``fd``, from its start."""
    chunks: list[bytes] = []
    offset = 0
    remaining = os.fstat(fd).st_size
    while True:
        block = os.pread(fd, max(remaining, 1 << 16), offset)
        if not block:
            break
        chunks.append(block)
        offset += len(block)
        remaining -= len(block)
    return b"".join(chunks)


def read_regular_file(path: Path) -> tuple[int, bytes] | None:
    """``(fd, bytes)`` of the regular file at ``path`` (the fd stays open for
    later ``pread``), None if it does not exist. Raises OSError if it cannot be
    read, ValueError if it is not a regular file."""
    fd = open_regular_file(path)
    if fd is None:
        return None
    try:
        return fd, read_all(fd)
    except BaseException:
        os.close(fd)
        raise


def quarantine_name(path: Path) -> Path:
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.quarantine-{stamp}")
    n = 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}.quarantine-{stamp}-{n}")
    return candidate


def quarantine(path: Path, expected: os.stat_result | None) -> Path | None:
    """Rename ``path`` aside (under the lock). ``expected`` is the stat of the file
    judged unreadable; if ``path`` changed since, it is left alone (None)."""
    with exclusive_lock(path.parent) as lock_fd:
        try:
            current = os.lstat(path)  # a symlink is renamed aside, its target untouched
        except FileNotFoundError:
            return None
        if expected is not None and (current.st_dev, current.st_ino) != (
            expected.st_dev,
            expected.st_ino,
        ):
            return None
        target = quarantine_name(path)
        bump_generation(lock_fd)
        remove_index(path.parent)  # it indexed the file going aside
        os.rename(path, target)
        fsync_dir(path.parent)
        return target


_HEADER_BODY = struct.Struct("<8sQQ8s" + "Q" * 10)  # _index.HEADER without its checksum
_U64 = struct.Struct("<Q")
_SLOT_BYTES = struct.Struct("<QQ")
_HEADER_PAD = bytes(HEADER_SIZE - _HEADER_BODY.size - _U64.size)


def _header_bytes(
    s: Summary, covered: int, identities: int, records: int, newlines: int, fp: int
) -> bytes:
    """``Summary.pack`` of ``s`` with the fields an append changes replaced, without
    changing ``s`` (the append is not durable yet) and without its per-field
    ``getattr`` (tests/ledger/test_append_fast.py pins the two equal)."""
    body = _HEADER_BODY.pack(
        MAGIC, s.dev, s.ino, s.generation, covered, s.tail_len, s.slots, identities, records,
        s.bad_lines, newlines, s.torn_tail, fp, s.first_bad_line,
    )  # fmt: skip
    return body + _U64.pack(xxh3_64_intdigest(body)) + _HEADER_PAD


#: one record's index writes, worked out before its fsync: (table, slot offset,
#: slot bytes, header bytes, 1 for a new identity else 0, end of the record,
#: fingerprint)
_Slot = tuple[Table, int, bytes, bytes, int, int, int]


_LIVE: weakref.WeakSet[Appender] = weakref.WeakSet()


def _mark_forked() -> None:
    # a fork hook rather than a getpid() per append: one system call fewer on the
    # fsync-bound hot path
    for appender in list(_LIVE):
        appender._forked = True


os.register_at_fork(after_in_child=_mark_forked)


class Appender:
    """Appends whole lines to ``steps.jsonl``: one ``write`` under the lock, then
    fsync. A torn tail (the file not ending in ``\\n``) gets a ``\\n`` first, so the
    new record starts on a fresh line.

    The lock file and the ledger stay open between appends (an append is on the
    fsync-bound hot path); both are re-opened in a forked child, because a flock
    shared through an inherited descriptor would not exclude the parent."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LEDGER_NAME
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._forked = False
        _LIVE.add(self)
        self._generation = b""
        #: (inode, size) right after our last append: the tail is known to be "\\n"
        self._clean_end: tuple[int, int] | None = None
        self._thread_lock = threading.Lock()  # flock does not order our own threads
        self._table: Table | None = None
        self._header = b""  # the index header as we last wrote it
        #: (inode, size) after our last append when it left the index fresh
        self._indexed: tuple[int, int] | None = None
        self._unchecked = 0
        self._dev = 0

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None
        if self._table is not None:
            self._table.close()
            self._table = None

    def _lock(self) -> int:
        if self._forked:  # in a forked child: never share the parent's descriptors
            self.close()
            self._forked = False
        if self._lock_fd is None:
            self._lock_fd = open_lock(self.directory / LOCK_NAME)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        return self._lock_fd

    def _current_fd(self, lock_fd: int) -> tuple[int, int, int]:
        """Our descriptor for the file now at ``steps.jsonl``, its inode and size
        (called under the lock, so the path cannot change meanwhile)."""
        generation = os.pread(lock_fd, GENERATION_SIZE, 0)
        if self._fd is not None:
            info = os.fstat(self._fd)
            # same generation and still linked (not deleted): still the ledger
            if generation == self._generation and info.st_nlink:
                return self._fd, info.st_ino, info.st_size
            os.close(self._fd)  # replaced by a compaction or quarantine: follow the path
            self._fd = None
        created = not os.path.lexists(self.path)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NO_LINK, 0o644)
        except OSError as exc:
            raise _named(self.path, exc) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", str(self.path))
        os.set_blocking(fd, True)
        if created:
            fsync_dir(self.directory)
        self._dev = info.st_dev
        self._fd = fd
        self._generation = generation
        return fd, info.st_ino, info.st_size

    def append(self, line: bytes, identity: tuple[str, str] | None = None) -> None:
        """Append ``line`` (``\\n``-terminated) durably; raises OSError on failure,
        after truncating away any partial write. With ``identity`` (the record's),
        the index gets its slot under the same lock.

        Every ``Ledger.record`` comes here, so the path is kept short: a process
        that wakes from an fsync runs cold (on a shared machine each Python step
        then costs several times what it costs in a loop), and only the write and
        the fsync are the work. The record's slot and the index header that
        counts it are worked out before the fsync; after it only their two
        writes are left."""
        with self._thread_lock:
            lock_fd = self._lock()
            try:
                fd, inode, size = self._current_fd(lock_fd)
                if size and self._clean_end != (inode, size) and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                try:
                    written = os.write(fd, line)
                    if written != len(line):  # a short write: the loop
                        write_all(fd, line[written:])
                    slot = self._prepare_slot(inode, size, line, identity) if identity else None
                    os.fsync(fd)
                except OSError:
                    self._failed(fd, size)
                    raise
                self._clean_end = (inode, size + len(line))
                # the record is durable; its index entry is a cache: a failure
                # here leaves the index behind, and the next reader catches up
                if slot is not None:
                    self._write_slot(slot, inode)
                elif identity is not None:
                    with contextlib.suppress(OSError):
                        self._index(fd, inode, size, line, identity)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def append_many(self, entries: list[tuple[bytes, tuple[str, str] | None]]) -> None:
        """Append every ``(line, identity)`` of ``entries`` with one ``write`` and one
        fsync under one lock, in order, and give each its index slot there (a
        batch: docs/spec/ledger.md, "Batch append"). Durable when it returns; on
        failure (OSError) the partial write is truncated away. A crash mid-write
        leaves a prefix of whole lines, each checked by its own checksum, and at
        most one torn line, which no reader trusts."""
        if not entries:
            return
        with self._thread_lock:
            lock_fd = self._lock()
            try:
                fd, inode, size = self._current_fd(lock_fd)
                lines = [line for line, _ in entries]
                if size and self._clean_end != (inode, size) and os.pread(fd, 1, size - 1) != b"\n":
                    lines[0] = b"\n" + lines[0]
                data = b"".join(lines)
                try:
                    write_all(fd, data)
                    os.fsync(fd)
                except OSError:
                    self._failed(fd, size)
                    raise
                self._clean_end = (inode, size + len(data))
                at = size
                for line, (_, identity) in zip(lines, entries, strict=True):
                    if identity is not None:
                        with contextlib.suppress(OSError):
                            self._index(fd, inode, at, line, identity)
                    at += len(line)
            finally:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _failed(self, fd: int, size: int) -> None:
        """A write or fsync failed: leave no partial line behind."""
        self._clean_end = None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)

    def _prepare_slot(
        self, inode: int, size: int, line: bytes, identity: tuple[str, str]
    ) -> _Slot | None:
        """The index writes of one record just written at ``size`` (not yet
        fsync'd), when nobody appended since our own last append, which left the
        index fresh: its header is the one we wrote, so the next one is computed
        from it. None when that does not hold, or the table must grow: the record
        is then indexed by :meth:`_index` after its fsync, as a batch's are.
        Every RECHECK_EVERY appends the table is checked anyway, in case it was
        replaced (a rebuild by verify) under us. The probe is ``Table.insert``'s,
        reading 16 slots at a time."""
        table = self._table
        if (
            table is None
            or self._indexed != (inode, size)
            or self._unchecked >= RECHECK_EVERY
            or line[:1] == b"\n"
            or len(line) < FINGERPRINT
        ):
            return None
        h = identity_hash(*identity)
        s = table.summary
        slots = s.slots
        mask = slots - 1
        i = h & mask
        seen = 0
        try:
            while seen < slots:
                count = min(16, slots - i)
                raw = os.pread(table.fd, count * SLOT, HEADER_SIZE + i * SLOT)
                if len(raw) < count * SLOT:
                    return None
                for k in range(count):
                    slot_hash = _U64.unpack_from(raw, k * SLOT)[0]
                    if slot_hash != h and slot_hash:
                        continue
                    new = 0 if slot_hash else 1
                    if (s.identities + new) * 2 > slots:
                        return None  # full: it grows on the slow path
                    end = size + len(line)
                    fp = xxh3_64_intdigest(line[-FINGERPRINT:])
                    header = _header_bytes(
                        s, end, s.identities + new, s.records + 1, s.newlines + 1, fp
                    )
                    slot = _SLOT_BYTES.pack(h, size + 1)
                    return table, HEADER_SIZE + (i + k) * SLOT, slot, header, new, end, fp
                i = (i + count) & mask
                seen += count
        except OSError:
            pass
        return None

    def _write_slot(self, slot: _Slot, inode: int) -> None:
        """Write a prepared slot and the header that counts it (after the fsync,
        under the lock); the table's summary follows once both landed."""
        self._indexed = None
        table, at, data, header, new, end, fp = slot
        try:
            os.pwrite(table.fd, data, at)
            os.pwrite(table.fd, header, 0)
        except OSError:
            self._header = b""  # the header on disk is read again at the next append
            return
        s = table.summary
        s.covered = end
        s.identities += new
        s.records += 1
        s.newlines += 1
        s.fingerprint = fp
        self._header = header
        self._indexed = (inode, end)
        self._unchecked += 1

    def _index(
        self, fd: int, inode: int, size: int, line: bytes, identity: tuple[str, str]
    ) -> None:
        """Give the record just written at ``size`` its slot in ``steps.idx``
        (under the lock). An index that is missing or stale is left for the next
        opener to rebuild: appends stay on the fsync-bound fast path."""
        indexed, self._indexed = self._indexed, None
        table = self._table
        if (
            indexed == (inode, size)
            and table is not None
            and self._unchecked < RECHECK_EVERY
            and line[:1] != b"\n"
        ):
            # Nobody appended since our own last append, which left the index
            # fresh: its header is the one we wrote (a writer's slot costs three
            # system calls here, and every one counts on a loaded machine). Every
            # RECHECK_EVERY appends the file is checked anyway, in case it was
            # replaced (a rebuild by verify) under us.
            self._unchecked += 1
            self._insert(table, fd, inode, size, line, identity)
            return
        self._unchecked = 0
        if table is None or table.replaced():
            if table is not None:
                table.close()
            table = self._table = Table.open(self.directory, write=True)
            if table is None and size == 0:
                # a new ledger gets its (empty) index with its first record
                generation = self._generation.ljust(8, b"\0")
                write_table(self.directory, Summary(self._dev, inode, generation), {})
                table = self._table = Table.open(self.directory, write=True)
            if table is None:
                return
        raw = os.pread(table.fd, HEADER_SIZE, 0)
        if raw != self._header:  # another writer's append, or a new table
            summary = Summary.unpack(raw)
            if summary is None:
                return
            table.summary = summary
        summary = table.summary
        if (summary.dev, summary.ino, summary.generation) != (
            self._dev,
            inode,
            self._generation.ljust(8, b"\0"),
        ):
            return
        if summary.covered == size and not summary.tail_len and line[:1] != b"\n":
            self._insert(table, fd, inode, size, line, identity)
        elif table.matches(fd, os.fstat(fd), summary.generation) == "behind":
            catch_up(table, fd, size + len(line))

    def _insert(
        self, table: Table, fd: int, inode: int, size: int, line: bytes, identity: tuple[str, str]
    ) -> None:
        """The slot and header of one record appended at ``size`` to a fresh index."""
        summary = table.summary
        end = size + len(line)
        summary.records += 1
        summary.newlines += 1
        summary.covered = end
        summary.fingerprint = (
            xxh3_64_intdigest(line[-FINGERPRINT:])
            if len(line) >= FINGERPRINT
            else fingerprint(fd, end)
        )
        h = identity_hash(*identity)
        if table.insert(h, size):
            self._header = table.write_summary()
            self._indexed = (inode, end)
        else:
            grow(table, {h: size})
