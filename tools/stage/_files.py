"""emits_files: capture from a workspace into STATE/files.

Capture never lets a task's output reach outside its own directories: declared
patterns that are absolute or climb (``..``) are refused as plan errors; a matched
symlink is followed only when its target resolves inside the workspace (the file
is copied as a regular file); special files are refused. Staging the captured trees into consumers is
:mod:`crucible.stage._share`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import stat
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from crucible.core.errors import InputRefused, Location, OperationalError
from crucible.core.fdio import write_all
from crucible.core.fsio import NotRegular, TooDeep, kind_of, open_regular, walk_tree
from crucible.core.globs import GLOB_CHARS, pattern_regex
from crucible.core.structs import dataclass, field
from crucible.stage._fsio import TMP_PREFIX

__all__ = [
    "CAPTURE_DEPTH_MAX",
    "FILES_RUN_MAX",
    "CaptureRefused",
    "FileCapture",
    "capture_files",
    "check_pattern",
]

#: Bound on emits_files bytes: what one producer may capture, and what one task
#: may be handed from all its ancestors together (for the last task of a run,
#: the run's total). 4 GiB (our choice).
FILES_RUN_MAX = 4 * 1024**3

#: Bound on the depth of a captured path (directories from the workspace
#: root), so a task nesting thousands of directories fails as measured (our
#: choice; PATH_MAX allows about 2,000 one-letter levels).
CAPTURE_DEPTH_MAX = 256



class CaptureRefused(Exception):
    """What the task produced cannot be captured; the attempt fails with ``note``.

    ``retryable`` is False when a retry would produce the same refusal (a path
    outside the workspace, a bound exceeded)."""

    def __init__(self, note: str, *, retryable: bool) -> None:
        super().__init__(note)
        self.note = note
        self.retryable = retryable


@dataclass
class Moved:
    """A workspace file whose inode became the stored one (capture by link):
    its workspace name, to unlink once the capture passed, and the inode."""

    path: str
    dev: int
    ino: int


@dataclass
class FileCapture:
    files: list[dict[str, object]] = field(default_factory=list)
    total: int = 0
    #: files captured by link (``link=True``): their workspace names
    moved: list[Moved] = field(default_factory=list)


def check_pattern(pattern: str, where: str | Location) -> tuple[str, ...]:
    """The normalized parts of a declared emits_files entry; plan errors refused."""
    if not isinstance(pattern, str) or pattern.strip() == "":
        raise InputRefused("an emits_files entry must be a non-empty path", where=where)
    if "\x00" in pattern or "\\" in pattern:
        raise InputRefused(f"emits_files entry {pattern!r} holds NUL or '\\'", where=where)
    p = PurePosixPath(pattern)
    if p.is_absolute():
        raise InputRefused(f"emits_files entry {pattern!r} is absolute", where=where)
    parts = tuple(x for x in p.parts if x != ".")
    if ".." in parts:
        raise InputRefused(
            f"emits_files entry {pattern!r} climbs out of the workspace", where=where
        )
    if not parts:
        raise InputRefused(f"emits_files entry {pattern!r} names the workspace itself", where=where)
    try:
        pattern_regex(parts)
    except re.error as exc:  # "[!]", "[z-a]": refused as a plan error, never raised raw
        raise InputRefused(
            f"emits_files entry {pattern!r} is not a valid glob ({exc.msg})", where=where
        ) from None
    return parts


def _inside(real: str, root_real: str) -> bool:
    return real == root_real or real.startswith(root_real.rstrip("/") + "/")


class _Copier:
    def __init__(self, workspace: Path, dest: Path, budget: int, link: bool = False) -> None:
        #: capture by hard link where that is safe (:meth:`_link_file`)
        self.link = link
        self.workspace = workspace
        self.root_real = os.path.realpath(workspace)
        self.dest = dest
        self.budget = budget
        self.result = FileCapture()
        self.done: set[str] = set()
        #: directories made under ``dest`` (relative): a file's parent is made
        #: once, not asked for again before every file
        self.made: set[str] = set()
        #: ``dest``'s device, for the clone memo's key (no fstat per file)
        self.dest_dev: int | None = None
        self.hasher: _Hasher | None = None  # started at the first large file

    def _refuse_outside(self, rel: str, real: str) -> CaptureRefused:
        return CaptureRefused(
            f"emits_files: {rel!r} resolves to {real!r}, outside the workspace; refused",
            retryable=False,
        )

    def capture(self, rel: str) -> None:
        """Capture workspace-relative ``rel`` (a file or a directory tree).

        Iterative (a tree nested thousands deep is refused at
        :data:`CAPTURE_DEPTH_MAX`, never a RecursionError), and any entry that
        vanishes or cannot be read mid-walk (a daemon renaming a directory)
        fails the attempt instead of escaping as an OSError."""
        src = os.path.join(self.workspace, rel)
        real = os.path.realpath(src)
        if not _inside(real, self.root_real):
            raise self._refuse_outside(rel, real)
        stack: list[tuple[str, str, frozenset[str]]] = [(rel, real, frozenset())]
        while stack:
            item_rel, item_real, visiting = stack.pop()
            try:
                children = self._copy(item_rel, item_real, visiting)
            except OSError as exc:
                raise CaptureRefused(
                    f"emits_files: {item_rel!r} changed or vanished while it was captured "
                    f"({exc.strerror or exc}); refused",
                    retryable=False,
                ) from None
            stack.extend(reversed(children))

    def _copy(
        self, rel: str, real: str, visiting: frozenset[str]
    ) -> list[tuple[str, str, frozenset[str]]]:
        """Copy one file, or make one directory and return its entries to visit."""
        if rel.count("/") + 1 > CAPTURE_DEPTH_MAX:
            raise _too_deep(rel)
        try:
            st = os.stat(real)
        except OSError as exc:
            raise CaptureRefused(
                f"emits_files: cannot read {rel!r}: {exc.strerror}", retryable=True
            ) from None
        if stat.S_ISDIR(st.st_mode):
            if real in visiting:
                raise CaptureRefused(f"emits_files: {rel!r} is a symlink loop", retryable=False)
            visiting = visiting | {real}
            self._make_dir(rel)
            with os.scandir(real) as it:
                entries = sorted(e.name for e in it)
            children = []
            for name in entries:
                child_rel = f"{rel}/{name}"
                child = os.path.join(real, name)
                child_real = os.path.realpath(child) if os.path.islink(child) else child
                if not _inside(child_real, self.root_real):
                    raise self._refuse_outside(child_rel, child_real)
                children.append((child_rel, child_real, visiting))
            return children
        if not stat.S_ISREG(st.st_mode):
            raise CaptureRefused(
                f"emits_files: {rel!r} is {kind_of(st.st_mode)}, not a regular file",
                retryable=False,
            )
        if rel in self.done:
            return []
        self.done.add(rel)
        self._make_dir(rel.rpartition("/")[0])  # "": dest itself
        self.result.files.append(self._copy_file(rel, real, self.dest / rel))
        return []

    def _make_dir(self, rel: str) -> None:
        if rel not in self.made:
            (self.dest / rel).mkdir(parents=True, exist_ok=True)
            self.made.add(rel)
            if self.dest_dev is None:
                self.dest_dev = os.stat(self.dest).st_dev

    def _copy_file(self, rel: str, real: str, target: Path) -> dict[str, object]:
        """Copy one checked file; returns its ``files`` entry (a large file's
        digest is set when :attr:`hasher` is closed). The source is opened
        without following a final symlink and without blocking, and, where
        /proc shows it, re-checked by what was opened: a file swapped for a
        symlink or a FIFO after the check is refused, not followed or waited on."""
        try:
            fd, st = open_regular(real)
        except NotRegular:
            raise CaptureRefused(
                f"emits_files: {rel!r} changed while it was captured; refused", retryable=False
            ) from None
        except OSError as exc:
            raise CaptureRefused(
                f"emits_files: cannot read {rel!r}: {exc.strerror}", retryable=False
            ) from None
        try:
            opened = _opened_path(fd)
            if opened is not None and not _inside(opened, self.root_real):
                raise CaptureRefused(
                    f"emits_files: {rel!r} changed while it was captured; refused", retryable=False
                )
            self.result.total += st.st_size
            if self.result.total > self.budget:
                raise CaptureRefused(
                    f"emits_files: more than {self.budget} bytes captured (at {rel!r}); "
                    f"the bound on a task's files is {self.budget} bytes",
                    retryable=False,
                )
            limit = self.budget - self.result.total + st.st_size
            entry: dict[str, object] = {"path": rel}
            if self.link and self._link_file(fd, st, real, target, entry):
                self.result.moved.append(Moved(real, st.st_dev, st.st_ino))
                return entry
            if st.st_size < KERNEL_COPY_MIN:
                size, entry["digest"] = copy_fd_hashed(
                    fd, target, limit=limit, expect=st.st_size
                )
            else:
                size = self._copy_large(fd, target, limit, entry, st)
            entry["size"] = size
            self.result.total += size - st.st_size  # a file that grew while copied
            return entry
        finally:
            os.close(fd)

    def _link_file(
        self, fd: int, st: os.stat_result, real: str, target: Path, entry: dict[str, object]
    ) -> bool:
        """Capture by hard link: the task's inode becomes the stored one, no
        byte copied. Only when that is safe — the file has no other name
        (``st_nlink`` 1: not a staged link, nothing the task linked
        elsewhere), nobody holds it open for writing (the kernel grants a
        read lease, crucible.stage._guard), and nobody opened it for writing
        while it was hashed (the lease held). Else False: it is copied."""
        if st.st_nlink != 1:
            return False
        from crucible.stage import _guard  # lazy: signal and resource, only for a link

        if not _guard.no_writer(fd):
            return False
        linked = done = False
        h = hashlib.sha256()
        size = 0
        try:
            try:
                os.link(real, target, follow_symlinks=False)
                linked = True
            except OSError:
                return False
            # the name may have been swapped since it was opened: the inode
            # linked must be the one opened (and hashed below)
            if os.lstat(target).st_ino == st.st_ino and os.fstat(fd).st_nlink == 2:
                buf = memoryview(bytearray(min(1 << 20, st.st_size + 1)))
                size = hash_fd(fd, buf, h, 0, 1 << 62)
                done = size == st.st_size
        finally:
            unwritten = _guard.still_unwritten(fd)
            done = done and unwritten and os.fstat(fd).st_nlink == 2
            if linked and not done:
                os.unlink(target)
        if done:
            entry["digest"] = "sha256:" + h.hexdigest()
            entry["size"] = size
        return done

    def _copy_large(
        self, fd: int, target: Path, limit: int, entry: dict[str, object], st: os.stat_result
    ) -> int:
        """Copy in the kernel while the hashing threads follow the copy: the
        digest is taken over the copy, never over a source that may still
        change after it was read. A file the kernel copies in one step
        (its size ``st.st_size`` at most one sendfile's) is handed over once
        copied: its thread wakes once, not at the copy's start, its step and its
        end (three context switches a file, which the CPU of a capture of many
        files showed)."""
        out = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        if self.hasher is None:
            try:
                self.hasher = _Hasher()
            except BaseException:
                os.close(out)
                raise
        job = _Copy(out, target, entry)
        follow = st.st_size > _SENDFILE_MAX
        if follow:
            self.hasher.submit(job)  # from here on the hasher closes ``out``
        try:
            size = kernel_copy_bounded(
                fd,
                out,
                target,
                limit=limit,
                progress=job.advance if follow else None,
                key=None if self.dest_dev is None else (st.st_dev, self.dest_dev),
            )
        except BaseException as exc:
            if follow:
                self.hasher.drop(job)
            else:
                os.close(out)
            if isinstance(exc, OSError):
                raise OperationalError(
                    f"cannot capture into {target}: {exc.strerror or exc}"
                ) from None
            raise
        job.finish(size)
        if not follow:
            self.hasher.submit(job)  # from here on the hasher closes ``out``
        if not self.hasher.threaded:
            self.hasher.hash_here(job)
        return size

    def finish(self, *, failed: bool) -> None:
        """Wait for the hashing threads (``failed``: drop their work)."""
        if self.hasher is not None:
            hasher, self.hasher = self.hasher, None
            hasher.close(abort=failed)


def _too_deep(rel: str) -> CaptureRefused:
    return CaptureRefused(
        f"emits_files: {rel[:120]!r}… is nested more than {CAPTURE_DEPTH_MAX} directories "
        f"deep; the bound on a captured path's depth is {CAPTURE_DEPTH_MAX}",
        retryable=False,
    )


def _opened_path(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def copy_fd_hashed(
    src: int, target: Path, *, limit: int, mode: int = 0o644, expect: int | None = None
) -> tuple[int, str]:
    """Copy what ``src`` holds (from its current offset) to a new file
    ``target``, hashing as it goes: (bytes, ``sha256:…``). More than ``limit``
    bytes fails the copy (a file that grows while it is read). The digest is
    taken over the very bytes written (they pass through our memory).
    ``expect``: the size fstat gave, so that a small file is read with buffers
    of its size (``os.read`` allocates what it is asked for)."""
    h = hashlib.sha256()
    size = 0
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        while chunk := os.read(src, _read_size(size, limit, expect)):
            size += len(chunk)
            if size > limit:
                raise _grew(target, limit)
            h.update(chunk)
            write_all(out, chunk)
    except OSError as exc:
        raise OperationalError(f"cannot capture into {target}: {exc.strerror or exc}") from None
    finally:
        os.close(out)
    return size, "sha256:" + h.hexdigest()


#: read size of the in-memory copy (files below :data:`KERNEL_COPY_MIN`); a
#: 1 MiB ``os.read`` allocates (and maps) a 1 MiB buffer even for 10 bytes
_CHUNK = 1 << 18


def _read_size(done: int, limit: int, expect: int | None) -> int:
    """The next read of a copy: up to one byte past the expected end (that
    read finds the end), then whole chunks (the file grew); never more than
    one byte past ``limit``."""
    want = _CHUNK if expect is None or done > expect else expect - done + 1
    return min(want, _CHUNK, limit + 1 - done)

#: A file of at least this many bytes is copied in the kernel (a reflink where
#: the filesystem has them, else ``sendfile``) and its copy hashed by a
#: :class:`_Hasher` thread while the next file is copied; below it, the bytes
#: are read, hashed and written in one pass (fewer system calls, no thread).
KERNEL_COPY_MIN = 1 << 18

#: the FICLONE ioctl request number (linux/fs.h), not exposed by fcntl
FICLONE = 0x40049409
#: (source device, target device) -> whether FICLONE works between them (one
#: memo for capture and the shared store, so each learns it once)
_clone_ok: dict[tuple[int, int], bool] = {}
#: bytes per sendfile call: the bound is re-checked, and the hashing thread
#: told how far the copy got, between calls
_SENDFILE_MAX = 1 << 23


def _grew(target: Path, limit: int) -> CaptureRefused:
    return CaptureRefused(
        f"emits_files: {target.name!r} grew past the bound of {limit} bytes "
        "while it was captured",
        retryable=False,
    )


def clone_fd(src: int, out: int, key: tuple[int, int] | None = None) -> bool:
    """A copy-on-write clone of all of ``src`` into ``out`` (XFS, btrfs); False
    where the filesystems cannot, remembered per ``key``, the pair of devices
    (taken from the two files where the caller does not know it)."""
    if key is None:
        key = (os.fstat(src).st_dev, os.fstat(out).st_dev)
    if _clone_ok.get(key) is False:
        return False

    try:
        fcntl.ioctl(out, FICLONE, src)
    except OSError:
        _clone_ok[key] = False
        return False
    _clone_ok[key] = True
    return True


def clone_known_bad(key: tuple[int, int]) -> bool:
    """Whether a clone between this pair of devices is known not to work."""
    return _clone_ok.get(key) is False


def kernel_copy_bounded(
    src: int,
    out: int,
    target: Path,
    *,
    limit: int,
    progress: Callable[[int], None] | None = None,
    key: tuple[int, int] | None = None,
) -> int:
    """Copy all of ``src`` (from offset 0) into the empty ``out`` without the
    bytes passing through Python; returns the bytes copied, and tells
    ``progress`` how many are in ``out`` after each step. More than ``limit``
    fails the copy: ``sendfile`` is asked for at most ``limit + 1`` bytes in
    all, and a clone's size is checked before anything else is done with it.
    ``key``: the two files' devices, when the caller knows them (clone_fd)."""
    if clone_fd(src, out, key):
        size = os.fstat(out).st_size
        if size > limit:
            raise _grew(target, limit)
        return size
    size = 0
    try:
        while n := os.sendfile(out, src, size, min(_SENDFILE_MAX, limit + 1 - size)):
            size += n
            if size > limit:
                raise _grew(target, limit)
            if progress is not None:
                progress(size)
        return size
    except OSError as exc:
        if size or exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
    while chunk := os.pread(src, min(_CHUNK, limit + 1 - size), size):
        size += len(chunk)
        if size > limit:
            raise _grew(target, limit)
        write_all(out, chunk)
        if progress is not None:
            progress(size)
    return size


def hash_fd(fd: int, buf: memoryview, h: Any, start: int, end: int) -> int:
    """Update the sha256 object ``h`` with ``fd``'s bytes from ``start`` to
    ``end``, read into ``buf``; returns where it stopped (``end``, or sooner
    at the end of the file)."""
    pos = start
    while pos < end:
        view = buf[: min(len(buf), end - pos)]
        n = os.preadv(fd, [view], pos)
        if not n:
            break
        h.update(view[:n])  # releases the GIL: the copy goes on meanwhile
        pos += n
    return pos


class _Copy:
    """One large file being copied into the store, and how far the copy has
    got: the hashing thread that took it hashes up to ``copied`` and waits for
    more until the copy has ``finished`` (or ``failed``). The hasher closes
    ``fd``, once the copy is settled."""

    __slots__ = ("copied", "cv", "entry", "failed", "fd", "size", "target")

    def __init__(self, fd: int, target: Path, entry: dict[str, object]) -> None:
        self.fd = fd
        self.target = target
        self.entry = entry
        self.copied = 0
        self.size: int | None = None
        self.failed = False
        self.cv = threading.Condition()

    def advance(self, copied: int) -> None:
        with self.cv:
            self.copied = copied
            self.cv.notify()

    def finish(self, size: int) -> None:
        with self.cv:
            self.copied = self.size = size
            self.cv.notify()

    def fail(self) -> None:
        with self.cv:
            self.failed = True
            self.cv.notify()

    def settled(self) -> None:
        """Wait until the copy is finished or failed."""
        with self.cv:
            while self.size is None and not self.failed:
                self.cv.wait()

    def wait(self, pos: int) -> tuple[int, bool]:
        """(bytes copied, whether that is all of them) once past ``pos``, the
        copy is finished, or it failed (then (-1, True))."""
        with self.cv:
            while self.copied <= pos and self.size is None and not self.failed:
                self.cv.wait()
            return (-1, True) if self.failed else (self.copied, self.size is not None)


class _Hasher:
    """Hashes captured copies — new files in the capture's temporary tree, held
    by no one but capture, so the digest describes the bytes the store keeps —
    on up to :data:`HASH_THREADS` threads, each following a copy as the kernel
    makes it, while the caller goes on to the next file (hashlib and sendfile
    both release the GIL). Made at the first large file: a capture of small
    files starts no thread. On one core the caller hashes each copy once it
    is made (:meth:`hash_here`). A failure is raised by :meth:`close`."""

    def __init__(self) -> None:
        # lazy: not loaded with this module; only __init__() needs it
        import queue

        n = _hash_threads()
        self.threaded = n > 1
        self._buf = memoryview(bytearray(_HASH_READ))
        # bounded: the copy runs ahead by a few files' fds, no more
        self._jobs: queue.Queue[_Copy | None] = queue.Queue(maxsize=4 * n)
        self._errors: list[BaseException] = []
        self._abort = False
        self._last: _Copy | None = None  # the one job a copy may still be making
        self._threads = [
            threading.Thread(target=self._run, name="crucible-capture-hash", daemon=True)
            for _ in range(n if self.threaded else 0)
        ]
        for t in self._threads:
            t.start()

    def submit(self, job: _Copy) -> None:
        """Hand over a copy about to be made (threads: it is hashed as it grows)."""
        if self._errors:  # a thread failed: stop copying now
            os.close(job.fd)
            raise self._errors[0]
        self._last = job
        if self.threaded:
            try:
                self._jobs.put(job)  # waits while the hashing is a few files behind
            except BaseException:  # interrupted: no thread will see it
                os.close(job.fd)
                raise

    def drop(self, job: _Copy) -> None:
        """The copy failed: no digest; its fd is closed."""
        job.fail()
        if not self.threaded:
            os.close(job.fd)

    def hash_here(self, job: _Copy) -> None:
        self._hash(job, self._buf)
        if self._errors:
            raise self._errors[0]

    def _run(self) -> None:
        buf = memoryview(bytearray(_HASH_READ))
        while (job := self._jobs.get()) is not None:
            self._hash(job, buf)

    def _hash(self, job: _Copy, buf: memoryview) -> None:
        try:
            h, pos = hashlib.sha256(), 0
            while not self._abort and not self._errors:
                copied, final = job.wait(pos)
                if copied < 0:
                    return  # the copy failed: the caller raises
                pos = hash_fd(job.fd, buf, h, pos, copied)
                if pos != copied:  # pragma: no cover - only capture holds the copy
                    raise OperationalError(f"{job.target} changed size while it was hashed")
                if final:
                    job.entry["digest"] = "sha256:" + h.hexdigest()
                    return
        except OSError as exc:
            self._errors.append(
                OperationalError(f"cannot capture into {job.target}: {exc.strerror or exc}")
            )
        except BaseException as exc:  # handed to the caller's thread
            self._errors.append(exc)
        finally:
            # never while the copy still writes to it: the number could be reused
            job.settled()
            os.close(job.fd)

    def close(self, *, abort: bool = False) -> None:
        """Wait for every job (``abort``: close their fds unhashed); raises the
        first error a job met."""
        self._abort = abort
        if abort and self._last is not None:
            self._last.fail()  # interrupted between its submit and its copy
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        if self._errors and not abort:
            raise self._errors[0]


#: bytes per read of a copy being hashed
_HASH_READ = 1 << 20

#: hashing threads per capture: sha256 runs at ~1.7 GB/s here and the kernel
#: copies at ~2.5 GB/s, so two hashers keep up with one copier
HASH_THREADS = 2


def _hash_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(HASH_THREADS, cores))


