"""Bounded evaluation of one Starlark expression (docs/spec/manifest.md,
"Bounded evaluation"): a ``when`` condition today, an output expression or a
retry ``when`` tomorrow.

Starlark has no while and no recursion, yet one expression can still run for
hours (``[1 for a in range(100000) for b in range(100000)]``) or ask for more
memory than the machine has (``"x" * 2000000000``: starlark-rust aborts the
process). Neither may reach the dispatcher, so an expression is evaluated in a
long-lived child process (:func:`evaluate_expression`):

- **time**: the child's evaluator checks a deadline between its steps
  (starlark-pyo3's ``check_cancelled``) and answers ``timeout``; a single step
  that never yields is cut off by the parent, which SIGKILLs the child a grace
  period after the deadline;
- **memory**: the child's data segment is limited to what it holds after start-up
  plus :data:`MAX_EVAL_MEMORY`; an allocation past it aborts the child, never the
  caller (``memory``);
- **signals**: the parent waits on the child's pipe in short slices and asks
  ``cancelled()`` between them; when it says so, the child is killed and the
  answer is ``cancelled`` (the caller is stopping: it decides nothing);
- the child ignores SIGINT (the caller handles Ctrl-C), dies with its parent
  (``PR_SET_PDEATHSIG``) and ends when its stdin closes.

A child that was killed or crashed is started again for the next expression.
One child serves the whole process, one expression at a time (a lock).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, Any, Literal

from crucible.compile._starbound import MAX_EVAL_MEMORY, limit_memory
from crucible.core.structs import dataclass

__all__ = [
    "MAX_EVAL_MEMORY",
    "MAX_EXPRESSION_SECONDS",
    "Evaluated",
    "evaluate_expression",
]

#: our choice: a condition compares a few values; two seconds is thousands of
#: times what a real one takes, and short enough not to stall a run
MAX_EXPRESSION_SECONDS = 2.0
#: after the deadline, how long a step that never yields may go on before the
#: child is killed
_GRACE_S = 1.0
#: how long a fresh child may take to import starlark (a loaded machine)
_STARTUP_S = 60.0
#: how often the wait asks ``cancelled()``
_SLICE_S = 0.05

Kind = Literal["value", "error", "prelude", "timeout", "memory", "cancelled"]


@dataclass(frozen=True)
class Evaluated:
    """The expression's JSON value (``kind == "value"``), or why there is none:
    ``error`` (Starlark refused it: a type error, a missing attribute, a value
    that is not JSON), ``prelude`` (the names could not be built from the data),
    ``timeout``, ``memory`` (the child crashed or ran out of memory),
    ``cancelled`` (``cancelled()`` said stop). ``message`` is one line."""

    kind: Kind
    value: Any = None
    message: str = ""


def evaluate_expression(
    expression: str,
    data: Mapping[str, Any],
    prelude: str = "",
    *,
    timeout: float = MAX_EXPRESSION_SECONDS,
    cancelled: Callable[[], bool] | None = None,
) -> Evaluated:
    """Evaluate ``expression`` with bounded time and memory.

    ``data`` (JSON values) is bound to ``_d`` before ``prelude`` runs (Starlark
    statements that define the names the expression reads, with the ``struct``
    and ``json`` extensions); the expression's value comes back as JSON."""
    # lazy: not loaded with this module; only evaluate_expression() needs it
    import orjson

    if cancelled is not None and cancelled():
        return Evaluated("cancelled", message="stopped before it was evaluated")
    # the data travels as JSON text, bound as is to ``_data`` in the child
    text = orjson.dumps(data).decode()
    request = orjson.dumps(
        {"expression": expression, "prelude": prelude, "data": text, "timeout": timeout}
    )
    with _LOCK:
        try:
            return _CHILD.ask(request + b"\n", timeout, cancelled or _never)
        except BaseException:
            # (a KeyboardInterrupt mid-wait) the child's reply to this request
            # must never be read as the next one's
            _CHILD.stop()
            raise


def _never() -> bool:
    return False


