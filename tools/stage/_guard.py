"""Read leases that keep the one stored copy intact while consumers hold hard
links to it (docs/spec/inputs.md 3.4, "One copy").

A consumer's read-only view of a producer's captured files is, where the
filesystem has no reflinks, a hard link to the stored inode itself: no copy.
A write through that link would change the store. So the process that runs
the consumer (a dispatch worker, which lives from the staging to the check)
holds a Linux *read lease* (``F_SETLEASE``, ``F_RDLCK``) on every stored inode
it handed over. Whoever opens that inode for writing or truncates it — through
any of its names — is held in ``open(2)`` by the kernel until the lease is
given up, and this process is told first (``F_SETSIG``: :data:`LEASE_SIGNAL`).
The handler copies the inode's bytes, untouched so far, to
``STATE/shared/@backup/<dev>-<ino>-<mtime>`` and only then gives the lease up; the
write proceeds, the consumer's check finds the change (its digest), and the
store file is replaced by the backup (crucible.stage._share).

Capture uses the same lease as a question: a task's file may move into the
store by a hard link only if nobody holds it open for writing (the kernel
refuses a read lease then) and it has no other name.

Only a process that called :func:`enable` guards views (its main thread runs
the handler); elsewhere (a ``crucible-stage inputs`` from a shell, a thread of
a Dask worker) :func:`active` is False and consumers get private copies. The
signal's default action is to ignore it, so a lease taken by a process without
the handler (capture's question) can never kill it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import resource
import signal
import threading
from typing import Any

from crucible.core.structs import dataclass, field

__all__ = [
    "BACKUP_DIR",
    "LEASE_SIGNAL",
    "active",
    "backup_name",
    "enable",
    "lease",
    "no_writer",
    "release",
]

#: ``F_SETSIG`` (linux/fcntl.h; the fcntl module does not export it)
F_SETSIG = 10
#: the lease-break signal: SIGURG, whose default action is to ignore it
LEASE_SIGNAL = signal.SIGURG
#: ``STATE/shared/@backup``: bytes saved before a write through a leased inode
BACKUP_DIR = "@backup"
#: descriptors kept free for everything else this process opens
_FD_RESERVE = 256


@dataclass
class _Lease:
    fd: int
    backups: str  # the directory its backup goes to
    holders: set[str] = field(default_factory=set)


#: (dev, ino) -> the lease this process holds on it
_leases: dict[tuple[int, int], _Lease] = {}
#: holder -> the inodes leased for it (a release touches only its own)
_by_holder: dict[str, set[tuple[int, int]]] = {}
_enabled = [False]
_budget = [0]


def enable() -> bool:
    """Guard views from this process: install the lease-break handler (main
    thread only) and raise the descriptor limit (a lease is a descriptor).
    Returns whether it is active. Idempotent."""
    if _enabled[0]:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        signal.signal(LEASE_SIGNAL, _on_break)
    except (ValueError, OSError):
        return False
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 65536)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    _budget[0] = max(0, soft - _FD_RESERVE)
    _enabled[0] = True
    return True


def active() -> bool:
    """Whether this process guards the stored inodes it links into views."""
    return _enabled[0]


def backup_name(dev: int, ino: int, mtime_ns: int) -> str:
    """``<dev>-<ino>-<mtime>``: the inode as it was captured (an inode number
    used again by a later file has another mtime, so never finds this one)."""
    return f"{dev}-{ino}-{mtime_ns}"


def lease(path: str, holder: str, backups: str) -> bool:
    """Hold a read lease on the inode at ``path`` for ``holder`` (a consumer's
    workspace). False when it cannot be held (not enabled, a writer holds the
    inode open, the filesystem has no leases, too many descriptors): the
    caller hands the consumer a private copy instead."""
    if not _enabled[0]:
        return False
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    ident = (st.st_dev, st.st_ino)
    held = _leases.get(ident)
    if held is not None:
        held.holders.add(holder)
        _by_holder.setdefault(holder, set()).add(ident)
        return True
    if len(_leases) >= _budget[0]:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    entry = _Lease(fd, backups, {holder})
    _leases[ident] = entry  # before the lease: a break at once finds it
    try:
        if os.fstat(fd).st_ino != st.st_ino:
            raise OSError(errno.ESTALE, "replaced")
        fcntl.fcntl(fd, F_SETSIG, LEASE_SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        _leases.pop(ident, None)
        os.close(fd)
        return False
    _by_holder.setdefault(holder, set()).add(ident)
    return True


def release(holder: str) -> None:
    """Give up every lease held only for ``holder`` (its check is done)."""
    for ident in _by_holder.pop(holder, ()):
        entry = _leases.get(ident)
        if entry is None:
            continue  # broken meanwhile (the handler dropped it)
        entry.holders.discard(holder)
        if not entry.holders:
            _drop(ident, entry)


def _drop(ident: tuple[int, int], entry: _Lease) -> None:
    if _leases.get(ident) is entry:
        del _leases[ident]
    with contextlib.suppress(OSError):
        fcntl.fcntl(entry.fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    with contextlib.suppress(OSError):
        os.close(entry.fd)


def _on_break(signum: int, frame: Any) -> None:
    """A writer waits in open(2) on a leased inode: save its bytes, then let go."""
    for ident, entry in list(_leases.items()):
        try:
            if fcntl.fcntl(entry.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                continue  # not this one
        except OSError:
            pass
        with contextlib.suppress(OSError):
            save_backup(entry.fd, entry.backups, ident)
        _drop(ident, entry)


def save_backup(fd: int, backups: str, ident: tuple[int, int]) -> None:
    """The bytes of ``fd`` at ``backups/<dev>-<ino>-<mtime>``, unless a backup of that
    inode is already there (another worker's lease broke first: it wrote it,
    or holds its own lease until it has, so the writer still waits)."""
    os.makedirs(backups, exist_ok=True)
    final = f"{backups}/{backup_name(*ident, os.fstat(fd).st_mtime_ns)}"
    if os.path.lexists(final):
        return
    tmp = f"{backups}/@tmp-{os.getpid()}-{ident[1]}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        offset = 0
        while n := os.sendfile(out, fd, offset, 1 << 30):
            offset += n
    finally:
        os.close(out)
    try:
        os.link(tmp, final)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def no_writer(fd: int) -> bool:
    """Whether nobody holds the file of ``fd`` (opened read-only) open for
    writing or mapped writable, asked by taking a read lease (the kernel refuses
    one then). The lease is kept: :func:`still_unwritten` asks whether it held,
    :func:`let_go` gives it up."""
    try:
        fcntl.fcntl(fd, F_SETSIG, LEASE_SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def still_unwritten(fd: int) -> bool:
    """After :func:`no_writer`: whether the lease held (nobody opened the file
    for writing since); the lease is given up either way."""
    try:
        held = fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK
    except OSError:
        held = False
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return held
