"""The Dask executor: each unit runs on a Dask worker through the same unit code.

The dispatcher keeps every scheduling decision; this module only submits
futures, each carrying a *batch* of unit attempts of one task (one, unless many
units of a task wait at once: a future costs the scheduler, the client and the
worker about a millisecond of CPU, more than a short task itself). On the
worker, :func:`_run_batch` builds (once per run and worker process) the same
:class:`crucible.run.executors._unit.UnitRunner` as the local workers use, with
worker-side stand-ins for the slot pipes (:class:`_Control`) and the request
channel (:class:`_Channel`), and runs the batch's attempts one after another:
stage, spawn, wait, capture. Each attempt's answer, and a task's start, come
back as worker events; a future's end reports what has no event (cancelled, a
lost worker). Both run on the client's event-loop thread, queue the reply and
write one byte to a pipe the dispatcher's selector watches. A batch whose task
runs long hands the attempts behind it back (the dispatcher starts them
elsewhere), as a pipelined local worker does. Stop and kill reach every worker
by ``Client.run``.

Requires the state and pack directories at the same path on every worker
(each worker proves it by reading a token the dispatcher wrote). See
docs/run-on-a-cluster.md and docs/spec/run.md ("Executors").
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import os
import secrets
import shutil
import signal
import site
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import crucible
from crucible import stage
from crucible.core import atomic
from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    Location,
    OperationalError,
    ParseError,
    UsageError,
)
from crucible.core.plan import Task
from crucible.core.structs import dataclass, field, replace
from crucible.run._options import RunOptions
from crucible.run.executors._agent_io import AgentStdout
from crucible.run.executors._batched_seam import BatchedSeam
from crucible.run.executors._launch import serialised
from crucible.run.executors._log_tail import LogTailer
from crucible.run.executors._pipelined import RECENT, Pipeline, handback_after
from crucible.run.executors._procs import TaskProcess
from crucible.run.executors._reaper import Reaper
from crucible.run.executors._runner_spec import RunnerSpec
from crucible.run.executors._seam import ExecutorLost
from crucible.run.executors._slots import Slots
from crucible.run.executors._unit import UnitRunner
from crucible.run.executors._workers import Reply
from crucible.run.executors.dask._batches import Batches
from crucible.stage import StateLayout

__all__ = ["INSTALL_HINT", "DaskExecutor", "check_options", "import_distributed"]

INSTALL_HINT = "--executor dask needs Dask distributed: pip install 'crucible[dask]'"
#: bound on connecting to a scheduler and on its workers' first answer
CONNECT_TIMEOUT = 30.0
_EVENT_TOPIC = "crucible-unit"
#: a batch future's value when its answers went as worker events
_SENT = "sent"
#: how often the dispatcher checks its connection to the scheduler (s)
_WATCH_SECONDS = 0.2


def _not_started() -> tuple[str, dict[str, Any]]:
    """The answer of a unit not started because the run stops (it stays unsettled)."""
    return ("ok", {"kind": "not_started", "staged_env": None})


#: the answer of a unit a closing worker did not start (the dispatcher starts it elsewhere)
_HANDBACK = ("ok", {"kind": "handback", "staged_env": None})

#: times a unit cancelled before it started (its run spec was lost with a
#: worker) is sent again with the spec scattered anew, before it counts as lost
_RESENDS = 3


def import_distributed() -> Any:
    """``distributed``, or a one-line usage error saying how to install it (or
    which Dask config file it cannot read: Dask reads them at its import)."""
    try:
        # lazy: distributed is heavy; only import_distributed() needs it
        import distributed
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    except ValueError as exc:  # a Dask config file that is no YAML mapping
        raise _config_error(exc) from None
    return distributed


def _config_error(exc: ValueError) -> CrucibleError:
    """The Dask config file that stopped Dask's import, located (one line)."""

    yaml: Any = importlib.import_module("yaml")  # Dask's dependency (no stubs here)

    for path in _dask_config_files():
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                loaded = yaml.safe_load(f)
        except OSError:
            continue  # Dask skips what it cannot read
        except yaml.YAMLError as problem:
            mark = getattr(problem, "problem_mark", None)
            where = Location(
                file=path,
                line=None if mark is None else mark.line + 1,
                col=None if mark is None else mark.column + 1,
            )
            what = getattr(problem, "problem", None) or type(problem).__name__
            return ParseError(f"malformed Dask config (YAML: {what})", where=where)
        if loaded is not None and not isinstance(loaded, dict):
            return ParseError("malformed Dask config: not a mapping", where=path)
    return ParseError(f"malformed Dask config: {str(exc).splitlines()[0]}")


def _dask_config_files() -> list[str]:
    """The files Dask reads its config from (dask.config's paths, DASK_CONFIG
    last), each directory's ``*.yaml``, ``*.yml`` and ``*.json``."""

    dirs = [
        os.getenv("DASK_ROOT_CONFIG", "/etc/dask"),
        os.path.join(sys.prefix, "etc", "dask"),
        *[os.path.join(prefix, "etc", "dask") for prefix in site.PREFIXES],
        os.path.join(os.path.expanduser("~"), ".config", "dask"),
    ]
    if os.getenv("DASK_CONFIG"):
        dirs.append(os.environ["DASK_CONFIG"])
    files: list[str] = []
    for directory in dict.fromkeys(dirs):
        if os.path.isfile(directory):
            files.append(directory)
            continue
        with contextlib.suppress(OSError):
            files.extend(
                os.path.join(directory, name)
                for name in sorted(os.listdir(directory))
                if name.endswith((".yaml", ".yml", ".json"))
            )
    return files