class _Child:
    """The evaluator process, started on first use and after every kill."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""

    def _start(self, cancelled: Callable[[], bool]) -> Evaluated | None:
        # no Rust backtrace (seconds to symbolize, in a child short of memory),
        # no faulthandler dump of a child whose crash is reported here
        env = {**os.environ, "RUST_BACKTRACE": "0"}
        env.pop("PYTHONFAULTHANDLER", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD_MAIN, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a Rust panic's report: ours to summarize
            env=env,
            close_fds=True,
        )
        self.buffer = b""
        line = self._read_line(time.monotonic() + _STARTUP_S, cancelled)
        if isinstance(line, Evaluated):
            if line.kind == "timeout":
                return Evaluated("error", message="the expression evaluator did not start")
            return line
        if line != b"ready":
            self.stop()
            return Evaluated("error", message="the expression evaluator did not start")
        return None

    def ask(self, request: bytes, timeout: float, cancelled: Callable[[], bool]) -> Evaluated:
        # lazy: not loaded with this module; only ask() needs it
        import orjson

        for last_try in (False, True):
            if self.proc is None or self.proc.poll() is not None:
                failed = self._start(cancelled)
                if failed is not None:
                    return failed
            assert self.proc is not None and self.proc.stdin is not None
            try:
                self.proc.stdin.write(request)
                self.proc.stdin.flush()
                break
            except OSError:  # it died between two expressions: once more, fresh
                if last_try:
                    return self._crashed()
                self.stop()
        line = self._read_line(time.monotonic() + timeout + _GRACE_S, cancelled)
        if isinstance(line, Evaluated):
            if line.kind == "timeout":
                return _timed_out(timeout)
            return line
        reply = orjson.loads(line)
        kind = reply["kind"]
        if kind == "timeout":
            return _timed_out(timeout)
        return Evaluated(kind, reply.get("value"), reply.get("message", ""))

    def _read_line(self, deadline: float, cancelled: Callable[[], bool]) -> bytes | Evaluated:
        """The child's next line, or what stopped the wait (the child killed then)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            if cancelled():
                self.stop()
                return Evaluated("cancelled", message="stopped by a signal")
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                return Evaluated("timeout")
            ready, _, _ = select.select([fd], [], [], min(left, _SLICE_S))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return self._crashed()
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def _crashed(self) -> Evaluated:
        assert self.proc is not None
        status = self.proc.wait()
        self.stop()
        cause = f" ({signal.Signals(-status).name})" if status < 0 else ""
        return Evaluated(
            "memory",
            message=f"the evaluator crashed{cause}: the expression needs more than "
            f"{MAX_EVAL_MEMORY >> 20} MiB of memory",
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _timed_out(timeout: float) -> Evaluated:
    return Evaluated(
        "timeout", message=f"evaluation took longer than {timeout:g} s and was stopped"
    )


_LOCK = threading.Lock()
_CHILD = _Child()
atexit.register(_CHILD.stop)

# -- the child -----------------------------------------------------------------

_CHILD_MAIN = "import crucible.compile._bounded as b; b.serve()"


def serve(
    stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None
) -> None:  # pragma: no cover - runs in the child
    """The child's loop: one JSON request a line in, one JSON reply a line out."""
    # lazy: not loaded with this module; only serve() needs it
    import faulthandler

    # lazy: starlark is heavy; only serve() needs it
    import orjson
    import starlark as sl

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    faulthandler.disable()
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    inp = stdin or sys.stdin.buffer
    out = stdout or sys.stdout.buffer
    lib = sl.LibraryExtension
    globals_ = sl.Globals.extended_by([lib.StructType, lib.Json])
    limit_memory()
    out.write(b"ready\n")
    out.flush()
    for line in inp:
        request = orjson.loads(line)
        try:
            reply = _evaluate_here(sl, globals_, request)
        except BaseException as exc:  # pyo3's PanicException is a BaseException
            reply = {
                "kind": "memory" if isinstance(exc, MemoryError) else "error",
                "message": f"evaluation failed: {_first_line(str(exc)) or type(exc).__name__}",
            }
        try:
            data = orjson.dumps(reply)
        except TypeError as exc:
            data = orjson.dumps({"kind": "error", "message": f"the value is not JSON: {exc}"})
        out.write(data + b"\n")
        out.flush()


def _evaluate_here(
    sl: Any, globals_: Any, request: dict[str, Any]
) -> dict[str, Any]:  # pragma: no cover - runs in the child
    # lazy: not loaded with this module; only _evaluate_here() needs it
    import orjson

    deadline = time.monotonic() + float(request["timeout"])
    options = sl.EvalOptions(check_cancelled=lambda: time.monotonic() > deadline)
    module = sl.Module()
    module["_data"] = request["data"]
    prelude = "_d = json.decode(_data)\n" + request["prelude"]
    try:
        sl.eval_with(options, module, _parsed(sl, "values", prelude), globals_)
    except sl.StarlarkError as exc:
        if time.monotonic() > deadline:
            return {"kind": "timeout"}
        return {"kind": "prelude", "message": _first_line(str(exc))}
    try:
        value = sl.eval_with(
            options, module, _parsed(sl, "expression", request["expression"]), globals_
        ).value
    except sl.StarlarkError as exc:
        if time.monotonic() > deadline:
            return {"kind": "timeout"}
        message = _first_line(str(exc))
        # the value itself could not be converted (a function, a range)
        unjson = re.match(r"Operation `serde::serialize` not supported on type `(\w+)`", message)
        if unjson:
            return {"kind": "error", "message": f"its value is a {unjson[1]}, not JSON"}
        return {"kind": "error", "message": message}
    try:
        orjson.dumps(value)
    except TypeError:
        return {"kind": "error", "message": f"its value is a {type(value).__name__}, not JSON"}
    return {"kind": "value", "value": value}


#: parsed sources by text: a run evaluates the same few expressions and preludes
#: for every instance (an AST can be evaluated again)
_PARSED: dict[tuple[str, str], Any] = {}


def _parsed(sl: Any, name: str, text: str) -> Any:  # pragma: no cover - runs in the child
    ast = _PARSED.get((name, text))
    if ast is None:
        if len(_PARSED) >= 256:
            _PARSED.clear()
        ast = _PARSED[(name, text)] = sl.parse(name, text)
    return ast


def _first_line(report: str) -> str:
    """starlark's ``error: …`` line (after a call stack, when there is one)."""
    lines = report.strip().splitlines()
    for line in lines:
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    return lines[0] if lines else ""


def _die_with_parent(parent: int | None) -> None:  # pragma: no cover - runs in the child
    """SIGKILL this child when the process that started it ends (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        # lazy: ctypes costs start-up; only _die_with_parent() needs it
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:  # it ended before the prctl
        os._exit(0)
