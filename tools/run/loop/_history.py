"""The scored loop's settled revisions and what they decided, as ``STATE/loop.json``
holds them (docs/spec/loop.md, "State"): read on a resume, a revision added as
it is judged, written atomically.

Keeping the best is bookkeeping here: a revision whose entry says ``kept``
becomes the kept revision and its score the best so far; any other counts
towards patience. Judging a revision is :mod:`crucible.run.loop._scoring`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import atomic, canon
from crucible.core.errors import InputRefused, ParseError
from crucible.run.loop._spec import LoopSpec

__all__ = ["LOOP_FORMAT", "LoopHistory"]

LOOP_FORMAT = "crucible.loop/1"


class LoopHistory:
    """The settled revisions of one loop, the one kept and whether (and why)
    the loop stopped."""

    def __init__(self, path: Path, spec: LoopSpec) -> None:
        self.path = path
        self.spec = spec
        #: settled revisions, as loop.json lists them
        self.revisions: list[dict[str, Any]] = []
        self.kept: int | None = None
        self.best: Any = None
        #: revisions in a row without an improvement (failed ones count)
        self.stale = 0
        self.stop_reason: str | None = None
        self.finished = False

    def load(self) -> None:
        """A resume continues from loop.json's settled revisions (none without one)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        where = str(self.path)
        try:
            doc = canon.loads(data)
        except canon.CanonError as exc:
            raise ParseError(f"not a loop state file: {exc.message}", where=where) from None
        revisions = doc.get("revisions") if isinstance(doc, dict) else None
        if not isinstance(revisions, list) or not all(isinstance(r, dict) for r in revisions):
            raise InputRefused("not a loop state file: no revisions list", where=where)
        for i, r in enumerate(revisions):
            if r.get("revision") != i + 1:
                raise InputRefused(
                    f"revision {i + 1} is out of order", where=f"{where}:$.revisions[{i}]"
                )
            self._account(r)
        self.revisions = revisions
        if doc.get("finished") is True:
            self.finished = True
            self.stop_reason = doc.get("stop_reason")

    def duration_s(self) -> float:
        """The loop time the settled revisions took (earlier sessions' share of
        the time budget, read at a resume)."""
        return sum(int(r.get("duration_ms", 0)) for r in self.revisions) / 1000

    def add(self, entry: dict[str, Any]) -> None:
        """A revision judged (crucible.run.loop._scoring.judge): listed, and kept
        when it says so."""
        self.revisions.append(entry)
        self._account(entry)

    def _account(self, r: dict[str, Any]) -> None:
        if r.get("kept") is True:
            self.kept, self.best, self.stale = r["revision"], r.get("score"), 0
        else:
            self.stale += 1

    def _doc(self) -> dict[str, Any]:
        return {
            "format": LOOP_FORMAT,
            "direction": self.spec.direction,
            "metric": self.spec.metric,
            "max_revisions": self.spec.max_revisions,
            "revisions": self.revisions,
            "kept_revision": self.kept,
            "best_score": self.best,
            "stop_reason": self.stop_reason,
            "finished": self.finished,
        }

    def write(self, *, durable: bool = False) -> None:
        """Atomic always, durable only when asked: a revision's entry lost to a
        crash only reruns that revision on resume. The write that says the loop
        finished is made durable first (crucible.run.loop._writes.LoopWriter)."""
        atomic.write_bytes(self.path, canon.dumps(self._doc()), durable=durable)
