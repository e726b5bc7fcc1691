"""Temporary files: freeing a producer's ``temp_files`` once nothing of this
run can need them (docs/spec/run.md, "Temporary files"; issue 33 item 2).

A producer's temporaries are staged only into its direct dependants (the
tasks whose ``needs`` name it; crucible.stage hides them from the rest). Once
the producer and every selected direct dependant has settled — each settle
comes through :meth:`TempFreer.settled`, hooked on the schedule's — they are
freed: ``STATE/freed/<task>.json`` is written (durably) *first*, then the
files leave the store, the published manifests and the dependants' views. A
crash between the two leaves a marker whose files still exist: the next
session finishes the deletion before anything runs (:meth:`TempFreer.start`);
nothing ever refers to a file that is gone without a marker saying so. A
later session (``--resume``, ``--retry-failed``) that runs a direct dependant
again reruns the producer first (:func:`rerun_for_freed`, with the reason
``-n`` shows).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.atomic import write_bytes
from crucible.core.fsio import clear_path, remove_tree
from crucible.core.plan import Task

__all__ = [
    "FREED_DIR",
    "FREED_FORMAT",
    "TempFreer",
    "freed_marker",
    "read_freed",
    "rerun_for_freed",
]

FREED_DIR = "freed"
FREED_FORMAT = "crucible.freed/1"


def freed_marker(state: Path, task: str) -> Path:
    return state / FREED_DIR / f"{task}.json"


def read_freed(state: Path) -> dict[str, dict[str, Any]]:
    """Every marker in ``STATE/freed/``, by task (a damaged one is skipped)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(state / FREED_DIR))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("@"):
            continue
        with contextlib.suppress(OSError, canon.CanonError):
            doc = canon.loads((state / FREED_DIR / name).read_bytes())
            if isinstance(doc, dict) and doc.get("format") == FREED_FORMAT:
                out[str(doc.get("task"))] = doc
    return out


def direct_dependants(tasks: Mapping[str, Task], producer: str) -> list[str]:
    return [n for n, t in tasks.items() if producer in t.needs]


def rerun_for_freed(
    state: Path,
    tasks: Mapping[str, Task],
    runs: Callable[[str], bool],
) -> dict[str, str]:
    """Producers whose temporaries were freed and that a task this session
    runs (``runs``) stages: task -> why it runs again."""
    out: dict[str, str] = {}
    for producer in read_freed(state):
        if producer not in tasks:
            continue
        needing = [c for c in direct_dependants(tasks, producer) if runs(c)]
        if needing:
            out[producer] = (
                f"its temporary files were freed and {needing[0]!r} "
                f"{'and others need' if len(needing) > 1 else 'needs'} them"
            )
    return out


