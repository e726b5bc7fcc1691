"""Hostile-input-safe access to a bundle directory.

Nothing here follows a symbolic link: the tree is walked with ``lstat`` semantics
and every file is opened component by component relative to the bundle's
directory descriptor with ``O_NOFOLLOW``, so a link planted inside the bundle (or
swapped in after the walk) can never make the reader see bytes outside it. Every
read is bounded: a file larger than its ceiling is refused from ``fstat`` before a
byte is read, and at most ``ceiling + 1`` bytes are ever read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from crucible.core.structs import dataclass, field
from crucible.proof.reader._display import escaped
from crucible.proof.reader._findings import Inability, Problem, over_bound

__all__ = ["BundleTree", "walk_bundle"]

_DIR_FLAGS = (
    os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_MAX_NAME_BYTES = 255


@dataclass
class BundleTree:
    """The bundle's regular files (relative POSIX path -> size), as walked once."""

    root: Path
    sizes: dict[str, int] = field(default_factory=dict)
    #: first entry that is neither a directory nor a regular file (a symlink, a fifo...)
    irregular: str | None = None
    #: first name that is not a portable path component
    bad_name: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def read(self, rel: str, ceiling: int) -> bytes:
        """The bytes of ``rel``; ``input-over-bound`` when larger than ``ceiling``."""
        parts = rel.split("/")
        try:
            fd = os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise Inability(f"cannot open the bundle: {exc.strerror}", where=self.where) from None
        try:
            for part in parts[:-1]:
                try:
                    nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._vanished(rel, exc) from None
                os.close(fd)
                fd = nxt
            try:
                ffd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise self._vanished(rel, exc) from None
            try:
                st = os.fstat(ffd)
                if not stat.S_ISREG(st.st_mode):
                    raise Problem("input-malformed", 1, "not a regular file", path=rel)
                if st.st_size > ceiling:
                    raise over_bound(f"{st.st_size} bytes exceed the ceiling of {ceiling}", rel)
                chunks: list[bytes] = []
                remaining = ceiling + 1
                while remaining > 0:
                    chunk = os.read(ffd, min(remaining, 1 << 20))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    remaining -= len(chunk)
                data = b"".join(chunks)
            except OSError as exc:
                raise Inability(f"{rel}: read failed: {exc.strerror}", where=self.where) from None
            finally:
                os.close(ffd)
        finally:
            os.close(fd)
        if len(data) > ceiling:  # grew after fstat
            raise over_bound(f"more than {ceiling} bytes", rel)
        return data

    @property
    def where(self) -> str:
        """The bundle as named on the command line, escaped for one line."""
        return escaped(self.root)

    def _vanished(self, rel: str, exc: OSError) -> Exception:
        # ELOOP/ENOTDIR: a component became a symlink after the walk; never follow it.
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            return Problem("input-malformed", 1, "a path component is not a directory", path=rel)
        return Inability(f"{rel}: cannot open: {exc.strerror}", where=self.where)


def _portable(name: str) -> bool:
    if name in ("", ".", "..") or "\\" in name or "\x00" in name:
        return False
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes surfaced as surrogates
        return False
    # control characters: C0 (below 0x20) and DEL (0x7F), as the writer refuses them
    return len(encoded) <= _MAX_NAME_BYTES and not any(
        ord(c) < 0x20 or ord(c) == 0x7F for c in name
    )


def walk_bundle(root: Path, *, max_entries: int) -> BundleTree:
    """Walk ``root`` without following links; ``input-over-bound`` past ``max_entries``.

    The walk itself is bounded: it stops as soon as the entry count passes the
    ceiling, so a bundle of a million files costs a bounded amount of work.
    """
    tree = BundleTree(root=root)
    try:
        # lstat: the bundle itself is never reached through a link either
        st = os.lstat(root)
    except OSError as exc:
        raise Inability(f"cannot read the bundle: {exc.strerror}", where=tree.where) from None
    if stat.S_ISLNK(st.st_mode):
        raise Inability(
            "a symbolic link; links are not followed (name the bundle directory itself)",
            where=tree.where,
        )
    if not stat.S_ISDIR(st.st_mode):
        raise Inability("not a directory", where=tree.where)
    entries = 0
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        abs_dir, rel_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as it:
                listing = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            listed = escaped(rel_dir) or "the bundle directory"
            raise Inability(f"{listed}: cannot list: {exc.strerror}", where=tree.where) from None
        for entry in listing:
            entries += 1
            if entries > max_entries:
                raise over_bound(f"the bundle holds more than {max_entries} entries")
            rel = f"{rel_dir}{entry.name}"
            if not _portable(entry.name):
                if tree.bad_name is None:
                    tree.bad_name = escaped(rel)
                continue  # never descended into nor named again
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise Inability(f"{rel}: cannot stat: {exc.strerror}", where=tree.where) from None
            if stat.S_ISDIR(est.st_mode):
                stack.append((entry.path, rel + "/"))
            elif stat.S_ISREG(est.st_mode):
                tree.sizes[rel] = est.st_size
            elif tree.irregular is None:
                tree.irregular = rel
    tree.sizes = dict(sorted(tree.sizes.items()))
    return tree
