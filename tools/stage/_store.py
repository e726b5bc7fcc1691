"""The one owner of ``STATE/results/``: settled records of plain units and the
packed records of keyed units (docs/spec/inputs.md 5, "Result records").

A plain unit (an unmapped task, a mapped task's aggregate) has its own file
``results/<task>.json``, replaced atomically. The keyed units of a task (fan-out
instances, a scored loop's revisions ``@rev<N>``) share ONE append-only file
``results/<task>.jsonl``: one canonical record per line, the last line for a key
wins, a tombstone line removes the key, a torn last line is ignored. One file
instead of one per instance: on ext4 and tmpfs every non-empty file costs an
inode and a 4 KiB block, over the budget of a no-op instance (issue 14).

Writers are worker processes and the dispatcher: an append is one ``write`` of
the whole line on an ``O_APPEND`` descriptor under an exclusive ``flock`` of the
file, so lines never interleave; a short write (ENOSPC) is cut back under the
lock and raises. Nothing here fsyncs unless asked (``durable``): the dispatcher
fsyncs the files its workers wrote, once per group commit (docs/spec/run.md,
"Session log").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from crucible.core import canon
from crucible.core.atomic import abandon, fsync_dir
from crucible.core.contract import RESULT_STATUSES
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.core.fdio import write_all
from crucible.core.fsio import NotRegular, open_regular
from crucible.stage._fsio import write_atomic
from crucible.stage._names import check_task_name

__all__ = [
    "PACKED_SUFFIX",
    "RESULT_FORMAT",
    "TOMBSTONE",
    "Records",
    "load_keyed",
    "load_one",
    "packed_path",
    "parse_packed",
    "parse_record_line",
    "plain_path",
    "record_path",
    "remove_record",
    "scan_keyed",
    "store_record",
]

RESULT_FORMAT = "crucible.result/1"
PACKED_SUFFIX = ".jsonl"
#: the member that makes a line of a packed file a tombstone
TOMBSTONE = "removed"


def as_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a Path, without a copy when it is one: ``Path(p)`` parses its
    argument again even then, and staging and capture did so ~15 times a unit."""
    return path if isinstance(path, Path) else Path(path)


#: str(state) -> STATE/results (one join a record less). The hot-path twin of
#: StateLayout.result_path/packed_path, which own the spelling; tests/stage/test_layout_paths.py
#: pins that both agree.
_results_dirs: dict[str, Path] = {}


def _results_dir(state: Path) -> Path:
    found = _results_dirs.get(str(state))
    if found is None:
        found = _results_dirs[str(state)] = as_path(state) / "results"
    return found


def plain_path(state: Path, task: str) -> Path:
    """``results/<task>.json``: an unmapped task's record, or a mapped task's aggregate."""
    return _results_dir(state) / (check_task_name(task) + ".json")


def packed_path(state: Path, task: str) -> Path:
    """``results/<task>.jsonl``: the records of every keyed unit of ``task``."""
    return _results_dir(state) / (check_task_name(task) + PACKED_SUFFIX)


def record_path(state: Path, task: str, key: str | None) -> Path:
    """The file that holds the record of ``task`` (key None) or of its unit ``key``."""
    return plain_path(state, task) if key is None else packed_path(state, task)


# -- reading -------------------------------------------------------------------


class _Packed:
    """What was read of one packed file: the last line of each key, up to
    ``offset`` (the end of its last whole line), kept as bytes — each line was
    parsed and checked when it was read, and is parsed again when asked for
    (:class:`Records`). The file only grows by appends, so a later read of the
    same inode parses only what was appended. ``head`` and ``tail`` (its first
    and last whole lines) tell a file replaced by one that reuses the inode
    number (a rerun unlinks it), or cut back and written again."""

    __slots__ = ("dev", "head", "ino", "lines", "offset", "raw", "tail")

    def __init__(self, dev: int, ino: int) -> None:
        self.dev = dev
        self.ino = ino
        self.offset = 0
        self.lines = 0
        self.raw: dict[str, bytes] = {}
        self.head = b""
        self.tail = b""

    def same_file(self, fd: int, st: os.stat_result) -> bool:
        """Whether ``fd`` is this file, grown only by appends since it was read."""
        if (self.dev, self.ino) != (st.st_dev, st.st_ino) or st.st_size < self.offset:
            return False
        if not self.offset:
            return True
        return (
            os.pread(fd, len(self.head), 0) == self.head
            and os.pread(fd, len(self.tail), self.offset - len(self.tail)) == self.tail
        )


