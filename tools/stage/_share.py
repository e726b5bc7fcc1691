"""Staging captured files without a copy per consumer (docs/spec/inputs.md 3.4).

A producer unit's captured tree (``STATE/files/<task>[/<escaped key>]``, the
*store*) is never handed to a consumer. The first staging that needs it builds
one *published* copy, ``STATE/shared/<task>[/<escaped key>]/tree`` (files 0444),
checking every file against the digest capture recorded, and writes its
``manifest.json``: per file its path, size, digest and the identity of the
published inode (inode number, size, mtime, mode). Every consumer then gets, per
file, the cheapest private-enough handle, tried in this order:

1. a reflink (``FICLONE``) of the published file: its own copy-on-write inode,
   no data copied; a write changes only the consumer's copy;
2. a hard link to the published file: no data copied, but one inode shared by
   every consumer, so a write through it is seen by all of them — it is
   *detected* instead (below) and the published copy is restored;
3. a copy, when neither works (the workspace on another filesystem, a file at
   the filesystem's link limit).

Detection (hard links only; reflinks and copies are private): every staging
re-checks the published files' identities before linking them (a stat each),
and :func:`verify_consumer`, run by capture at the end of each consumer's
attempt, checks every linked file the consumer holds. A file whose identity
changed is hashed; when its bytes or its mode changed, the published copy is
replaced by a fresh one from the store (a new generation: later consumers get
new inodes), the old inode is listed in ``@tampered/<unit>``, and the consumer
found holding it is named in its failed attempt.

Threat model: tasks run as the same user as crucible, so nothing here stops a
determined task (it can chmod and write any file, the store and records
included); the published copy keeps a careless or hostile write through a staged
file away from the store, and the checks make it visible and undo it for later
consumers.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from crucible.core import structs
from crucible.core.errors import CrucibleError, InputRefused, OperationalError
from crucible.core.fdio import write_all
from crucible.core.fsio import NotRegular, clear_path, open_regular, remove_tree, walk_tree
from crucible.core.globs import pattern_regex
from crucible.core.structs import dataclass
from crucible.stage import _guard as guard
from crucible.stage._files import clone_fd, clone_known_bad, copy_fd_hashed
from crucible.stage._fsio import TMP_PREFIX, swap_in_dir
from crucible.stage._guard import BACKUP_DIR, backup_name
from crucible.stage._layout import StateLayout
from crucible.stage._names import escape_key
from crucible.stage._store import load_keyed

__all__ = [
    "MANIFEST_FORMAT",
    "SHARED_ROOT",
    "TAMPERED_DIR",
    "Published",
    "Unit",
    "ensure_dir",
    "link_published",
    "publish",
    "refresh_held",
    "restage_units",
    "stage_units",
    "units_of",
    "verify_consumer",
]

SHARED_ROOT = "shared"
MANIFEST_FORMAT = "crucible.shared/1"
#: stage's list of a unit's replaced inodes: ``<parent>/@tampered/<unit>``
TAMPERED_DIR = "@tampered"
_READONLY = 0o444
#: publishing modes: the store is what consumers link (one copy; only where
#: the staging process guards them, crucible.stage._guard), or a copy of it
STORE = "store"
COPY = "copy"
#: a walk of a store or a staged tree; capture's own bound keeps them far below
_WALK_DEPTH = 100_000


@dataclass(frozen=True)
class Entry:
    rel: str
    size: int
    digest: str
    ino: int
    mtime_ns: int


@dataclass(frozen=True)
class Published:
    """One producer unit's published set, as its manifest describes it."""

    label: str  # "task" or "task[<escaped key>]", for messages
    root: Path  # STATE/shared/<unit>
    generation: int
    dev: int  # the published tree's filesystem
    dirs: tuple[str, ...]
    files: tuple[Entry, ...]
    #: where the published files are: the store itself (``store`` mode: one
    #: copy, views guarded by leases) or ``root/tree`` (``copy`` mode)
    tree: Path
    mode: str = COPY


@dataclass(frozen=True)
class Unit:
    """One producer unit with captured files: an unmapped task, or one instance."""

    store: Path  # STATE/files/<task>[/<escaped key>]
    record: Path  # STATE/results/<task>.json, or <task>.jsonl (packed, crucible.stage._store)
    root: Path  # STATE/shared/<task>[/<escaped key>]
    label: str  # "task" or "task[<escaped key>]"
    staged: str  # "task" or "task/<escaped key>", under a consumer's inputs/
    key: str | None = None  # a keyed unit's key: its record is a line of ``record``
    #: patterns of files not handed to this consumer: the producer's
    #: temp_files, for a consumer that is not its direct dependant
    skip: tuple[str, ...] = ()


def units_of(state: Path, task: str, mapped: bool) -> list[Unit]:
    """The units of ``task`` whose captured files exist, in name order. (The
    layout checks the task name; escaped keys never start with @, stage's
    temporaries always do.)"""
    layout = StateLayout(state)
    files = layout.files_dir(task)
    shared = layout.shared_dir(task)
    if not mapped:
        if not files.is_dir():
            return []
        return [Unit(files, layout.result_path(task), shared, task, task)]
    packed = layout.packed_path(task)
    try:
        names = sorted(n for n in os.listdir(files) if not n.startswith("@"))
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise OperationalError(f"cannot list: {exc.strerror}", where=str(files)) from None
    # the raw keys from the records (a shortened escaped key cannot be reversed)
    from crucible.stage._store import load_keyed

    raw = {escape_key(k): k for k in load_keyed(state, task)}
    return [
        Unit(files / n, packed, shared / n, f"{task}[{n}]", f"{task}/{n}", raw.get(n))
        for n in names
        if (files / n).is_dir()
    ]


