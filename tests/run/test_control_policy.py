"""crucible.run.engine._control's decisions as functions: the retry policy's delays and
limits, the deadline, tolerance, the last-attempt environment, condition errors."""

from __future__ import annotations

from typing import Any

import pytest

from crucible.core.plan import Task
from crucible.run.engine._control import (
    ConditionError,
    backoff_delay,
    evaluate,
    last_attempt_env,
    next_retry,
    tolerates,
)


def T(members: dict[str, Any]) -> Task:
    """A plan task with these members (the model applies the defaults)."""
    return Task.from_json({"name": "t", "kind": "command", **members}, "$.tasks[0]", 3)


def tol(task: dict[str, Any], *args: Any) -> bool:
    return tolerates(T(task), *args)


def retry(task: dict[str, Any], attempt: int, **kw: Any) -> float | None:
    args: dict[str, Any] = {
        "timed_out": False,
        "exit_code": 1,
        "retryable": True,
        "backoff": 0.5,
        "elapsed": 0.0,
    }
    args.update(kw)
    return next_retry(T(task), attempt, **args).delay


def test_retries_keep_the_old_backoff() -> None:
    task = {"retries": 3}
    assert [retry(task, n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, None]
    assert retry({"retries": 20}, 10) == 30.0  # capped
    assert retry(task, 1, retryable=False) is None


def test_retry_policy_delay_factor_and_cap() -> None:
    policy = {"limit": 4, "delay": 1, "factor": 3, "max_delay": 5, "on_timeout": True}
    task = {"retries": 0, "retry": policy}
    assert [retry(task, n) for n in (1, 2, 3, 4, 5)] == [1.0, 3.0, 5.0, 5.0, None]


def test_on_exit_and_on_timeout_filter() -> None:
    policy = {"limit": 2, "delay": 0, "factor": 2, "max_delay": 30, "on_timeout": False}
    task = {"retries": 0, "retry": {**policy, "on_exit": [75]}}
    assert retry(task, 1, exit_code=75) == 0.0
    assert retry(task, 1, exit_code=1) is None
    assert retry(task, 1, timed_out=True, exit_code=-15) is None
    on_timeout = {"retries": 0, "retry": {**policy, "on_timeout": True, "on_exit": [75]}}
    assert retry(on_timeout, 1, timed_out=True, exit_code=-15) == 0.0  # on_exit is for exits


def test_a_deadline_refuses_a_retry_that_would_start_after_it() -> None:
    task = {"retries": 5, "deadline": 2}
    assert retry(task, 1, elapsed=1.0) == 0.5
    decision = next_retry(
        T(task), 2, timed_out=False, exit_code=1, retryable=True, backoff=0.5, elapsed=1.5
    )
    assert decision.delay is None
    assert decision.why_not == "no retry: the deadline of 2 s is reached after 2 attempts"


def test_tolerance() -> None:
    assert tol({"on_failure": "continue"}, None)
    assert tol({"on_failure": "continue"}, -15, True)
    assert tol({"allow_exit": [3]}, 3) and not tol({"allow_exit": [3]}, 4)
    assert not tol({"allow_exit": [3]}, 3, True)  # a timeout is not an exit code
    assert not tol({}, 1)


@pytest.mark.parametrize(
    ("code", "timed_out", "reason"),
    [(3, False, "exit"), (-9, False, "signal"), (-15, True, "timeout"), (0, False, "result")],
)
def test_last_attempt_env(code: int, timed_out: bool, reason: str) -> None:
    env = last_attempt_env(code, timed_out)
    assert env == {"CRUCIBLE_LAST_EXIT": str(code), "CRUCIBLE_LAST_REASON": reason}


VALUES = {"params": {"a": [1]}, "inputs": {}, "needs": {"b": {"status": "failed"}}}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ('fail("no")', "fail: no"),
        ("params.a[5]", "out of bound"),
        ("params", "must be true or false, not dict"),
        ("needs.b.status + 1", "not supported"),
    ],
)
def test_condition_errors_name_the_problem(expression: str, message: str) -> None:
    with pytest.raises(ConditionError, match=message):
        evaluate(expression, VALUES, item=False, outcome=False)


def test_conditions_see_statuses_and_builtins() -> None:
    assert evaluate(
        "needs.b.status == 'failed' and len(params.a) == 1", VALUES, item=False, outcome=False
    )
    assert evaluate(
        'any([x == 2 for x in item.xs]) and getattr(item, "odd-key")',
        {**VALUES, "item": {"xs": [1, 2], "odd-key": True}},
        item=True,
        outcome=False,
    )


@pytest.mark.parametrize(
    ("policy", "attempt", "expected"),
    [
        # issue 27 item 6: OverflowError (34, 'Numerical result out of range') at attempt 21
        ({"delay": 0.5, "factor": 9007199254740991, "max_delay": 30}, 21, 30.0),
        ({"delay": 0.5, "factor": 9007199254740991, "max_delay": 30}, 1000, 30.0),
        # factor 10 with max_delay 1: after ~308 attempts
        ({"delay": 0.5, "factor": 10, "max_delay": 1}, 400, 1.0),
        ({"delay": 0.5, "factor": 10, "max_delay": 1}, 2, 1.0),
        ({"delay": 0.1, "factor": 2, "max_delay": 30}, 3, 0.4),
        ({"delay": 0, "factor": 9007199254740991, "max_delay": 30}, 1000, 0.0),
    ],
)
def test_backoff_never_overflows(policy: dict[str, Any], attempt: int, expected: float) -> None:
    task = {"retry": {"limit": 1000, "on_timeout": True, **policy}}
    assert retry(task, attempt) == pytest.approx(expected)


def test_backoff_delay_is_min_of_cap_and_growth() -> None:
    assert backoff_delay(1.0, 3.0, 2, 100.0) == 9.0
    assert backoff_delay(1.0, 3.0, 5, 100.0) == 100.0
    assert backoff_delay(50.0, 1.0, 10**6, 30.0) == 30.0
