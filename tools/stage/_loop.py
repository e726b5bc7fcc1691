"""The scored loop as stage sees it: revision keys, the reserved-inputs metadata,
and the kept revision's captured files (docs/spec/inputs.md, "Reserved inputs
of the scored loop").

A body task's unit in revision N has the instance key ``@rev<N>`` (the ``@``
cannot start a fan-out key the dispatcher forms, so it cannot collide). Stage
accepts such a key only for a task in the plan's ``loop.body``, and within one
revision a body task reads its body producers at the same key. A task after
the loop reads a body producer at the kept revision's key. The loop's engine
writes ``STATE/reserved/{revision,history,kept}.json`` and ``meta.json``
(crucible.run.loop._inputs); stage reads them here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import InputRefused, OperationalError, ParseError
from crucible.core.fdio import read_file
from crucible.stage._layout import StateLayout
from crucible.stage._names import escape_key
from crucible.stage._plan import PlanView
from crucible.stage._share import SHARED_ROOT, Unit

__all__ = [
    "KEPT_DIR",
    "META_FORMAT",
    "META_NAME",
    "REVISION_PREFIX",
    "LoopView",
    "kept_revision",
    "kept_units",
    "loop_of",
    "producer_key",
    "read_meta",
    "read_reserved",
    "revision_key",
    "revision_of",
    "revision_unit",
]

REVISION_PREFIX = "@rev"
#: the kept revision's captured files, under a consumer's inputs/ (a task name
#: never starts with "@", so this cannot collide with inputs/<producer>/)
KEPT_DIR = "@kept"
META_NAME = "meta.json"
META_FORMAT = "crucible.reserved-meta/1"
#: revisions are counted from 1, written without leading zeros: one spelling each
_REVISION_RE = re.compile(r"@rev([1-9][0-9]{0,15})")


def revision_key(revision: int) -> str:
    """The instance key of revision ``revision`` (1, 2, …): ``@rev<N>``."""
    if type(revision) is not int or revision < 1:
        raise ValueError(f"a revision is an integer >= 1, not {revision!r}")
    return f"{REVISION_PREFIX}{revision}"


def revision_of(key: object) -> int | None:
    """N for the key ``@rev<N>``; None for any other key (or none)."""
    if not isinstance(key, str):
        return None
    m = _REVISION_RE.fullmatch(key)
    return int(m.group(1)) if m else None


class LoopView:
    """The loop member of a plan: which tasks are the body, and which come after."""

    def __init__(self, pv: PlanView, body: frozenset[str]) -> None:
        self.body = body
        # after: every task downstream of the body, found in one pass over the
        # edges (not an ancestor walk per task: 10,000-task plans)
        children: dict[str, list[str]] = {}
        for t in pv.tasks.values():
            for n in t.needs:
                children.setdefault(n, []).append(t.name)
        after: set[str] = set()
        stack = [c for b in body for c in children.get(b, ())]
        while stack:
            n = stack.pop()
            if n not in after and n not in body:
                after.add(n)
                stack.extend(children.get(n, ()))
        self.after = frozenset(after)

    def sees_reserved(self, pv: PlanView, task: str) -> bool:
        """The loop's reserved inputs reach its body, the tasks after it and the
        epilogues; never a task before the loop or beside it (which may run
        while the loop writes them)."""
        return task in self.body or task in self.after or pv.tasks[task].epilogue


def loop_of(pv: PlanView) -> LoopView | None:
    """The plan's loop (IR v3 with a ``loop`` member), or None; worked out once
    per view (kept in its memo). The model checked its shape
    (crucible.core.plan.Plan.loop); a body task the plan lacks is refused here."""
    if "loop" in pv.memo:
        lv: LoopView | None = pv.memo["loop"]
        return lv
    lv = None
    loop = pv.model.loop if pv.version >= 3 else None
    if loop is not None:
        for b in loop.body:
            pv.task(b)  # an unknown name is a plan error
        lv = LoopView(pv, frozenset(loop.body))
    pv.memo["loop"] = lv
    return lv


def _read_json(path: Path) -> Any:
    try:
        data = read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    try:
        return canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None


def read_meta(state: Path) -> dict[str, Any]:
    """``STATE/reserved/meta.json`` (schema reserved-meta.json), or {} without one."""
    path = StateLayout(state).reserved_root / META_NAME
    doc = _read_json(path)
    if doc is None:
        return {}
    if not isinstance(doc, dict) or doc.get("format") != META_FORMAT:
        raise InputRefused(f"not a {META_FORMAT} document", where=f"{path}:$.format")
    hist = doc.get("history")
    if hist is not None:
        dropped = hist.get("dropped") if isinstance(hist, dict) else None
        if type(dropped) is not int or dropped < 0:
            raise InputRefused(
                "history.dropped must be an integer >= 0", where=f"{path}:$.history.dropped"
            )
    return doc


def kept_revision(kept: Any) -> int | None:
    """The revision a ``kept`` value names, or None (null, or not a loop's value)."""
    if not isinstance(kept, dict):
        return None
    rev = kept.get("revision")
    return rev if type(rev) is int and rev >= 1 else None


def revision_unit(state: Path, task: str, key: str, staged: str) -> Unit:
    """The captured files of ``task`` in the revision of ``key``, staged at
    ``inputs/<staged>/``. Its published copy is the instance's,
    ``STATE/shared/<task>/<escaped key>``, whoever it is staged for."""
    layout = StateLayout(state)
    return Unit(
        store=layout.files_dir(task, key),  # checks the name
        record=layout.result_path(task, key),
        key=key,
        root=state / SHARED_ROOT / task / escape_key(key),
        label=f"{task}[{key}]",
        staged=staged,
    )


def kept_units(pv: PlanView, state: Path, kept: Any) -> list[Unit]:
    """The kept revision's captured files of each task named in
    ``kept.outputs`` that declares emits_files and has a store, in name order;
    each is staged at ``inputs/@kept/<task>/``."""
    rev = kept_revision(kept)
    outputs = kept.get("outputs") if isinstance(kept, dict) else None
    if rev is None or not isinstance(outputs, dict):
        return []
    key = revision_key(rev)
    units = []
    for task in sorted(outputs):
        t = pv.tasks.get(task)
        if t is None or not t.emits_files or t.map is not None:
            continue
        unit = revision_unit(state, task, key, f"{KEPT_DIR}/{task}")
        if unit.store.is_dir():
            units.append(unit)
    return units


def read_reserved(state: Path, name: str) -> Any:
    """``STATE/reserved/<name>.json``'s value, or None without one."""
    return _read_json(StateLayout(state).reserved_path(name))


def producer_key(
    pv: PlanView, state: Path, consumer: str, key: str | None, producer: str
) -> str | None:
    """The instance key at which ``consumer`` (instance ``key``) reads
    ``producer``: a body producer is read in the consumer's own revision by a
    body task, and at the kept revision by a task after the loop (from
    ``STATE/reserved/kept.json``; without one, or without that revision's
    record, its plain record). Anything else: None, the plain record."""
    lv = loop_of(pv)
    if lv is None or producer not in lv.body:
        return None
    if consumer in lv.body:
        return key if revision_of(key) is not None else None
    rev = kept_revision(read_reserved(state, "kept"))
    if rev is None:
        return None
    kept = revision_key(rev)
    # a state without that revision's record (the body run as a plain DAG, as a
    # driver that simulates the loop does) keeps the plain record
    from crucible.stage._store import load_keyed

    return kept if kept in load_keyed(state, producer) else None
