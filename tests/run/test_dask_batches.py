"""How the Dask executor groups submitted units into futures
(crucible.run.executors.dask._batches; docs/spec/run.md, "Executors"): as many batches as
the window has room for, each as large as the waiting units need to fill the
free places and at most its task's batch size, which halves after a batch of
the task handed units back and doubles after one that did not."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.run.executors.dask._batches import BATCH_MAX, Batches


def _unit(token: int, task: str = "t") -> tuple[int, tuple[Any, ...]]:
    return token, ("unit", task, str(token), 1, None)


def _send(batches: Batches) -> list[list[int]]:
    """take() and mark every batch sent; the tokens of each batch."""
    out: list[list[int]] = []
    for task, groups in batches.take().items():
        for group in groups:
            tokens = [t for t, _ in group]
            batches.sent(f"{task}-{tokens[0]}", task, tokens)
            out.append(tokens)
    return out


def test_waiting_units_fill_every_free_place_in_full_batches() -> None:
    batches = Batches(window=12)
    assert batches.room == 12 * BATCH_MAX
    for token in range(1, 97):
        batches.add(_unit(token))
    sent = _send(batches)
    assert [len(b) for b in sent] == [8] * 12
    assert [t for b in sent for t in b] == list(range(1, 97))  # submission order
    assert batches.in_flight == 12 and batches.room == 0 and not batches.pending


def test_few_units_go_one_per_future_so_no_free_place_stays_empty() -> None:
    batches = Batches(window=12)
    for token in range(1, 13):
        batches.add(_unit(token))
    assert [len(b) for b in _send(batches)] == [1] * 12
    batches = Batches(window=12)
    for token in range(1, 17):
        batches.add(_unit(token))
    assert [len(b) for b in _send(batches)] == [2] * 8  # ceil(16 / 12)


def test_a_batch_holds_its_place_until_its_last_unit_settles() -> None:
    batches = Batches(window=2)
    for token in range(1, 17):
        batches.add(_unit(token))
    first, _ = _send(batches)
    batches.add(_unit(17))
    assert batches.take() == {}  # the window is full: it waits
    assert batches.pending == [_unit(17)]
    for token in first[:-1]:
        batches.leave(token)
    assert batches.in_flight == 2 and batches.take() == {}
    batches.leave(first[-1])
    assert batches.in_flight == 1
    assert _send(batches) == [[17]]


def test_what_the_window_has_no_room_for_stays_pending_in_order() -> None:
    batches = Batches(window=1)
    for token in range(1, 21):
        batches.add(_unit(token))
    assert _send(batches) == [list(range(1, 9))]
    assert [t for t, _ in batches.pending] == list(range(9, 21))
    assert batches.drain() == list(range(9, 21))  # stopping: never sent
    assert batches.pending == []


def test_a_handback_halves_its_tasks_batches_and_short_tasks_double_them() -> None:
    batches = Batches(window=1)
    sizes: list[int] = []
    # each round: whether the batch handed back, and how long its first task ran
    rounds = [(True, 1.0), (True, 1.0), (True, 1.0), (False, 1.0), (False, 0.001), (False, 0.001)]
    for handed_back, ran in rounds:
        for token in range(100 * len(sizes) + 1, 100 * len(sizes) + 9):
            batches.add(_unit(token))
        (sent,) = _send(batches)
        sizes.append(len(sent))
        batches.leave(sent[0], ran=ran)
        for token in sent[1:]:  # the units behind the first: handed back or done
            batches.leave(token, handed_back=handed_back, ran=None if handed_back else ran)
        batches.drain()
    # a batch of one long task neither halves nor doubles: it says nothing new
    assert sizes == [8, 4, 2, 1, 1, 2]
    assert batches.size("t") == 4
    assert batches.size("other") == BATCH_MAX  # each task its own


def test_a_batch_holds_units_of_one_task_only() -> None:
    batches = Batches(window=4)
    for token in range(1, 9):
        batches.add(_unit(token, "a" if token % 2 else "b"))
    groups = batches.take()
    assert sorted(groups) == ["a", "b"]
    for task, sent in groups.items():
        assert all(request[1] == task for group in sent for _, request in group)
    assert sum(len(g) for sent in groups.values() for g in sent) == 8


def test_a_unit_sent_again_leaves_its_batch_and_waits_in_order() -> None:
    batches = Batches(window=1)
    for token in (1, 2, 3):
        batches.add(_unit(token))
    (sent,) = _send(batches)
    assert sent == [1, 2, 3]
    batches.add(_unit(4))
    batches.again(_unit(2))  # its future was cancelled before it ran
    batches.leave(1)
    batches.leave(3)
    assert batches.in_flight == 0  # 2 is no longer the batch's
    assert [t for t, _ in batches.pending] == [2, 4]


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(min_value=1, max_value=6),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.integers(1, 12)),
            st.tuples(st.just("settle"), st.booleans(), st.floats(0.0, 1.0)),
            st.tuples(st.just("again"), st.just(None), st.just(None)),
        ),
        max_size=40,
    ),
)
def test_every_unit_is_sent_once_within_the_window_and_in_order(
    window: int, steps: list[tuple[str, Any, Any]]
) -> None:
    """Whatever the sequence of submissions, flushes, settlements and resends:
    the window is never exceeded, a batch holds one task's units in token
    order, each submitted token is sent (again only after a resend) or still
    pending, and room never goes below zero."""
    batches = Batches(window=window)
    token = 0
    unsent: set[int] = set()
    in_flight: list[int] = []  # sent, not settled, in the order sent
    for kind, a, b in steps:
        if kind == "add":
            for _ in range(min(b, batches.room)):
                token += 1
                batches.add(_unit(token, a))
                unsent.add(token)
        elif kind == "settle" and in_flight:
            batches.leave(in_flight.pop(0), handed_back=a, ran=b)
        elif kind == "again" and in_flight:
            again = in_flight.pop()
            batches.again(_unit(again))
            unsent.add(again)
        assert batches.room >= 0
        for task, groups in batches.take().items():
            for group in groups:
                tokens = [t for t, _ in group]
                assert tokens == sorted(tokens)
                assert all(request[1] == task for _, request in group)
                assert 1 <= len(tokens) <= batches.size(task) <= BATCH_MAX
                assert set(tokens) <= unsent
                unsent -= set(tokens)
                batches.sent(f"{task}-{tokens[0]}-{token}", task, tokens)
                in_flight.extend(tokens)
        assert batches.in_flight <= window
        assert {t for t, _ in batches.pending} == unsent
