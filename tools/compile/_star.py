"""Starlark pack sources (starlark-pyo3).

The source calls ``workflow(name=…, description=…, params=…, tasks=[…])`` once;
``task(…)`` returns a handle to put in ``tasks`` or another task's ``needs``.
Both constructors check their keyword arguments against the allowlist of the
pack's edition, which the compiler reads from the manifest before evaluating:
an unknown keyword argument (``inputs=`` below edition 3, ``edition=`` ever)
fails at the call, with the call's source span.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

from crucible.compile._checker import Checker, check_params, type_name
from crucible.compile._diagnostics import Diagnostic, Location
from crucible.compile._editions import EDITION_CONTROL
from crucible.compile._locate import FileLocator
from crucible.compile._shape import WORKFLOW_KEYS_SINCE_4, check_task
from crucible.compile._starbound import MAX_EVAL_MEMORY, limit_memory, nesting_problem
from crucible.core.errors import ParseError
from crucible.core.fdio import write_all
from crucible.core.structs import dataclass, field

__all__ = ["EVAL_TIMEOUT_S", "StarResult", "evaluate_source"]

#: a source that loops this long is refused (our choice; Starlark has no while
#: and no recursion, but a large range() can still run for hours)
EVAL_TIMEOUT_S = 60.0
_WORKFLOW_KWARGS = ("name", "description", "params", "tasks")
_SPAN_RE = re.compile(r"^\s*-->\s*(.*):(\d+):(\d+)\s*$", re.MULTILINE)
_ERROR_RE = re.compile(r"^error:\s*(.*)$", re.MULTILINE)


@dataclass
class TaskHandle:
    """What ``task()`` returns to Starlark: the checked keyword arguments."""

    kwargs: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.kwargs.get("name", ""))


class _CallRefused(Exception):
    """Raised inside a constructor; Starlark adds the call's span."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class StarResult:
    """The raw workflow table a source built (manifest-shaped: ``task`` is the list)."""

    workflow: dict[str, Any] | None
    diagnostics: list[Diagnostic] = field(default_factory=list)


def _plain(value: Any) -> Any:
    """Task handles inside ``needs`` become names; tuples stay (checks accept them)."""
    if isinstance(value, TaskHandle):
        return value.name
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def evaluate_source(
    text: str, display: str, edition: int, *, timeout: float = EVAL_TIMEOUT_S
) -> StarResult:
    """Evaluate a Starlark source; its one ``workflow()`` call is the result.

    The source's nesting is bounded first (:mod:`crucible.compile._starbound`,
    a :class:`ParseError` at the line that passes the bound); the evaluation
    runs in a forked child with bounded memory, so a crash, an abort or a panic
    of the evaluator is a diagnostic here, never the end of this process."""
    problem = nesting_problem(text)
    if problem is not None:
        location, message = problem
        raise ParseError(message, location=location.in_file(display))
    return _in_child(text, display, edition, timeout)


def _workflow_table(chk: Checker, kwargs: dict[str, Any], edition: int) -> dict[str, Any]:
    """``workflow(...)``'s keyword arguments checked (into ``chk``) and turned into
    the manifest's ``[workflow]`` table, its ``task()`` values as ``task``."""
    # edition 4: outputs= and publish= (checked with the rest of the workflow)
    known = _WORKFLOW_KWARGS + (WORKFLOW_KEYS_SINCE_4 if edition >= EDITION_CONTROL else ())
    chk.known_keys((), kwargs, known, "workflow()")
    if "params" in kwargs:
        check_params(chk, ("params",), kwargs["params"])
    tasks = kwargs.get("tasks", [])
    if not isinstance(tasks, list | tuple):
        chk.wrong_type(("tasks",), tasks, "tasks must be a list of task()")
        tasks = []
    for i, item in enumerate(tasks):
        if not isinstance(item, TaskHandle):
            chk.error(
                "wrong-type", ("tasks", i), f"tasks[{i}] is a {type_name(item)}, not a task()"
            )
    table = {k: v for k, v in kwargs.items() if k != "tasks"}
    table["task"] = [t.kwargs for t in tasks if isinstance(t, TaskHandle)]
    return table


def _evaluate_here(text: str, display: str, edition: int, timeout: float) -> StarResult:
    """The evaluation itself (in the child). Ctrl-C is the parent's to handle."""
    # lazy: starlark is heavy; only _evaluate_here() needs it
    import starlark as sl

    state: dict[str, Any] = {"workflow": None, "refused": None}
    quiet = Checker(FileLocator(display))

    def task(*args: Any, **kwargs: Any) -> Any:
        if args:
            _refuse(state, "positional", "task() takes keyword arguments only")
        kwargs = {k: _plain(v) for k, v in kwargs.items()}
        chk = Checker(quiet.locator)
        check_task(chk, (), kwargs, edition, label="task()")
        _remember(state, chk)
        return sl.OpaquePythonObject(TaskHandle(kwargs))

    def workflow(*args: Any, **kwargs: Any) -> None:
        if args:
            _refuse(state, "positional", "workflow() takes keyword arguments only")
        if state["workflow"] is not None:
            _refuse(state, "duplicate-workflow", "workflow() is called more than once")
        if "edition" in kwargs:
            _refuse(
                state,
                "unknown-key",
                "workflow() does not take edition: set edition at the top of the manifest "
                "(the compiler needs it before evaluating the source)",
            )
        chk = Checker(quiet.locator)
        table = _workflow_table(chk, kwargs, edition)
        _remember(state, chk)
        state["workflow"] = table

    module = sl.Module()
    module.add_callable("task", task)
    module.add_callable("workflow", workflow)
    try:
        ast = sl.parse(display, text)
    except sl.StarlarkError as exc:
        message, location = _split_error(str(exc), display)
        raise ParseError(f"Starlark syntax: {message}", location=location) from None
    deadline = time.monotonic() + timeout
    parent = os.getppid()
    # stop at the deadline, and when the parent is gone (killed by a signal it
    # could not pass on): nobody would read the result
    options = sl.EvalOptions(
        check_cancelled=lambda: time.monotonic() > deadline or os.getppid() != parent
    )
    try:
        sl.eval_with(options, module, ast, sl.Globals.standard())
    except sl.StarlarkError as exc:
        message, location = _split_error(str(exc), display)
        if time.monotonic() > deadline and "cancelled" in message:
            return _timed_out(timeout, location)
        refused: _CallRefused | None = state["refused"]
        if refused is not None:
            return StarResult(None, [Diagnostic(refused.code, refused.message, location)])
        return StarResult(None, [Diagnostic("starlark-error", message, location)])
    if state["workflow"] is None:
        return StarResult(
            None,
            [Diagnostic("no-workflow", "the source never calls workflow()", Location(display))],
        )
    return StarResult(state["workflow"])


