"""The Dask executor: each unit runs on a Dask worker through the same unit code.

The dispatcher keeps every scheduling decision; this module only submits one
future per unit attempt. On the worker, :func:`_run_unit` builds (once per run
and worker process) the same :class:`crucible.run.unit.UnitRunner` as the local
workers use, with worker-side stand-ins for the slot pipes (:class:`_Control`)
and the request channel (:class:`_Channel`), and runs the attempt: stage,
spawn, wait, capture. Completion comes back through a future callback, and a
task's start through a worker event; both run on the client's event-loop
thread, queue the reply and write one byte to a pipe the dispatcher's selector
watches. Stop and kill reach every worker by ``Client.run``.

Requires the state and pack directories at the same path on every worker
(each worker proves it by reading a token the dispatcher wrote). See
docs/run-on-a-cluster.md and docs/spec/run.md ("Executors").
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from crucible.core.errors import CrucibleError, InputRefused, OperationalError, UsageError
from crucible.run.options import RunOptions
from crucible.run.unit import Slots, UnitRunner
from crucible.run.workers import Reply

__all__ = ["INSTALL_HINT", "TOKEN_NAME", "DaskExecutor", "check_options", "import_distributed"]

INSTALL_HINT = "--executor dask needs Dask distributed: pip install 'crucible[dask]'"
#: the file under STATE each worker must read before the run starts
TOKEN_NAME = "executor-token"
#: bound on connecting to a scheduler and on its workers' first answer
CONNECT_TIMEOUT = 30.0
_EVENT_TOPIC = "crucible-unit"


def import_distributed() -> Any:
    """``distributed``, or a one-line usage error saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return distributed


def check_options(options: RunOptions) -> None:
    """At the command edge: Dask installed, and a scheduler for ``dask``."""
    import_distributed()
    if options.executor == "dask" and not options.scheduler:
        raise UsageError("--executor dask needs --scheduler tcp://HOST:PORT")
    if options.executor != "dask" and options.scheduler:
        raise UsageError("--scheduler needs --executor dask")


# ------------------------------------------------------------------ worker side


@dataclass(frozen=True)
class _Spec:
    """What a worker needs to build the run's UnitRunner (scattered once)."""

    run_id: str
    plan: dict[str, Any]
    tasks: dict[str, dict[str, Any]]
    options: RunOptions
    emit_cap: int
    environ: dict[str, str]
    pack_dir: str


