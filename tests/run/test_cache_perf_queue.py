"""The hit path looks each ready unit up once (crucible.run.cache._hits.ReadyQueue):
units that missed and wait for a worker are not looked up again on every turn
of the dispatcher's loop (a wide fan-out would be quadratic), and the queue
keeps its order."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from crucible.run.cache._hits import CacheHits, ReadyQueue


class _U:
    def __init__(self, name: str) -> None:
        self.name, self.key, self.attempt = name, None, 1

    def __repr__(self) -> str:
        return self.name


def _hits(hit: set[str], looked: list[str]) -> CacheHits:
    hits = CacheHits.__new__(CacheHits)  # no cache directory: the lookup is faked

    def look_up(unit: Any) -> dict[str, Any] | None:
        looked.append(unit.name)
        return {"kind": "cached"} if unit.name in hit else None

    hits._look_up = look_up  # type: ignore[method-assign]
    hits.cache = SimpleNamespace(keyer=SimpleNamespace(steady=contextlib.nullcontext))  # type: ignore[assignment]
    return hits


def test_each_unit_is_looked_up_once_and_order_is_kept() -> None:
    looked: list[str] = []
    hits = _hits({"h1", "h2", "c1"}, looked)
    ready = ReadyQueue()
    for n in ("m1", "h1", "m2", "h2", "m3"):
        ready.append(_U(n))

    def settle(unit: Any, reply: dict[str, Any]) -> None:
        if unit.name == "h1":  # its consumers become ready while the pass runs
            ready.append(_U("c1"))
            ready.append(_U("c2"))

    assert hits.take(ready, settle) == 3
    assert [u.name for u in ready] == ["m1", "m2", "m3", "c2"]
    assert looked == ["m1", "h1", "m2", "h2", "m3", "c1", "c2"]
    # turns of the loop: a worker takes one, nothing new, then one more arrives
    assert ready.popleft().name == "m1"
    for _ in range(100):
        hits.take(ready, settle)
    ready.append(_U("m4"))
    hits.take(ready, settle)
    assert looked.count("m2") == 1 and looked[-1] == "m4"
    assert [u.name for u in ready] == ["m2", "m3", "c2", "m4"]
    ready.clear()
    assert ready.fresh == 0 and hits.take(ready, settle) == 0
