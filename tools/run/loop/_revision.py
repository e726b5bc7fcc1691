"""The loop body as a DAG of its own, and the revision running through it.

A revision's body units are scheduled as any others (``-j`` applies), but
readied here rather than by the task graph: a body task is ready once every
body task it needs settled in the same revision (docs/spec/loop.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from crucible.run.loop._spec import revision_key

__all__ = ["PASSED", "SKIPPED", "BodyGraph", "Revision"]

PASSED, SKIPPED = "passed", "skipped"


class BodyGraph:
    """The body tasks in plan order, each one's body needs and body consumers."""

    def __init__(
        self, body: frozenset[str], order: Iterable[str], needs: Mapping[str, Sequence[str]]
    ) -> None:
        self.tasks = body
        self.order = [n for n in order if n in body]
        self.needs = {t: [n for n in needs[t] if n in body] for t in body}
        self.consumers: dict[str, list[str]] = {t: [] for t in body}
        for t in self.order:
            for n in self.needs[t]:
                self.consumers[n].append(t)


class Revision:
    """The running revision's bookkeeping: what each body task still waits for,
    how its units settled, how many are queued or deciding, and why it ends
    early. One object over the loop's life, begun again for each revision."""

    def __init__(self, body: BodyGraph) -> None:
        self.body = body
        #: the revision running now (None between revisions)
        self.n: int | None = None
        self.started = 0.0
        self.left: dict[str, int] = {}
        self.status: dict[str, str] = {}
        #: units queued or being decided that have not settled
        self.pending = 0
        #: why the revision fails early (a body task other than the score failed)
        self.abort: str | None = None
        #: the time budget stopped a unit of the running revision
        self.cut = False

    def begin(self, n: int) -> list[str]:
        """Revision ``n`` starts; returns the body tasks ready at once (counted
        pending before any can settle at once: a false condition)."""
        self.n = n
        self.started = time.monotonic()
        self.left = {t: len(self.body.needs[t]) for t in self.body.order}
        self.status = {}
        self.abort = None
        self.cut = False
        self.pending = 0
        roots = [t for t in self.body.order if self.left[t] == 0]
        self.pending += len(roots)
        return roots

    @property
    def key(self) -> str:
        """The running revision's instance key (``@rev<N>``)."""
        assert self.n is not None
        return revision_key(self.n)

    def settled(self, name: str, status: str) -> None:
        self.status[name] = status
        self.pending -= 1

    def wake(self, name: str) -> list[str]:
        """``name`` settled: the body consumers it was the last need of (counted
        pending before any can settle at once)."""
        woken = []
        for c in self.body.consumers[name]:
            self.left[c] -= 1
            if self.left[c] == 0:
                woken.append(c)
        self.pending += len(woken)
        return woken

    def failed_need(self, name: str) -> str | None:
        """The note of a body task that joins all and has a body need that did
        not pass in this revision, or None."""
        for n in self.body.needs[name]:
            if self.status.get(n) != PASSED:
                how = "was skipped" if self.status.get(n) == SKIPPED else "failed"
                return f"skipped: needs {n!r}, which {how}"
        return None

    def unsettled(self) -> int:
        """Body units of this revision that never settled (never queued)."""
        return len(self.body.tasks) - len(self.status)

    def duration_ms(self) -> int:
        return int((time.monotonic() - self.started) * 1000)
