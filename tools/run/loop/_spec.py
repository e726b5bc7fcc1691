"""The scored loop of an IR v3 plan (docs/spec/loop.md): what it is, read once.

:meth:`LoopSpec.from_plan` reads the plan's ``loop`` member (compile checked it;
dispatch re-checks the few things it relies on, so a hand-edited plan is named
rather than run wrongly) and :meth:`LoopSpec.phases` splits the tasks into the
ones before the loop, the body and the ones after it.

Revision units carry the instance key ``@rev<N>``: no fan-out key can start
with ``@`` (the dispatcher reserves the prefix), so a revision never collides
with an instance.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from crucible.core.errors import InputRefused
from crucible.core.plan import Plan, in_plan
from crucible.core.structs import dataclass

__all__ = ["REV_PREFIX", "LoopSpec", "Phases", "revision_key", "revision_of"]

#: the instance key prefix of a revision unit (``@rev1``, ``@rev2``, ...)
REV_PREFIX = "@rev"
MAX_REVISIONS_CAP = 10000


def revision_key(n: int) -> str:
    return f"{REV_PREFIX}{n}"


def revision_of(key: str | None) -> int | None:
    """N for a key ``@rev<N>`` (N >= 1, no leading zero), else None."""
    if key is None or not key.startswith(REV_PREFIX):
        return None
    digits = key[len(REV_PREFIX) :]
    if not digits.isdigit() or not digits.isascii() or digits.startswith("0"):
        return None
    return int(digits)


@dataclass(frozen=True)
class Phases:
    """The tasks around the loop, by name."""

    #: ancestors of a body task that are not in the body: run once, before revision 1
    before: frozenset[str]
    #: tasks that (transitively) need a body task: run once, after the loop stopped
    after: frozenset[str]


@dataclass(frozen=True)
class LoopSpec:
    body: tuple[str, ...]
    score: str
    metric: str
    direction: str
    max_revisions: int
    min_delta: float
    history_bytes: int
    target: float | None = None
    patience: int | None = None
    time_budget: float | None = None

    @classmethod
    def from_plan(cls, plan: Plan) -> LoopSpec | None:
        """The plan's loop, or None for a plan without one. The model read its
        members and their defaults (crucible.core.plan.Loop); this checks what
        the run relies on across them."""
        loop = plan.loop
        if loop is None:
            return None
        where = in_plan("$.loop")
        for b in loop.body:
            if b not in plan.by_name:
                raise InputRefused(f"body task {b!r} is not in the plan", where=f"{where}.body")
        if loop.score not in loop.body:
            raise InputRefused(f"score {loop.score!r} is not a body task", where=f"{where}.score")
        if not 1 <= loop.max_revisions <= MAX_REVISIONS_CAP:
            raise InputRefused(
                f"max_revisions must be an integer from 1 to {MAX_REVISIONS_CAP}",
                where=f"{where}.max_revisions",
            )
        if loop.patience is not None and loop.patience < 1:
            raise InputRefused("patience must be a positive integer", where=f"{where}.patience")
        return cls(
            body=tuple(sorted(loop.body)),
            score=loop.score,
            metric=loop.metric,
            direction=loop.direction,
            max_revisions=loop.max_revisions,
            min_delta=float(_number(loop.min_delta, f"{where}.min_delta", 0.0)),
            history_bytes=loop.history_bytes,
            target=loop.target,
            patience=loop.patience,
            time_budget=None
            if loop.time_budget is None
            else _number(loop.time_budget, f"{where}.time_budget", 0.0, strict=True),
        )

    def phases(self, needs: Mapping[str, Sequence[str]]) -> Phases:
        """Before and after sets over ``needs`` (task -> the tasks it needs)."""
        body = set(self.body)
        consumers: dict[str, list[str]] = {n: [] for n in needs}
        for n, deps in needs.items():
            for d in deps:
                consumers[d].append(n)
        return Phases(before=_reach(body, needs), after=_reach(body, consumers))

    def better(self, score: float, kept: float | None) -> bool:
        """Is ``score`` an improvement on the kept score (by more than min_delta,
        or strictly better with min_delta 0)?"""
        if kept is None:
            return True
        gain = score - kept if self.direction == "max" else kept - score
        # 0.6 - 0.5 is 0.0999…98 in binary floating point: a gain that equals
        # min_delta up to rounding counts as reaching it
        slack = 1e-12 * max(1.0, abs(score), abs(kept))
        return gain > 0 and gain + slack >= self.min_delta

    def reached(self, score: float) -> bool:
        """Has ``score`` reached the target (>= for max, <= for min)?"""
        if self.target is None:
            return False
        return score >= self.target if self.direction == "max" else score <= self.target


def _number(value: Any, where: str, low: float | None = None, *, strict: bool = False) -> float:
    if type(value) not in (int, float):
        raise InputRefused("must be a number", where=where)
    if low is not None and (value <= low if strict else value < low):
        raise InputRefused(f"must be {'>' if strict else '>='} {low:g}", where=where)
    return value  # type: ignore[no-any-return]


def _reach(body: set[str], edges: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """The tasks outside ``body`` reached from it along ``edges`` (needs: the
    ancestors; consumers: the descendants), walking no further through the body."""
    seen: set[str] = set()
    todo = deque(n for b in body for n in edges[b] if n not in body)
    while todo:
        n = todo.popleft()
        if n in seen or n in body:
            continue
        seen.add(n)
        todo.extend(edges[n])
    return frozenset(seen)
