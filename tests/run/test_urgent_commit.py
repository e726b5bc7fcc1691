"""A batch a unit's start waits for is fsync'd within URGENT_COMMIT_WINDOW of the
previous fsync, not GROUP_COMMIT_WINDOW (docs/spec/run.md, "Session log"): the
group-commit window was the floor of every link of a chain."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._schedule import Schedule
from crucible.run.session import _log
from crucible.run.session._log import SessionLog
from crucible.run.session.events import SessionEvent


class _Gate:
    """What Schedule.settle hands the durability gate, recorded."""

    def __init__(self) -> None:
        self.deferred: list[tuple[Callable[[], None], bool]] = []

    def after_durable(self, fn: Callable[[], None], *, urgent: bool = True) -> None:
        self.deferred.append((fn, urgent))

    def release(self) -> None:
        for fn, _ in self.deferred:
            fn()
        self.deferred.clear()


def _schedule(waits_for: dict[str, tuple[str, ...]]) -> tuple[Schedule, _Gate, list[str]]:
    consumers: dict[str, list[str]] = {name: [] for name in waits_for}
    for name, deps in waits_for.items():
        for dep in deps:
            consumers[dep].append(name)
    graph = TaskGraph(
        tasks=dict.fromkeys(waits_for),  # type: ignore[arg-type]
        waits_for=waits_for,
        consumers={k: tuple(v) for k, v in consumers.items()},
        order=tuple(waits_for),
    )
    gate = _Gate()
    schedule = Schedule(graph, gate, None)  # type: ignore[arg-type]
    schedule.resume(None)
    readied: list[str] = []
    schedule.on_ready = readied.append
    return schedule, gate, readied


def test_a_settle_that_readies_a_consumer_is_urgent_and_one_that_does_not_is_not() -> None:
    schedule, gate, readied = _schedule({"a": (), "b": (), "c": ("a", "b"), "d": ()})
    schedule.settle("a", "passed")  # c still waits for b
    assert [u for _, u in gate.deferred] == [False]
    schedule.settle("b", "passed")  # in the same batch as a: c waits for nothing else
    assert [u for _, u in gate.deferred] == [False, True]
    schedule.settle("d", "passed")  # no consumer: nothing waits for its batch
    assert len(gate.deferred) == 2
    gate.release()
    assert readied == ["c"]


def test_the_urgency_follows_the_wakes_already_applied() -> None:
    schedule, gate, readied = _schedule({"a": (), "b": (), "c": ("a", "b")})
    schedule.settle("a", "passed")
    gate.release()  # a's batch durable: c waits for b alone
    schedule.settle("b", "passed")
    assert [u for _, u in gate.deferred] == [True]
    gate.release()
    assert readied == ["c"]


def test_a_settled_consumer_makes_nothing_urgent_and_a_listener_is_never() -> None:
    schedule, gate, _ = _schedule({"a": (), "b": ("a",)})
    schedule.status["b"] = "skipped"
    seen: list[str] = []
    schedule.on_settled = seen.append
    schedule.settle("a", "passed")
    assert [u for _, u in gate.deferred] == [False, False]
    gate.release()
    assert seen == ["a"]


def _event() -> SessionEvent:
    return SessionEvent("shutdown", {"exit_code": 0, "reason": "test"})


def test_an_urgent_batch_does_not_wait_for_the_group_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a group window of 60 s, a batch behind a fresh fsync would wait a
    minute; an urgent one that joins it goes at once, and takes the waiting
    one with it (batches stay in order)."""
    monkeypatch.setattr(_log, "GROUP_COMMIT_WINDOW", 60.0)
    monkeypatch.setattr(_log, "URGENT_COMMIT_WINDOW", 0.0)
    log = SessionLog(tmp_path / "session.jsonl", session=1)
    try:
        log.emit(_event())
        first = log.commit()
        deadline = time.monotonic() + 10
        while log.durable_seq < first and time.monotonic() < deadline:
            time.sleep(0.001)
        assert log.durable_seq == first  # the first fsync goes at once
        log.emit(_event())
        held = log.commit()  # waits for the window...
        time.sleep(0.05)
        assert log.durable_seq == first
        log.emit(_event())
        urgent = log.commit(urgent=True)  # ...until a batch someone waits for joins it
        deadline = time.monotonic() + 10
        while log.durable_seq < urgent and time.monotonic() < deadline:
            time.sleep(0.001)
        assert log.durable_seq == urgent > held
        assert len((tmp_path / "session.jsonl").read_bytes().splitlines()) == 3
    finally:
        log.close()  # its end joins the batch still waiting
