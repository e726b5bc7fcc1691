"""``--publish-dir DIR``: chosen captured files, published when the run ends (IR v3).

Each ``[workflow.publish]`` destination is a directory under DIR, built whole in a
temporary directory and renamed into place, so a reader (or a crash) never sees a
half-published destination: it holds the previous publication, nothing, or the
new one with its manifest ``@publish.json`` (every
file with its producer, instance key, status, size and SHA-256). A file is a
hard link to the captured copy under ``STATE/files/`` when that copy is read-only
and on DIR's file system (nobody can change the run's record through the link),
a copy otherwise. The temporary directory is ``STATE/.publish/`` when STATE and DIR share
a file system (a crash then leaves nothing in DIR at all), else a hidden
``.crucible-publish-*`` sibling of the destination; either is swept by the next
publish. A producer that did not pass is published only with ``settled = true``.
Nothing is written outside DIR and STATE. docs/spec/run.md, "Published files".
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from crucible.core import atomic, canon
from crucible.core.errors import InputRefused, OperationalError, UsageError
from crucible.core.fdio import read_regular
from crucible.core.fsio import make_dirs
from crucible.core.plan import Plan, Publish

__all__ = ["PUBLISH_FORMAT", "check_destinations", "publish"]

PUBLISH_FORMAT = "crucible.publish/1"
_TMP = ".crucible-publish-"
_OLD = ".crucible-old-"


def _sha256(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def _collect(plan: Plan, state: Path, dest: str, spec: Publish) -> list[dict[str, Any]]:
    """Every file this destination gets: its path inside it and where it comes from."""
    # lazy: stage is not loaded with this module; only _collect() needs it
    from crucible import stage

    layout = stage.StateLayout(state)
    settled_ok = spec.settled
    entries: dict[str, dict[str, Any]] = {}
    for source, (name, pattern) in zip(spec.sources, spec.split(), strict=True):
        task = plan.task(name)
        record = stage.load_result(state, name)
        if record is None:
            continue
        fanout = task.fans_out
        units: list[tuple[str | None, dict[str, Any] | None]]
        if fanout:
            units = [(k, stage.load_result(state, name, k)) for k in record.get("keys", [])]
        else:
            units = [(None, record)]
        for key, rec in units:
            if rec is None:
                continue
            status = rec.get("status")
            if status != "passed" and not settled_ok:
                continue
            root = layout.files_dir(name, key)
            revision = (rec.get("extra") or {}).get("revision")
            if key is None and type(revision) is int:  # a loop body task: the kept revision's
                root = layout.files_dir(name, f"@rev{revision}")
            if not root.is_dir():
                continue
            prefix = "" if key is None else stage.escape_key(key) + "/"
            for match in sorted(root.glob(pattern)):
                try:
                    st = os.lstat(match)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = prefix + match.relative_to(root).as_posix()
                if rel in entries:
                    raise InputRefused(
                        f"publish {dest}/{rel} comes from both {entries[rel]['from']!r} "
                        f"and {source!r}",
                        where=f"$.workflow.publish[{dest!r}]",
                    )
                entry: dict[str, Any] = {"path": rel, "from": source, "task": name}
                if key is not None:
                    entry["key"] = key
                entry.update(status=status, source=match)
                entries[rel] = entry
    return [entries[k] for k in sorted(entries)]


def _place(src: Path, dst: Path) -> str:
    """Hard link a read-only captured file, copy (fsynced) anything else; returns which."""
    if os.stat(src).st_mode & 0o222 == 0:
        try:
            os.link(src, dst)
            return "link"
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(dst, 0o444)
    return "copy"


def _inside(target: Path, dest: str) -> Path:
    """``target/dest``, refusing a symlink on the way (it could lead outside)."""
    path = target
    for part in dest.split("/"):
        path = path / part
        if path.is_symlink():
            raise OperationalError(
                "a symlink is in the way of a publish destination", where=str(path)
            )
    return path


def _sweep(parent: Path) -> None:
    """Leftovers of an earlier publish that crashed: never a destination."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(parent):
            if entry.startswith((_TMP, _OLD)):
                _remove(parent / entry)