def _skip_at_root(name: str) -> bool:
    # What stage handed the task is not its output; stage's temporaries neither.
    return name == "inputs" or name.startswith(TMP_PREFIX)


def _walk_rel(workspace: Path, base: str) -> list[str]:
    """Workspace-relative paths under ``base`` (files and dirs), not following
    links, iteratively and at most :data:`CAPTURE_DEPTH_MAX` deep.

    A glob from the workspace root does not enter ``inputs/`` (what stage handed
    the task is not its output) nor stage's ``@tmp-`` temporaries."""
    top = os.path.join(workspace, base) if base else str(workspace)
    depth = base.count("/") + 1 if base else 0
    try:
        rels = walk_tree(
            top,
            max_depth=CAPTURE_DEPTH_MAX - depth,
            prune_top=None if base else _skip_at_root,
        )
    except TooDeep as exc:
        raise _too_deep(f"{base}/{exc.rel}" if base else exc.rel) from None
    except OSError as exc:
        raise CaptureRefused(
            f"emits_files: {base or '.'!r} changed or vanished while it was searched "
            f"({exc.strerror or exc}); refused",
            retryable=False,
        ) from None
    return [f"{base}/{r}" for r in rels] if base else rels


def capture_files(
    workspace: Path,
    patterns: tuple[str, ...],
    dest: Path,
    *,
    budget: int,
    require_literals: bool,
    link: bool = False,
) -> FileCapture:
    """Copy what ``patterns`` match in ``workspace`` to ``dest`` (same relative paths).

    A literal entry that does not exist fails the attempt when
    ``require_literals`` (a passing attempt); a glob may match nothing.
    ``link``: capture by hard link where safe (the caller then empties the
    workspace of :attr:`FileCapture.moved`, or copies nothing back).
    """
    copier = _Copier(workspace, dest, budget, link)
    try:
        _capture_patterns(copier, workspace, patterns, require_literals)
    except BaseException:
        copier.finish(failed=True)
        raise
    copier.finish(failed=False)
    copier.result.files.sort(key=lambda f: str(f["path"]))
    return copier.result