# -- the lock ------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state: Path) -> Any:
    """One lock per state's shared root: publishing, restoring and linking are
    serialized between workers (each is short: a stat and a link per file)."""
    root = StateLayout(state).shared_root
    try:
        root.mkdir(exist_ok=True)
        fd = os.open(root / "@lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OperationalError(
            f"cannot lock shared files: {exc.strerror or exc}", where=str(root)
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


# -- manifests -------------------------------------------------------------------


def _read_manifest(root: Path, label: str, store: Path) -> tuple[str, Published] | None:
    try:
        with open(root / "manifest.json", "rb") as f:
            doc = orjson.loads(f.read())
        files = tuple(Entry(*e) for e in doc["files"])
        gen, dev = int(doc["generation"]), int(doc["dev"])
        mode = STORE if doc.get("mode") == STORE else COPY
        tree = store if mode == STORE else root / "tree"
        pub = Published(label, root, gen, dev, tuple(doc["dirs"]), files, tree, mode)
        return str(doc["source"]), pub
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # damaged: published again from the store


def _keyed_record(record: Path, key: str | None) -> dict[str, Any] | None:
    """A keyed unit's record, a line of its task's packed file (crucible.stage._store);
    None without one (``key`` None: captured files whose unit has no record)."""

    if key is None:
        return None
    try:
        return load_keyed(record.parent.parent, record.name[: -len(".jsonl")]).get(key)
    except CrucibleError:
        return None


def _source_id(store: Path, record: Path, key: str | None = None) -> str:
    """What the published set was built from: the settled record's bytes (a new
    capture or an amended record changes them), else the store directory's own
    identity."""
    if record.suffix == ".jsonl":
        rec = _keyed_record(record, key)
        if rec is not None:
            return (
                "record:"
                + hashlib.sha256(orjson.dumps(rec, option=orjson.OPT_SORT_KEYS)).hexdigest()
            )
        st = os.lstat(store)
        return f"store:{st.st_ino}:{st.st_mtime_ns}"
    try:
        with open(record, "rb") as f:
            return "record:" + hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        st = os.lstat(store)
        return f"store:{st.st_ino}:{st.st_mtime_ns}"


def _recorded_files(
    record: Path, key: str | None = None
) -> tuple[dict[str, tuple[int, str]], int | None]:
    """(path -> (size, digest) as capture recorded them, the record's mtime). A
    keyed record has no mtime of its own (its packed file's is the last append's,
    maybe after a change to this unit's files): its files are always hashed."""
    mtime: int | None = None
    try:
        if record.suffix == ".jsonl":
            rec: Any = _keyed_record(record, key)
        else:
            with open(record, "rb") as f:
                rec = orjson.loads(f.read())
                mtime = os.fstat(f.fileno()).st_mtime_ns
    except (OSError, ValueError):
        return {}, None
    files = rec.get("files") if isinstance(rec, dict) else None
    out: dict[str, tuple[int, str]] = {}
    for f in files if isinstance(files, list) else []:
        if isinstance(f, dict) and isinstance(f.get("digest"), str):
            out[str(f.get("path"))] = (int(f.get("size", -1)), f["digest"])
    return out, mtime


# -- publishing -------------------------------------------------------------------


# A published inode's ctime moves on every write, chmod, utime and link(2), and
# no task can set it back: after each staging the ctimes are recorded, and a
# ctime that moved since then means "hash this file" (a link or an unlink by a
# consumer moves it too: then the bytes are found unchanged and the new ctime
# recorded). Size, mtime and mode are checked as well, for filesystems with
# coarse ctimes.


def _ctimes_path(pub: Published) -> Path:
    return pub.root / "ctimes"


def _read_ctimes(pub: Published) -> dict[str, int]:
    """The recorded ctimes by path: a binary file of signed 64-bit integers,
    the generation then one per manifest file, rewritten in place (a rename
    over a file makes ext4 flush the new one: 7 ms per staging)."""
    try:
        fd = os.open(_ctimes_path(pub), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        data = os.read(fd, 8 * (len(pub.files) + 1) + 1)
    finally:
        os.close(fd)
    values = array.array("q")
    if len(data) != 8 * (len(pub.files) + 1):
        return {}
    values.frombytes(data)
    if values[0] != pub.generation:
        return {}
    return {e.rel: values[i + 1] for i, e in enumerate(pub.files)}


def _record_ctimes(pub: Published) -> None:
    """The published files' ctimes now (call with the lock held, after linking)."""
    tree = str(pub.tree)
    values = array.array("q", [pub.generation])
    for e in pub.files:
        try:
            values.append(os.lstat(f"{tree}/{e.rel}").st_ctime_ns)
        except OSError:
            values.append(-1)  # gone: found at the next check
    try:
        fd = os.open(
            _ctimes_path(pub), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            data = values.tobytes()
            if os.pwrite(fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write")
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    except OSError as exc:
        raise OperationalError(
            f"cannot record shared files: {exc.strerror or exc}", where=str(pub.root)
        ) from None


def _same(st: os.stat_result, e: Entry, ctime: int | None) -> bool:
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_ino == e.ino
        and st.st_size == e.size
        and st.st_mtime_ns == e.mtime_ns
        and stat.S_IMODE(st.st_mode) == _READONLY
        and st.st_ctime_ns == ctime
    )


def _changed(pub: Published, state: Path | None = None) -> tuple[list[Entry], bool]:
    """Published files that were changed since the last staging recorded them
    (stat first; the bytes are hashed only when the stat moved), and whether the
    manifest is stale: a file intact but at another inode than it names (a
    store file restored since; consumers linking the new inode would hold one
    no check knows). In store mode an inode with a backup is changed too: a
    lease on it broke, so a write through it is under way (crucible.stage._guard)."""
    ctimes = _read_ctimes(pub)
    backed = _backups(state) if state is not None and pub.mode == STORE else set()
    bad = []
    stale = False
    tree = str(pub.tree)
    for e in pub.files:
        path = f"{tree}/{e.rel}"
        try:
            st = os.lstat(path)
        except OSError:
            bad.append(e)
            continue
        if backup_name(pub.dev, e.ino, e.mtime_ns) in backed or (
            not _same(st, e, ctimes.get(e.rel)) and _really_changed(path, e)
        ):
            bad.append(e)
        elif st.st_ino != e.ino:
            stale = True
    return bad, stale


def _backup_dir(state: Path) -> Path:
    return StateLayout(state).shared_root / BACKUP_DIR


def _backups(state: Path) -> set[str]:
    """The names in ``shared/@backup`` (one listing; none nearly always)."""
    try:
        return set(os.listdir(_backup_dir(state)))
    except OSError:
        return set()


def _really_changed(path: str, e: Entry) -> bool:
    """A changed identity that is a changed file: other bytes, another mode, or
    not a regular file any more (a touched mtime alone is not)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != _READONLY:
            return True
        fd, _ = open_regular(path)
    except (OSError, NotRegular):
        return True
    try:
        return _read_digest(fd) != e.digest
    finally:
        os.close(fd)


def _read_digest(fd: int) -> str:
    """The ``sha256:`` digest of what ``fd`` reads from where it stands to its end."""
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True)
class _NewSet:
    """What a new published set is built from, in either mode: the unit's store
    and record, the directory its set goes in, and what its manifest says."""

    store: Path
    record: Path
    parent: Path
    label: str
    source: str
    generation: int
    key: str | None = None


def _build(req: _NewSet) -> Path:
    """A new published set from the store, in a temp directory beside ``parent``'s
    entries; returns it. Files are checked against the recorded digests."""
    with _new_set(req.parent) as tmp:
        tree = tmp / "tree"
        tree.mkdir()
        recorded, written = _recorded_files(req.record, req.key)
        dirs: list[str] = []
        files: list[list[Any]] = []
        for rel in walk_tree(str(req.store), max_depth=_WALK_DEPTH):
            src = req.store / rel
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                (tree / rel).mkdir()
                dirs.append(rel)
                continue
            try:
                fd, st = open_regular(src)
            except NotRegular as exc:
                raise InputRefused(f"captured file {rel!r} of {req.label} {exc.why}") from None
            want = recorded.get(rel)
            try:
                if want is not None and _digest_stands(want, st, written):
                    # copy (or clone) without a hash
                    size, sha = _clone_or_copy(fd, tree / rel, hash_it=False), want[1]
                else:
                    size, sha = _clone_or_copy(fd, tree / rel, hash_it=True)
            finally:
                os.close(fd)
            if want is not None and want[1] != sha:
                raise InputRefused(
                    f"captured file {rel!r} of {req.label} no longer matches the digest its "
                    f"capture recorded ({want[1]}); the store was changed",
                    where=str(src),
                )
            os.chmod(tree / rel, _READONLY)
            pst = os.lstat(tree / rel)
            files.append([rel, size, sha, pst.st_ino, pst.st_mtime_ns])
        for rel in reversed(dirs):  # read-only directories, deepest first
            os.chmod(tree / rel, 0o555)
        doc = _manifest(req.source, req.generation, os.lstat(tree).st_dev, dirs, files)
        _write_manifest(tmp, doc)
        return tmp


@contextlib.contextmanager
def _new_set(parent: Path) -> Iterator[Path]:
    """A temp directory beside ``parent``'s entries for a new published set
    (either mode), removed when building it fails."""
    parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # lazy: tempfile loads shutil, random, bz2 and lzma (~3 ms of start-up)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}pub-", dir=parent))
    try:
        yield tmp
    except BaseException:
        remove_tree(tmp)
        raise


def _digest_stands(want: tuple[int, str], st: os.stat_result, written: int | None) -> bool:
    """The digest a file's capture recorded (``want``: size, digest) still holds
    without hashing it again. Capture wrote the file, then the record
    (``written``: its mtime); a later write or chmod moves the file's ctime to
    the record's mtime or past it (the same coarse clock), and no task can move
    a ctime back. Only then (or when both fell in one clock tick) are its bytes
    hashed."""
    return written is not None and st.st_ctime_ns < written and want[0] == st.st_size


def _manifest(
    source: str,
    generation: int,
    dev: int,
    dirs: list[str],
    files: list[list[Any]],
    mode: str | None = None,
) -> dict[str, Any]:
    """A published set's manifest: its source, generation and device, its
    directories and files (rel, size, digest, inode, mtime); ``mode`` only for
    a store-mode set (a copy-mode manifest has none)."""
    doc: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "source": source,
        "generation": generation,
        "dev": dev,
        "dirs": dirs,
        "files": files,
    }
    if mode is not None:
        doc["mode"] = mode
    return doc


def _write_manifest(tmp: Path, doc: dict[str, Any]) -> None:
    """The tree's manifest, new in ``tmp`` (published with it by one rename)."""
    fd = os.open(tmp / "manifest.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        # orjson, not canonical JSON: mtimes in ns pass 2^53; a private file
        write_all(fd, orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
    finally:
        os.close(fd)


def _clone_or_copy(src_fd: int, target: Path, *, hash_it: bool) -> Any:
    """Copy ``src_fd`` to a new ``target`` — a reflink where the filesystem
    can, else in the kernel (sendfile). With ``hash_it`` a thread hashes the
    source meanwhile (both release the GIL) and (bytes, digest) is returned;
    else the bytes copied."""
    hashed: list[tuple[int, str] | BaseException] = []
    thread = threading.Thread(target=_hash_fd, args=(src_fd, hashed), daemon=True)
    if hash_it:
        thread.start()
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        if not clone_fd(src_fd, out):
            _kernel_copy(src_fd, out)
        copied = os.fstat(out).st_size
    except OSError as exc:
        raise OperationalError(f"cannot publish {target}: {exc.strerror or exc}") from None
    finally:
        os.close(out)
        if hash_it:
            thread.join()
    if not hash_it:
        return copied
    result = hashed[0]
    if isinstance(result, BaseException):
        raise OperationalError(f"cannot publish {target}: {result}") from None
    if result[0] != copied:
        raise OperationalError(f"{target} changed size while it was published")
    return result


def _hash_fd(fd: int, into: list[tuple[int, str] | BaseException]) -> None:
    try:
        h = hashlib.sha256()
        size = 0
        while chunk := os.pread(fd, 1 << 22, size):
            h.update(chunk)
            size += len(chunk)
        into.append((size, "sha256:" + h.hexdigest()))
    except BaseException as exc:  # handed to the caller's thread
        into.append(exc)


def _kernel_copy(src: int, out: int) -> None:
    """sendfile to the end (as shutil.copyfile does); a plain read/write loop
    where the kernel refuses it."""
    offset = 0
    try:
        while n := os.sendfile(out, src, offset, 1 << 30):
            offset += n
        return
    except OSError as exc:
        if offset or exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK):
            raise
    while chunk := os.pread(src, 1 << 20, offset):
        write_all(out, chunk)
        offset += len(chunk)


def publish(
    state: Path,
    store: Path,
    record: Path,
    root: Path,
    label: str,
    key: str | None = None,
    *,
    mode: str | None = None,
) -> Published:
    """The current published set of one producer unit: built on first use,
    rebuilt when its store was captured again, restored when a published file
    was changed (the changed inodes are listed in ``@tampered``). ``mode``:
    :data:`STORE` (the default where this process guards views) publishes
    the store itself, :data:`COPY` a copy of it. Call with the lock held."""
    if mode is None:
        mode = STORE if guard.active() else COPY
    source = _source_id(store, record, key)
    found = _read_manifest(root, label, store)
    generation = 1
    if found is not None:
        old_source, pub = found
        if old_source == source:
            bad, stale = _changed(pub, state)
            if not bad and not stale and pub.mode == mode:
                return pub
            if bad:
                _list_tampered(pub, bad)
                if pub.mode == STORE:
                    _restore_store(state, pub, bad)
        generation = pub.generation + 1
    req = _NewSet(store, record, root.parent, label, source, generation, key)
    built = _build_store(state, req) if mode == STORE else _build(req)
    swap_in_dir(built, root, durable=False)
    found = _read_manifest(root, label, store)
    if found is None:  # pragma: no cover - we just wrote it
        raise OperationalError("cannot read the manifest just written", where=str(root))
    _record_ctimes(found[1])
    return found[1]


def _digest_of(path: str) -> str | None:
    try:
        fd, _ = open_regular(path)
    except (OSError, NotRegular):
        return None
    try:
        return _read_digest(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _restore_store(state: Path, pub: Published, bad: list[Entry]) -> None:
    """Store mode: give each changed store file a fresh inode holding its
    captured bytes — its lease's backup (saved before the write), else its own
    bytes when only its mode, links or times moved. The changed inode stays
    with the consumers that hold it (listed in ``@tampered``). Without an
    intact copy the store was changed for good: refused, naming the file."""
    backups = _backup_dir(state)
    saved = sorted(_backups(state))
    for e in bad:
        target = f"{pub.tree}/{e.rel}"
        # this inode's backup (its mtime names it; an entry made from a changed
        # store file does not know the mtime it was captured with: any of the
        # inode's, each judged by its digest)
        exact = backup_name(pub.dev, e.ino, e.mtime_ns)
        prefix = exact.rpartition("-")[0] + "-"
        found = False
        for name in sorted((n for n in saved if n.startswith(prefix)), key=lambda n: n != exact):
            backup = f"{backups}/{name}"
            if _digest_of(backup) == e.digest:
                os.chmod(backup, _READONLY)
                os.replace(backup, target)
                found = True
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(backup)  # not the captured bytes (an inode number used again)
        if found:
            continue
        if _digest_of(target) == e.digest:
            tmp = f"{pub.tree}/{TMP_PREFIX}restore-{os.getpid()}"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fd, _ = open_regular(target)
            try:
                _clone_or_copy(fd, Path(tmp), hash_it=False)
            finally:
                os.close(fd)
            if _digest_of(tmp) == e.digest:
                os.chmod(tmp, _READONLY)
                os.replace(tmp, target)
                continue
            os.unlink(tmp)
        raise InputRefused(
            f"captured file {e.rel!r} of {pub.label} was changed and no intact copy of it "
            f"is left (written while no lease guarded it); the store was changed: run "
            f"its producer again (--fresh)",
            where=target,
        )


def _build_store(state: Path, req: _NewSet) -> Path:
    """A store-mode manifest (the store's own inodes, files made read-only),
    in a temp directory beside ``parent``'s entries; returns it. Each file is
    checked against its recorded digest as :func:`_build` checks it; one
    that does not match is restored from its backup when there is one."""
    with _new_set(req.parent) as tmp:
        recorded, written = _recorded_files(req.record, req.key)
        dirs: list[str] = []
        files: list[list[Any]] = []
        dev = os.lstat(req.store).st_dev
        for rel in walk_tree(str(req.store), max_depth=_WALK_DEPTH):
            if rel.startswith(TMP_PREFIX):
                continue
            path = f"{req.store}/{rel}"
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                dirs.append(rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise InputRefused(f"captured file {rel!r} of {req.label} is not a regular file")
            want = recorded.get(rel)
            if want is not None and _digest_stands(want, st, written):
                sha = want[1]
            else:
                sha = _digest_of(path) or ""
            if want is not None and want[1] != sha:
                probe = Published(req.label, req.parent, 0, dev, (), (), req.store, STORE)
                _restore_store(state, probe, [Entry(rel, want[0], want[1], st.st_ino, 0)])
                st, sha = os.lstat(path), want[1]
            if stat.S_IMODE(st.st_mode) != _READONLY:
                os.chmod(path, _READONLY)
                st = os.lstat(path)
            files.append([rel, st.st_size, sha, st.st_ino, st.st_mtime_ns])
        _write_manifest(tmp, _manifest(req.source, req.generation, dev, dirs, files, STORE))
        return tmp


def _list_tampered(pub: Published, bad: list[Entry]) -> None:
    """Remember the changed inodes across the restore: consumers still holding
    them are named when they are captured."""
    path = _tampered_path(pub.root)
    path.parent.mkdir(exist_ok=True)
    lines = b"".join(
        orjson.dumps({"dev": pub.dev, "ino": e.ino, "path": e.rel, "generation": pub.generation})
        + b"\n"
        for e in bad
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, lines)
    finally:
        os.close(fd)


def _tampered_path(root: Path) -> Path:
    """``@tampered/<unit>`` beside the unit's published root: it outlives the
    root's swap, and a fixed ``@`` directory instead of a suffix keeps a 249-byte
    task name or a 250-byte escaped key within the file-name limit (an ``@``
    name is never a task name nor an escaped key)."""
    return root.parent / TAMPERED_DIR / root.name


def _tampered_inodes(root: Path) -> dict[tuple[int, int], str]:
    path = _tampered_path(root)
    out: dict[tuple[int, int], str] = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    doc = orjson.loads(line)
                    out[int(doc["dev"]), int(doc["ino"])] = str(doc["path"])
    except FileNotFoundError:
        pass
    return out


# -- consumers ----------------------------------------------------------------------


def _visible(pub: Published, skip: tuple[str, ...]) -> Published:
    """``pub`` without the paths ``skip`` matches (or that lie under a match)."""
    if not skip:
        return pub

    regexes = [pattern_regex(tuple(p for p in s.split("/") if p)) for s in skip]

    def hidden(rel: str) -> bool:
        parts = rel.split("/")
        return any(r.match("/".join(parts[:n])) for r in regexes for n in range(1, len(parts) + 1))

    return structs.replace(
        pub,
        dirs=tuple(d for d in pub.dirs if not hidden(d)),
        files=tuple(e for e in pub.files if not hidden(e.rel)),
    )


def link_published(pub: Published, dest: Path, guarded: _Guarded | None = None) -> int:
    """Lay ``pub``'s tree into ``dest`` (a new directory): directories made,
    files reflinked, hard-linked or copied (module doc). Returns the bytes.
    ``guarded``: who holds the links, in store mode (each one leased)."""
    dest_s = str(dest)
    try:
        os.makedirs(dest_s, exist_ok=True)
        for rel in pub.dirs:
            os.mkdir(f"{dest_s}/{rel}")
        key = (pub.dev, os.stat(dest_s).st_dev)
    except OSError as exc:
        raise OperationalError(f"cannot stage into {dest}: {exc.strerror or exc}") from None
    tree = str(pub.tree)
    total = 0
    for e in pub.files:
        src = f"{tree}/{e.rel}"
        dst = f"{dest_s}/{e.rel}"
        try:
            _hand_over(src, dst, key, e, _guard_of(pub, guarded))
        except OSError as exc:
            raise OperationalError(f"cannot stage {src}: {exc.strerror or exc}") from None
        total += e.size
    return total


@dataclass(frozen=True)
class _Guarded:
    """Who a store-mode view is for: the consumer's workspace (its leases'
    holder) and where a broken lease saves the bytes."""

    holder: str
    backups: str


def _guarded(state: Path, holder: Path | str | None) -> _Guarded | None:
    if holder is None or not guard.active():
        return None
    return _Guarded(os.path.abspath(holder), os.path.abspath(_backup_dir(state)))


def _guard_of(pub: Published, guarded: _Guarded | None) -> _Guarded | None:
    """The guard a hard link to ``pub`` needs: none for a copy-mode tree (the
    store is not reachable through it); in store mode a lease, and without
    one (``_NO_GUARD``) no hard link at all."""
    if pub.mode != STORE:
        return None
    return guarded or _NO_GUARD


_NO_GUARD = _Guarded("", "")


class _Unsettled(Exception):
    """A published file was being changed while it was handed over (its copy
    or its link is not of the captured bytes; nothing is left at the
    destination): the caller settles it (:func:`_settle`) and lays the unit
    again from a fresh published set."""

    def __init__(self, entry: Entry) -> None:
        super().__init__(entry.rel)
        self.entry = entry


#: how many times one unit is laid again after a file changed under it (each
#: time the changed inode is set aside, so a writer cannot reach the next one)
_LAY_TRIES = 3


def _settle(state: Path, pub: Published, e: Entry) -> None:
    """``e`` changed while it was handed over: its inode is listed as tampered
    (the consumer writing it is named at its check) and, in store mode, the
    store file restored (a fresh inode); the next :func:`publish` builds a new
    generation."""
    _list_tampered(pub, [e])
    if pub.mode == STORE:
        _restore_store(state, pub, [e])


def _hand_over(
    src: str, dst: str, key: tuple[int, int], e: Entry, guarded: _Guarded | None = None
) -> None:
    """One file to a consumer: a reflink, else a hard link, else a copy. A
    hard link to a stored inode (``guarded``) needs a lease on it, held for
    the consumer until its check (crucible.stage._guard); else a copy. A copy
    must hash to ``e``'s digest, and a leased link must still be ``e``'s
    inode as published: else :class:`_Unsettled` (a consumer that ran
    meanwhile is writing it: the lease broke and the writer holds the inode
    open, or wrote it between the check and the lease)."""
    if clone_known_bad(key) or not _reflink(src, dst, key):
        if guarded is not None and (
            guarded is _NO_GUARD or not guard.lease(src, guarded.holder, guarded.backups)
        ):
            _copy(src, dst, e)
            return
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
                raise
            _copy(src, dst, e)  # another filesystem, or the link limit
            return
        if guarded is not None and not _as_published(os.lstat(dst), e):
            os.unlink(dst)
            raise _Unsettled(e)


def _as_published(st: os.stat_result, e: Entry) -> bool:
    """Whether a link just made is ``e``'s inode, unwritten and read-only (a
    write moves the mtime, a chmod the mode; the link itself moved the ctime)."""
    return (
        st.st_ino == e.ino
        and st.st_size == e.size
        and st.st_mtime_ns == e.mtime_ns
        and stat.S_IMODE(st.st_mode) == _READONLY
    )


def _reflink(src: str, dst: str, key: tuple[int, int]) -> bool:
    """A copy-on-write clone of ``src`` at ``dst``; False (nothing left at
    ``dst``) where the filesystems cannot, remembered for ``key``."""
    src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _READONLY)
        try:
            cloned = clone_fd(src_fd, out, key)
        finally:
            os.close(out)
    finally:
        os.close(src_fd)
    if not cloned:
        os.unlink(dst)
    return cloned


def _copy(src: str, dst: str, e: Entry) -> None:
    """A private copy of ``src`` at ``dst``, of ``e``'s bytes (hashed as they
    are copied), else none and :class:`_Unsettled`."""
    src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _, digest = copy_fd_hashed(src_fd, Path(dst), limit=1 << 62, mode=_READONLY)
    finally:
        os.close(src_fd)
    if digest != e.digest:
        os.unlink(dst)
        raise _Unsettled(e)
    os.chmod(dst, _READONLY)  # whatever the umask did


def _published_within(
    state: Path, u: Unit, used: int, bound: int, guarded: _Guarded | None
) -> tuple[Published, int]:
    """``u``'s published set and ``used`` plus its bytes, refused past ``bound``
    (before anything of it is laid). The one place both writers publish a unit:
    a keyed unit is published from its own line of the packed records. The
    store itself is published only for a guarded consumer."""
    mode = STORE if guarded is not None else COPY
    pub = publish(state, u.store, u.record, u.root, u.label, u.key, mode=mode)
    size = sum(e.size for e in _visible(pub, u.skip).files)
    if used + size > bound:
        raise InputRefused(
            f"staging emits_files would pass the bound of {bound} bytes "
            f"one task may be handed (at {u.store})"
        )
    return pub, used + size


def stage_units(
    state: Path,
    units: list[Unit],
    dest: Path,
    used: int,
    bound: int,
    holder: Path | str | None = None,
) -> int:
    """Lay every unit's published files into ``dest/<unit.staged>``; returns
    ``used`` plus their bytes. Raises :class:`InputRefused` past ``bound``
    (nothing is linked for the unit that would pass it). ``holder``: the
    consumer's workspace, which may hold guarded links to the store itself
    when this process guards views (crucible.stage._guard)."""
    if not units:
        return used
    guarded = _guarded(state, holder)
    with _locked(state):
        for u in units:
            for tries_left in reversed(range(_LAY_TRIES)):
                pub, now = _published_within(state, u, used, bound, guarded)
                try:
                    link_published(_visible(pub, u.skip), dest / u.staged, guarded)
                except _Unsettled as exc:
                    remove_tree(dest / u.staged)  # what was laid of it: laid again
                    _unsettled(state, pub, exc, tries_left)
                    continue
                _record_ctimes(pub)  # the links just made moved them
                used = now
                break
    return used


def _unsettled(state: Path, pub: Published, exc: _Unsettled, tries_left: int) -> None:
    """Settle the file that changed under a staging, or give up after the last try."""
    if not tries_left:
        raise OperationalError(
            f"captured file {exc.entry.rel!r} of {pub.label} kept changing while it was "
            f"staged (a consumer is writing it)",
            where=str(pub.tree / exc.entry.rel),
        )
    _settle(state, pub, exc.entry)


def ensure_dir(base: Path, rel: str) -> None:
    """``base/rel`` as a real directory, each component checked from ``base``
    down: whatever else stands at one (a symlink — never followed —, a file, a
    FIFO) is removed and a directory made (restaging a recycled workspace: 3.8)."""
    path = str(base)
    for part in rel.split("/"):
        path = f"{path}/{part}"
        with contextlib.suppress(FileNotFoundError):  # nothing there: make it
            if stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            clear_path(Path(path))
        os.mkdir(path)


def relink_published(pub: Published, dest: Path, guarded: _Guarded | None = None) -> int:
    """Lay ``pub``'s tree into ``dest``, which may hold an earlier consumer's
    (a recycled workspace, 3.8): a file that already is a hard link to the
    current published inode is kept — :func:`publish` has just checked that
    inode — and anything else at a published path is replaced, as
    :func:`link_published` lays it. ``dest`` itself must be a real directory
    (:func:`ensure_dir` from the consumer's ``inputs/``). Returns the number of
    files handed over."""
    for rel in pub.dirs:
        ensure_dir(dest, rel)
    key = (pub.dev, os.stat(dest).st_dev)
    tree = str(pub.tree)
    dest_s = str(dest)
    handed = 0
    for e in pub.files:
        dst = f"{dest_s}/{e.rel}"
        try:
            st: os.stat_result | None = os.lstat(dst)
        except FileNotFoundError:
            st = None
        if st is not None:
            if (
                stat.S_ISREG(st.st_mode)
                and st.st_ino == e.ino
                and st.st_dev == pub.dev
                and (
                    pub.mode != STORE
                    or (guarded is not None and guard.lease(dst, guarded.holder, guarded.backups))
                )
            ):
                continue
            clear_path(Path(dst))
        _hand_over(f"{tree}/{e.rel}", dst, key, e, _guard_of(pub, guarded))
        handed += 1
    return handed


def restage_units(
    state: Path,
    units: list[Unit],
    dest: Path,
    used: int,
    bound: int,
    holder: Path | str | None = None,
) -> tuple[int, set[str]]:
    """:func:`stage_units` into a tree an earlier consumer of the same task left
    (:func:`relink_published`); returns ``used`` plus the units' bytes, and every
    path laid under ``dest`` (directories and files)."""
    laid: set[str] = set()
    if not units:
        return used, laid
    guarded = _guarded(state, holder)
    with _locked(state):
        for u in units:
            for tries_left in reversed(range(_LAY_TRIES)):
                pub, now = _published_within(state, u, used, bound, guarded)
                try:
                    ensure_dir(dest, u.staged)  # each component checked from inputs/ down
                    shown = _visible(pub, u.skip)
                    handed = relink_published(shown, dest / u.staged, guarded)
                except _Unsettled as exc:  # what was laid stays: relaid in place
                    _unsettled(state, pub, exc, tries_left)
                    continue
                except OSError as exc:
                    raise OperationalError(
                        f"cannot stage into {dest}: {exc.strerror or exc}"
                    ) from None
                used = now
                break
            laid.add(u.staged)
            laid.update(f"{u.staged}/{rel}" for rel in shown.dirs)
            laid.update(f"{u.staged}/{e.rel}" for e in shown.files)
            if handed:
                _record_ctimes(pub)  # the links just made moved them
    return used, laid


def verify_consumer(state: Path, holder: str, units: list[Unit], workspace: Path) -> list[str]:
    """Check what a consumer was handed, after its attempt: every staged file it
    holds that is a hard link to a published inode must be unchanged (its stat as
    recorded, else its bytes hashed), and none may be an inode already found
    changed. A changed file gets its published set restored; the returned notes
    name each file and the consumer ``holder``."""
    try:
        return _verify_consumer(state, holder, units, workspace)
    finally:
        guard.release(os.path.abspath(workspace))  # checked: its leases are no longer needed


def _verify_consumer(state: Path, holder: str, units: list[Unit], workspace: Path) -> list[str]:
    notes: list[str] = []
    for u in units:
        found = _read_manifest(u.root, u.label, u.store)
        if found is None:
            continue
        changed = _changed_holdings(found[1], workspace / "inputs" / u.staged)
        if not changed:
            continue
        with _locked(state):
            pub = found[1]
            current = _read_manifest(u.root, u.label, u.store)
            if current is not None and current[1].generation == pub.generation:
                # still the generation whose inodes it changed: restore them now
                # (an inode of an earlier one, listed in @tampered, is restored)
                bad = [e for e in pub.files if changed.get(e.rel)]
                if bad:
                    _list_tampered(pub, bad)
                    if pub.mode == STORE:
                        _restore_store(state, pub, bad)
            publish(state, u.store, u.record, u.root, u.label, u.key, mode=pub.mode)
        shown = ", ".join(f"inputs/{u.staged}/{r}" for r in sorted(changed)[:5])
        more = len(changed) - 5
        notes.append(
            f"staged file {shown}{f' and {more} more' if more > 0 else ''} (from {u.label}) "
            f"changed while {holder} held it: staged files are shared read-only with every "
            f"consumer and must not be written or chmod'ed (by {holder}, or by a consumer "
            f"holding the same file at the same time); the published copy was restored"
        )
    return notes


def refresh_held(state: Path, units: list[Unit], workspace: Path) -> list[str]:
    """Just before a staged consumer starts: any file it holds whose inode was
    changed since it was staged (by a consumer that ran meanwhile) is restored
    and its link replaced by one to the fresh published copy, so it starts with
    the captured bytes. Returns the workspace paths replaced."""
    replaced: list[str] = []
    guarded = _guarded(state, workspace)
    for u in units:
        found = _read_manifest(u.root, u.label, u.store)
        if found is None:
            continue
        top = workspace / "inputs" / u.staged
        held = _changed_holdings(found[1], top)
        changed = set(held)
        if found[1].mode == STORE:
            changed |= _unguarded_holdings(found[1], top, guarded)
        if not changed:
            continue
        with _locked(state):
            current = _read_manifest(u.root, u.label, u.store)
            pub = found[1]
            if current is not None and current[1].generation == pub.generation:
                bad = [e for e in pub.files if held.get(e.rel) and _changed_one(pub, e, top)]
                if bad:
                    _list_tampered(pub, bad)
                    if pub.mode == STORE:
                        _restore_store(state, pub, bad)
            for tries_left in reversed(range(_LAY_TRIES)):
                fresh = publish(state, u.store, u.record, u.root, u.label, u.key, mode=pub.mode)
                try:
                    relinked = _relink_changed(fresh, top, changed, guarded)
                except _Unsettled as exc:
                    _unsettled(state, fresh, exc, tries_left)
                    continue
                replaced += (f"inputs/{u.staged}/{rel}" for rel in relinked)
                _record_ctimes(fresh)
                break
    return replaced


def _relink_changed(
    fresh: Published, top: Path, changed: set[str], guarded: _Guarded | None
) -> list[str]:
    """Replace the consumer's files ``changed`` under ``top`` by handles to
    ``fresh``'s; returns the paths replaced."""
    by_rel = {e.rel: e for e in fresh.files}
    key = (fresh.dev, os.stat(top).st_dev)
    relinked = []
    for rel in sorted(changed):
        e = by_rel.get(rel)
        if e is None:
            continue
        dst = top / rel
        tmp = dst.with_name(f"{TMP_PREFIX}relink")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            _hand_over(str(fresh.tree / rel), str(tmp), key, e, _guard_of(fresh, guarded))
            os.replace(tmp, dst)
        except OSError as exc:
            raise OperationalError(f"cannot restore {dst}: {exc.strerror or exc}") from None
        relinked.append(rel)
    return relinked


def _changed_one(pub: Published, e: Entry, top: Path) -> bool:
    """Whether the consumer's file for ``e`` under ``top`` was changed (not
    merely unleased)."""
    path = f"{top}/{e.rel}"
    try:
        st = os.lstat(path)
    except OSError:
        return True
    return not _same(st, e, _read_ctimes(pub).get(e.rel)) and _really_changed(path, e)


def _unguarded_holdings(pub: Published, top: Path, guarded: _Guarded | None) -> set[str]:
    """Store mode, just before a consumer starts (a retry: its leases were
    given up at the last check): the held links to stored inodes, leased again;
    one that cannot be is replaced by a copy (returned, to be relinked)."""
    by_ino = {e.ino: e for e in pub.files}
    out: set[str] = set()
    for held, st in _held_files(top, pub.dev):
        e = by_ino.get(st.st_ino)
        if e is None:
            continue
        if guarded is None or not guard.lease(held, guarded.holder, guarded.backups):
            out.add(e.rel)
    return out


def _changed_holdings(pub: Published, top: Path) -> dict[str, bool]:
    """Published paths whose inode, as held under ``top``, was changed: True
    for an inode ``pub`` names (still to be restored), False for one an
    earlier generation named (listed in ``@tampered``: already restored)."""
    by_ino = {e.ino: e for e in pub.files}
    tampered = _tampered_inodes(pub.root)
    ctimes = _read_ctimes(pub)
    changed: dict[str, bool] = {}
    for held, st in _held_files(top, pub.dev):
        e = by_ino.get(st.st_ino)
        if e is not None:
            # The held file's own bytes: the published path may already name a
            # fresh copy (another worker restored it after this manifest was read).
            if _same(st, e, ctimes.get(e.rel)) or not _really_changed(held, e):
                continue
            changed[e.rel] = True
        elif (st.st_dev, st.st_ino) in tampered:
            changed.setdefault(tampered[st.st_dev, st.st_ino], False)
    return changed


def _held_files(top: Path, dev: int) -> list[tuple[str, os.stat_result]]:
    """(path, lstat) of every regular file under ``top`` on device ``dev``
    (reflinks and copies are private inodes: never in a manifest, so skipped by
    the caller)."""
    out: list[tuple[str, os.stat_result]] = []
    try:
        rels = walk_tree(str(top), max_depth=_WALK_DEPTH)
    except OSError:
        return out
    for rel in rels:
        path = f"{top}/{rel}"
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_dev == dev:
            out.append((path, st))
    return out
