"""One ``syncfs(2)`` of a filesystem instead of one fsync per file (the session
log's group commit, a proof bundle before it is renamed in).

The session log's group commit makes every record file a batch wrote durable
before the batch's lines (docs/spec/run.md, "Records ride the group commit").
One fsync per file costs a round trip to the device each: a fully cached rerun
of 1,000 plain units spent ~0.4 s in them. ``syncfs`` writes back every dirty
file of one filesystem and waits once: 256 small files took 4 ms instead of
120 ms here (ext4, measured). PostgreSQL's ``recovery_init_sync_method =
syncfs`` is the precedent, with the same two caveats, which decide when it is
used:

- it reports a writeback error only since Linux 5.8 (errors are tracked per
  superblock, and reported to each open file once, from when that file was
  opened): older kernels, and other systems, fsync each file;
- it writes back whatever else is dirty on that filesystem too, so it is used
  only for a batch of several files, and only on the local filesystems whose
  ``syncfs`` is known to reach the device (ext2/3/4, XFS, Btrfs, F2FS, tmpfs);
  on any other (NFS, FUSE, overlay) each file is fsynced.

The descriptor ``syncfs`` is called on is the session log's own, opened when
the session starts, so an error of any write of the session since then is
reported (and one of another program on that filesystem too: conservative, the
run stops, exit 3).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

__all__ = ["SYNCFS_FILESYSTEMS", "SYNCFS_MIN_PATHS", "FsSync"]

#: a batch with at least this many files and directories to make durable uses
#: one syncfs (measured here: 16 files cost 8 ms fsynced one by one, 1 ms by
#: syncfs; 4 files 1.6 ms and 0.9 ms): below it, other programs' dirty data on
#: the filesystem would cost more than the fsyncs saved
SYNCFS_MIN_PATHS = 8
#: statfs f_type of the filesystems whose syncfs writes every dirty inode of
#: the filesystem back and waits for the device (linux/magic.h)
SYNCFS_FILESYSTEMS = frozenset(
    {
        0xEF53,  # ext2, ext3, ext4
        0x58465342,  # XFS
        0x9123683E,  # Btrfs
        0xF2F52010,  # F2FS
        0x01021994,  # tmpfs (nothing to write back)
    }
)


def _kernel_reports_errors(release: str) -> bool:
    """Linux 5.8 or later (``os.uname().release``, e.g. ``6.1.0-13-amd64``)."""
    try:
        major, minor = (int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (5, 8)


class FsSync:
    """``syncfs`` of the filesystem holding ``fd``, when it can stand in for the
    fsyncs of a batch's files (:meth:`covers`)."""

    def __init__(self, fd: int, where: str) -> None:
        self.fd = fd
        #: what an error names (the state directory)
        self.where = where
        self.dev = os.fstat(fd).st_dev
        #: the libc syncfs, once found usable (None: not looked at yet, False: not usable)
        self._call: Callable[[int], int] | bool | None = None

    def _syncfs(self) -> Callable[[int], int] | bool:
        """Looked up at the first large batch (ctypes costs ~3 ms to import)."""
        if self._call is None:
            self._call = False
            if sys.platform.startswith("linux") and _kernel_reports_errors(os.uname().release):
                try:
                    # lazy: ctypes costs start-up; only _syncfs() needs it
                    import ctypes

                    libc = ctypes.CDLL(None, use_errno=True)
                    buf = ctypes.create_string_buffer(512)  # struct statfs, f_type first
                    if libc.fstatfs(self.fd, buf) == 0:
                        f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
                        if f_type in SYNCFS_FILESYSTEMS:
                            syncfs = libc.syncfs
                            syncfs.argtypes = [ctypes.c_int]
                            syncfs.restype = ctypes.c_int
                            self._call = syncfs
                except (OSError, AttributeError):  # no libc, no syncfs symbol
                    self._call = False
        return self._call

    def covers(self, paths: list[str]) -> bool:
        """Whether one syncfs makes ``paths`` durable: at least SYNCFS_MIN_PATHS
        of them, every one on this filesystem (a path removed meanwhile, a
        retry's record, needs nothing)."""
        if len(paths) < SYNCFS_MIN_PATHS or not self._syncfs():
            return False
        for p in paths:
            try:
                if os.lstat(p).st_dev != self.dev:
                    return False  # another filesystem (a mount inside STATE): fsync each
            except FileNotFoundError:
                continue
        return True

    def sync(self) -> None:
        """One syncfs; a writeback error since the session log was opened raises
        OSError (ENOSPC, EIO)."""
        call = self._syncfs()
        assert callable(call), "sync() after covers() said yes"
        if call(self.fd) != 0:
            # lazy: ctypes costs start-up; only sync() needs it
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), self.where)
