"""Writing a bundle atomically, and the custody folder (admission-proof.md §9)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
from pathlib import Path

from crucible.core import canon
from crucible.core.atomic import fsync_dir
from crucible.core.errors import OperationalError, UsageError
from crucible.proof import layout

__all__ = ["check_target", "custody_dir", "staging_dir", "swap_into", "sync_tree", "write_custody"]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging_dir(out: Path, what: str = "tmp") -> Path:
    return out.parent / f".{out.name}.{what}-{os.getpid()}"


def custody_dir(out: Path) -> Path:
    return out.parent / (out.name + layout.CUSTODY_SUFFIX)


def check_target(out: Path) -> None:
    """Refuse to replace anything that is not a previous bundle."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out} exists and is not a bundle directory")
    if out.is_dir() and any(out.iterdir()) and not (out / layout.ADMISSION_PROOF).exists():
        raise UsageError(
            f"--out {out} is a non-empty directory that is not a bundle; not replacing it"
        )
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")


def sync_tree(root: Path) -> None:
    """fsync every file and directory below ``root`` (before it is renamed in)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


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
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, dest)
        (staging / "custody.json").write_bytes(canon.dumps({"custodyVersion": 1, "items": items}))
        sync_tree(staging)
        swap_into(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