def check_options(options: RunOptions) -> None:
    """At the command edge, before the state dir is claimed: Dask installed and
    its config readable, a scheduler address Dask can dial for ``dask``, a
    usable temporary directory for ``dask-local``."""
    distributed = import_distributed()
    if options.executor == "dask" and not options.scheduler:
        raise UsageError("--executor dask needs --scheduler tcp://HOST:PORT")
    if options.executor != "dask" and options.scheduler:
        raise UsageError("--scheduler needs --executor dask")
    if options.scheduler:
        # lazy: distributed is heavy; only check_options() needs it
        from distributed.comm.registry import backends

        scheme, _ = distributed.comm.parse_address(options.scheduler, strict=False)
        if scheme not in backends:
            known = ", ".join(f"{name}://" for name in sorted(backends))
            raise UsageError(
                f"--scheduler {options.scheduler}: unknown address scheme {scheme!r}"
                f" (Dask dials {known})"
            )
    if options.executor == "dask-local":
        # lazy: dask is heavy; only check_options() needs it
        import dask

        scratch = dask.config.get("temporary-directory", None)
        if scratch and not (os.path.isdir(scratch) and os.access(scratch, os.W_OK | os.X_OK)):
            raise UsageError(
                "Dask's temporary directory (DASK_TEMPORARY_DIRECTORY or temporary-directory)"
                " is not a writable directory",
                where=str(scratch),
            )


# ------------------------------------------------------------------ worker side


@dataclass(frozen=True)
class _Spec(RunnerSpec):
    """What a worker needs to build the run's UnitRunner (scattered once), and
    its share of the slots."""

    #: task processes a worker runs at once, by worker name (``dask-local``:
    #: the -j slots split among its workers); a worker not named here runs at
    #: most its Dask thread count of them
    slots: dict[str, int] = field(default_factory=dict)
    #: ``STATE/.dask/RUN``: a token's file there says a worker took its unit
    #: (_claim: Dask may send a batch again, silently, when a worker retires)
    claims: str = ""


