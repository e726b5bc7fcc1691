"""``--reuse``: after an edit, rerun only what the edit changed (docs/spec/cache.md,
"After an edit: --reuse").

Every run records at its claim what its units' cache keys need beyond the plan,
the params and the settled records: the host variables its tasks are handed,
the ``--agent-cmd``, the emit cap, and when it started (``STATE/environ.json``,
schema ``run-environ.json``). ``--reuse`` starts over as ``--fresh`` does (the
earlier run moves to ``STATE.prev``), but first keys every passed unit of the
earlier run as that run would have (its plan, its params, its records, its
recorded environment) and records it in a cache — ``--cache DIR`` when given,
else a temporary one beside the state dir, removed after the run. The new run
then looks each unit up as any cached run does: a unit whose key did not change
is restored from the earlier run's record and files; one whose key changed (its
definition, a param it lists, an input, an ancestor's files, a variable it is
handed, a program it runs) runs, and so, when its result changes, do its
dependants. A program file changed in place since the earlier run started (its
ctime is later) counts as changed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.core import atomic, canon
from crucible.core.errors import CrucibleError
from crucible.core.plan import Plan, Task

if TYPE_CHECKING:
    from crucible.stage import StateDir

__all__ = [
    "ENVIRON_FILE",
    "ENVIRON_FORMAT",
    "environ_record",
    "import_previous",
    "note_environ",
    "reuse_dir",
]

ENVIRON_FILE = "environ.json"
ENVIRON_FORMAT = "crucible.run-environ/1"

Warn = Callable[[str], None]


def environ_record(
    plan: Plan, environ: Mapping[str, str], agent_cmd: str | None, emit_cap: int
) -> dict[str, Any]:
    """What ``STATE/environ.json`` holds for a run of ``plan`` from ``environ``:
    every host variable a task of it is handed and keyed on (run.md,
    "Environment"; cache.md), never another."""
    # lazy: run.executors._environ is not loaded with this module; only environ_record() needs it
    from crucible.run.executors._environ import BASE_VARS

    names = set(BASE_VARS)
    if plan.edition >= 2:
        for task in plan.tasks:
            names.update(n for n in task.env if not n.startswith("CRUCIBLE_"))
    return {
        "format": ENVIRON_FORMAT,
        "environ": {k: environ[k] for k in sorted(names) if k in environ},
        "agent_cmd": agent_cmd,
        "emit_cap": emit_cap,
        # a decimal string: nanoseconds since the epoch leave JSON's safe integers
        "started_ns": str(time.time_ns()),
    }


def write_environ(state: Path, record: Mapping[str, Any]) -> None:
    # Not fsync'd: lost in a crash, --reuse reuses nothing of this run (it says so).
    atomic.write_bytes(state / ENVIRON_FILE, canon.dumps(dict(record)), durable=False)


def note_environ(state: Path, record: Mapping[str, Any], *, resumed: bool, session: int) -> None:
    """A new run records its environment; a resumed session whose environment
    differs from the one in force adds it to ``later`` with its session number,
    so that ``--reuse`` keys each unit under the environment of the session it
    passed in (cache.md, "After an edit: --reuse")."""
    if not resumed:
        write_environ(state, record)
        return
    held = _read_environ(state)
    if held is None:
        return  # nothing recorded (an older engine's run): --reuse reuses nothing
    later = list(held.get("later", ()))
    current = later[-1] if later else held
    if all(current.get(k) == record[k] for k in _KEYED):
        return
    later.append({"session": session, **{k: record[k] for k in _KEYED}})
    write_environ(state, {**held, "later": later})


#: what a session's units are keyed on besides the plan (environ.json)
_KEYED = ("environ", "agent_cmd", "emit_cap")


def _environment_ok(doc: Mapping[str, Any]) -> bool:
    return (
        isinstance(doc.get("environ"), dict)
        and all(isinstance(v, str) for v in doc["environ"].values())
        and isinstance(doc.get("emit_cap"), int)
        and (doc.get("agent_cmd") is None or isinstance(doc["agent_cmd"], str))
    )


def _read_environ(prev: Path) -> dict[str, Any] | None:
    try:
        doc = canon.loads((prev / ENVIRON_FILE).read_bytes())
    except (OSError, canon.CanonError):
        return None
    ok = (
        isinstance(doc, dict)
        and doc.get("format") == ENVIRON_FORMAT
        and _environment_ok(doc)
        and isinstance(doc.get("started_ns"), str)
        and doc["started_ns"].isdigit()
        and isinstance(doc.get("later", []), list)
        and all(
            isinstance(e, dict) and isinstance(e.get("session"), int) and _environment_ok(e)
            for e in doc.get("later", [])
        )
    )
    return doc if ok else None


def _passed_in(prev: Path) -> dict[tuple[str, str | None], int] | None:
    """The session each unit last passed in, from the earlier run's session log
    (None when it cannot be read: then no unit of a run with several
    environments is reused)."""
    # lazy: run.session._log is not loaded with this module; only _passed_in() needs it
    from crucible.run.session._log import read_events

    try:
        events = read_events(prev / "session.jsonl")
    except (OSError, CrucibleError):
        return None
    passed: dict[tuple[str, str | None], int] = {}
    for e in events:
        if e.get("event") == "task_finished" and e.get("status") == "passed":
            passed[(str(e.get("task")), e.get("key"))] = int(e.get("session", 0))
    return passed


def _environment_of(doc: Mapping[str, Any], session: int) -> Mapping[str, Any]:
    """The environment in force in ``session``: the last ``later`` entry that
    began at or before it, else the first session's."""
    chosen: Mapping[str, Any] = doc
    for entry in doc.get("later", ()):
        if entry["session"] <= session:
            chosen = entry
    return chosen


