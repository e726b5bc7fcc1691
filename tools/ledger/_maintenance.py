"""``verify`` (read-only health report) and ``compact`` (atomic rewrite keeping the
latest record of each identity, safe against concurrent appenders)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from crucible.core.atomic import atomic_file
from crucible.core.errors import OperationalError
from crucible.core.structs import dataclass
from crucible.ledger._files import (
    GENERATION_SIZE,
    LEDGER_NAME,
    bump_generation,
    describe,
    exclusive_lock,
    open_regular_file,
    read_all,
    read_regular_file,
)
from crucible.ledger._index import build
from crucible.ledger._index import remove as remove_index
from crucible.ledger._record import FORMAT_VERSION, decode_line
from crucible.ledger._scan import Scan, scan

__all__ = ["CompactReport", "compact", "verify"]


def _read(path: Path) -> tuple[bytes, os.stat_result | None]:
    try:
        found = read_regular_file(path)
    except ValueError as exc:
        raise OperationalError(f"cannot read the ledger: {exc}", where=str(path)) from None
    except OSError as exc:
        raise OperationalError(
            f"cannot read the ledger: {exc.strerror or exc}", where=str(path)
        ) from None
    if found is None:
        return b"", None
    fd, data = found
    try:
        return data, os.fstat(fd)
    finally:
        os.close(fd)


def _reindex(directory: Path, lock_fd: int) -> None:
    """Rebuild ``steps.idx`` from the ledger now at its path (under the lock);
    best effort: a missing index is rebuilt by the next opener anyway."""
    generation = os.pread(lock_fd, GENERATION_SIZE, 0).ljust(GENERATION_SIZE, b"\0")
    with contextlib.suppress(OSError, ValueError):
        fd = open_regular_file(directory / LEDGER_NAME)
        if fd is None:
            remove_index(directory)
            return
        try:
            data = read_all(fd)
            result = scan(data, hashed=True)
            if not result.garbage:
                build(directory, data, result, os.fstat(fd), generation)
        finally:
            os.close(fd)


def verify(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A report of ``<directory>/steps.jsonl``: records, identities, duplicate
    identities, bad lines (number and reason), torn tail. ``damaged`` is true
    when a line is bad or the tail is torn. Changes nothing in the ledger; its
    index (``steps.idx``) is rebuilt when the directory lets us."""
    directory = Path(directory)
    path = directory / LEDGER_NAME
    data, _ = _read(path)
    result = scan(data, strict=True)
    if data and directory.is_dir():
        with contextlib.suppress(OSError), exclusive_lock(directory, create=False) as lock_fd:
            _reindex(directory, lock_fd)
    return {
        "v": FORMAT_VERSION,
        "path": str(path),
        "bytes": result.size,
        "records": result.records,
        "identities": result.identities,
        "duplicates": result.duplicates,
        "bad_lines": result.bad_lines,
        "bad": [
            {"line": n, "reason": r}
            for n, r in zip(result.bad_line_numbers, result.bad_reasons, strict=True)
        ],
        "torn_tail": result.torn_tail,
        "unterminated": result.unterminated,
        "damaged": result.damaged,
    }


@dataclass(frozen=True)
class CompactReport:
    path: Path
    records_before: int
    kept: int
    dropped_duplicates: int
    dropped_bad: int
    torn_tail: bool
    rejected: Path | None

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "path": str(self.path),
            "records_before": self.records_before,
            "kept": self.kept,
            "dropped_duplicates": self.dropped_duplicates,
            "dropped_bad": self.dropped_bad,
            "torn_tail": self.torn_tail,
            "rejected": None if self.rejected is None else str(self.rejected),
        }


def _write_atomic(path: Path, chunks: list[bytes], mode: int) -> None:
    """The one atomic writer (core): temp file in the same directory, fsync,
    rename, fsync the directory."""
    with atomic_file(path, mode, tmp_prefix=f".{path.name}.") as f:
        for chunk in chunks:
            f.write(chunk)


def compact(directory: str | os.PathLike[str]) -> CompactReport:
    """Rewrite ``steps.jsonl`` keeping the latest record of each identity, in file
    order. Bad lines and a torn tail are not carried over; their bytes are kept in
    ``steps.jsonl.rejected-<n>`` so nothing is silently lost. The whole read,
    rewrite and rename happens under the appenders' lock, so no append can slip
    between the read and the rename; appenders notice the new inode and re-open."""
    directory = Path(directory)
    path = directory / LEDGER_NAME
    if not directory.is_dir():
        return CompactReport(path, 0, 0, 0, 0, False, None)  # nothing to compact
    try:
        with exclusive_lock(directory) as lock_fd:
            data, info = _read(path)
            if info is None:
                return CompactReport(path, 0, 0, 0, 0, False, None)
            result: Scan = scan(data, strict=True)
            keep = sorted(result.index.values())
            kept: list[bytes] = []
            for pos in keep:
                end = data.find(b"\n", pos)
                kept.append(data[pos : len(data) if end < 0 else end] + b"\n")
            rejected = _rejected_bytes(data, result, set(keep))
            rejected_path: Path | None = None
            if rejected:
                rejected_path = _free_name(path, "rejected")
                _write_atomic(rejected_path, [rejected], 0o644)
            bump_generation(lock_fd)
            _write_atomic(path, kept, info.st_mode & 0o7777)
            _reindex(directory, lock_fd)
    except OSError as exc:
        raise OperationalError(f"cannot compact: {describe(exc)}", where=str(path)) from None
    return CompactReport(
        path,
        result.records,
        len(keep),
        result.duplicates,
        result.bad_lines,
        result.torn_tail,
        rejected_path,
    )


def _free_name(path: Path, what: str) -> Path:
    n = 1
    while os.path.lexists(candidate := path.with_name(f"{path.name}.{what}-{n}")):
        n += 1
    return candidate


def _rejected_bytes(data: bytes, result: Scan, kept: set[int]) -> bytes:
    """The bad lines and torn tail of ``data`` (not the dropped duplicates, which
    are good records superseded by a later one)."""
    if not result.bad_lines and not result.torn_tail:
        return b""

    out: list[bytes] = []
    pos = 0
    for line in data.split(b"\n"):
        if line and pos not in kept:
            record, _ = decode_line(line)
            if record is None:
                out.append(line + b"\n")
        pos += len(line) + 1
    return b"".join(out)
