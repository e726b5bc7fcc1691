"""The task cache as a unit sees it: keyed before staging, restored on a hit,
saved after a pass.

Used on the scheduling thread to look units up and restore hits
(:mod:`crucible.run.cache._hits`), in a dispatcher worker to key a unit that
missed and save it once it passed (:class:`crucible.run.executors._unit.UnitRunner`), and
by the dry run (:mod:`crucible.run.cache._explain`), on top of
:mod:`crucible.run.cache._store` (key and store) and :mod:`crucible.run.cache._keyer`
(the key from the plan and the settled records). Every problem with the cache
is a warning and a miss: the unit runs (docs/spec/cache.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.core.errors import CrucibleError
from crucible.stage import StateLayout, escape_key, load_result, write_result

if TYPE_CHECKING:
    from crucible.core.plan import Task
    from crucible.run.cache._keyer import Keyer

__all__ = ["UnitCache", "cacheable", "usable_cache_dir"]

Warn = Callable[[str], None]
#: what a broken cache can raise besides CrucibleError; never a failed run
_CACHE_ERRORS = (CrucibleError, OSError, ValueError, KeyError, TypeError)


def usable_cache_dir(path: Path | None, warn: Warn) -> Path | None:
    """``--cache DIR`` checked once, before the workers fork: created when
    missing; a file, an uncreatable or unwritable directory is one warning and
    the run proceeds uncached (None)."""
    if path is None:
        return None
    path = path.absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():
            raise NotADirectoryError(20, "not a directory")
        # not tempfile.mkstemp: importing tempfile (shutil, random, bz2, lzma)
        # costs ~3 ms of a cached run's start-up
        probe = f"{path}/.probe-{os.getpid()}-{os.urandom(6).hex()}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
    except FileExistsError:
        warn(f"cache: {path}: not a directory; running uncached")
        return None
    except OSError as exc:
        warn(f"cache: {path}: {exc.strerror or exc}; running uncached")
        return None
    return path


def cacheable(task: Task) -> bool:
    """``cache = false`` (edition 4): the task's results are state, never cached;
    nor is a task with ``temp_files`` (its temporaries are freed: a hit could
    not lay them back, and they must not outlive the run in the cache)."""
    return task.caches and not task.temp_files


class UnitCache:
    """One process's view of the cache directory (the ledger opens lazily, at the
    first lookup or save: in a worker, after the fork), keying units of
    ``keyer``'s plan and state directory."""

    def __init__(self, directory: Path, keyer: Keyer) -> None:
        from crucible.run.cache._store import TaskCache  # lazy: only a run with --cache

        self.plan = keyer.plan
        self.state = keyer.state
        self.layout = StateLayout(self.state)
        self._results = str(self.layout.results_root)
        self.warnings: list[str] = []
        self.cache = TaskCache(directory, warn=self.warnings.append)
        self.keyer = keyer

    def take_warnings(self) -> list[str]:
        out, self.warnings = self.warnings, []
        return out

    def key(self, name: str, key: str | None) -> Any:
        """The unit's CacheKey from the plan and the settled records (nothing is
        staged), or None when it cannot be computed: a refusal staging will
        report (silent), or a broken cache (warned)."""
        try:
            return self.keyer.key(name, key)
        except CrucibleError:
            return None  # stage refuses it too, and says why
        except _CACHE_ERRORS as exc:
            self.warnings.append(f"cache: cannot key {_label(name, key)}: {exc}; running it")
            return None

    def lookup(self, ck: Any, attempt: int) -> dict[str, Any] | None:
        """On a hit: restore the files and the result record (as recorded, with this
        session's attempt and ``cached``/``cache_key``); return the record."""
        hit = self.find(ck)
        restored = None if hit is None else self._restore(ck, hit, attempt)
        return None if restored is None else restored[0]

    def lookup_reply(self, ck: Any, attempt: int) -> dict[str, Any] | None:
        """:meth:`lookup`, answered as :meth:`restore_reply` does."""
        hit = self.find(ck)
        return None if hit is None else self.restore_reply(ck, hit, attempt)

    def find(self, ck: Any) -> Any:
        """The cache's record for ``ck`` (a :class:`crucible.run.cache._store.Hit`, its
        store files not checked yet), or None."""
        try:
            hit = self.cache.find(ck)
        except _CACHE_ERRORS as exc:
            self.warnings.append(f"cache: cannot look up {_label(ck.task, ck.key)}: {exc}")
            return None
        if hit is None or hit.record.get("task") != ck.task or hit.record.get("key") != ck.key:
            return None  # a record of another unit under this key: never restored
        return hit

    def restore(self, ck: Any, hit: Any, attempt: int) -> dict[str, Any] | None:
        """Check the store files of ``hit`` (a miss, warned, when one is missing
        or altered), lay them back, write the record; return it."""
        restored = self._restore(ck, hit, attempt)
        return None if restored is None else restored[0]

    def restore_reply(self, ck: Any, hit: Any, attempt: int) -> dict[str, Any] | None:
        """:meth:`restore`, answered with what the dispatcher settles the unit
        with (:meth:`hit_reply`, and the record file to make durable)."""
        restored = self._restore(ck, hit, attempt)
        if restored is None:
            return None
        record, path = restored
        return {**self.hit_reply(ck, record), "wrote": [path, os.path.dirname(path)]}

    def _restore(self, ck: Any, hit: Any, attempt: int) -> tuple[dict[str, Any], str] | None:
        try:
            if not self.cache.verify(ck, hit):
                return None
            record = dict(hit.record)
            record["attempt"] = attempt
            record["cached"] = True
            record["cache_key"] = ck.digest
            if hit.files:
                self.cache.restore(hit, self.layout.files_dir(ck.task, ck.key))
            # Not fsync'd here: the dispatcher hands the file to the session
            # log's group commit, which makes it durable before the batch
            # holding its task_finished (Dispatcher._settle_cached). A plain
            # unit's is a hard link to the store's copy of these very bytes
            # (crucible.run.cache._store.restored_record) when the cache has one; else
            # it is written atomically (a keyed unit's: a line of its task's
            # packed file, stage.write_result). The task name is the plan's,
            # checked when it was loaded: its path is results/<task>.json.
            if ck.key is None and attempt == 1:
                path = f"{self._results}/{ck.task}.json"
                if self.cache.link_record(ck, hit, path):
                    return record, path
            return record, str(write_result(self.state, record, durable=False))
        except _CACHE_ERRORS as exc:
            self.warnings.append(
                f"cache: cannot restore {_label(ck.task, ck.key)}: {exc}; running it"
            )
            return None

    def hit_reply(self, ck: Any, record: Mapping[str, Any]) -> dict[str, Any]:
        """What the scheduling thread settles a restored unit with (the shape of
        a worker's reply: kind ``cached``)."""
        summary = {k: record.get(k) for k in ("status", "note", "retryable", "files_captured")}
        if isinstance(record.get("usage"), dict):  # of the attempt that produced it
            summary["usage"] = record["usage"]
        if record.get("files_captured"):
            with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):  # junk
                summary["files_bytes"] = sum(int(f.get("size", 0)) for f in record["files"])
        return {"kind": "cached", "cache_key": ck.digest, "record": summary}

    def save(
        self, ck: Any, *, defer: bool = False, record: dict[str, Any] | None = None
    ) -> Any:
        """Record a passed unit: its record as captured, its files into the store.
        ``record``: the record just written to the state (a worker has it: not
        read back), else it is read. ``defer``: the ledger line is returned (a
        ``crucible.run.cache._store.Fact``), for the dispatcher to append with
        its batch (:meth:`append_facts`); None when nothing is to be recorded."""
        try:
            if record is None:
                record = load_result(self.state, ck.task, ck.key)
            if record is None or record.get("status") != "passed":
                return None
            files_dir = self.layout.files_dir(ck.task, ck.key)
            return self.cache.save(ck, record, files_dir, escape_key, defer=defer)
        except _CACHE_ERRORS as exc:
            self.warnings.append(f"cache: cannot record {_label(ck.task, ck.key)}: {exc}")
            return None

    def append_facts(self, facts: list[Any]) -> int:
        """Append the ledger lines of saves deferred by workers (one batch)."""
        try:
            return self.cache.append_facts(facts)
        except _CACHE_ERRORS as exc:
            self.warnings.append(f"cache: cannot record {len(facts)} units: {exc}")
            return 0

    def close(self) -> None:
        with contextlib.suppress(*_CACHE_ERRORS):
            self.cache.close()


def _label(name: str, key: str | None) -> str:
    return repr(name) if key is None else f"{name!r}[{key!r}]"
