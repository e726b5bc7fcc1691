"""The reserved inputs revision / history / kept, written before each revision.

The values are built by :mod:`crucible.run.loop_inputs` (docs/spec/loop.md,
"Reserved inputs") when it is there; this module only gathers what they are
built from and falls back to the contract's plain form without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crucible.core import atomic, canon
from crucible.run.loop_spec import LoopSpec, revision_key

if TYPE_CHECKING:
    from crucible.run.engine import Dispatcher

__all__ = ["write"]


def _kept_outputs(d: Dispatcher, spec: LoopSpec, kept: int) -> dict[str, Any]:
    outputs: dict[str, Any] = {}
    for t in spec.body:
        rec = d.stage.load_result(d.state, t, revision_key(kept))
        output = rec.get("output") if rec is not None else None
        emits = d.graph.tasks[t].get("emits", {})
        outputs[t] = {
            f: output[f] for f in sorted(emits) if isinstance(output, dict) and f in output
        }
    return outputs


def _history(revisions: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """Newest last, within ``budget`` bytes of canonical JSON, oldest dropped first."""
    records = [
        {k: r.get(k) for k in ("revision", "score", "verdict", "note", "kept", "fields")}
        for r in revisions
    ]
    size = len(canon.dumps(records))
    dropped = 0
    while records and size > budget:
        size -= len(canon.dumps(records[0])) + (1 if len(records) > 1 else 0)
        records.pop(0)
        dropped += 1
    return records, dropped


def write(
    d: Dispatcher, spec: LoopSpec, n: int, revisions: list[dict[str, Any]], kept: int | None
) -> None:
    """STATE/reserved/{revision,history,kept}.json for revision ``n``, atomically."""
    kept_entry = None
    if kept is not None:
        score = next(r.get("score") for r in revisions if r["revision"] == kept)
        kept_entry = {"revision": kept, "score": score, "outputs": _kept_outputs(d, spec, kept)}
    try:
        from crucible.run import loop_inputs  # type: ignore[attr-defined]
    except ImportError:
        loop_inputs = None
    if loop_inputs is not None:  # pragma: no cover - once the stage side has landed
        history, _dropped = loop_inputs.history_value(revisions, spec.history_bytes)
        loop_inputs.write_reserved(d.layout, n, history, kept_entry)
        return
    history, _dropped = _history(revisions, spec.history_bytes)
    root = d.layout.reserved_root
    root.mkdir(exist_ok=True)
    for name, value in (("revision", n), ("history", history), ("kept", kept_entry)):
        atomic.write_bytes(root / f"{name}.json", canon.dumps(value))
