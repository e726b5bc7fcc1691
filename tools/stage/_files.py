"""emits_files: capture from a workspace into STATE/files.

Capture never lets a task's output reach outside its own directories: declared
patterns that are absolute or climb (``..``) are refused as plan errors; a matched
symlink is followed only when its target resolves inside the workspace (the file
is copied as a regular file); special files are refused. Staging the captured trees into consumers is
:mod:`crucible.stage._share`.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from crucible.core.errors import InputRefused, Location, OperationalError
from crucible.core.fdio import write_all
from crucible.core.fsio import NotRegular, TooDeep, kind_of, open_regular, walk_tree
from crucible.core.globs import GLOB_CHARS, pattern_regex
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
class FileCapture:
    files: list[dict[str, object]] = field(default_factory=list)
    total: int = 0


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
    def __init__(self, workspace: Path, dest: Path, budget: int) -> None:
        self.workspace = workspace
        self.root_real = os.path.realpath(workspace)
        self.dest = dest
        self.budget = budget
        self.result = FileCapture()
        self.done: set[str] = set()

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
            (self.dest / rel).mkdir(parents=True, exist_ok=True)
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
        target = self.dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        size, sha = self._copy_file(rel, real, target)
        self.result.files.append({"path": rel, "size": size, "digest": sha})
        return []

    def _copy_file(self, rel: str, real: str, target: Path) -> tuple[int, str]:
        """Copy one checked file. The source is opened without following a final
        symlink and without blocking, and, where /proc shows it, re-checked by
        what was opened: a file swapped for a symlink or a FIFO after the check
        is refused, not followed or waited on."""
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
            size, sha = copy_fd_hashed(
                fd, target, limit=self.budget - self.result.total + st.st_size
            )
            self.result.total += size - st.st_size  # a file that grew while copied
            return size, sha
        finally:
            os.close(fd)


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


def copy_fd_hashed(src: int, target: Path, *, limit: int, mode: int = 0o644) -> tuple[int, str]:
    """Copy what ``src`` holds (from its current offset) to a new file
    ``target``, hashing as it goes: (bytes, ``sha256:…``). More than ``limit``
    bytes fails the copy (a file that grows while it is read)."""
    h = hashlib.sha256()
    size = 0
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        while chunk := os.read(src, 1 << 20):
            size += len(chunk)
            if size > limit:
                raise CaptureRefused(
                    f"emits_files: {target.name!r} grew past the bound of {limit} bytes "
                    "while it was captured",
                    retryable=False,
                )
            h.update(chunk)
            write_all(out, chunk)
    except OSError as exc:
        raise OperationalError(f"cannot capture into {target}: {exc.strerror or exc}") from None
    finally:
        os.close(out)
    return size, "sha256:" + h.hexdigest()


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
) -> FileCapture:
    """Copy what ``patterns`` match in ``workspace`` to ``dest`` (same relative paths).

    A literal entry that does not exist fails the attempt when
    ``require_literals`` (a passing attempt); a glob may match nothing.
    """
    copier = _Copier(workspace, dest, budget)
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
    copier.result.files.sort(key=lambda f: str(f["path"]))
    return copier.result
