"""``steps.idx``: an on-disk hash table identity -> byte offset of the latest record.

A cache of ``steps.jsonl``, never authoritative (docs/spec/ledger.md §6): it is
trusted only while its header matches the ledger it was built from (device,
inode, the lock's generation token, the size it covers and a fingerprint of the
bytes just before that size); anything else — missing, garbage, from another
generation, covering more than the file holds — is rebuilt from the ledger.
Every hit is checked against the record it points at (checksum and identity),
so a damaged entry can cost a miss, never a wrong answer.

Layout (little-endian): a 128-byte header (``HEADER`` below, its last 8 bytes an
xxh3_64 of the first 120), then ``slots`` 16-byte slots ``(hash, offset + 1)``,
open addressing with linear probing, at most half full. ``hash`` is the xxh3_64
of the identity (0 is empty, so a zero hash is stored as 1); one slot per hash,
so two identities of the same 64-bit hash make the earlier one a miss.

Writers hold the ledger's lock: an append inserts its slot in place (no fsync:
losing the newest entries to a power cut costs misses, never wrong hits); a
rebuild or a growth writes a new file and renames it over the old one, so an
open reader keeps the table of its own snapshot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from array import array
from pathlib import Path
from stat import S_ISREG

import xxhash

from crucible.core.errors import OperationalError
from crucible.core.structs import dataclass, fields
from crucible.ledger._scan import Scan, identity_hash, scan

__all__ = [
    "INDEX_NAME",
    "Summary",
    "Table",
    "build",
    "catch_up",
    "generation_of",
    "identity_hash",
    "remove",
    "summary_of",
]

INDEX_NAME = "steps.idx"
#: the ledger's lock file and its generation token (owned here: the index's
#: generation check reads them; crucible.ledger._files creates the file)
LOCK_NAME = "steps.lock"
GENERATION_SIZE = 8
MAGIC = b"crlidx\x01\x00"
HEADER = struct.Struct("<8sQQ8s" + "Q" * 10 + "Q")
HEADER_SIZE = 128
SLOT = 16
MIN_SLOTS = 64
#: bytes before the covered size whose hash is kept: a file rewritten in place
#: (same inode, same size) is caught without reading it
FINGERPRINT = 64
_NO_LINK = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_xxh = xxhash.xxh3_64_intdigest


@dataclass
class Summary:
    """What the table covers: the header's fields after the magic."""

    dev: int = 0
    ino: int = 0
    generation: bytes = b"\0" * 8
    #: bytes of the ledger indexed: up to and including its last "\n"
    covered: int = 0
    #: bytes after ``covered`` when indexed (an unterminated last line)
    tail_len: int = 0
    slots: int = MIN_SLOTS
    identities: int = 0
    records: int = 0
    bad_lines: int = 0
    #: "\n" bytes in the covered part (to number the lines of a later part)
    newlines: int = 0
    #: the ledger ends in an unterminated segment that is not a record (a 0/1 word on disk)
    torn_tail: bool = False
    fingerprint: int = 0
    first_bad_line: int = 0

    def pack(self) -> bytes:
        values = [getattr(self, name) for name in _FIELDS]
        body = HEADER.pack(MAGIC, *values, 0)[:-8]
        return (body + struct.pack("<Q", _xxh(body))).ljust(HEADER_SIZE, b"\0")

    @classmethod
    def unpack(cls, raw: bytes) -> Summary | None:
        if len(raw) < HEADER.size or not raw.startswith(MAGIC):
            return None
        _magic, *values, check = HEADER.unpack_from(raw)
        if check != _xxh(raw[: HEADER.size - 8]):
            return None
        summary = cls(*values)
        summary.torn_tail = bool(summary.torn_tail)
        slots = summary.slots
        if slots < MIN_SLOTS or slots & (slots - 1) or summary.identities * 2 > slots:
            return None
        return summary

    @property
    def unterminated(self) -> bool:
        return self.tail_len > 0

    @property
    def duplicates(self) -> int:
        return self.records - self.identities


_FIELDS = tuple(f.name for f in fields(Summary))


def fingerprint(fd: int, covered: int) -> int:
    start = max(0, covered - FINGERPRINT)
    return _xxh(os.pread(fd, covered - start, start))


