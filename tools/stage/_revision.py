"""Revision units of a scored loop (docs/spec/loop.md, "State").

A body task's unit in revision N has the instance key ``@rev<N>`` (an ``@``
cannot start a fan-out key). Inside revision N a body task reads its body
producers' revision-N records and files; a task outside the body (after the
loop, an epilogue) reads the kept revision's, named by ``STATE/loop.json``.
Only these lookups know about revisions; the rest of stage sees an instance key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "REV_PREFIX",
    "is_revision",
    "kept_revision",
    "loop_outcome",
    "producer_key",
    "revision_units",
]

REV_PREFIX = "@rev"


def is_revision(key: str | None) -> bool:
    if key is None or not key.startswith(REV_PREFIX):
        return False
    digits = key[len(REV_PREFIX) :]
    return digits.isascii() and digits.isdigit() and not digits.startswith("0")


def _loop_doc(state: Path) -> dict[str, Any]:
    try:
        with open(Path(state) / "loop.json", "rb") as f:
            doc = orjson.loads(f.read())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def kept_revision(state: Path) -> int | None:
    """The kept revision of the loop (None: none kept, or no loop.json)."""
    kept = _loop_doc(state).get("kept_revision")
    return kept if type(kept) is int and kept >= 1 else None


def producer_key(
    body: frozenset[str], state: Path, consumer_key: str | None, producer: str
) -> str | None:
    """The key of ``producer``'s unit that the consumer unit reads: None for a
    producer outside the loop body; the consumer's own revision inside it; else
    the kept revision (None when nothing was kept: the plain record then)."""
    if producer not in body:
        return None
    if is_revision(consumer_key):
        return consumer_key
    kept = kept_revision(state)
    return None if kept is None else f"{REV_PREFIX}{kept}"


def loop_body(plan: Any) -> frozenset[str]:
    loop = plan.get("loop") if isinstance(plan, dict) else None
    body = loop.get("body") if isinstance(loop, dict) else None
    if not isinstance(body, list):
        return frozenset()
    return frozenset(b for b in body if isinstance(b, str))


def revision_units(
    state: Path, task: str, consumer_key: str | None, body: frozenset[str]
) -> list[Any]:
    """The one revision unit of body task ``task`` whose captured files the
    consumer is handed, staged as ``inputs/<task>/`` like an unmapped producer's."""
    from crucible.stage._names import escape_key
    from crucible.stage._share import SHARED_ROOT, Unit

    key = producer_key(body, state, consumer_key, task)
    if key is None:
        return []
    esc = escape_key(key)
    store = Path(state) / "files" / task / esc
    if not store.is_dir():
        return []
    return [
        Unit(
            store,
            Path(state) / "results" / task / f"{esc}.json",
            Path(state) / SHARED_ROOT / task / esc,
            f"{task}[{esc}]",
            task,
        )
    ]


def loop_outcome(state: Path) -> dict[str, Any]:
    """``outcome.loop``: how the loop ended, from ``STATE/loop.json``."""
    doc = _loop_doc(state)
    revisions = doc.get("revisions")
    return {
        "stop_reason": doc.get("stop_reason"),
        "revisions": len(revisions) if isinstance(revisions, list) else 0,
        "kept_revision": doc.get("kept_revision"),
        "best_score": doc.get("best_score"),
    }