#: one entry per packed file this process read (a fold reads each file once).
#: Lines, not parsed records: a dispatcher folding 100,000 no-op instances
#: kept ~1.2 KiB of dicts per instance here (issue 14: 209 MiB RSS); a line
#: of ~210 bytes costs ~0.3 KiB with its key.
_cache: dict[str, _Packed] = {}


class Records(Mapping[str, dict[str, Any]]):
    """The settled records of a task's keyed units, by key, as one read of its
    packed file found them: each record is parsed from its line when it is
    asked for, and every lookup returns a new dict (so a caller may change
    what it got). Iterates in the order the keys first settled."""

    __slots__ = ("_raw",)

    def __init__(self, raw: dict[str, bytes]) -> None:
        self._raw = raw

    def __getitem__(self, key: str) -> dict[str, Any]:
        record: dict[str, Any] = _parse_line(self._raw[key])
        return record

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)


def _read_from(fd: int, offset: int, size: int) -> bytes:
    chunks = []
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 22), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _parse_line(line: bytes) -> Any:
    return orjson.loads(line)


def parse_record_line(line: bytes) -> dict[str, Any]:
    """A record from a line :func:`scan_keyed` returned (checked when it was read)."""
    record: dict[str, Any] = _parse_line(line)
    return record


def check_record(record: Any, where: str, task: str, key: str | None) -> dict[str, Any]:
    """A settled record read back: the format, the unit it names, its status."""
    if not isinstance(record, dict):
        raise ParseError("a result record must be a JSON object", where=where)
    if record.get("format") != RESULT_FORMAT:
        raise InputRefused(
            f"unknown record format {record.get('format')!r} (expected {RESULT_FORMAT})",
            where=f"{where}:$.format",
        )
    if record.get("task") != task or record.get("key") != key:
        raise InputRefused(
            f"record is for task {record.get('task')!r} key {record.get('key')!r}, "
            f"not {task!r} key {key!r} (plan/state mismatch)",
            where=where,
        )
    if record.get("status") not in RESULT_STATUSES:
        raise InputRefused(f"unknown status {record.get('status')!r}", where=f"{where}:$.status")
    return record