def _timed_out(timeout: float, location: Location) -> StarResult:
    message = f"evaluation took longer than {timeout:g} s and was stopped"
    return StarResult(None, [Diagnostic("starlark-timeout", message, location)])


def _in_child(text: str, display: str, edition: int, timeout: float) -> StarResult:
    """Evaluate in a forked child; its result comes back pickled through a pipe."""
    # lazy: pickle costs start-up; only _in_child() needs it
    import pickle
    import select

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child (its outcome is what the tests check)
        os.close(read_fd)
        _child(text, display, edition, timeout, write_fd)
    os.close(write_fd)
    chunks: list[bytes] = []
    interrupted: list[int] = []
    # the child also checks the deadline between its steps; a step that never
    # yields (a straight-line x = x + x) is cut off here, a little later
    deadline = time.monotonic() + timeout + 2.0
    timed_out = False
    try:
        with _sigint_noted(interrupted):
            while not interrupted:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                ready, _, _ = select.select([read_fd], [], [], min(left, 0.1))
                if ready:
                    chunk = os.read(read_fd, 1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
    finally:
        os.close(read_fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    if interrupted:
        raise KeyboardInterrupt
    where = Location(display)
    if timed_out:
        return _timed_out(timeout, where)
    try:
        outcome = pickle.loads(b"".join(chunks))
    except Exception:
        outcome = None
    if isinstance(outcome, StarResult):
        return outcome
    if isinstance(outcome, ParseError):
        raise outcome
    if isinstance(outcome, str):  # an exception the evaluator raised (a Rust panic)
        return StarResult(None, [Diagnostic("starlark-error", outcome, where)])
    if os.WIFSIGNALED(status):
        cause = signal.Signals(os.WTERMSIG(status)).name
        message = (
            f"the Starlark evaluator crashed ({cause}): the source needs more than "
            f"{MAX_EVAL_MEMORY >> 20} MiB of memory or nests too deeply"
        )
    else:
        message = "the Starlark evaluator ended without a result"
    return StarResult(None, [Diagnostic("starlark-error", message, where)])


def _child(
    text: str, display: str, edition: int, timeout: float, fd: int
) -> None:  # pragma: no cover
    # lazy: pickle costs start-up; only _child() needs it
    import faulthandler
    import pickle

    outcome: object
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us on Ctrl-C
        # a Rust panic prints its backtrace on stderr; the parent reports it
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        # and with RUST_BACKTRACE=1 it symbolizes a backtrace first: seconds, and
        # memory the child is short of by then
        os.environ["RUST_BACKTRACE"] = "0"
        # a crash here is reported by the parent; no dump of this child's stack
        # (PYTHONFAULTHANDLER, pytest) on a descriptor the parent shares
        faulthandler.disable()
        limit_memory(MAX_EVAL_MEMORY)
        try:
            outcome = _evaluate_here(text, display, edition, timeout)
        except ParseError as exc:
            outcome = exc
        except BaseException as exc:  # pyo3's PanicException is a BaseException
            outcome = f"evaluation failed: {exc or type(exc).__name__}"
            if isinstance(exc, MemoryError) or "memory" in str(exc):
                outcome += f" (an evaluation may use {MAX_EVAL_MEMORY >> 20} MiB)"
        try:
            data = pickle.dumps(outcome)
        except Exception as exc:
            data = pickle.dumps(f"the source built a value crucible cannot read: {exc}")
        write_all(fd, data)
    finally:
        os._exit(0)


@contextlib.contextmanager
def _sigint_noted(noted: list[int]) -> Iterator[None]:
    """Within the block, SIGINT is appended to ``noted`` instead of raising."""
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, _frame: noted.append(signum))
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _refuse(state: dict[str, Any], code: str, message: str) -> None:
    state["refused"] = _CallRefused(code, message)
    raise state["refused"]


def _remember(state: dict[str, Any], chk: Checker) -> None:
    if chk.diagnostics:
        d = chk.diagnostics[0]
        _refuse(state, d.code, d.message)


def _split_error(text: str, display: str) -> tuple[str, Location]:
    """Starlark's report → (the ``error:`` line, the innermost ``--> file:line:col``)."""
    spans = _SPAN_RE.findall(text)
    errors = _ERROR_RE.findall(text)
    message = errors[-1].strip() if errors else text.strip().splitlines()[0]
    # A Python exception raised inside a constructor reads "error: _CallRefused: …".
    message = re.sub(r"^\w+: ", "", message) if message.startswith("_CallRefused") else message
    if spans:
        file, line, col = spans[-1]
        return message, Location(file or display, int(line), int(col))
    return message, Location(display)