def _remove(path: Path) -> None:
    """Remove our scratch or an earlier publication set aside (a directory), or
    a non-directory left under one of our names: rmtree alone would fail on that
    at every later publish (issue 27 item 11)."""
    if not os.path.isdir(path) or os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return

    def writable(func: Any, p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
        func(p)

    shutil.rmtree(path, onerror=writable)


def check_destinations(plan: Plan, target: Path) -> None:
    """Refuse (before anything is published, and before the run at admission) a
    destination that holds anything crucible did not publish there: a publish
    replaces only an earlier publication, which its ``@publish.json`` lists
    whole (issue 27 item 11). Also a component on the way that is no directory."""
    for dest in plan.workflow.publish:
        final = _inside(target, dest)
        inside = [p for p in final.parents if p == target or target in p.parents]
        for parent in reversed(inside):
            if os.path.lexists(parent) and not parent.is_dir():
                raise UsageError(
                    f"publish destination {dest!r}: {parent} is in the way and is not "
                    "a directory; crucible never replaces what it did not publish",
                    where=str(parent),
                )
        if os.path.lexists(final):
            foreign = _foreign(final, dest)
            if foreign is not None:
                raise UsageError(
                    f"publish destination {dest!r} {foreign}: crucible replaces only what it "
                    "published there; move it away or publish elsewhere",
                    where=str(final),
                )


def _foreign(final: Path, dest: str) -> str | None:
    """What in ``final`` is not part of crucible's publication of ``dest``, said
    after the destination's name (None: ``final`` is one, whole, or empty)."""
    if not final.is_dir():
        return "is not a directory"
    first = min((e.name for e in os.scandir(final)), default=None)
    if first is None:
        return None  # an empty directory: nothing to lose
    manifest_path = final / "@publish.json"
    try:
        manifest = canon.loads(read_regular(manifest_path, follow=False))
    except (OSError, canon.CanonError):
        return f"holds {first!r} and no readable @publish.json"
    if not (
        isinstance(manifest, dict)
        and manifest.get("format") == PUBLISH_FORMAT
        and manifest.get("destination") == dest
        and isinstance(manifest.get("files"), list)
    ):
        return "holds an @publish.json of another destination or format"
    listed = {f.get("path") for f in manifest["files"] if isinstance(f, dict)}
    dirs = {p for path in listed if isinstance(path, str) for p in _parents(path)}
    for root, subdirs, files in os.walk(final):
        rel_root = os.path.relpath(root, final)
        for name in files:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel == "@publish.json":
                continue
            if rel not in listed or not os.path.isfile(os.path.join(root, name)):
                return f"holds {rel!r}, which its @publish.json does not list"
        for name in subdirs:
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel not in dirs or os.path.islink(os.path.join(root, name)):
                return f"holds {rel + '/'!r}, which its @publish.json does not list"
    return None


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _workdir(state: Path, parent: Path) -> Path:
    """Where a destination is built: under STATE when a rename can move it to
    ``parent`` (the same file system), else beside the destination."""
    # lazy: stage is not loaded with this module; only _workdir() needs it
    from crucible.stage import StateLayout

    scratch = StateLayout(state).publish_scratch
    try:
        if os.stat(state).st_dev == os.stat(parent).st_dev:
            scratch.mkdir(exist_ok=True)
            return scratch
    except OSError:
        pass
    return parent


def _publish_one(
    state: Path, target: Path, dest: str, files: list[dict[str, Any]], digest: str, settled: bool
) -> dict[str, Any]:
    final = _inside(target, dest)
    parent = final.parent
    make_dirs(parent)
    _sweep(parent)
    workdir = _workdir(state, parent)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=workdir))
    try:
        listed = []
        for entry in files:
            src: Path = entry.pop("source")
            dst = tmp / entry["path"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            entry["method"] = _place(src, dst)
            entry["digest"], entry["size"] = _sha256(dst)
            listed.append(entry)
        manifest = {
            "format": PUBLISH_FORMAT,
            "destination": dest,
            "plan": digest,
            "settled": settled,
            "files": listed,
        }
        atomic.write_bytes(tmp / "@publish.json", canon.dumps(manifest))
        os.chmod(tmp, 0o755)
        _swap(tmp, final)
    except OSError as exc:
        _remove(tmp)
        raise OperationalError(
            f"cannot publish {dest}: {exc.strerror or exc}", where=str(final)
        ) from None
    except BaseException:
        _remove(tmp)
        raise
    return manifest


def _swap(built: Path, final: Path) -> None:
    """``built`` becomes ``final``; an earlier publication is renamed aside first
    and removed after, so ``final`` is always absent or whole."""
    old: Path | None = None
    try:
        os.rename(built, final)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise
        old = built.parent / f"{_OLD}{os.getpid()}-{built.name[-8:]}"
        os.replace(final, old)
        os.replace(built, final)
    atomic.fsync_dir(final.parent)
    if old is not None:
        _remove(old)


def publish(plan: Plan, state: Path, target: Path, digest: str) -> list[dict[str, Any]]:
    """Publish every destination of ``[workflow.publish]`` into ``target``; returns
    their manifests."""
    make_dirs(target)
    check_destinations(plan, target)  # all of them, before any is replaced
    from crucible.stage import StateLayout

    _sweep(StateLayout(state).publish_scratch)
    manifests = []
    for dest, spec in plan.workflow.publish.items():
        files = _collect(plan, state, dest, spec)
        manifests.append(_publish_one(state, target, dest, files, digest, spec.settled))
    return manifests