def _matches(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    # lazy: core.globs is not loaded with this module; only _matches() needs it
    from crucible.core.globs import pattern_regex

    regexes = [pattern_regex(tuple(p for p in s.split("/") if p)) for s in patterns]

    def hit(rel: str) -> bool:
        parts = rel.split("/")
        return any(r.match("/".join(parts[:n])) for r in regexes for n in range(1, len(parts) + 1))

    return hit


def _mapped(task: Task) -> bool:
    return task.fans_out or task.key is not None


class TempFreer:
    """Frees each producer's temporaries once it and its direct dependants settled."""

    def __init__(
        self,
        state: Path,
        tasks: Mapping[str, Task],
        status: Mapping[str, str],
        selected: Callable[[], set[str] | None],
        emit: Callable[[str, int, int], None],
        loop_body: frozenset[str] = frozenset(),
    ) -> None:
        """``loop_body``: a scored loop's body, whose revisions' files are kept
        (our gap: not freed)."""
        self.state = state
        self.tasks = tasks
        self.status = status
        self.selected = selected
        self.emit = emit
        self.temps = {
            n: t.temp_files for n, t in tasks.items() if t.temp_files and n not in loop_body
        }
        self.dependants = {p: direct_dependants(tasks, p) for p in self.temps}
        self.freed: set[str] = set()

    @property
    def wanted(self) -> bool:
        return bool(self.temps)

    def start(self) -> None:
        """Before anything runs: finish what an earlier session marked freed
        (a crash between its marker and the deletion), and free what settled
        in an earlier session and is no longer needed."""
        for producer in read_freed(self.state):
            if producer in self.temps and producer in self.status:
                self._delete(producer)
                self.freed.add(producer)
        for producer in self.temps:
            self._maybe_free(producer)

    def settled(self, name: str) -> None:
        """``name`` settled: free what it was the last to need."""
        if name in self.temps:
            self._maybe_free(name)
        for dep in self.tasks[name].needs:
            if dep in self.temps:
                self._maybe_free(dep)

    def _maybe_free(self, producer: str) -> None:
        if producer in self.freed or producer not in self.status:
            return
        selected = self.selected()
        for c in self.dependants[producer]:
            if (selected is None or c in selected) and c not in self.status:
                return  # a dependant of this run has yet to settle
        self.freed.add(producer)
        files, size = self._measure(producer)
        doc = {
            "format": FREED_FORMAT,
            "task": producer,
            "temp_files": list(self.temps[producer]),
            "files": files,
            "bytes": size,
        }
        # the marker first: a crash before the deletion leaves it to finish
        (self.state / FREED_DIR).mkdir(exist_ok=True)
        write_bytes(freed_marker(self.state, producer), canon.dumps(doc), durable=True)
        self._delete(producer)
        self.emit(producer, files, size)

    def _units(self, producer: str) -> list[tuple[str, Path]]:
        """(staged prefix, store dir) of each captured unit of ``producer``."""
        store = self.state / "files" / producer
        if not _mapped(self.tasks[producer]):
            return [(producer, store)] if store.is_dir() else []
        try:
            names = sorted(n for n in os.listdir(store) if not n.startswith("@"))
        except OSError:
            return []
        return [(f"{producer}/{n}", store / n) for n in names if (store / n).is_dir()]

    def _victims(self, producer: str) -> list[tuple[str, str]]:
        """(staged prefix, unit-relative path) of every temporary file or
        directory tree in the store (the top-most match of each)."""
        hit = _matches(self.temps[producer])
        out: list[tuple[str, str]] = []
        for prefix, store in self._units(producer):
            stack = [""]
            while stack:
                rel = stack.pop()
                try:
                    entries = list(os.scandir(store / rel if rel else store))
                except OSError:
                    continue
                for e in entries:
                    sub = f"{rel}/{e.name}" if rel else e.name
                    if hit(sub):
                        out.append((prefix, sub))
                    elif e.is_dir(follow_symlinks=False):
                        stack.append(sub)
        return out

    def _measure(self, producer: str) -> tuple[int, int]:
        files = size = 0
        for prefix, rel in self._victims(producer):
            top = self.state / "files" / prefix / rel
            walked = os.walk(top) if top.is_dir() else [(str(top.parent), [], [top.name])]
            for root, _dirs, names in walked:
                for n in names:
                    with contextlib.suppress(OSError):
                        size += os.lstat(os.path.join(root, n)).st_size
                        files += 1
        return files, size

    def _delete(self, producer: str) -> None:
        """The temporaries out of the store, the published manifests (built
        again from what is left) and every direct dependant's view."""
        victims = self._victims(producer)
        workspaces: list[Path] = []
        for c in self.dependants[producer]:
            top = self.state / "work" / c
            if not _mapped(self.tasks[c]):
                workspaces.append(top)
                continue
            with contextlib.suppress(OSError):  # its instances', and the free ones
                workspaces.extend(e for e in top.iterdir() if e.is_dir() and not e.is_symlink())
        for prefix, rel in victims:
            for ws in workspaces:
                view = ws / "inputs" / prefix / rel
                if os.path.lexists(view):
                    clear_path(view)
            clear_path(self.state / "files" / prefix / rel)
        remove_tree(self.state / "shared" / producer)
