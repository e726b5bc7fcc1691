"""The bounded expression evaluator (crucible.compile._bounded; manifest.md,
"Bounded evaluation"): time, memory and cancellation never reach the caller."""

from __future__ import annotations

import time

import pytest

from crucible.compile._bounded import MAX_EVAL_MEMORY, evaluate_expression

LOOP = "len([1 for a in range(100000) for b in range(100000) if False]) == 0"


def test_a_value_comes_back_as_json() -> None:
    done = evaluate_expression(
        "params.x + [1]", {"params": {"x": [0]}}, "params = struct(**_d['params'])"
    )
    assert (done.kind, done.value) == ("value", [0, 1])


def test_a_loop_is_stopped_at_the_deadline() -> None:
    done = evaluate_expression(LOOP, {}, timeout=0.2)
    assert done.kind == "timeout"
    assert done.message == "evaluation took longer than 0.2 s and was stopped"


def test_a_huge_allocation_ends_the_child_not_the_caller() -> None:
    done = evaluate_expression('len("x" * 2000000000) > 0', {})
    assert done.kind == "memory"
    assert f"more than {MAX_EVAL_MEMORY >> 20} MiB" in done.message
    # the next expression gets a fresh child
    assert evaluate_expression("1 + 1 == 2", {}).value is True


def test_cancelled_abandons_the_evaluation() -> None:
    started = time.monotonic()
    calls: list[float] = []

    def cancelled() -> bool:
        calls.append(time.monotonic())
        return len(calls) > 3

    done = evaluate_expression(LOOP, {}, timeout=60, cancelled=cancelled)
    assert done.kind == "cancelled"
    assert time.monotonic() - started < 30  # long before the deadline
    assert evaluate_expression("True", {}).value is True


def test_errors_and_non_json_values_are_one_line() -> None:
    assert evaluate_expression("nope", {}).kind == "error"
    done = evaluate_expression("1 == 1", {}, "x = _d['missing']")
    assert done.kind == "prelude" and "missing" in done.message
    done = evaluate_expression("lambda: 1", {})
    assert done.kind == "error" and "not JSON" in done.message


def test_an_exception_mid_wait_never_leaves_a_stale_reply() -> None:
    asked: list[int] = []

    def interrupt_once_sent() -> bool:
        asked.append(1)
        if len(asked) > 1:  # the first ask is before the request is sent
            raise KeyboardInterrupt
        return False

    evaluate_expression("1", {})  # a child is up
    with pytest.raises(KeyboardInterrupt):
        evaluate_expression(LOOP, {}, cancelled=interrupt_once_sent)
    assert evaluate_expression("3", {}).value == 3
