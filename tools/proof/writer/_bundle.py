"""Writing a bundle atomically, and the custody folder (admission-proof.md §9).

Every byte goes to a staging directory beside ``--out``; a write that fails (a full
disk, a file-size limit) is exit 3 naming the bundle file it was writing, and the
previous bundle stays as it was. Only a directory whose inventory is a bundle is
ever replaced.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import stat
from pathlib import Path
from typing import IO

from crucible.core import canon
from crucible.core.atomic import fsync_dir
from crucible.core.errors import OperationalError, UsageError
from crucible.core.syncfs import FsSync
from crucible.proof import layout

__all__ = [
    "FileSink",
    "Spool",
    "check_target",
    "custody_dir",
    "staging_dir",
    "swap_into",
    "sync_tree",
    "write_custody",
    "write_staged",
]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: a directory with more entries than this is not a bundle we would replace (our choice:
#: the reader's walk bound, admission-proof.md §9)
_MAX_TARGET_ENTRIES = 1 << 20


def staging_dir(out: Path, what: str = "tmp") -> Path:
    return out.parent / f".{out.name}.{what}-{os.getpid()}"


def custody_dir(out: Path) -> Path:
    return out.parent / (out.name + layout.CUSTODY_SUFFIX)


def cannot_write(out: Path, rel: str, exc: OSError) -> OperationalError:
    """Exit 3 naming the bundle file being written (issue 12 item 28)."""
    return OperationalError(
        f"cannot write {rel}: {exc.strerror or exc}; the previous bundle is untouched",
        where=str(out),
    )


def write_staged(
    staging: Path, out: Path, rel: str, data: bytes, made: set[str] | None = None
) -> None:
    """Write ``rel`` of the bundle ``out`` into its staging directory. ``made``: the
    directories (relative) a caller already created, so a bundle of many files does
    not ask the kernel again for every one."""
    target = staging / rel
    parent = rel.rpartition("/")[0]
    try:
        if made is None or parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            if made is not None:
                made.add(parent)
        with open(target, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise cannot_write(out, rel, exc) from None


class FileSink:
    """Where committed immutable files go (the staging directory)."""

    def __init__(self, root: Path, out: Path, keep: bool = False) -> None:
        self.root = root
        self.out = out
        #: path -> bytes of every committed file, kept only in cross-check mode
        self.kept: dict[str, bytes] | None = {} if keep else None
        #: directories already created below the staging directory
        self._made: set[str] = set()

    def write(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            write_staged(self.root, self.out, rel, data, self._made)
            if self.kept is not None:
                self.kept[rel] = data

    def read(self, rel: str) -> bytes:
        try:
            return (self.root / rel).read_bytes()
        except OSError as exc:
            raise OperationalError(
                f"cannot read back {rel}: {exc.strerror}", where=str(self.out)
            ) from None


class Spool:
    """``admission-proof.json`` as it grows, in the staging directory; a failed write
    names it (the buffered file fails at a later write, flush or close)."""

    def __init__(self, staging: Path, out: Path) -> None:
        self.out = out
        try:
            self._file: IO[bytes] = open(staging / layout.ADMISSION_PROOF, "wb")  # noqa: SIM115
        except OSError as exc:
            raise cannot_write(out, layout.ADMISSION_PROOF, exc) from None

    def write(self, data: bytes) -> int:
        try:
            return self._file.write(data)
        except OSError as exc:
            raise cannot_write(self.out, layout.ADMISSION_PROOF, exc) from None

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            raise cannot_write(self.out, layout.ADMISSION_PROOF, exc) from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()


def check_target(out: Path) -> None:
    """Refuse to replace anything that is not a previous bundle (exit 2): a link, a
    file, or a directory holding anything but a bundle's paths (an empty one is fine)."""
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OperationalError(f"--out {out}: cannot inspect: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(
            f"--out {out} is a symbolic link; links are not followed, not replacing it"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"--out {out} exists and is not a bundle directory")
    problem = _not_a_bundle(out)
    if problem is not None:
        raise UsageError(f"--out {out} is not a bundle ({problem}); not replacing it")


def _not_a_bundle(out: Path) -> str | None:
    """Why the directory ``out`` is not a bundle, or None (a bundle, or empty)."""
    found: set[str] = set()
    stack = [(str(out), "")]
    while stack:
        abs_dir, rel_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as it:
                entries = list(it)
        except OSError as exc:
            raise OperationalError(
                f"--out {out}: cannot list {rel_dir or '.'}: {exc.strerror}"
            ) from None
        if not entries and rel_dir:
            return f"{rel_dir[:-1]!r} is an empty directory"  # the writer never makes one
        for entry in entries:
            rel = rel_dir + entry.name
            if entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, rel + "/"))
                continue
            if not entry.is_file(follow_symlinks=False):
                return f"{rel!r} is not a regular file"
            if not layout.is_bundle_path(rel):
                return f"{rel!r} is no bundle path"
            found.add(rel)
            if len(found) > _MAX_TARGET_ENTRIES:
                return f"more than {_MAX_TARGET_ENTRIES} files"
    missing = [p for p in layout.REQUIRED_FILES if p not in found]
    if found and missing:
        return f"no {missing[0]}"
    return None


def sync_tree(root: Path) -> None:
    """Make every file and directory below ``root`` durable (before it is renamed in):
    one ``syncfs`` of its filesystem where that reports writeback errors
    (crucible.core.syncfs: a bundle of 8,000 files took 37 s fsynced one by one on
    a busy disk), else one fsync each."""
    current = str(root)
    try:
        paths: list[str] = []
        for dirpath, _dirs, files in os.walk(root):
            paths.extend(os.path.join(dirpath, name) for name in files)
            paths.append(dirpath)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fs = FsSync(fd, str(root))
            if fs.covers(paths):
                fs.sync()
                return
        finally:
            os.close(fd)
        for current in paths:
            if os.path.isdir(current):
                fsync_dir(current)
                continue
            fd = os.open(current, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise OperationalError(f"cannot sync: {exc.strerror}", where=current) from None


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False if unsupported."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(rc == 0)


def swap_into(staging: Path, out: Path) -> None:
    """Make ``staging`` the directory ``out``; a crash leaves the old one or the new one."""
    try:
        if not out.exists():
            os.rename(staging, out)
        elif _exchange(staging, out):
            shutil.rmtree(staging)  # now holds the previous bundle
        else:
            aside = staging_dir(out, "old")
            os.rename(out, aside)
            os.rename(staging, out)
            shutil.rmtree(aside)
        fsync_dir(out.parent)
    except OSError as exc:
        raise OperationalError(f"cannot write bundle {out}: {exc.strerror or exc}") from None


def write_custody(out: Path, items: list[dict[str, object]], sources: dict[str, Path]) -> Path:
    """Copy received-but-unrecorded files next to the bundle (never inside it)."""
    target = custody_dir(out)
    staging = staging_dir(target)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        for rel, source in sources.items():
            dest = staging / rel
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, dest)
            except OSError as exc:
                raise cannot_write(target, rel, exc) from None
        custody = canon.dumps({"custodyVersion": 1, "items": items})
        write_staged(staging, target, "custody.json", custody)
        sync_tree(staging)
        swap_into(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
