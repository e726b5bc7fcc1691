"""``retry.when`` at run time (issue 32; docs/spec/run.md, "Control flow"): a
condition over the attempt that just failed, Argo's ``retryStrategy.expression``
over ``lastRetry``.

The policy's other rules (``limit``, ``on_exit``, ``on_timeout``, ``deadline``, a
failure that is not retryable) are asked first (:func:`crucible.run.engine._control.next_retry`);
only a retry they allow is put to the condition: the two combine as "and". The
condition is evaluated like ``when``, by the bounded evaluator of
:mod:`crucible.compile._bounded` (time, memory, signals), on the scheduling thread.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

from crucible.core.plan import Task
from crucible.run.engine._control import Retry, _starlark_type

__all__ = ["LAST_PRELUDE", "apply_retry_when", "last_attempt"]

#: binds ``last`` (a struct of the fields below) from the evaluator's data ``_d``
LAST_PRELUDE = 'last = struct(**_d["last"])\n'


def last_attempt(
    *,
    attempt: int,
    exit_code: int | None,
    timed_out: bool,
    duration: float | None,
    tail: str,
    lost: bool = False,
) -> dict[str, Any]:
    """What ``retry.when`` reads of the attempt that failed: ``exit_code`` (its
    exit status, None when a signal ended it or it has none), ``signal`` (the
    signal's name, ``"SIGKILL"``, or None), ``reason`` (``exit``, ``timeout``,
    ``signal``, ``result`` — the values of ``CRUCIBLE_LAST_REASON`` — or ``lost``
    when its worker was lost), ``duration_s``, ``stderr_tail`` (the last lines of
    its output, as its note shows them; ``""`` when none) and ``attempt`` (its
    number, from 1)."""
    sig: str | None = None
    if exit_code is not None and exit_code < 0:
        try:
            sig = signal.Signals(-exit_code).name
        except ValueError:
            sig = f"SIG{-exit_code}"
    if lost:
        reason = "lost"
    elif timed_out:
        reason = "timeout"
    elif sig is not None:
        reason = "signal"
    elif exit_code:
        reason = "exit"
    else:
        reason = "result"
    return {
        "exit_code": exit_code if exit_code is not None and exit_code >= 0 else None,
        "signal": sig,
        "reason": reason,
        "duration_s": None if duration is None else round(duration, 6),
        "stderr_tail": tail,
        "attempt": attempt,
    }


def apply_retry_when(
    task: Task,
    retry: Retry,
    last: Mapping[str, Any],
    *,
    cancelled: Callable[[], bool] | None = None,
) -> Retry:
    """``retry`` unless the task's ``retry.when`` turns it down: false gives no
    retry (``no retry: retry.when is false``), an evaluation error (a type error,
    a value that is not a boolean, past a bound) gives none either, with the
    error in the note. A stopping dispatcher (a signal) abandons the evaluation
    and keeps the retry: the unit stays unsettled and a resume runs it again."""
    policy = task.retry
    if retry.delay is None or policy is None or policy.when is None:
        return retry
    from crucible.compile import evaluate_expression  # only for a task with retry.when

    expression = policy.when
    done = evaluate_expression(expression, {"last": dict(last)}, LAST_PRELUDE, cancelled=cancelled)
    if done.kind == "cancelled":
        return retry
    if done.kind != "value":
        return Retry(None, f"no retry: retry.when error: {expression}: {done.message}")
    if not isinstance(done.value, bool):
        return Retry(
            None,
            f"no retry: retry.when error: {expression}: a condition must be true or false, "
            f"not {_starlark_type(done.value)}",
        )
    return retry if done.value else Retry(None, f"no retry: retry.when is false: {expression}")