class _Control:
    """Worker-side stand-in for :class:`crucible.run.executors._unit.Slots`: this worker
    process's share of the run's ``-j`` slots (a unit takes one before its task
    process starts and gives it back once it was reaped, so the worker's other
    Dask threads stage and capture meanwhile, as the local executor's extra
    workers do); stop and kill are pipes the unit's wait polls, written by
    :func:`_worker_signal`."""

    def __init__(self, slots: int) -> None:
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.kill_r, self.kill_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # the request pipe stand-in: its write end stays open, so it never hangs up
        self.hold_r, self.hold_w = os.pipe2(os.O_CLOEXEC)
        self.stopped = False
        #: stopped because the worker closes (crucible.run.executors.dask._close), not by the run
        self.closing = False
        #: this worker leaves the cluster (:class:`_LeaveGuard`): its units were killed
        self.lost = False
        self._free = slots
        #: batches of the run running on this worker (the guard waits for them)
        self._batches = 0
        self._changed = threading.Condition()

    def acquire(self, requests_fd: int) -> bool:
        with self._changed:
            while not self.stopped and self._free <= 0:
                self._changed.wait()
            if self.stopped:
                return False
            self._free -= 1
            return True

    def release(self) -> None:
        with self._changed:
            self._free += 1
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()
        with contextlib.suppress(BlockingIOError):
            os.write(self.stop_w, b"s")

    def kill(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.kill_w, b"k")

    def batch_began(self) -> None:
        with self._changed:
            self._batches += 1

    def batch_ended(self) -> None:
        with self._changed:
            self._batches -= 1
            self._changed.notify_all()

    def leave(self) -> None:
        """This worker leaves: start nothing more, SIGKILL every running task's
        group (stopped first: a killed attempt is then not captured)."""
        with self._changed:
            self.lost = True
        self.stop()
        self.kill()

    def wait_idle(self, timeout: float) -> None:
        """Return once every batch of the run here has answered (bounded)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._batches > 0 and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)


def _lost_answer(result: dict[str, Any], address: str) -> dict[str, Any]:
    """What an attempt ended by its worker's departure answers: ``worker_lost``
    (its task was killed; known dead before the dispatcher retries it), or
    ``handback`` for one not started (it runs elsewhere). An attempt that
    ended by itself keeps its answer (its record is written)."""
    staged_env = result.get("staged_env")
    if result.get("kind") == "not_started":
        return {"kind": "handback", "staged_env": staged_env}
    if result.get("kind") == "finished" and result.get("record") is None:
        # as a KilledWorker answer: the retry stages anew (this attempt's
        # workspace may be one it recycled, under another name)
        return {"kind": "worker_lost", "worker": address}
    return result


#: a worker's states once it leaves the cluster (Dask's ``Status`` names)
_LEAVING = frozenset({"closing", "closed", "failed"})
#: how often a worker checks whether it is leaving (ms)
_LEAVE_CHECK_MS = 100
#: how long a worker's signal waits for its units to answer before it leaves (s)
_LEAVE_WAIT = 5.0


def _leave_all() -> list[_Control]:
    with _LOCK:
        controls = list(_CONTROLS.values())
    for control in controls:
        control.leave()
    return controls


class _LeaveGuard:
    """A worker that leaves the cluster (SIGTERM, a lost scheduler, a nanny's
    restart) kills its units' tasks and answers them ``worker_lost`` before it
    leaves the scheduler, so that no retry overlaps an attempt still running
    (docs/spec/run.md, "A lost worker"). Dask lets a closing worker's running
    tasks finish first (up to its close timeout) and only then tears its
    plugins down: the guard checks the worker's status every 100 ms on its
    event loop to kill them at once, and its ``teardown`` (a duck-typed worker
    plugin) holds the departure until every batch has answered."""

    name = "crucible-leave-guard"

    def __init__(self, worker: Any) -> None:
        self._worker = worker

    def check(self) -> None:
        if getattr(self._worker.status, "name", "") in _LEAVING:
            _leave_all()

    async def teardown(self, worker: Any) -> None:
        # lazy: asyncio costs start-up; only teardown() needs it
        import asyncio

        if getattr(worker.status, "name", "") not in _LEAVING:
            return  # removed from a worker that stays
        loop = asyncio.get_running_loop()
        for control in _leave_all():
            await loop.run_in_executor(None, control.wait_idle, CONNECT_TIMEOUT)


def _guard(worker: Any, on_signals: bool) -> None:
    """On the worker's event loop: its leave guard, once; ``on_signals``: also
    at SIGTERM and SIGINT (a cluster's worker; a ``dask-local`` worker is the
    dispatcher's child, stopped by it, and shares its terminal's Ctrl-C)."""
    # lazy: tornado is heavy; only _guard() needs it
    from tornado.ioloop import PeriodicCallback

    if _LeaveGuard.name in worker.plugins:
        return
    guard = worker.plugins[_LeaveGuard.name] = _LeaveGuard(worker)
    check = PeriodicCallback(guard.check, _LEAVE_CHECK_MS)
    worker.periodic_callbacks[_LeaveGuard.name] = check  # stopped when the worker closes
    check.start()
    if on_signals:
        _leave_on_signals()


def _leave_on_signals() -> None:
    """``dask worker --no-nanny`` answers SIGTERM and SIGINT by leaving its event
    loop without closing the worker (no status change, no teardown) while its
    threads finish their tasks: the units leave at the signal itself, before
    the worker's own handler runs. The handler only wakes a thread and waits
    for it (bounded: a signal handler runs between two bytecodes of the main
    thread, which may hold a lock the leave takes), then calls the handler it
    replaced."""

    wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
    left = threading.Event()

    def watch() -> None:
        with contextlib.suppress(OSError):
            os.read(wake_r, 1)
            for control in _leave_all():  # every task killed and reaped
                control.wait_idle(_LEAVE_WAIT)
        left.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def on_signal(signum: int, frame: Any, previous: Any = previous) -> None:
            with contextlib.suppress(OSError):
                os.write(wake_w, b"x")
            left.wait(_LEAVE_WAIT)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        try:
            signal.signal(signum, on_signal)
        except ValueError:  # not the main thread: the worker closes by other paths
            os.close(wake_r)
            os.close(wake_w)
            return
    threading.Thread(target=watch, name="crucible-leave", daemon=True).start()


class _Channel:
    """Worker-side stand-in for :class:`crucible.run.executors._workers.Channel`: the
    interim "started" reply travels as a worker event."""

    def __init__(self, run_id: str, token: int, requests_fd: int, worker: Any) -> None:
        self.run_id = run_id
        self.token = token
        self.requests_fd = requests_fd
        self._worker = worker
        #: a batch's: the units behind this one are handed back once it runs long
        self.pipeline: Pipeline | None = None

    def send(self, payload: Any) -> None:
        message = {"run": self.run_id, "token": self.token, **payload}
        message["worker"] = self._worker.address
        self._worker.log_event(_EVENT_TOPIC, message)


_LOCK = threading.Lock()
_CONTROLS: dict[str, _Control] = {}
_RUNNERS: dict[str, UnitRunner] = {}
#: held around a task's spawn: procs.spawn changes the process's working
#: directory around posix_spawn, and a worker runs units in several threads
_SPAWN_LOCK = threading.Lock()


def _control(run_id: str, slots: int = 0) -> _Control:
    """The run's control on this worker (created by its first unit, or by a
    stop heard before any: then it never starts one)."""
    with _LOCK:
        control = _CONTROLS.get(run_id)
        if control is None:
            control = _CONTROLS[run_id] = _Control(slots)
        return control


#: this worker process's reaper (crucible.run.executors._reaper), started at its first task
_REAPER: list[Reaper] = []


def _reaper(grace: float) -> Reaper:
    with _LOCK:
        if not _REAPER:
            reaper = Reaper(grace)
            reaper.start()  # now, not at the first task (see Reaper)
            _REAPER.append(reaper)
        return _REAPER[0]


def _watch_started(pid: int) -> None:
    reaper = _REAPER[0] if _REAPER else None
    if reaper is not None:
        reaper.watch(pid)


class _WorkerRunner(UnitRunner):
    """The local unit code, with its spawn serialised among the worker's
    threads, and each task's group registered with the worker's reaper while
    it runs: should the worker die (SIGKILL, the OOM killer), nobody else
    would kill it."""

    #: a Dask worker may share STATE with the dispatcher over another host's
    #: mount: it fsyncs its own records (the dispatcher's fsync would not cover
    #: that host's cache); dask-local's workers share this host's page cache,
    #: so theirs ride the dispatcher's group commit (docs/spec/run.md, "Session log")
    durable_records = True

    #: one start at a time among the worker's threads (procs.spawn changes the
    #: process's working directory around posix_spawn), each group watched
    _launch = staticmethod(serialised(_SPAWN_LOCK, _watch_started))

    def wait(
        self,
        proc: TaskProcess,
        channel: Any,
        out_r: int,
        sink: Any,
        agent_out: AgentStdout | None = None,
    ) -> tuple[int, str | None, bool]:
        try:
            return super().wait(proc, channel, out_r, sink, agent_out)
        finally:
            if _REAPER:  # the leader was reaped and its group killed
                _REAPER[0].forget(proc.pid)


def _runner(spec: _Spec, worker: Any) -> UnitRunner:
    with _LOCK:
        runner = _RUNNERS.get(spec.run_id)
    if runner is None:
        slots = spec.slots.get(str(worker.name), worker.state.nthreads)
        _reaper(spec.options.kill_grace)
        runner = spec.runner(_WorkerRunner, cast(Slots, _control(spec.run_id, slots)))
        runner.durable_records = spec.options.executor != "dask-local"
        with _LOCK:
            runner = _RUNNERS.setdefault(spec.run_id, runner)
        # a worker that joined after the run's checks (_check_worker) gets its
        # leave guard now; the plugins dict is the event loop's
        worker.loop.add_callback(_guard, worker, spec.options.executor == "dask")
    return runner


#: how long each task's recent attempts took on this worker (seconds), by
#: run and task: a batch's handback threshold (crucible.run.executors._pipelined.handback_after)
_RECENT: dict[tuple[str, str], collections.deque[float]] = {}


def _recent(run_id: str, name: str) -> collections.deque[float]:
    with _LOCK:
        return _RECENT.setdefault((run_id, name), collections.deque(maxlen=RECENT))


def _run_batch(spec: _Spec, units: list[tuple[int, tuple[Any, ...]]]) -> Any:
    """On a worker: the attempts of one batch, one after another, each answered
    like a local worker's reply.

    Each answer travels as a worker event, which reaches the client ahead of
    the batch's completion (both go through the worker's one stream to the
    scheduler, in order, and on from there in order): the dispatcher never
    fetches a result from the worker (a round trip per unit). Once an attempt's
    task runs longer than the handback threshold, the attempts behind it are
    answered ``handback`` at once (nothing was staged for them). The future
    returns ``_SENT``, or the messages that could not be events."""
    # lazy: distributed is heavy; only _run_batch() needs it
    from distributed import get_worker

    worker = get_worker()
    kept: list[dict[str, Any]] = []

    def send(message: dict[str, Any]) -> None:
        message["run"] = spec.run_id
        try:
            worker.log_event(_EVENT_TOPIC, message)
        except TypeError:  # not msgpack-serialisable: the dispatcher fetches it
            kept.append(message)

    def answer_all(rest: list[tuple[int, tuple[Any, ...]]], answer: tuple[str, Any]) -> None:
        if rest:
            send({"finals": [[token, answer] for token, _ in rest]})

    try:
        runner = _runner(spec, worker)
        control = _control(spec.run_id)
    except BaseException:
        answer_all(units, ("bug", traceback.format_exc()))
        return kept or _SENT
    control.batch_began()
    try:
        _run_units(spec, units, runner, control, worker, send, answer_all)
    finally:
        control.batch_ended()
    return kept or _SENT  # nothing for Dask to size and keep


def _run_units(
    spec: _Spec,
    units: list[tuple[int, tuple[Any, ...]]],
    runner: UnitRunner,
    control: _Control,
    worker: Any,
    send: Callable[[dict[str, Any]], None],
    answer_all: Callable[[list[tuple[int, tuple[Any, ...]]], tuple[str, Any]], None],
) -> None:
    """:func:`_run_batch`'s loop (the batch counted on its run's control meanwhile)."""
    recent = _recent(spec.run_id, units[0][1][1])
    handed: list[bool] = []
    for index, (token, request) in enumerate(units):
        rest = units[index + 1 :]
        if control.stopped:  # queued here when the run stopped: nothing staged
            if control.closing or control.lost:
                # the worker leaves: the dispatcher starts them elsewhere; each is
                # claimed first, so a copy of this batch the scheduler sends to
                # another worker skips it (_claim)
                answer_all([u for u in units[index:] if _claim(spec, u[0])], _HANDBACK)
            else:
                answer_all(units[index:], _not_started())
            break
        if not _claim(spec, token):
            continue  # this batch was sent again: the worker that claimed it answers
        channel = _Channel(spec.run_id, token, control.hold_r, worker)

        def hand_back(rest: list[tuple[int, tuple[Any, ...]]] = rest) -> None:
            if not handed:  # the task runs long: the units behind it go elsewhere
                handed.append(True)
                answer_all([u for u in rest if _claim(spec, u[0])], _HANDBACK)

        if rest:
            with _LOCK:  # a copy: the worker's other threads append to it
                seen = collections.deque(recent)
            channel.pipeline = Pipeline(lambda: None, [], hand_back, handback_after(seen))
        began = time.monotonic()
        answer: tuple[str, Any]
        try:
            result = runner.run(request, channel)  # type: ignore[arg-type]
            if isinstance(result, dict):
                if control.lost:
                    result = _lost_answer(result, worker.address)
                result["worker"] = worker.address
            answer = ("ok", result)
            if control.closing and result.get("kind") in ("finished", "not_started"):
                # stopped by the worker's close, not by the run: a lost attempt
                answer = ("ok", {"kind": "worker_lost", "worker": worker.address})
        except CrucibleError as exc:
            answer = ("error", str(exc))
        except BaseException:
            answer = ("bug", traceback.format_exc())
        with _LOCK:
            recent.append(time.monotonic() - began)
        send({"token": token, "final": answer})
        if handed:
            break


def _claim(spec: _Spec, token: int) -> bool:
    """Whether this worker is the first to take ``token``'s unit. A worker that
    retires gracefully (dask-jobqueue's ``--lifetime``) has the scheduler send
    the batches it was running to another worker, whatever ``allowed-failures``
    says; the retiring worker stops and answers its units (_dask_close), so the
    copy must not run them again: each unit is claimed, on the shared state,
    before it is run or answered ``handback``, and a copy skips what is
    claimed (its answer comes from the worker that claimed it)."""
    if not spec.claims:
        return True
    path = os.path.join(spec.claims, str(token))
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except FileExistsError:
        return False
    return True


def _answers(messages: list[dict[str, Any]]) -> list[tuple[int, tuple[str, Any]]]:
    """The (token, answer) pairs of the messages a batch returned unsent."""
    out: list[tuple[int, tuple[str, Any]]] = []
    for message in messages:
        if "finals" in message:
            out.extend((int(token), (answer[0], answer[1])) for token, answer in message["finals"])
        elif "final" in message:
            answer = message["final"]
            out.append((int(message["token"]), (answer[0], answer[1])))
    return out


def _worker_signal(run_id: str, what: str) -> None:
    """On every worker (Client.run): stop or kill the run's units there."""
    control = _control(run_id)
    if what == "stop":
        control.stop()
    else:
        control.kill()


def stop_on_worker(run_id: str) -> None:
    """On a worker that closes (crucible.run.executors.dask._close): stop the run's units
    there, if any ran there (else nothing is created)."""
    with _LOCK:
        control = _CONTROLS.get(run_id)
    if control is not None:
        control.closing = True
        control.stop()


def _worker_forget(run_id: str) -> None:
    with _LOCK:
        _RUNNERS.pop(run_id, None)
        control = _CONTROLS.pop(run_id, None)
        for key in [k for k in _RECENT if k[0] == run_id]:
            del _RECENT[key]
    if control is not None:
        for fd in (control.stop_r, control.stop_w, control.kill_r, control.kill_w,
                   control.hold_r, control.hold_w):  # fmt: skip
            with contextlib.suppress(OSError):
                os.close(fd)


def _pack_file(pack_dir: str, plan: Path) -> tuple[str, int] | None:
    """What tells the pack directory from another at its path: the plan or
    manifest file read from it (name and size), if it was a file there."""
    path = os.path.abspath(plan)
    if str(plan) == "-" or os.path.dirname(path) != pack_dir:
        return None
    try:
        return os.path.basename(path), os.stat(path).st_size
    except OSError:
        return None


def _sees_pack(pack_dir: str, pack_file: tuple[str, int] | None) -> str | None:
    """On a worker: None if it sees the pack directory (and the file read
    there, of the same size), else why not."""
    if not os.path.isdir(pack_dir):
        return "not a directory there"
    if pack_file is None:
        return None
    name, size = pack_file
    try:
        seen = os.stat(os.path.join(pack_dir, name)).st_size
    except OSError as exc:
        return f"cannot read {name} there: {exc.strerror}"
    return None if seen == size else f"{name} there is another file"


def _check_worker(
    path: str,
    expected: str,
    version: str,
    pack_dir: str,
    pack_file: tuple[str, int] | None,
    on_signals: bool,
    dask_worker: Any = None,
) -> tuple[str, str] | None:
    """On every worker (Client.run, on its event loop): None if it runs the
    dispatcher's crucible version, reads the dispatcher's token in the state
    directory and sees the pack directory; else (what, why): ``version``,
    ``state`` or ``pack``. Also loads the unit code there now, before the run,
    not at its first unit, and installs the worker's leave guard."""
    # lazy: run.session._log is not loaded with this module; only _check_worker() needs it
    import crucible.run.session._log

    if crucible.__version__ != version:
        return ("version", f"runs crucible {crucible.__version__}, the dispatcher {version}")
    if dask_worker is not None:
        _guard(dask_worker, on_signals)
    try:
        with open(path, encoding="utf-8") as f:
            found = f.read()
    except OSError as exc:
        return ("state", f"cannot read {path}: {exc.strerror}")
    if found != expected:
        return ("state", f"{path} holds another run's token")
    if pack_dir and (why := _sees_pack(pack_dir, pack_file)) is not None:
        return ("pack", why)
    return None


# --------------------------------------------------------------- dispatcher side


def _local_resources() -> dict[str, float]:
    """What each ``dask-local`` worker offers: this machine's CPUs and memory."""
    offer: dict[str, float] = {"cpus": float(os.cpu_count() or 1)}
    with contextlib.suppress(ValueError, OSError, AttributeError):
        offer["memory"] = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return offer


def _check_resources(
    tasks: Mapping[str, Task], info: dict[str, Any]
) -> dict[str, dict[str, float]]:
    """Each task's Dask resources; refuse (exit 1) a task no worker can run."""
    offers = {addr: w.get("resources") or {} for addr, w in info.get("workers", {}).items()}
    out: dict[str, dict[str, float]] = {}
    for name, task in tasks.items():
        need: dict[str, float] = (
            dict(task.resources.amounts()) if task.resources is not None else {}
        )
        if not need:
            continue
        if not any(all(offer.get(r, 0) >= v for r, v in need.items()) for offer in offers.values()):
            wanted = ", ".join(f"{r}={_amount(r, v)}" for r, v in sorted(need.items()))
            short = [r for r, v in sorted(need.items())
                     if not any(o.get(r, 0) >= v for o in offers.values())]  # fmt: skip
            # a resource some worker offers, only not that much, says the most offered
            # ("no Dask worker offers memory" for 1000 TiB read as none offering any)
            most = {r: max((o.get(r, 0) for o in offers.values()), default=0) for r in short}
            parts = [
                f"no Dask worker offers {r}={_amount(r, need[r])} "
                f"(the most one offers: {_amount(r, most[r])})"
                if most[r] > 0
                else f"no Dask worker offers {r}"
                for r in short
            ]
            which = "; ".join(parts) or "no Dask worker offers that combination"
            raise InputRefused(f"task {name!r} needs resources {wanted}; {which}")
        out[name] = {r: float(v) for r, v in need.items()}
    return out


def _amount(resource: str, value: float) -> str:
    """A resource amount as people read it: memory in binary units (1000 TiB)."""
    if resource != "memory":
        return f"{value:g}"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{value:g} B"


def _absolute(options: RunOptions) -> RunOptions:
    """The options as a worker needs them: a worker's working directory is
    not the dispatcher's (and changes around each spawn)."""
    cache = None if options.cache is None else Path(os.path.abspath(options.cache))
    return replace(options, state=Path(os.path.abspath(options.state)), cache=cache)


@dataclass(frozen=True)
class LocalLayout:
    """How ``dask-local`` spreads ``-j N`` (docs/spec/run.md, "Executors")."""

    #: task processes each worker runs at once (its share of N, at least 1)
    slots: list[int]
    #: Dask threads per worker: its slots, plus threads that stage and
    #: capture the next units while the slots are busy
    threads: int
    #: batches the dispatcher keeps submitted and unfinished
    #: (crucible.run.executors.dask._batches)
    window: int


def local_layout(jobs: int, workers: int | None, threads: int | None) -> LocalLayout:
    """As the local executor: N slots, and min(N, 8) + 1 more units staged
    ahead, here split among the workers; and each worker's queue holds one
    more batch per thread, so a thread that finishes starts the next batch
    without a round trip to the scheduler and the dispatcher."""
    count = workers or max(1, min(jobs, os.cpu_count() or 1))
    slots = [max(1, jobs // count + (i < jobs % count)) for i in range(count)]
    ahead = -(-(min(jobs, 8) + 1) // count)  # ceil
    per_worker = threads or max(slots) + ahead
    return LocalLayout(slots=slots, threads=per_worker, window=2 * per_worker * count)


_DASK_LOGGERS = ("distributed", "tornado", "asyncio")


def _configure_dask() -> None:
    """Dask settings for a run: quiet, no silent reruns, no per-unit overhead."""
    # lazy: dask is heavy; only _configure_dask() needs it
    import dask

    # Dask's own logging would break the one-line stderr contract; its config
    # gave some loggers (distributed.client ...) levels of their own.
    names = [n for n in logging.root.manager.loggerDict if n.split(".")[0] in _DASK_LOGGERS]
    for name in [*_DASK_LOGGERS, *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # A lost worker's unit must not be rerun silently by the scheduler:
    # the dispatcher decides on retries (KilledWorker at once).
    dask.config.set({"distributed.scheduler.allowed-failures": 0})
    # Per-unit overhead (benchmarks/bench_dask.py): a worker's statistical
    # profiler samples every thread's stack every 10 ms, and work stealing
    # re-costs queued tasks every 100 ms on the scheduler (in this process
    # under dask-local); neither helps here, where a unit waits for its slot
    # inside its Dask task (not stealable) and the window bounds what is
    # queued. Both apply to what this process starts (dask-local).
    dask.config.set(
        {
            "distributed.worker.profile.enabled": False,
            "distributed.scheduler.work-stealing": False,
        }
    )


class DaskExecutor(BatchedSeam):
    """The :class:`crucible.run.executors._seam.Executor` on a Dask cluster."""

    def __init__(
        self,
        options: RunOptions,
        *,
        jobs: int,
        runner: UnitRunner,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        import_distributed()
        self.jobs = jobs
        self._warn = warn or (lambda _w: None)
        #: the units not sent yet and the batches in flight (the window: at
        #: most -j of them, or local_layout's for dask-local)
        self.batches = Batches(window=jobs)
        self._slots: dict[str, int] = {}
        self.run_id = secrets.token_hex(8)
        #: token -> its batch's future (None until sent)
        self._live: dict[int, Any] = {}
        #: started units, and the worker each started on
        self._started: dict[int, str] = {}
        #: started units' task pids (a unit answered from its record: _recorded)
        self._pids: dict[int, int] = {}
        self._state = options.state
        #: token -> its request, until its end (a unit whose spec was lost is sent again)
        self._requests: dict[int, tuple[Any, ...]] = {}
        self._resent: dict[int, int] = {}
        #: stop() or close() called: a cancelled unit is then one not started
        self._stopping = False
        #: the last worker seen lost (a unit cancelled with its spec names it)
        self._lost_worker = "unknown"
        self._queue: collections.deque[tuple[str, int, Any]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._cluster: Any = None
        #: dask-local's workers run on this host; a remote scheduler's may not
        self.pids_are_local = options.executor == "dask-local"
        self._client: Any = None
        self._scratch: str | None = None
        self._claims: Path | None = None
        self._closed = False
        #: the scheduler's address, and whether the connection to it was lost
        self._address = options.scheduler or "(dask-local)"
        self._lost = False
        self._watching = threading.Event()
        #: --follow: the units' logs tailed on the shared state (crucible.run.executors._log_tail)
        self._tailer: LogTailer | None = LogTailer() if options.follow else None
        self._log_path = runner.paths.log_path
        _configure_dask()
        try:
            if options.executor == "dask-local":
                self._start_local_cluster(options, jobs)
            else:
                self._connect(options)
            self._prepare_run(options, runner)
        except BaseException:
            self.close()
            raise
        watch = threading.Thread(target=self._watch_scheduler, name="crucible-dask-watch")
        watch.daemon = True
        watch.start()

    def _connected(self) -> bool:
        return cast(Any, self._client).status in ("running", "closing", "closed")

    def _watch_scheduler(self) -> None:
        """Mid-run, a lost connection to the scheduler ends the run at once
        (the client would retry for 30 s, then fail every future): the units'
        fate is unknown here, so none is counted (read raises ExecutorLost)."""
        while not self._watching.wait(_WATCH_SECONDS):
            if not self._connected():
                self._queue.append(("lost", 0, self._client.status))
                self._wake()
                return

    def _start_local_cluster(self, options: RunOptions, jobs: int) -> None:
        """dask-local: a cluster of worker processes on this host, every worker
        registered before the token and the spec go out."""
        # lazy: distributed is heavy; only _start_local_cluster() needs it
        from distributed import Client

        layout = local_layout(jobs, options.workers, options.threads_per_worker)
        self.batches.window = layout.window
        self._slots = {str(i): n for i, n in enumerate(layout.slots)}
        self._scratch = tempfile.mkdtemp(prefix="crucible-dask-")
        try:
            self._cluster = self._local_cluster(layout)
        except RuntimeError as exc:  # "Cluster failed to start", its cause attached
            cause = exc.__cause__ or exc
            raise OperationalError(f"cannot start the Dask local cluster: {cause}") from None
        self._client = cast(Any, Client)(self._cluster, timeout=CONNECT_TIMEOUT)
        # every worker, before the token and the spec go out: a worker
        # that registers later would prove nothing and hold no copy
        self._client.wait_for_workers(len(layout.slots), timeout=CONNECT_TIMEOUT)

    def _local_cluster(self, layout: LocalLayout) -> Any:
        # lazy: distributed is heavy; only _local_cluster() needs it
        from distributed import LocalCluster

        return cast(Any, LocalCluster)(
            n_workers=len(layout.slots),
            threads_per_worker=layout.threads,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            # the scheduler's HTTP server (health, metrics) still starts
            # without a dashboard, on 8787 by default: a port another
            # cluster may hold, and Dask then warns on our stderr
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            local_directory=self._scratch,
            silence_logs=logging.CRITICAL,
            resources=_local_resources(),
        )

    def _connect(self, options: RunOptions) -> None:
        """--executor dask: the scheduler at --scheduler, with a worker at least."""
        # lazy: distributed is heavy; only _connect() needs it
        from distributed import Client

        if not options.scheduler:
            raise UsageError("--executor dask needs --scheduler tcp://HOST:PORT")
        try:
            self._client = cast(Any, Client)(options.scheduler, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise OperationalError(
                f"cannot reach the Dask scheduler {options.scheduler}: {exc}"
            ) from None
        try:
            self._client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise OperationalError(
                f"the Dask scheduler {options.scheduler} has no worker"
            ) from None

    def _prepare_run(self, options: RunOptions, runner: UnitRunner) -> None:
        """Prove the workers see this state, check the tasks' resources, listen
        for the workers' events and scatter the run's spec."""
        self._prove_state(options.state, runner.pack_dir, options.plan)
        self._address = str(cast(Any, self._client).scheduler.address)
        if options.executor == "dask":  # dask-local's scheduler is set here (_configure_dask)
            self._warn_allowed_failures()
        self._claims = Path(os.path.abspath(options.state)) / ".dask" / self.run_id
        self._claims.mkdir(parents=True, exist_ok=True)
        self._resources = _check_resources(runner.tasks, self._client.scheduler_info())
        self._client.subscribe_topic(_EVENT_TOPIC, self._on_event)
        # a worker that closes mid-run (a batch system's walltime) stops its units
        from crucible.run.executors.dask._close import StopOnClose

        self._client.register_plugin(
            StopOnClose(self.run_id, stop_on_worker), name=f"crucible-close-{self.run_id}"
        )
        self._spec_value = _Spec(
            run_id=self.run_id,
            plan=runner.plan,
            model=runner.model,
            options=_absolute(options),
            emit_cap=runner.emit_cap,
            environ=dict(runner.environ),
            pack_dir=runner.pack_dir,
            slots=self._slots,
            claims=str(self._claims),
        )
        self._spec = self._scatter_spec()

    def _scatter_spec(self) -> Any:
        """The run's spec on every worker (one future the units depend on)."""
        return self._client.scatter(self._spec_value, broadcast=True, hash=False)

    def _prove_state(self, state: Path, pack_dir: str, plan: Path) -> None:
        """Every worker runs this crucible version, reads a token written here
        and sees the pack directory; refuse (exit 3) otherwise."""

        path = StateLayout(state).executor_token_path
        token = f"{socket.gethostname()} {os.getpid()} {self.run_id}\n"
        atomic.write_bytes(path, token.encode("utf-8"))
        answers = self._client.run(
            _check_worker, str(path), token, crucible.__version__, pack_dir,
            _pack_file(pack_dir, plan), self._cluster is None, on_error="return",
        )  # fmt: skip
        for address, problem in sorted(answers.items()):
            if isinstance(problem, BaseException):  # it could not even load crucible
                raise OperationalError(
                    f"Dask worker {address} cannot run crucible's code"
                    f" ({type(problem).__name__}: {problem}); install crucible"
                    f" {crucible.__version__} in the workers' environment, as here"
                )
            if problem is None:
                continue
            what, why = problem
            if what == "version":
                raise OperationalError(
                    f"Dask worker {address} {why}: install the same crucible version on"
                    " every worker"
                )
            place = "state" if what == "state" else "pack"
            raise OperationalError(
                f"Dask worker {address} cannot see the {place} directory ({why});"
                " it must be at the same path on every worker",
                where=str(path) if what == "state" else pack_dir,
            )

    def _warn_allowed_failures(self) -> None:
        """A scheduler that reruns a lost worker's task itself (its
        ``allowed-failures`` above 0) would do so behind the dispatcher's back."""
        with contextlib.suppress(Exception):
            allowed = self._client.run_on_scheduler(
                lambda dask_scheduler: dask_scheduler.allowed_failures
            )
            if allowed:
                self._warn(
                    f"the Dask scheduler {self._address} has allowed-failures {allowed}: it may"
                    " rerun a lost worker's unit behind the dispatcher's back; set"
                    " distributed.scheduler.allowed-failures to 0 there"
                )

    # ----------------------------------------------------- client-thread hooks

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _on_event(self, event: Any) -> None:
        _, message = event
        if isinstance(message, dict) and message.get("run") == self.run_id:
            if "finals" in message:
                for token, answer in message["finals"]:
                    self._queue.append(("final", int(token), answer))
            elif "final" in message:
                self._queue.append(("final", int(message["token"]), message["final"]))
            else:
                self._queue.append(("started", int(message["token"]), message))
            self._wake()

    def _on_done(self, tokens: list[int], future: Any) -> None:
        self._queue.append(("done", 0, (tokens, future)))
        self._wake()

    # ----------------------------------------------------------- the seam

    def flush(self) -> None:
        batched = {} if self._stopping else self.batches.take()
        if not batched:
            return
        if self._spec.status != "finished":
            # Scattered data lives only in workers' memory: a worker that died
            # holding the last copy took the spec with it (Dask then cancels
            # every unit waiting on it). Scatter it again for these units.
            self._spec = self._scatter_spec()
        for name, groups in batched.items():
            keys = [self._batch_key(name, group) for group in groups]
            futures = self._client.map(
                _run_batch,
                [self._spec] * len(groups),
                groups,
                key=keys,
                pure=False,
                resources=self._resources.get(name),
            )
            for key, group, future in zip(keys, groups, futures, strict=True):
                tokens = [token for token, _ in group]
                self.batches.sent(key, name, tokens)
                for token in tokens:
                    self._live[token] = future
                future.add_done_callback(lambda f, ts=tokens: self._on_done(ts, f))

    def _batch_key(self, name: str, group: list[tuple[int, tuple[Any, ...]]]) -> str:
        first = group[0][0]
        again = f"r{self._resent[first]}" if first in self._resent else ""
        return f"crucible-{name}-{self.run_id}-{first}x{len(group)}{again}"

    def read(self, fd: int) -> list[Reply]:
        self._drain_wake()
        replies: list[Reply] = []
        while self._queue:
            kind, token, value = self._queue.popleft()
            if kind == "lost" or (kind == "done" and not self._connected()):
                # the client fails every future once the connection is gone:
                # those ends say nothing of the units (their workers may finish them)
                self._lost = True
                raise ExecutorLost(
                    f"lost the Dask scheduler {self._address} mid-run (the connection closed);"
                    " the units in flight stay unsettled: resume with --resume"
                )
            if kind == "done":
                tokens, future = value
                for reply in self._ended(tokens, future):
                    self._settle(reply, replies)
                continue
            if token not in self._live:
                continue  # a start heard after its end, or an end heard twice
            if kind == "started":
                worker = str(value.get("worker") or self._lost_worker)
                if self._heard_start(token, worker, value, replies):
                    self._pids[token] = int(value.get("pid") or 0)
                continue
            outcome, payload = value
            self._settle(Reply(token, outcome, payload), replies)
        return replies

    def _settle(self, reply: Reply, replies: list[Reply]) -> None:
        """A token's final reply: it leaves its batch (and the batch the window,
        once no token of it is left)."""
        token = reply.token
        if token not in self._live:
            return
        if self._tailer is not None:  # the rest of its output, before its end
            self._tailer.finish(token)
        del self._live[token]
        self._requests.pop(token, None)
        self._resent.pop(token, None)
        self._started.pop(token, None)
        self._pids.pop(token, None)
        kind = reply.payload.get("kind") if isinstance(reply.payload, dict) else None
        ran = reply.payload.get("duration") if kind == "finished" else None
        self.batches.leave(token, handed_back=kind == "handback", ran=ran)
        replies.append(reply)

    def _ended(self, tokens: list[int], future: Any) -> list[Reply]:
        """The replies a batch future's end gives its tokens still without one
        (none while their answers are on their way as events)."""
        mine = [token for token in tokens if self._live.get(token) is future]
        if not mine:
            return []
        status = future.status
        if status == "finished":
            value = future.result()  # the rare path: fetched from the worker
            if value == _SENT:
                return []
            return [Reply(token, *answer) for token, answer in _answers(value)]
        if status == "cancelled":
            if self._stopping:
                return [Reply(t, *_not_started()) for t in mine]
            return [reply for t in mine if (reply := self._cancelled(t)) is not None]
        exc = future.exception()
        # lazy: distributed is heavy; only _ended() needs it
        from distributed import KilledWorker

        if isinstance(exc, KilledWorker):
            last = getattr(exc, "last_worker", None)
            address = getattr(last, "address", None) or "unknown"
            self._lost_worker = address
            return [
                self._recorded(t) or Reply(t, "ok", {"kind": "worker_lost", "worker": address})
                for t in mine
            ]
        return [Reply(t, "bug", f"{type(exc).__name__}: {exc}") for t in mine]

    def _cancelled(self, token: int) -> Reply | None:
        """A unit Dask cancelled while the run goes on: the spec it waited on
        was lost with a worker (nothing else here cancels one). Not started,
        it is sent again (at the next flush, with the spec scattered anew); one
        that started, or was sent again too often, is a lost-worker unit, so it
        is retried or fails under its task's policy (never left unsettled: a
        run that counts no failure would then say it failed)."""
        if (recorded := self._recorded(token)) is not None:
            return recorded
        tries = self._resent.get(token, 0)
        if token in self._started or tries >= _RESENDS:
            worker = self._started.get(token, self._lost_worker)
            return Reply(token, "ok", {"kind": "worker_lost", "worker": worker})
        self._resent[token] = tries + 1
        self._live[token] = None
        self.batches.again((token, self._requests[token]))
        return None

    def _recorded(self, token: int) -> Reply | None:
        """The answer of a unit whose batch ended without it (its worker left,
        the connection dropping its answer) although its attempt passed and
        wrote its record: that record's, so that no retry gives the unit a
        second passed record (docs/spec/run.md, "A lost worker")."""

        request = self._requests.get(token)
        if request is None:
            return None
        _, name, key, attempt = request[:4]
        try:
            record = stage.load_result(self._state, name, key)
        except (CrucibleError, OSError):
            return None
        if record is None or record.get("status") != "passed" or record.get("attempt") != attempt:
            return None
        summary = {k: record.get(k) for k in ("status", "note", "retryable", "files_captured")}
        if record.get("files_captured"):
            summary["files_bytes"] = sum(int(f.get("size", 0)) for f in record.get("files", []))
        return Reply(token, "ok", {
            "kind": "finished", "pid": self._pids.get(token, 0),
            "code": int(record.get("exit_code") or 0), "duration": None, "stop_reason": None,
            "staged_env": None, "record": summary,
            "worker": self._started.get(token, self._lost_worker),
        })  # fmt: skip

    def stop(self) -> None:
        self._stopping = True
        # what the window held back was never sent: not started
        self._queue.extend(("final", token, _not_started()) for token in self.batches.drain())
        self._wake()
        self._broadcast("stop")

    def kill(self) -> None:
        self._broadcast("kill")

    def _broadcast(self, what: str) -> None:
        if self._client is None or self._lost:  # no scheduler to reach the workers by
            return
        with contextlib.suppress(Exception):
            self._client.run(_worker_signal, self.run_id, what)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._watching.set()
        client = self._client
        if client is not None and self._lost:  # nothing to reach: drop the connection
            with contextlib.suppress(Exception):
                client.close(timeout=1)
        elif client is not None:
            if self._live:  # leaving early (an error): leave no task running
                self._broadcast("stop")
                self._broadcast("kill")
                with contextlib.suppress(Exception):
                    client.cancel(
                        list({id(f): f for f in self._live.values() if f is not None}.values())
                    )
            with contextlib.suppress(Exception):  # its teardown finds no control left
                client.run(_worker_forget, self.run_id)
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin(f"crucible-close-{self.run_id}")
            with contextlib.suppress(Exception):
                client.close(timeout=CONNECT_TIMEOUT)
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close(timeout=CONNECT_TIMEOUT)
        if self._tailer is not None:
            self._tailer.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if self._claims is not None:
            shutil.rmtree(self._claims, ignore_errors=True)
            with contextlib.suppress(OSError):  # the last run's: .dask goes too
                self._claims.parent.rmdir()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
