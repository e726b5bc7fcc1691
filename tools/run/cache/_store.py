"""The task cache: a unit's result, keyed by everything that can change it.

A unit's workspace is fresh per run and everything it receives is staged by
``crucible.stage`` with digests, so its cache key can be complete: the task's
compiled definition, the digests of every staged input and every staged
ancestor file, its instance key and item, the host variables it is actually
handed, the agent command, and the emit cap (docs/spec/cache.md). What the key
leaves out — wall clock, the state directory's path, host variables a task is
not handed — cannot reach the task.

Records live in a ledger (``crucible.ledger``, scope ``dispatch``): memo →
ledger → execute, at-least-once executed, exactly-once recorded, only settled
facts. A record's value is the result record and the list of captured files
(path, size, digest); the files themselves live in a content-addressed store
under the cache directory, ``files/sha256/<2 hex>/<62 hex>``, written before the
record is appended, so a crash between them leaves a store file no record
names (a ``gc`` removes it), never a record whose files are missing. A store
file whose digest no longer matches is never restored: the lookup is a miss,
reported.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from crucible.core import canon, digest
from crucible.core.errors import OperationalError
from crucible.core.fdio import read_regular, write_all
from crucible.core.plan import Plan, Task
from crucible.run.cache._storefs import READ as _READ
from crucible.run.cache._storefs import file_digest, real_dirs

__all__ = [
    "CACHE_SCOPE",
    "KEY_FORMAT",
    "RESTORED",
    "CacheKey",
    "Fact",
    "Hit",
    "Miss",
    "TaskCache",
    "ancestor_files",
    "explain_miss",
    "fixed_components",
    "restored_record",
    "scalar_digest",
    "write_quick",
]

CACHE_SCOPE = "dispatch"
KEY_FORMAT = "crucible.cache-key/2"
#: plan task members that never change what a unit does (documentation only)
_NOT_IN_KEY = frozenset({"description"})
#: host variables an edition-1 task is keyed on: it is handed the whole host
#: environment, and keying on all of it would make every shell's PWD, SHLVL
#: and OLDPWD a miss (docs/spec/cache.md)
_EDITION1_KEYED_VARS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")

Warn = Callable[[str], None]
#: a ledger line a worker encoded and its dispatcher appends: (line, scope, step)
Fact = tuple[bytes, str, str]


def _digest_of(value: Any) -> str:
    return digest.of_bytes(canon.dumps(value))


#: a temporary file in the cache directory: created, never opened through
#: whatever is at its name (O_EXCL refuses a symlink and a hard link alike)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


#: link(2) errors that mean links cannot be made here (EXDEV: another
#: filesystem; EPERM: protected_hardlinks; EMLINK; ENOTSUP): copies instead
_NO_LINKS = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP})


def _copy_new(src: str, target: str) -> None:
    """Copy a store file to a new, read-only file at ``target`` (created O_EXCL:
    nothing at the name is written through)."""
    fin = os.open(src, _READ)
    try:
        fd = _create(target)
        try:
            while chunk := os.read(fin, 1 << 20):
                write_all(fd, chunk)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
    finally:
        os.close(fin)


def _create(path: str) -> int:
    """A new temporary file at ``path`` (mode 0600 until its writer sets it).
    Anything already at the name — a symlink or hard link planted there, or a
    crash's leftover (``gc`` removes those in the store) — is FileExistsError:
    never opened, so never written through."""
    return os.open(path, _CREATE, 0o600)


def _write_new(tmp: str, path: str | Path, data: bytes, mode: int) -> None:
    """``data`` at ``path`` by way of a new temporary file ``tmp`` (created by
    :func:`_create` before the try: what was at that name is not ours to
    remove), given ``mode`` and renamed over ``path``; the temp file is removed
    when anything fails."""
    fd = _create(tmp)
    try:
        try:
            write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@functools.lru_cache(maxsize=1024, typed=True)
def scalar_digest(value: str | int | None) -> str:
    """:func:`_digest_of` of a string, an integer or null, remembered: a run
    keys every unit on the same plan version, emit cap and agent command."""
    return _digest_of(value)


def _components_digest(components: dict[str, str]) -> str:
    """The key's digest: canonical JSON of ``{"components", "format"}``. The
    values are ``sha256:`` digests, so orjson's sorted output is RFC 8785's
    whenever every name sorts the same in UTF-16 as in code points (no name
    holds a character at or above U+E000, as canon's own fast path checks)."""
    doc = {"components": components, "format": KEY_FORMAT}
    if all(not k or max(k) < "\ue000" for k in components):
        try:
            return digest.of_bytes(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
        except TypeError:  # a lone surrogate: canon says so
            pass
    return _digest_of(doc)


class CacheKey:
    """A unit's key: ``digest`` over the canonical JSON of ``components`` (name →
    digest of that part), kept apart so a miss can name what changed. (A plain
    class, not a dataclass: one per unit, and a frozen dataclass's creation and
    construction cost ~1 ms at import and ~2 us per unit.)"""

    __slots__ = ("components", "digest", "key", "task")

    def __init__(self, task: str, key: str | None, components: dict[str, str]) -> None:
        self.task = task
        self.key = key
        self.components = components
        self.digest = _components_digest(components)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CacheKey):
            return NotImplemented
        return (self.task, self.key, self.components) == (other.task, other.key, other.components)

    __hash__ = None  # type: ignore[assignment]  # components is a dict

    def __repr__(self) -> str:
        return f"CacheKey(task={self.task!r}, key={self.key!r}, digest={self.digest!r})"


def write_quick(path: str | Path, data: bytes, made_dirs: set[str]) -> None:
    """Replace ``path`` with ``data`` atomically, not durably (what it writes is
    found again or rebuilt after a power cut: a hit's record, the last key),
    creating its directory once per process (``made_dirs``; a caller in the
    cache directory makes it with :func:`real_dirs` first). The temporary
    name is fixed per process — one thread of a process writes these — so
    there is no random name to draw and no retry; it is created O_EXCL, so a
    link planted at it is refused (OSError), never written through."""
    # lazy: core.atomic is not loaded with this module; only write_quick() needs it
    from crucible.core.atomic import TMP_PREFIX

    parent = os.path.dirname(path)
    if parent not in made_dirs:
        os.makedirs(parent, exist_ok=True)
        made_dirs.add(parent)
    tmp = f"{parent}/{TMP_PREFIX}q-{os.getpid()}"
    _write_new(tmp, path, data, 0o644)


def _task_definition(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task's plan object as its key holds it. A static fan-out's sources
    (a literal list, a sequence, a param, the matrix's axes, include and
    exclude) decide which instances exist, not what one does: an instance is
    keyed on its own key and item, so widening or narrowing a list reuses the
    instances already computed (docs/spec/cache.md, "Params"). ``parallelism``
    is a scheduling bound, like ``-j``; ``on_empty`` only decides what a fan-out
    with no instance (so no key) settles as."""
    out = {k: v for k, v in task.items() if k not in _NOT_IN_KEY}
    matrix = out.get("matrix")
    if isinstance(matrix, dict):
        out["matrix"] = [a.get("name") for a in matrix.get("axes", ()) if isinstance(a, dict)]
    if "map" in out and not isinstance(out["map"], str):
        out["map"] = "static"  # a "producer.field" source stays as it is
    out.pop("parallelism", None)
    out.pop("on_empty", None)
    return out


def _record_files(record: Mapping[str, Any], files_dir: Path) -> list[dict[str, Any]]:
    """A record's captured files with digests (hashed here when the record has none)."""
    out = []
    for entry in record.get("files", []) or []:
        d = entry.get("digest")
        if not isinstance(d, str):
            d = digest.of_file(files_dir / entry["path"])
        out.append({"path": entry["path"], "size": entry.get("size"), "digest": d})
    return out


#: ancestor -> (its record's (inode, size, mtime), its files component)
FilesMemo = dict[str, tuple[tuple[int, int, int], str]]


def ancestor_files(
    state: Path,
    escape_key: Callable[[str], str],
    ancestors: list[str],
    memo: FilesMemo | None = None,
) -> dict[str, str]:
    """One component per ancestor that declares emits_files: what was staged
    under ``inputs/<ancestor>/`` (its captured files and their digests).

    With ``memo`` (one per run), an ancestor whose record file is the one read
    before is not read again: every instance of a wide fan-out below it would
    otherwise re-read it (and, for a fold, every instance record of it). A
    settled record is replaced, never changed in place, so its identity says
    whether it changed; a fold's record is written after its instances'.
    ``ancestors`` (the keyer's, walked once per task over the plan's view):
    the ancestors that declare emits_files, sorted."""
    out: dict[str, str] = {}
    for name in ancestors:
        rec_path = state / "results" / f"{name}.json"
        try:
            st = os.stat(rec_path)
        except FileNotFoundError:
            out[f"files:{name}"] = _digest_of(None)
            continue
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        known = None if memo is None else memo.get(name)
        if known is not None and known[0] == ident:
            out[f"files:{name}"] = known[1]
            continue
        record = canon.loads(rec_path.read_bytes())
        if "keys" in record:  # a fold: every instance's files
            from crucible.stage.readers import load_all  # packed: one read (inputs.md 5)

            per: dict[str, Any] = {}
            instances = load_all(state, name)
            for k in record["keys"]:
                if (irec := instances.get(k)) is not None:
                    per[k] = _record_files(irec, state / "files" / name / escape_key(k))
            component = _digest_of(per)
        else:
            component = _digest_of(_record_files(record, state / "files" / name))
        out[f"files:{name}"] = component
        if memo is not None:
            memo[name] = (ident, component)
    return out


@functools.lru_cache(maxsize=4096)
def _value_of_env(value: str) -> str:
    """A variable's digest (most tasks of a plan are handed the same values)."""
    return _digest_of(value)


def fixed_components(
    plan: Plan,
    task: Task,
    definition: Mapping[str, Any],
    host_env: Mapping[str, str],
    agent_cmd: str | None,
    emit_cap: int,
    programs_changed_after: int | None = None,
    programs_memo: dict[tuple[str, str | None], str] | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """The components that depend on the task alone, as (those before
    ``instance``, those after it) in key order.

    One ``env:<NAME>`` component per host variable the task is handed, so a
    miss names each variable that changed; ``PATH`` is keyed as the programs
    it resolves (``program:<name>``, crucible.run.cache._programs), not as a
    string. ``definition``: the task's own plan object, which the key hashes as
    the plan spells it (:func:`_task_definition`); everything else is read
    from the model."""
    # lazy: run.cache._programs is not loaded with this module; only fixed_components() needs it
    from crucible.run.cache._programs import program_components

    if plan.edition <= 1:
        env = {k: host_env[k] for k in _EDITION1_KEYED_VARS if k in host_env}
    else:
        env = dict(host_env)
    head = {
        "plan_version": scalar_digest(plan.version),
        "task": _digest_of(_task_definition(definition)),
    }
    tail = {f"env:{k}": _value_of_env(env[k]) for k in sorted(env) if k != "PATH"}
    tail.update(program_components(task, env, _digest_of, programs_changed_after, programs_memo))
    tail["emit_cap"] = scalar_digest(emit_cap)
    if task.kind == "agent":
        tail["agent_cmd"] = scalar_digest(agent_cmd)
    return head, tail


# ------------------------------------------------------------------- lookups


def _step(ck: CacheKey) -> str:
    """The ledger step of a key, spelled as ``crucible.ledger`` content steps are."""
    return f"unit:{ck.digest}"


#: the ledger value's member naming the store file that holds the bytes a hit of
#: a plain unit restores as its record (restored_bytes): laid by hard link
RESTORED = "restored_record"


def restored_record(record: Mapping[str, Any], ck: CacheKey) -> dict[str, Any]:
    """The record a hit restores (at its first attempt, the only one looked
    up): as captured, with ``attempt`` 1, ``cached`` and ``cache_key``."""
    return {**record, "attempt": 1, "cached": True, "cache_key": ck.digest}


class Hit:
    """A ledger record for a key: the result record as captured, its store
    files, and the digest of the store file holding the restored record's bytes
    (a plain unit recorded by this engine), else None."""

    __slots__ = ("files", "record", "restored")

    def __init__(
        self, record: dict[str, Any], files: list[dict[str, Any]], restored: str | None = None
    ) -> None:
        self.record = record
        self.files = files
        self.restored = restored

    @property
    def files_bytes(self) -> int:
        """What restoring it reads to check the store (recorded sizes)."""
        return sum(int(f.get("size") or 0) for f in self.files)


class Miss:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


_COMPONENT_WORDS = {
    "plan_version": "changed plan version",
    "task": "changed task definition",
    "instance": "new instance",
    "emit_cap": "changed emit cap",
    "agent_cmd": "changed --agent-cmd",
    "reads": "changed reads",
}


def _grouped(previous: Mapping[str, str], current: Mapping[str, str], prefix: str) -> list[str]:
    """The names under ``prefix`` whose component changed, appeared or went."""
    names = {n for n in (*previous, *current) if n.startswith(prefix)}
    return sorted(n[len(prefix) :] for n in names if previous.get(n) != current.get(n))


def explain_miss(previous: Mapping[str, str] | None, current: Mapping[str, str]) -> str:
    """Why a unit missed, against the last key recorded for the same task and
    instance: the first component (in key order) that differs; a change of
    environment names every variable and program that changed."""
    if previous is None:
        return "never run with this cache"
    for name, value in current.items():
        if previous.get(name) != value:
            if name.startswith(("env:", "program:")):
                return _environment_change(previous, current)
            if name.startswith("input:"):
                return f"changed input {name[6:]!r}"
            if name.startswith("files:"):
                return f"changed files of {name[6:]!r}"
            if name == "task":
                return "changed task definition"
            return _COMPONENT_WORDS.get(name, f"changed {name}")
    for name in previous:
        if name not in current:
            if name.startswith(("env:", "program:")):
                return _environment_change(previous, current)
            return f"input {name.split(':', 1)[-1]!r} no longer staged"
    return "same key, no record (a failure, or not cached)"


def _environment_change(previous: Mapping[str, str], current: Mapping[str, str]) -> str:
    parts = []
    variables = _grouped(previous, current, "env:")
    if variables:
        parts.append("changed environment variable " + ", ".join(variables))
    programs = _grouped(previous, current, "program:")
    if programs:
        listed = ", ".join(repr(p) for p in programs)
        parts.append(f"changed program {listed} (another file on PATH, or edited)")
    return "; ".join(parts)


class TaskCache:
    """A cache directory: a ledger of unit results plus a content store of files."""

    def __init__(self, directory: Path, *, warn: Warn) -> None:
        self.directory = directory
        self.warn = warn
        self.store = directory / "files" / "sha256"
        self._store_dir = str(self.store)
        self._last_dir = str(directory / "last")
        self._ledger: Any = None
        #: directories made or checked by this process (real_dirs), as strings
        self._made_dirs: set[str] = set()
        #: hard links from the store cannot be made (set at the first failure)
        self._links_fail = False

    # The ledger is opened lazily so a run whose units all miss early still
    # pays for opening it once, in the process that looks up.
    def _open(self) -> Any:
        if self._ledger is None:
            # lazy: ledger is not loaded with this module; only _open() needs it
            from crucible.ledger import Ledger

            self._ledger = Ledger(self.directory, warn=self.warn)
        return self._ledger

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def _store_path(self, file_digest: str) -> Path:
        hexd = file_digest.split(":", 1)[1]
        return Path(f"{self._store_dir}/{hexd[:2]}/{hexd[2:]}")

    def _last_path(self, task: str, key: str | None, escape_key: Callable[[str], str]) -> str:
        name = escape_key(key) if key is not None else "@task"
        # a string: three pathlib joins cost more than the read it names
        return f"{self._last_dir}/{escape_key(task)}/{name}.json"

    def last_components(
        self, task: str, key: str | None, escape_key: Callable[[str], str]
    ) -> dict[str, str] | None:
        try:
            # a link or FIFO planted there is no last key (an OSError; a FIFO
            # would hang the dry run)
            value = canon.loads(read_regular(self._last_path(task, key, escape_key), follow=False))
        except (OSError, canon.CanonError):
            return None
        return value if isinstance(value, dict) else None

    def lookup(self, ck: CacheKey) -> Hit | None:
        """The recorded result for ``ck``, or None. A record whose store files are
        missing or altered is a miss (warned), never restored."""
        hit = self.find(ck)
        return hit if hit is not None and self.verify(ck, hit) else None

    def find(self, ck: CacheKey) -> Hit | None:
        """The ledger's record for ``ck``, its store files not checked yet."""
        reply = self._open().lookup(CACHE_SCOPE, _step(ck))
        if reply is None or reply.status != "ok":
            return None
        value = reply.value
        if not isinstance(value, dict) or not isinstance(value.get("record"), dict):
            return None
        restored = value.get(RESTORED)
        return Hit(
            value["record"],
            value.get("files", []),
            restored if isinstance(restored, str) and restored.startswith("sha256:") else None,
        )

    def verify(self, ck: CacheKey, hit: Hit) -> bool:
        """Every store file of ``hit`` holds its recorded digest; else warned.
        ValueError for entries the cache never writes (a path that leaves the
        unit's files directory, no digest): a hand-edited ledger, never restored."""
        _check_files(hit.files)
        for entry in hit.files:
            path = self._store_path(entry["digest"])
            try:
                ok = file_digest(path) == entry["digest"]
            except OSError:
                ok = False
            if not ok:
                self.warn(
                    f"cache: store file {path} for {ck.task}: {entry['path']} is missing or "
                    "altered; running the task instead"
                )
                return False
        return True

    def link_record(self, ck: CacheKey, hit: Hit, target: str) -> bool:
        """Lay the record of a plain unit's hit at ``target`` as a hard link to the
        store file of its bytes (no new inode, nothing written); False when there
        is none, it no longer holds its digest, or links fail (the store on
        another filesystem): the caller writes the record instead. A link is
        made durable as a written record is: the group commit syncs ``target``,
        which is the store file's inode."""
        if hit.restored is None or self._links_fail:
            return False
        hexd = hit.restored[7:]  # after "sha256:"
        src = f"{self._store_dir}/{hexd[:2]}/{hexd[2:]}"
        try:
            if file_digest(src) != hit.restored:
                return False  # altered: written from the ledger instead
            try:
                os.link(src, target)
            except FileExistsError:  # a stale record (replaced, as a write would)
                parent, name = os.path.split(target)
                tmp = f"{parent}/@tmp-l{os.getpid()}-{name}"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                os.link(src, tmp)
                os.replace(tmp, target)
            except FileNotFoundError:
                parent = os.path.dirname(target)
                if not os.path.isdir(parent):  # the run's first record
                    os.makedirs(parent, exist_ok=True)
                    os.link(src, target)
                else:
                    raise
        except OSError as exc:
            if exc.errno in _NO_LINKS:
                self._links_fail = True  # EXDEV: another filesystem; EPERM: protected_hardlinks
            return False
        return True

    def restore(self, hit: Hit, files_dir: Path) -> None:
        """Lay the hit's captured files under ``files_dir`` (hard links from the
        store, read-only; copies across filesystems)."""
        if files_dir.exists():
            # lazy: shutil loads bz2, lzma and zlib (~2 ms of a cached run's start)
            import shutil

            shutil.rmtree(files_dir)
        made: set[Path] = set()
        for entry in hit.files:
            target = files_dir / entry["path"]
            if target.parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(target.parent)
            src = self._store_path(entry["digest"])
            try:
                os.link(src, target)
            except OSError as exc:
                # only where links cannot be made; anything already at the name
                # (EEXIST) is never copied over: it may be a link to a store file
                if exc.errno not in _NO_LINKS:
                    raise
                _copy_new(str(src), str(target))

    def save(
        self,
        ck: CacheKey,
        record: dict[str, Any],
        files_dir: Path,
        escape_key: Callable[[str], str],
        *,
        defer: bool = False,
    ) -> Fact | None:
        """Record a settled unit: store files first (fsynced), then the ledger
        line. ``defer``: the line is returned, encoded, for the dispatcher to
        append with the other units of its group-commit batch
        (:meth:`append_facts`: one write and one fsync for all of them)."""
        files = _record_files(record, files_dir)
        for entry in files:
            self._put_file(files_dir / entry["path"], entry["digest"])
        value: dict[str, Any] = {"record": record, "files": files}
        if ck.key is None:  # a plain unit: its hits link their record from the store
            with contextlib.suppress(OSError):
                value[RESTORED] = self._put_restored(canon.dumps(restored_record(record, ck)))
        # lazy: ledger is not loaded with this module; only save() needs it
        from crucible.ledger import Ledger, Outcome

        step = _step(ck)
        key = {"task": ck.task, "instance": ck.key, "components": ck.components}
        fact = None
        if defer:
            fact = (
                Ledger.encode_fact(CACHE_SCOPE, step, Outcome.ok(value), key=key),
                CACHE_SCOPE,
                step,
            )
        else:
            self._open().record(CACHE_SCOPE, step, Outcome.ok(value), key=key)
        self._write_last(ck, escape_key)
        return fact

    def append_facts(self, facts: list[Fact]) -> int:
        """Append the lines :meth:`save` deferred, as one batch (Ledger.append_encoded)."""
        return int(self._open().append_encoded(facts)) if facts else 0

    def _write_last(self, ck: CacheKey, escape_key: Callable[[str], str]) -> None:
        path = self._last_path(ck.task, ck.key, escape_key)
        with contextlib.suppress(OSError):
            real_dirs(self.directory, os.path.dirname(path), self._made_dirs)
            write_quick(path, canon.dumps(ck.components), self._made_dirs)

    # ------------------------------------------------------------ maintenance

    def _live(self) -> list[dict[str, Any]]:
        """The latest ledger record of every unit key that is still a hit candidate."""
        out = []
        for payload in self._open().records(CACHE_SCOPE):
            record = canon.loads(payload)
            if record.get("status") == "ok" and isinstance(record.get("value"), dict):
                out.append(record)
        return out

    def forget(self, task: str, escape_key: Callable[[str], str]) -> int:
        """Drop every cached result of ``task``: each of its live records is
        superseded by a ``failed`` record whose value is ``{"forgotten": true}``
        (the ledger is append-only; a lookup replays only ``ok``), and its
        ``last/`` entries go. Returns how many records were forgotten."""
        # lazy: ledger is not loaded with this module; only forget() needs it
        from crucible.ledger import Outcome

        ledger = self._open()
        n = 0
        for record in self._live():
            key = record.get("key")
            if isinstance(key, dict) and key.get("task") == task:
                ledger.record(
                    CACHE_SCOPE, record["step"], Outcome.failed({"forgotten": True}), key=key
                )
                n += 1
        root = self.directory / "last"
        last = root / escape_key(task)
        if _is_real_dir(root) and _is_real_dir(last):
            import shutil  # lazy: only forget needs it (start-up)

            shutil.rmtree(last)
        elif os.path.lexists(root) and not _is_real_dir(root):
            self.warn(f"cache: {root} is not a directory (a symlink is never followed); kept")
        return n

    def gc(self, *, grace: float = 60.0) -> dict[str, int]:
        """Remove store files no live record names. Files younger than ``grace``
        seconds are kept: a run stores a unit's files just before it appends
        the record that names them."""

        live: set[Any] = set()
        for r in self._live():
            live.update(f.get("digest") for f in r["value"].get("files", []))
            live.add(r["value"].get(RESTORED))
        removed = kept = freed = 0
        now = time.time()
        for d in (self.store.parent, self.store):  # files/, files/sha256/
            if not os.path.lexists(d):
                return {"removed": 0, "kept": 0, "bytes": 0}
            if not _is_real_dir(d):  # a link planted there: gc would delete outside the cache
                raise OperationalError(
                    "cannot collect the cache store: not a directory (a symlink is never followed)",
                    where=str(d),
                )
        for sub in sorted(self.store.iterdir()):
            if not sub.is_dir() or sub.is_symlink():
                continue
            for path in sorted(sub.iterdir()):
                name = f"sha256:{sub.name}{path.name}"
                info = path.lstat()
                if name in live or now - info.st_mtime < grace:
                    kept += 1
                    continue
                path.unlink()
                removed += 1
                freed += info.st_size
        return {"removed": removed, "kept": kept, "bytes": freed}

    def _put_restored(self, data: bytes) -> str:
        """Store a restored record's bytes; returns their digest. Not fsynced:
        a hit that links it has it synced by its group commit (a torn or lost
        one after a crash fails its digest check, and the record is written
        from the ledger instead: never a miss)."""
        data_digest = digest.of_bytes(data)
        hexd = data_digest[7:]  # after "sha256:"
        parent, name = f"{self._store_dir}/{hexd[:2]}", hexd[2:]
        target = f"{parent}/{name}"
        # Stored before: kept when it still holds those bytes (a regular file:
        # a link planted at the name is not one), else replaced
        with contextlib.suppress(OSError):
            if file_digest(target) == data_digest:
                return data_digest
        real_dirs(self.directory, parent, self._made_dirs)
        tmp = f"{parent}/@tmp-r{os.getpid()}-{threading.get_ident()}-{name}"
        # O_EXCL|O_NOFOLLOW: a link planted at the temp name is refused, never
        # written through (an OSError here: no restored copy, the hit writes
        # its record)
        _write_new(tmp, target, data, 0o444)
        return data_digest

    def _put_file(self, src: Path, want: str) -> None:
        """Copy a captured file into the store at its digest ``want`` (fsynced):
        the temp file is created O_EXCL|O_NOFOLLOW in a store directory that is
        a real directory, the source opened O_NOFOLLOW, so nothing is read or
        written through a link planted in the cache or among the captured files."""
        target = self._store_path(want)
        # Stored before: kept when it still holds that content (a regular file),
        # replaced when it was altered meanwhile (else every later lookup would
        # miss on it) or when a link was planted at its name.
        with contextlib.suppress(OSError):
            if file_digest(target) == want:
                return
        real_dirs(self.directory, target.parent, self._made_dirs)
        tmp = f"{target.parent}/@tmp-{os.getpid()}-{target.name}"
        h = hashlib.sha256()
        fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fin).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(src))
            fd = _create(tmp)
            try:
                try:
                    while chunk := os.read(fin, 1 << 20):
                        h.update(chunk)
                        write_all(fd, chunk)
                    os.fsync(fd)
                    os.fchmod(fd, 0o444)
                finally:
                    os.close(fd)
                if f"sha256:{h.hexdigest()}" != want:
                    raise OSError(f"{src} changed while it was stored")
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        finally:
            os.close(fin)


def _is_real_dir(path: Path) -> bool:
    """A directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _check_files(files: Any) -> None:
    """A ledger value's ``files`` list as the cache writes it (docs/schemas/
    cache-value.json): each path relative and inside its files directory, each
    digest a SHA-256, no path twice. ValueError otherwise (a hand-edited ledger: a miss,
    warned), so a restore never lays a file outside the unit's directory."""
    if not isinstance(files, list):
        raise ValueError("its files are not a list")
    seen: set[str] = set()
    for entry in files:
        if not isinstance(entry, dict):
            raise ValueError("a file entry is not an object")
        path, d = entry.get("path"), entry.get("digest")
        if not isinstance(path, str) or not _safe_relative(path):
            raise ValueError(f"file path {path!r} is not inside the unit's files")
        if path in seen:  # a second one would be laid over the first's store file
            raise ValueError(f"file path {path!r} is listed twice")
        seen.add(path)
        if not digest.is_digest(d):
            raise ValueError(f"file {path!r} has no sha256 digest")


def _safe_relative(path: str) -> bool:
    return (
        bool(path)
        and not path.startswith("/")
        and "\0" not in path
        and all(part not in ("", ".", "..") for part in path.split("/"))
    )
