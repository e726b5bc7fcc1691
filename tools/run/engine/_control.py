"""Control flow at run time (docs/spec/run.md, "Control flow"): conditions,
tolerated failures, the retry policy and the run's status.

The dispatcher's scheduling thread calls in here at three points: when a unit
is about to be queued (:meth:`Control.decide`: does its ``when`` hold?), when an
attempt failed (:func:`next_retry`: another attempt, after how long?), and when a
unit settled failed (:func:`tolerates`: does the run ignore it?). Nothing here
runs a process or touches a file except the records it marks tolerated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.core.structs import dataclass

if TYPE_CHECKING:  # built by the run (crucible.run.session._runner)
    from crucible.stage import StateDir

from crucible.core.plan import Plan, Task
from crucible.core.refs import RefMissing

__all__ = [
    "NO_ITEM",
    "ConditionCancelled",
    "ConditionError",
    "Control",
    "Retry",
    "amend_record",
    "backoff_delay",
    "evaluate",
    "fold_verdict",
    "last_attempt_env",
    "mark_tolerated",
    "next_retry",
    "run_status",
    "tolerates",
    "tolerates_fold",
]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
#: the simple ``retries`` form keeps today's backoff: options.backoff × 2^(n−1), capped
BACKOFF_MAX = 30.0
#: a non-mapped unit has no item (``None`` is a valid item)
NO_ITEM: Any = object()

# Builds the names a condition reads from the JSON document ``_d`` (bound by the
# bounded evaluator): struct() gives the fixed dotted spelling (params.x,
# needs.t.status); values below stay Starlark dicts and lists.
_PRELUDE = """
params = struct(**_d["params"])
inputs = struct(**_d["inputs"])
needs = struct(**{k: struct(**v) for k, v in _d["needs"].items()})
"""
_PRELUDE_ITEM = """
item = struct(**_d["item"]) if type(_d["item"]) == "dict" else _d["item"]
"""
_PRELUDE_OUTCOME = """
outcome = struct(**_d["outcome"])
"""


class ConditionError(Exception):
    """A condition that could not be evaluated (a type error, a missing attribute,
    a non-boolean value, past its time or memory bound): the unit fails with it,
    never silently false."""


class ConditionCancelled(Exception):
    """The evaluation was stopped because the dispatcher is stopping (a signal):
    the condition is undecided."""


def evaluate(
    expression: str,
    values: Mapping[str, Any],
    *,
    item: bool,
    outcome: bool,
    cancelled: Callable[[], bool] | None = None,
) -> bool:
    """Evaluate ``expression`` over ``values`` (params, inputs, needs[, item][, outcome])
    within the bounds of crucible.compile._bounded (time, memory, signals)."""
    # lazy: compile._bounded is not loaded with this module; only evaluate() needs it
    from crucible.compile import evaluate_expression

    prelude = _PRELUDE + (_PRELUDE_ITEM if item else "") + (_PRELUDE_OUTCOME if outcome else "")
    done = evaluate_expression(expression, values, prelude, cancelled=cancelled)
    if done.kind == "cancelled":
        raise ConditionCancelled(done.message)
    if done.kind == "prelude":  # a value struct() cannot hold (an empty key)
        raise ConditionError(f"cannot build its names: {done.message}")
    if done.kind != "value":
        raise ConditionError(done.message)
    if not isinstance(done.value, bool):
        raise ConditionError(f"a condition must be true or false, not {_starlark_type(done.value)}")
    return done.value


def _starlark_type(value: object) -> str:
    """The Starlark name of a JSON value's type (what the condition's author wrote)."""
    if value is None:
        return "NoneType"
    return {dict: "dict", list: "list", str: "string", int: "int", float: "float"}.get(
        type(value), type(value).__name__
    )


class Control:
    """Decides conditions for one run; holds what they read that does not change."""

    def __init__(
        self,
        plan: Plan,
        state_dir: StateDir,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.plan = plan
        #: the dispatcher is stopping (a signal): a running evaluation is abandoned
        self.cancelled = cancelled
        self.state_dir = state_dir
        self._params: dict[str, Any] | None = None
        self._mapped = {t.name for t in plan.tasks if t.fans_out}
        #: a task's input values, read once: its producers settled before it was
        #: ready, so every instance of a mapped task sees the same ones
        self._input_values: dict[str, dict[str, Any]] = {}
        #: a mapped task's instance counts by status, once it settled
        self._counts: dict[str, dict[str, int]] = {}

    def params(self) -> dict[str, Any]:
        if self._params is None:
            # lazy: not loaded with this module; only params() needs it
            import orjson

            # Admission wrote the resolved params before anything ran.
            path = self.state_dir.layout.params_path
            self._params = dict(orjson.loads(Path(path).read_bytes()))
        return self._params

    def _params_of(self, task: Task) -> dict[str, Any]:
        """The params a condition is offered: the task's ``params`` (all when it
        lists none; compile refuses a when naming another)."""
        listed = task.params
        params = self.params()
        return params if listed is None else {k: params[k] for k in listed if k in params}

    def _inputs_of(self, task: Task) -> dict[str, Any]:
        values = self._input_values.get(task.name)
        if values is None:
            values = self._input_values[task.name] = self._inputs(task)
        return values

    def _inputs(self, task: Task) -> dict[str, Any]:
        """Each declared input's value: the producer's field, or for a mapped
        producer an object instance key → value; null when the producer left none."""
        out: dict[str, Any] = {}
        for name, spec in task.inputs.items():
            producer, field = spec.producer, spec.field
            record = self.state_dir.load_result(producer)
            if producer not in self._mapped:
                output = record.get("output") if record else None
                value = output.get(field) if isinstance(output, dict) else None
                if spec.ref.path and value is not None:  # a.items[0] (edition 4)
                    try:
                        value = spec.ref.at(value)
                    except RefMissing:
                        value = None  # none there: staging fails the unit, saying why
                out[name] = value
                continue
            fold: dict[str, Any] = {}
            for key in record.get("keys", []) if record else []:
                irec = self.state_dir.load_result(producer, key)
                output = irec.get("output") if irec else None
                if isinstance(output, dict) and field in output:
                    fold[key] = output[field]
            out[name] = fold
        return out

    def _need(self, name: str, statuses: Mapping[str, str]) -> dict[str, Any]:
        """``needs.<name>``: its status, and for a mapped task ``counts`` — how many
        instances passed, failed, were skipped (Argo's AnySucceeded / AllFailed)."""
        need: dict[str, Any] = {"status": statuses.get(name, SKIPPED)}
        if name in self._mapped:
            counts = self._counts.get(name)
            if counts is None:
                record = self.state_dir.load_result(name)
                raw = record.get("counts", {}) if record else {}
                counts = {s: int(raw.get(s, 0)) for s in (PASSED, FAILED, SKIPPED)}
                self._counts[name] = counts
            need["counts"] = counts
        return need

    def decide(
        self,
        task: Task,
        statuses: Mapping[str, str],
        *,
        item: Any = NO_ITEM,
        run: str | None = None,
    ) -> tuple[str, str] | None:
        """None when the unit runs; else ``(status, note)`` to settle it with:
        skipped (condition false) or failed (condition error)."""
        expression = task.when
        assert expression is not None  # only a conditional unit is decided
        values: dict[str, Any] = {
            # Read here, in the dispatcher: an agent's condition may test params,
            # which still never reach the agent.
            "params": self._params_of(task),
            "inputs": self._inputs_of(task) if "inputs" in expression else {},
            "needs": {n: self._need(n, statuses) for n in task.needs},
        }
        if item is not NO_ITEM:
            values["item"] = item
        if task.epilogue:
            values["outcome"] = {"status": run or PASSED}
        try:
            holds = evaluate(
                expression,
                values,
                item=item is not NO_ITEM,
                outcome=task.epilogue,
                cancelled=self.cancelled,
            )
        except ConditionCancelled:
            # Undecided: the unit is queued like one that runs, and the stopping
            # dispatcher starts nothing queued (a resume evaluates it again).
            return None
        except ConditionError as exc:
            return FAILED, f"condition error: {expression}: {exc}"
        return None if holds else (SKIPPED, f"condition false: {expression}")


# -- tolerated failure -------------------------------------------------------


def tolerates(task: Task, exit_code: int | None, timed_out: bool = False) -> bool:
    """Does the run ignore this unit's failure? ``allow_exit`` lists the exit codes
    it tolerates (nothing else: not a timeout, not a refused result); without it,
    ``on_failure = "continue"`` tolerates every failure."""
    if task.allow_exit:
        return not timed_out and exit_code in task.allow_exit
    return task.tolerated


def amend_record(path: Path, *, durable: bool = True, **members: Any) -> dict[str, Any]:
    """Set ``members`` in a settled record and rewrite it atomically (stage's
    amend_result refuses a mapped task's aggregate, which this also amends).
    ``durable=False``: not fsynced; the dispatcher's group commit makes it
    durable before the batch holding its ``task_finished`` (run.md)."""
    # lazy: core.atomic is not loaded with this module; only amend_record() needs it
    from crucible.core import atomic, canon

    record: dict[str, Any] = canon.loads(path.read_bytes())
    record.update(members)
    atomic.write_bytes(path, canon.dumps(record), durable=durable)
    return record


def mark_tolerated(path: Path, *, durable: bool = True) -> None:
    """Add ``tolerated: true`` to a settled record."""
    amend_record(path, durable=durable, tolerated=True)


def fold_verdict(record: Mapping[str, Any]) -> tuple[str, str] | None:
    """A mapped task whose instances only passed or were skipped by their condition
    passes (all skipped: the task is skipped); None when the fold's verdict stands."""
    counts = record.get("counts", {})
    total = len(record.get("keys", []))
    skipped = int(counts.get(SKIPPED, 0))
    if record.get("status") != FAILED or int(counts.get(FAILED, 0)) or not skipped:
        return None
    if skipped == total:
        return SKIPPED, f"every instance ({total}) was skipped by its condition"
    return (
        PASSED,
        f"{total - skipped} of {total} instances passed, {skipped} skipped by their condition",
    )


def run_status(tasks: Mapping[str, Task], statuses: Mapping[str, str], tolerated: set[str]) -> str:
    """``outcome.status``: failed when a regular task failed and was not tolerated."""
    for name, task in tasks.items():
        if not task.epilogue and statuses.get(name) == FAILED and name not in tolerated:
            return FAILED
    return PASSED


# -- retries -----------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    """The next attempt's delay, or why there is none (``delay`` None)."""

    delay: float | None
    why_not: str | None = None


def next_retry(
    task: Task,
    attempt: int,
    *,
    timed_out: bool,
    exit_code: int | None,
    retryable: bool,
    backoff: float,
    elapsed: float | None,
) -> Retry:
    """Whether attempt ``attempt`` (failed) gets another, and after how long.

    ``retries = N``: up to N retries of a retryable failure or timeout, backoff
    options.backoff × 2^(n−1) capped at 30 s (unchanged). ``retry = {…}``: up to
    ``limit`` retries, delay × factor^(n−1) capped at ``max_delay``, only for the
    listed ``on_exit`` codes (when given) and timeouts only with ``on_timeout``.
    ``deadline``: no retry whose start would come later than ``deadline`` seconds
    after the first attempt started (``elapsed`` is the time since then).
    """
    if not retryable:
        return Retry(None)
    policy = task.retry
    if policy is None:
        if attempt >= task.retries + 1:
            return Retry(None)
        delay = backoff_delay(backoff, 2, attempt - 1, BACKOFF_MAX)
    else:
        if attempt >= policy.limit + 1:
            return Retry(None)
        if timed_out and not policy.on_timeout:
            return Retry(None, "no retry: on_timeout is false")
        if not timed_out and policy.on_exit is not None and exit_code not in policy.on_exit:
            return Retry(None, f"no retry: exit code {exit_code} is not in on_exit")
        delay = backoff_delay(
            float(policy.delay), float(policy.factor), attempt - 1, float(policy.max_delay)
        )
    deadline = task.deadline
    if deadline is not None and elapsed is not None and elapsed + delay >= float(deadline):
        return Retry(
            None, f"no retry: the deadline of {deadline} s is reached after {attempt} attempts"
        )
    return Retry(delay)


def backoff_delay(delay: float, factor: float, n: int, cap: float) -> float:
    """``min(cap, delay × factor^n)`` without computing a power that overflows
    (factor 2^53−1 at n = 21, factor 10 at n = 309): once the growth in log space
    reaches the cap, the answer is the cap."""
    if delay <= 0 or cap <= 0:
        return max(0.0, min(cap, delay))
    if factor > 1 and n * math.log(factor) >= math.log(cap / delay):
        return cap
    return min(cap, delay * factor**n)


def last_attempt_env(exit_code: int | None, timed_out: bool) -> dict[str, str]:
    """``CRUCIBLE_LAST_EXIT`` (the previous attempt's exit code; negative: killed by
    that signal; empty: none) and ``CRUCIBLE_LAST_REASON`` (``timeout``, ``signal``,
    ``exit`` for a non-zero exit, ``result`` for an exit 0 whose result was refused)."""
    if timed_out:
        reason = "timeout"
    elif exit_code is None:
        reason = "result"
    elif exit_code < 0:
        reason = "signal"
    else:
        reason = "exit" if exit_code else "result"
    return {
        "CRUCIBLE_LAST_EXIT": "" if exit_code is None else str(exit_code),
        "CRUCIBLE_LAST_REASON": reason,
    }


def tolerates_fold(task: Task, state_dir: StateDir, record: Mapping[str, Any]) -> bool:
    """A failed mapped task is tolerated when every instance that failed was."""
    if not task.tolerated and not task.allow_exit:
        return False
    failed = 0
    for key in record.get("keys", []):
        irec = state_dir.load_result(record["task"], key)
        if irec is not None and irec.get("status") == FAILED:
            if irec.get("tolerated") is not True:
                return False
            failed += 1
    return failed > 0