def _capture_patterns(
    copier: _Copier, workspace: Path, patterns: tuple[str, ...], require_literals: bool
) -> None:
    for i, pattern in enumerate(patterns):
        parts = check_pattern(pattern, f"emits_files[{i}]")
        glob_at = next((j for j, p in enumerate(parts) if GLOB_CHARS & set(p)), None)
        if glob_at is None:
            rel = "/".join(parts)
            if not os.path.lexists(os.path.join(workspace, rel)):
                if require_literals:
                    raise CaptureRefused(f"emits_files: {rel!r} was not written", retryable=True)
                continue
            copier.capture(rel)
            continue
        base = "/".join(parts[:glob_at])
        base_path = os.path.join(workspace, base) if base else str(workspace)
        if base and not _inside(os.path.realpath(base_path), copier.root_real):
            raise copier._refuse_outside(base, os.path.realpath(base_path))
        if not os.path.isdir(base_path):
            continue
        regex = pattern_regex(parts)
        matched = sorted(r for r in _walk_rel(workspace, base) if regex.match(r))
        # A matched directory brings its whole tree; skip matches inside one.
        taken: list[str] = []
        for rel in matched:
            if any(rel.startswith(t + "/") for t in taken):
                continue
            real = os.path.realpath(os.path.join(workspace, rel))
            if os.path.isdir(real):
                taken.append(rel)
            copier.capture(rel)