def generation_of(directory: Path) -> bytes:
    """The lock file's generation token (zeros when there is no lock file yet)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | _NO_LINK)
    except OSError:
        return b"\0" * 8
    try:
        return os.pread(fd, GENERATION_SIZE, 0).ljust(8, b"\0")
    finally:
        os.close(fd)


class Table:
    """An open ``steps.idx``: lookups by pread; inserts (under the ledger lock)
    in place."""

    def __init__(self, fd: int, summary: Summary, path: Path) -> None:
        self.fd = fd
        self.summary = summary
        self.path = path

    @classmethod
    def open(cls, directory: Path, *, write: bool = False) -> Table | None:
        """The table at ``directory/steps.idx`` if its header is whole, else None."""
        path = directory / INDEX_NAME
        try:
            fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | _NO_LINK)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            # a FIFO, a device, a directory planted at our name is not an index
            summary = (
                Summary.unpack(os.pread(fd, HEADER_SIZE, 0)) if S_ISREG(info.st_mode) else None
            )
            if summary is not None and info.st_size == HEADER_SIZE + summary.slots * SLOT:
                return cls(fd, summary, path)
        except OSError:
            pass
        os.close(fd)
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def replaced(self) -> bool:
        """Renamed over or deleted since opened (its link count is 0)."""
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return True

    def matches(self, ledger_fd: int, info: os.stat_result, generation: bytes) -> str:
        """``"fresh"`` (covers the whole file), ``"behind"`` (covers a prefix of
        it: index the rest) or ``"stale"`` (rebuild)."""
        s = self.summary
        if (s.dev, s.ino, s.generation) != (info.st_dev, info.st_ino, generation):
            return "stale"
        if s.covered + s.tail_len > info.st_size:
            return "stale"  # truncated
        try:
            if fingerprint(ledger_fd, s.covered) != s.fingerprint:
                return "stale"  # rewritten in place
        except OSError:
            return "stale"
        return "fresh" if s.covered + s.tail_len == info.st_size else "behind"

    # -- reading --------------------------------------------------------------
    def lookup(self, h: int) -> int | None:
        slots = self.summary.slots
        mask = slots - 1
        i = h & mask
        seen = 0
        while seen < slots:  # bounded: a damaged table may have no empty slot
            # 16 slots per read: a probe sequence rarely leaves one
            count = min(16, slots - i)
            raw = os.pread(self.fd, count * SLOT, HEADER_SIZE + i * SLOT)
            if len(raw) < count * SLOT:
                return None
            for k in range(count):
                slot_hash, pos = struct.unpack_from("<QQ", raw, k * SLOT)
                if slot_hash == h:
                    return pos - 1 if pos else None
                if slot_hash == 0:
                    return None
            i = (i + count) & mask
            seen += count
        return None

    def offsets(self) -> list[int]:
        """Every indexed offset (unordered)."""
        table = array("Q")
        table.frombytes(_pread_all(self.fd, self.summary.slots * SLOT, HEADER_SIZE))
        return [pos - 1 for pos in table[1::2] if pos]

    # -- writing (under the ledger lock) ----------------------------------------
    def insert(self, h: int, pos: int) -> bool:
        """Point ``h`` at ``pos``; False when the table is too full (grow first).
        The probe is bounded: slots written by a writer killed before its header
        was are not counted in ``identities``, so the count can be low."""
        slots = self.summary.slots
        mask = slots - 1
        i = h & mask
        for _ in range(slots):
            raw = os.pread(self.fd, SLOT, HEADER_SIZE + i * SLOT)
            slot_hash = struct.unpack("<Q", raw[:8])[0] if len(raw) == SLOT else 0
            if slot_hash in (0, h):
                if slot_hash == 0:
                    if (self.summary.identities + 1) * 2 > slots:
                        return False
                    self.summary.identities += 1
                os.pwrite(self.fd, struct.pack("<QQ", h, pos + 1), HEADER_SIZE + i * SLOT)
                return True
            i = (i + 1) & mask
        return False

    def write_summary(self) -> bytes:
        """Write the header; returns its bytes (an appender that finds them
        unchanged at its next append skips decoding them)."""
        raw = self.summary.pack()
        os.pwrite(self.fd, raw, 0)
        return raw


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while size > 0:
        block = os.pread(fd, min(size, 1 << 24), offset)
        if not block:
            break
        parts.append(block)
        size -= len(block)
        offset += len(block)
    return b"".join(parts)


def _fill(entries: dict[int, int], slots: int) -> array[int]:
    table = array("Q", bytes(slots * SLOT))
    mask = slots - 1
    for h, pos in entries.items():
        i = h & mask
        while table[2 * i]:
            i = (i + 1) & mask
        table[2 * i] = h
        table[2 * i + 1] = pos + 1
    return table


def _slots_for(identities: int) -> int:
    slots = MIN_SLOTS
    while slots < identities * 2 + 2:
        slots *= 2
    return slots


def write_table(directory: Path, summary: Summary, entries: dict[int, int]) -> None:
    """Write a fresh ``steps.idx`` (temp file + rename: a reader keeps its own)."""
    # lazy: core.atomic is not loaded with this module; only write_table() needs it
    from crucible.core.atomic import write_bytes

    summary.slots = max(summary.slots, _slots_for(len(entries)))
    summary.identities = len(entries)
    table = _fill(entries, summary.slots)
    # not durable: a lost index is rebuilt; atomic, so no reader sees half of one
    try:
        write_bytes(
            directory / INDEX_NAME,
            summary.pack() + table.tobytes(),
            tmp_prefix=f".{INDEX_NAME}.",
            durable=False,
        )
    except OperationalError as exc:  # the callers treat an index as best effort
        raise OSError(errno.EIO, str(exc)) from None


def summary_of(result: Scan, data: bytes, info: os.stat_result, generation: bytes) -> Summary:
    covered = data.rfind(b"\n") + 1
    return Summary(
        info.st_dev,
        info.st_ino,
        generation,
        covered,
        tail_len=len(data) - covered,
        records=result.records,
        bad_lines=result.bad_lines,
        newlines=data.count(b"\n", 0, covered),
        torn_tail=result.torn_tail,
        fingerprint=_xxh(data[max(0, covered - FINGERPRINT) : covered]),
        first_bad_line=result.bad_line_numbers[0] if result.bad_line_numbers else 0,
    )


def build(
    directory: Path, data: bytes, result: Scan, info: os.stat_result, generation: bytes
) -> None:
    """Write the index of ``data`` (the whole ledger, scanned with ``hashed=True``
    as ``result``)."""
    write_table(directory, summary_of(result, data, info, generation), result.hashed)


def catch_up(table: Table, ledger_fd: int, size: int) -> Scan:
    """Index the part of the ledger after what ``table`` covers (under the lock):
    appends made without the index (a crash between an append and its slot, an
    older writer). Returns the scan of that part."""
    s = table.summary
    start = s.covered
    data = _pread_all(ledger_fd, size - start, start)
    part = scan(data, hashed=True)
    if s.tail_len and not s.torn_tail:
        s.records -= 1  # the old unterminated record is in ``data`` again
    s.records += part.records
    s.bad_lines += part.bad_lines
    if not s.first_bad_line and part.bad_line_numbers:
        s.first_bad_line = s.newlines + part.bad_line_numbers[0]
    covered = data.rfind(b"\n") + 1
    s.newlines += data.count(b"\n", 0, covered)
    s.covered = start + covered
    s.tail_len = len(data) - covered
    s.torn_tail = part.torn_tail
    s.fingerprint = fingerprint(ledger_fd, s.covered)
    entries = {h: start + pos for h, pos in part.hashed.items()}
    if (s.identities + len(entries)) * 2 > s.slots:
        grow(table, entries)
        return part
    for h, pos in entries.items():
        if not table.insert(h, pos):  # pragma: no cover - sized above
            raise OSError(errno.ENOSPC, "index table full")
    table.write_summary()
    return part


def grow(table: Table, extra: dict[int, int]) -> None:
    """Rewrite ``table`` with twice the slots (or more) holding also ``extra``."""
    raw = array("Q")
    raw.frombytes(_pread_all(table.fd, table.summary.slots * SLOT, HEADER_SIZE))
    entries = {raw[i]: raw[i + 1] - 1 for i in range(0, len(raw), 2) if raw[i]}
    entries.update(extra)
    summary = table.summary
    summary.slots = _slots_for(len(entries) * 2)
    write_table(table.path.parent, summary, entries)


def remove(directory: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(directory / INDEX_NAME)