def _apply(
    entry: _Packed,
    data: bytes,
    path: str,
    task: str,
    parsed: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Parse and check the whole lines of ``data`` (read at ``entry.offset``)
    into ``entry`` (and the records into ``parsed`` when given). A last line
    without its newline is left for a later read; an unparseable line followed
    by another is an error naming ``file:line``; an unparseable last line is a
    torn one (a crash mid-append) and is ignored."""
    end = data.rfind(b"\n") + 1
    pos = 0
    while pos < end:
        nl = data.index(b"\n", pos)
        line = data[pos:nl]
        lineno = entry.lines + 1
        where = f"{path}:{lineno}"
        try:
            value = _parse_line(line)
        except ValueError:
            if nl + 1 >= len(data):
                return  # a torn last line: ignored, never consumed
            raise ParseError("not a JSON record (a damaged line)", where=where) from None
        k, removed = _packed_line(value, where, task)
        if removed:
            entry.raw.pop(k, None)
            if parsed is not None:
                parsed.pop(k, None)
        else:
            entry.raw[k] = line
            if parsed is not None:
                parsed[k] = value
        entry.lines = lineno
        entry.offset += nl + 1 - pos
        entry.tail = data[pos : nl + 1]
        if lineno == 1:
            entry.head = entry.tail
        pos = nl + 1


def _packed_line(value: Any, where: str, task: str) -> tuple[str, bool]:
    """A parsed line of ``task``'s packed file, checked (inputs.md 5): its key,
    and whether it is a tombstone (True) rather than a record."""
    if not isinstance(value, dict) or not isinstance(value.get("key"), str):
        raise ParseError("a packed result line is a JSON object with a string key", where=where)
    k: str = value["key"]
    if value.get(TOMBSTONE) is True:
        if value.get("task") != task or value.get("format") != RESULT_FORMAT:
            raise InputRefused(
                f"tombstone is for task {value.get('task')!r} format "
                f"{value.get('format')!r}, not {task!r} (plan/state mismatch)",
                where=where,
            )
        return k, True
    check_record(value, where, task, k)
    return k, False


def parse_packed(data: bytes, path: str, task: str) -> dict[str, dict[str, Any]]:
    """The records of a packed file's bytes, by key (what :func:`load_keyed` reads)."""
    parsed: dict[str, dict[str, Any]] = {}
    _apply(_Packed(0, 0), data, path, task, parsed)
    return parsed


def load_keyed(state: Path, task: str) -> Records:
    """Every keyed unit's settled record of ``task``, by key, in one read of
    ``results/<task>.jsonl`` (none without one); a later call reads only what
    was appended since. Each record is parsed when it is looked up."""
    path = str(packed_path(state, task))
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        _cache.pop(path, None)
        return Records({})
    except NotRegular as exc:
        raise OperationalError(f"cannot read result records: {exc.why}", where=path) from None
    except OSError as exc:
        raise OperationalError(f"cannot read result records: {exc.strerror}", where=path) from None
    try:
        entry = _cache.get(path)
        if entry is None or not entry.same_file(fd, st):
            entry = _Packed(st.st_dev, st.st_ino)  # new, replaced or cut back: read it all
        if st.st_size > entry.offset:
            data = _read_from(fd, entry.offset, st.st_size)
            fresh = _Packed(entry.dev, entry.ino)
            # a copy: a Records view handed out earlier keeps what it saw
            fresh.offset, fresh.lines, fresh.raw = entry.offset, entry.lines, dict(entry.raw)
            fresh.head, fresh.tail = entry.head, entry.tail
            _apply(fresh, data, path, task)
            entry = fresh
    except OSError as exc:
        raise OperationalError(f"cannot read result records: {exc.strerror}", where=path) from None
    finally:
        os.close(fd)
    _cache[path] = entry
    return Records(entry.raw)


def scan_keyed(state: Path, task: str) -> tuple[dict[str, str], dict[str, bytes]]:
    """One pass over ``results/<task>.jsonl`` in 1 MiB blocks, nothing kept for
    later reads (unlike :func:`load_keyed`): each key's status (its last line
    wins, a tombstone removes it) and the lines of the keys whose status is
    not ``passed``. For a fold of a million instances that is ~0.1 KiB a key
    while it runs, where :func:`load_keyed` keeps ~0.5 KiB a key for the
    session. Lines are checked as :func:`load_keyed` checks them (a damaged
    line followed by another is ``file:line``; a torn last line is ignored)."""
    path = str(packed_path(state, task))
    status: dict[str, str] = {}
    odd: dict[str, bytes] = {}
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return status, odd
    except NotRegular as exc:
        raise OperationalError(f"cannot read result records: {exc.why}", where=path) from None
    except OSError as exc:
        raise OperationalError(f"cannot read result records: {exc.strerror}", where=path) from None
    passed = "passed"  # one string for every passed key (a million of them)
    try:
        offset, rest, lineno = 0, b"", 0
        damaged: str | None = None
        while offset < st.st_size:
            chunk = os.pread(fd, min(st.st_size - offset, 1 << 20), offset)
            if not chunk:
                break
            offset += len(chunk)
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            data, rest = data[:cut], data[cut:]  # whole lines; the rest waits
            for line in data.split(b"\n")[:-1]:
                lineno += 1
                if damaged is not None:  # a damaged line with another after it
                    raise ParseError("not a JSON record (a damaged line)", where=damaged)
                where = f"{path}:{lineno}"
                try:
                    value = _parse_line(line)
                except ValueError:
                    damaged = where  # torn if it is the last line
                    continue
                k, removed = _packed_line(value, where, task)
                if removed:
                    status.pop(k, None)
                    odd.pop(k, None)
                    continue
                if value["status"] == passed:
                    status[k] = passed
                    odd.pop(k, None)
                else:
                    status[k] = value["status"]
                    odd[k] = line
    except OSError as exc:
        raise OperationalError(f"cannot read result records: {exc.strerror}", where=path) from None
    finally:
        os.close(fd)
    return status, odd


def _read_plain(path: str) -> bytes | None:
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        return None
    except NotRegular as exc:
        raise OperationalError(f"cannot read result record: {exc.why}", where=path) from None
    except OSError as exc:
        raise OperationalError(f"cannot read result record: {exc.strerror}", where=path) from None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise OperationalError(f"cannot read result record: {exc.strerror}", where=path) from None
    finally:
        os.close(fd)


def load_one(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    """The settled record of ``task`` (key None) or of its unit ``key``, or None."""
    if key is not None:
        return load_keyed(state, task).get(key)
    path = str(plain_path(state, task))
    data = _read_plain(path)
    if data is None:
        return None
    try:
        record = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=path) from None
    return check_record(record, path, task, None)


# -- writing -------------------------------------------------------------------

_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK


def _open_packed(path: Path) -> tuple[int, bool]:
    """(fd, created) of a packed file, opened to append; refused unless regular
    (a symlink is not followed, a FIFO never waited on)."""
    created = False
    # no file (create it), no results/ (make it), another writer created it first
    # (open it): three tries at most; a fourth covers results/ removed meanwhile
    for _ in range(4):
        try:
            try:
                fd = os.open(path, _APPEND_FLAGS & ~os.O_CREAT)
            except FileNotFoundError:
                fd = os.open(path, _APPEND_FLAGS | os.O_EXCL, 0o644)
                created = True
            break
        except FileNotFoundError:  # no results/ yet (the first record of a run)
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # another writer created it meanwhile
            continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):
                raise OperationalError(
                    "cannot write result records: is not a regular file", where=str(path)
                ) from None
            raise OperationalError(
                f"cannot write result records: {exc.strerror}", where=str(path)
            ) from None
    else:  # pragma: no cover - a directory that keeps vanishing
        raise OperationalError("cannot write result records", where=str(path))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OperationalError(
            "cannot write result records: is not a regular file", where=str(path)
        )
    return fd, created


