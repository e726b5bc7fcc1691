"""The reserved inputs revision / history / kept, written before each revision
(and once more when the loop stops, for the tasks after it and the epilogues).

The values are built and written by :mod:`crucible.run.loop._inputs`
(docs/spec/loop.md, "Reserved inputs"); this module is the engine's one call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.run.engine._host import LoopHost

__all__ = ["write"]


def write(d: LoopHost, n: int, revisions: list[dict[str, Any]]) -> None:
    """STATE/reserved/{revision,history,kept,meta}.json for revision ``n``, from
    loop.json's settled ``revisions``, atomically."""
    # lazy: run.loop._inputs is not loaded with this module; only write() needs it
    from crucible.run.loop import _inputs as loop_inputs

    # Atomic, not durable: derived from loop.json and rewritten before every
    # revision (a resume rewrites them too), and the scheduling thread never
    # waits for an fsync it can do without (8 of them per revision, measured).
    loop_inputs.reserve(d.layout, d.plan, n, revisions, durable=False)