def import_previous(prev: Path, cache_dir: Path, *, warn: Warn) -> int:
    """Record every passed unit of the run in ``prev`` in the cache at
    ``cache_dir``, keyed as that run would have keyed it; returns how many."""
    # lazy: --reuse only (the keyer and the store stay off a plain run's start-up)
    from crucible.run.cache._keyer import Keyer
    from crucible.run.cache._store import TaskCache
    from crucible.run.cache._unit import cacheable
    from crucible.stage import StateDir, escape_key
    from crucible.stage.readers import loop_of

    doc = _read_environ(prev)
    if doc is None:
        warn(
            f"--reuse: {prev} records no environment (a run of an older engine, or "
            "its environ.json was lost): nothing of it is reused"
        )
        return 0
    try:
        plan = canon.loads((prev / "plan.json").read_bytes())
        prev_dir = StateDir(plan, prev)  # the earlier run's plan, checked
    except (OSError, CrucibleError, canon.CanonError) as exc:
        warn(f"--reuse: cannot read the earlier run's plan in {prev}: {exc}; nothing is reused")
        return 0
    if loop_of(prev_dir.view) is not None:  # its units are not keyed (cache.md)
        warn("--reuse: a plan with a [loop] is not keyed: nothing of the earlier run is reused")
        return 0
    # one keyer per environment a session of the earlier run had (index 0: the
    # first session's); a unit is keyed under the one it passed in
    environments = [doc, *doc.get("later", ())]
    keyers = [
        Keyer(
            plan,
            prev,
            plan_view=prev_dir.view,
            environ=env["environ"],
            agent_cmd=env["agent_cmd"],
            emit_cap=env["emit_cap"],
            programs_changed_after=int(doc["started_ns"]),
        )
        for env in environments
    ]
    passed_in = _passed_in(prev) if len(environments) > 1 else {}
    cache = TaskCache(cache_dir, warn=warn)
    layout = prev_dir.layout
    saved = 0
    facts: list[Any] = []
    failed: list[str] = []
    try:
        for task in prev_dir.view.model.tasks:
            if not cacheable(task):
                continue
            name = task.name
            for key, record in _passed_units(prev_dir, task):
                if len(keyers) == 1:
                    keyer = keyers[0]
                else:
                    session = None if passed_in is None else passed_in.get((name, key))
                    if session is None:
                        continue  # the session it passed in is unknown: it runs again
                    env = _environment_of(doc, session)
                    keyer = keyers[next(i for i, e in enumerate(environments) if e is env)]
                try:
                    ck = keyer.key(name, key)
                except CrucibleError:
                    continue  # staging refused it then: nothing to reuse
                kept = {k: v for k, v in record.items() if k not in ("cached", "cache_key")}
                files = layout.files_dir(name, key)
                try:
                    fact = cache.save(ck, kept, files, escape_key, defer=True)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    failed.append(f"{name if key is None else f'{name}[{key}]'} ({exc})")
                    continue  # that unit runs again
                if fact is not None:
                    facts.append(fact)
                saved += 1
        cache.append_facts(facts)  # one write and one fsync for all of them
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warn(f"--reuse: cannot record the earlier run's units: {exc}; they run again")
        saved = 0
    finally:
        with contextlib.suppress(OSError, CrucibleError):
            cache.close()
    if failed:
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        warn(f"--reuse: cannot reuse {failed[0]}{more}: they run again")
    return saved


def _passed_units(prev_dir: StateDir, task: Task) -> list[tuple[str | None, dict[str, Any]]]:
    """(instance key or None, record) of every passed unit of ``task`` in ``state``."""
    name = task.name
    out: list[tuple[str | None, dict[str, Any]]] = []
    with contextlib.suppress(CrucibleError, OSError):
        if not task.fans_out:
            record = prev_dir.load_result(name)
            if isinstance(record, dict) and record.get("status") == "passed":
                out.append((None, record))
            return out
        records = prev_dir.load_all(name)
        for key in records:
            rec = records[key]
            if isinstance(rec, dict) and rec.get("status") == "passed":
                out.append((key, rec))
    return out


def reuse_dir(state: Path) -> Path:
    """A temporary cache beside ``state`` (its filesystem: files are hard-linked).
    One a killed run left is removed first (the caller holds the state's lock:
    no other run of this state uses one)."""
    # lazy: shutil, tempfile cost start-up; only reuse_dir() needs it
    import shutil
    import tempfile

    prefix = f".{state.name}.reuse-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(state.parent):
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.fspath(state.parent)))