def _torn_tail(fd: int, size: int) -> int:
    """Where the file's last whole line ends (``size`` when it ends in a newline):
    a line torn by a crash is cut before the next append, so it stays the last
    line only, never one in the middle."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        chunk = os.pread(fd, pos - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            return start + nl + 1
        pos = start
    return 0


def append_line(path: Path, line: bytes, *, durable: bool = False) -> None:
    """Append one whole line under the file's lock, with one ``write``."""
    fd, created = _open_packed(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        try:
            whole = _torn_tail(fd, size)
            if whole != size:
                os.ftruncate(fd, whole)
                size = whole
            n = os.write(fd, line)
            if n != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if durable:
                os.fsync(fd)
        except OSError as exc:
            # never leave a part of this line for the other writers to append after
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise OperationalError(
                f"cannot write result record: {exc.strerror}", where=str(path)
            ) from None
    finally:
        os.close(fd)  # releases the lock
    if durable and created:
        fsync_dir(path.parent)


#: this process's temp names: ``@tmp-r<pid>-<n>`` (a forked worker has its own
#: pid; a name another process left behind is skipped, O_EXCL)
_tmp_seq = [0]
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_plain(path: Path | str, data: bytes, durable: bool) -> None:
    """A plain record, atomically: what :func:`crucible.stage._fsio.write_atomic`
    does, with a temp name made from the pid and a counter instead of
    ``mkstemp``'s random one (the dispatcher writes one record per task: the
    random name cost more than the write). The results directory is made only
    after a first failure (it exists for all but a run's first record)."""
    target = str(path)
    directory = os.path.dirname(target) or "."
    for _ in range(2):
        try:
            _tmp_seq[0] += 1
            tmp = f"{directory}/@tmp-r{os.getpid()}-{_tmp_seq[0]}"
            fd = os.open(tmp, _TMP_FLAGS, 0o600)
        except FileExistsError:
            continue
        except FileNotFoundError:
            try:
                os.makedirs(directory, exist_ok=True)
            except OSError as exc:
                raise OperationalError(f"cannot write {path}: {exc.strerror or exc}") from None
            continue
        except OSError as exc:
            raise OperationalError(f"cannot write {target}: {exc.strerror or exc}") from None
        try:
            try:
                n = os.write(fd, data)
                if n != len(data):
                    write_all(fd, data[n:])
                if durable:
                    os.fsync(fd)
                os.fchmod(fd, 0o644)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except BaseException as exc:
            abandon(tmp, target, exc)
            raise
        if durable:
            fsync_dir(directory)
        return
    write_atomic(as_path(path), data, durable=durable)  # the slow path's own errors and retries


#: str(state) -> str(STATE/results), for :func:`store_record_where`
_results_strs: dict[str, str] = {}


def store_record_where(
    state: Path, record: dict[str, Any], *, durable: bool = True
) -> tuple[str, str]:
    """:func:`store_record`, returning (the file, its directory) as strings: what
    a dispatch worker hands the group commit to fsync, once per task, without
    the Path objects (their joins and parses cost more than the write)."""
    key = record.get("key")
    if key is not None:
        path = store_record(state, record, durable=durable)
        return str(path), str(path.parent)
    data = canon.dumps(record)
    where = _results_strs.get(str(state))
    if where is None:
        where = _results_strs[str(state)] = str(_results_dir(state))
    target = f"{where}/{check_task_name(record['task'])}.json"
    _write_plain(target, data, durable)
    return target, where


def store_record(state: Path, record: dict[str, Any], *, durable: bool = True) -> Path:
    """Write a settled record where it lives; returns that file. A plain record
    replaces its file atomically; a keyed one is appended to its task's packed
    file. ``durable=False`` leaves the fsyncs to the caller (the dispatcher's
    group commit fsyncs the file and its directory)."""
    key = record.get("key")
    data = canon.dumps(record)
    if key is None:
        path = plain_path(state, record["task"])
        _write_plain(path, data, durable)
        return path
    path = packed_path(state, record["task"])
    append_line(path, data + b"\n", durable=durable)
    return path


def _unlink(path: Path, durable: bool) -> None:
    _cache.pop(str(path), None)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OperationalError(f"cannot remove {path}: {exc.strerror}") from None
    if durable:
        fsync_dir(path.parent)


def remove_packed(state: Path, task: str, *, durable: bool = True) -> None:
    """Remove every keyed record of ``task`` (its packed file)."""
    _unlink(packed_path(state, task), durable)


def remove_record(state: Path, task: str, key: str | None = None, *, durable: bool = True) -> None:
    """Remove a settled record (it runs again): a plain file is unlinked, a keyed
    record gets a tombstone line (only when the key has a record)."""
    if key is None:
        _unlink(plain_path(state, task), durable)
        return
    if key not in load_keyed(state, task):
        return
    remove_keys(state, task, [key], durable=durable)


def remove_keys(state: Path, task: str, keys: list[str], *, durable: bool = True) -> None:
    """Tombstones for ``keys`` of ``task``, in one append."""
    if not keys:
        return
    lines = b"".join(
        canon.dumps({"format": RESULT_FORMAT, "key": k, TOMBSTONE: True, "task": task}) + b"\n"
        for k in keys
    )
    append_line(packed_path(state, task), lines, durable=durable)