class _Control:
    """Worker-side stand-in for :class:`crucible.run.unit.Slots`: the
    dispatcher bounds units in flight itself, so a slot is always there until
    the run stops; stop and kill are pipes the unit's wait polls, written by
    :func:`_worker_signal`."""

    def __init__(self) -> None:
        self.stop_r, self.stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.kill_r, self.kill_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # the request pipe stand-in: its write end stays open, so it never hangs up
        self.hold_r, self.hold_w = os.pipe2(os.O_CLOEXEC)
        self.stopped = False

    def acquire(self, requests_fd: int) -> bool:
        return not self.stopped

    def release(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(BlockingIOError):
            os.write(self.stop_w, b"s")

    def kill(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.kill_w, b"k")


class _Channel:
    """Worker-side stand-in for :class:`crucible.run.workers.Channel`: the
    interim "started" reply travels as a worker event."""

    def __init__(self, run_id: str, token: int, requests_fd: int, worker: Any) -> None:
        self.run_id = run_id
        self.token = token
        self.requests_fd = requests_fd
        self._worker = worker

    def send(self, payload: Any) -> None:
        message = {"run": self.run_id, "token": self.token, **payload}
        message["worker"] = self._worker.address
        self._worker.log_event(_EVENT_TOPIC, message)


_LOCK = threading.Lock()
_CONTROLS: dict[str, _Control] = {}
_RUNNERS: dict[str, UnitRunner] = {}


def _control(run_id: str) -> _Control:
    with _LOCK:
        control = _CONTROLS.get(run_id)
        if control is None:
            control = _CONTROLS[run_id] = _Control()
        return control


def _runner(spec: _Spec) -> UnitRunner:
    with _LOCK:
        runner = _RUNNERS.get(spec.run_id)
    if runner is None:
        runner = UnitRunner(
            plan=spec.plan,
            tasks=spec.tasks,
            # the worker's own stdout is nobody's terminal
            options=replace(spec.options, follow=False),
            emit_cap=spec.emit_cap,
            environ=spec.environ,
            slots=cast(Slots, _control(spec.run_id)),
            pack_dir=spec.pack_dir,
        )
        with _LOCK:
            runner = _RUNNERS.setdefault(spec.run_id, runner)
    return runner


def _run_unit(spec: _Spec, token: int, request: tuple[Any, ...]) -> tuple[str, Any]:
    """On a worker: one attempt of one unit, answered like a local worker's reply."""
    from distributed import get_worker

    worker = get_worker()
    try:
        runner = _runner(spec)
        channel = _Channel(spec.run_id, token, _control(spec.run_id).hold_r, worker)
        result = runner.run(request, channel)  # type: ignore[arg-type]
        if isinstance(result, dict):
            result["worker"] = worker.address
        return ("ok", result)
    except CrucibleError as exc:
        return ("error", str(exc))
    except BaseException:
        return ("bug", traceback.format_exc())


def _worker_signal(run_id: str, what: str) -> None:
    """On every worker (Client.run): stop or kill the run's units there."""
    control = _control(run_id)
    if what == "stop":
        control.stop()
    else:
        control.kill()


def _worker_forget(run_id: str) -> None:
    with _LOCK:
        _RUNNERS.pop(run_id, None)
        control = _CONTROLS.pop(run_id, None)
    if control is not None:
        for fd in (control.stop_r, control.stop_w, control.kill_r, control.kill_w,
                   control.hold_r, control.hold_w):  # fmt: skip
            with contextlib.suppress(OSError):
                os.close(fd)


def _check_token(path: str, expected: str) -> str | None:
    """On every worker (Client.run): None if it reads the dispatcher's token."""
    try:
        with open(path, encoding="utf-8") as f:
            found = f.read()
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    if found != expected:
        return f"{path} holds another run's token"
    return None


# --------------------------------------------------------------- dispatcher side


def _local_resources() -> dict[str, float]:
    """What each ``dask-local`` worker offers: this machine's CPUs and memory."""
    offer: dict[str, float] = {"cpus": float(os.cpu_count() or 1)}
    with contextlib.suppress(ValueError, OSError, AttributeError):
        offer["memory"] = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return offer


def _check_resources(tasks: Any, info: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each task's Dask resources; refuse (exit 1) a task no worker can run."""
    offers = {addr: w.get("resources") or {} for addr, w in info.get("workers", {}).items()}
    out: dict[str, dict[str, float]] = {}
    for name, task in tasks.items():
        need = task.get("resources") or {}
        if not need:
            continue
        if not any(all(offer.get(r, 0) >= v for r, v in need.items()) for offer in offers.values()):
            wanted = ", ".join(f"{r}={v}" for r, v in sorted(need.items()))
            short = [r for r, v in sorted(need.items())
                     if not any(o.get(r, 0) >= v for o in offers.values())]  # fmt: skip
            which = ", ".join(short) if short else "that combination"
            raise InputRefused(
                f"task {name!r} needs resources {wanted}; no Dask worker offers {which}"
            )
        out[name] = {r: float(v) for r, v in need.items()}
    return out


class DaskExecutor:
    """The :class:`crucible.run.executor.Executor` on a Dask cluster."""

    def __init__(self, options: RunOptions, *, jobs: int, runner: UnitRunner) -> None:
        import_distributed()
        import dask
        import distributed

        # Dask's API is untyped: held as Any at this edge.
        Client: Any = distributed.Client
        LocalCluster: Any = distributed.LocalCluster

        self.jobs = jobs
        self.run_id = secrets.token_hex(8)
        self._live: dict[int, Any] = {}
        self._started: set[int] = set()
        self._queue: collections.deque[tuple[str, int, Any]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._cluster: Any = None
        self._client: Any = None
        self._scratch: str | None = None
        self._closed = False
        # Dask's own logging would break the one-line stderr contract.
        for name in ("distributed", "tornado"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        # A lost worker's unit must not be rerun silently by the scheduler:
        # the dispatcher decides on retries (KilledWorker at once).
        dask.config.set({"distributed.scheduler.allowed-failures": 0})
        try:
            if options.executor == "dask-local":
                workers = options.workers or max(1, min(jobs, os.cpu_count() or 1))
                self._scratch = tempfile.mkdtemp(prefix="crucible-dask-")
                self._cluster = LocalCluster(
                    n_workers=workers,
                    threads_per_worker=options.threads_per_worker,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    local_directory=self._scratch,
                    silence_logs=logging.CRITICAL,
                    resources=_local_resources(),
                )
                self._client = Client(self._cluster, timeout=CONNECT_TIMEOUT)
            else:
                if not options.scheduler:
                    raise UsageError("--executor dask needs --scheduler tcp://HOST:PORT")
                try:
                    self._client = Client(options.scheduler, timeout=CONNECT_TIMEOUT)
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
            self._prove_state(options.state)
            self._resources = _check_resources(runner.tasks, self._client.scheduler_info())
            self._client.subscribe_topic(_EVENT_TOPIC, self._on_event)
            self._spec = self._client.scatter(
                _Spec(
                    run_id=self.run_id,
                    plan=runner.plan,
                    tasks=dict(runner.tasks),
                    options=options,
                    emit_cap=runner.emit_cap,
                    environ=dict(runner.environ),
                    pack_dir=runner.pack_dir,
                ),
                broadcast=True,
                hash=False,
            )
        except BaseException:
            self.close()
            raise

    def _prove_state(self, state: Path) -> None:
        """Every worker reads a token written here; refuse (exit 3) otherwise."""
        from crucible.core import atomic

        path = state / TOKEN_NAME
        token = f"{socket.gethostname()} {os.getpid()} {self.run_id}\n"
        atomic.write_bytes(path, token.encode("utf-8"))
        answers = self._client.run(_check_token, str(path), token)
        for address, problem in sorted(answers.items()):
            if problem is not None:
                raise OperationalError(
                    f"{path}: Dask worker {address} cannot see the state directory"
                    f" ({problem}); it must be at the same path on every worker"
                )

    # ----------------------------------------------------- client-thread hooks

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    def _on_event(self, event: Any) -> None:
        _, message = event
        if isinstance(message, dict) and message.get("run") == self.run_id:
            self._queue.append(("started", int(message["token"]), message))
            self._wake()

    def _on_done(self, token: int, future: Any) -> None:
        self._queue.append(("done", token, future))
        self._wake()

    # ----------------------------------------------------------- the seam

    @property
    def peak_rss_kib(self) -> int:
        return 0  # no local helper processes (the workers are the cluster's)

    @property
    def reply_fds(self) -> list[int]:
        return [self._wake_r]

    @property
    def in_flight(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> int:
        return max(0, self.jobs - len(self._live))

    def submit(self, token: int, request: tuple[Any, ...]) -> None:
        name = request[1]
        future = self._client.submit(
            _run_unit,
            self._spec,
            token,
            request,
            key=f"crucible-{name}-{self.run_id}-{token}",
            pure=False,
            resources=self._resources.get(name),
        )
        self._live[token] = future
        future.add_done_callback(lambda f, t=token: self._on_done(t, f))

    def read(self, fd: int) -> list[Reply]:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        replies: list[Reply] = []
        while self._queue:
            kind, token, value = self._queue.popleft()
            if token not in self._live:
                continue  # a start heard after its end
            if kind == "started":
                if token not in self._started:
                    self._started.add(token)
                    replies.append(Reply(token, "interim", value))
                continue
            del self._live[token]
            self._started.discard(token)
            replies.append(self._final(token, value))
        return replies

    def _final(self, token: int, future: Any) -> Reply:
        status = future.status
        if status == "finished":
            outcome, payload = future.result()
            return Reply(token, outcome, payload)
        if status == "cancelled":
            return Reply(token, "ok", {"kind": "not_started", "staged_env": None})
        exc = future.exception()
        from distributed import KilledWorker

        if isinstance(exc, KilledWorker):
            last = getattr(exc, "last_worker", None)
            address = getattr(last, "address", None) or "unknown"
            return Reply(token, "ok", {"kind": "worker_lost", "worker": address})
        return Reply(token, "bug", f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._broadcast("stop")

    def kill(self) -> None:
        self._broadcast("kill")

    def _broadcast(self, what: str) -> None:
        if self._client is None:
            return
        with contextlib.suppress(Exception):
            self._client.run(_worker_signal, self.run_id, what)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        client = self._client
        if client is not None:
            if self._live:  # leaving early (an error): leave no task running
                self._broadcast("stop")
                self._broadcast("kill")
                with contextlib.suppress(Exception):
                    client.cancel(list(self._live.values()))
            with contextlib.suppress(Exception):
                client.run(_worker_forget, self.run_id)
            with contextlib.suppress(Exception):
                client.close(timeout=CONNECT_TIMEOUT)
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close(timeout=CONNECT_TIMEOUT)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
