"""The SLURM executor (``--executor slurm``): a task's ready units go to the
cluster as one job array, each element a batch of units that the node runs
through the same unit code as the local and Dask workers
(crucible.run.executors.slurm._node), against the shared state directory.

The dispatcher keeps every scheduling decision, as with Dask: which units
are ready, retries, caps, resume. This module only

- groups the units submitted in one round of the dispatcher's loop into
  batches (crucible.run.executors.dask._batches: at most ``-j`` array elements in flight,
  at most 8 units per element) and sends each task's batches as one
  ``sbatch --parsable --array=0-K`` (one controller round trip per task and
  round, not one per unit); resources map to ``--cpus-per-task``, ``--mem``
  and ``--gres=gpu:N``, timeouts to ``--time`` (plus MARGIN);
- hears what the elements answer: a poller thread reads ``RUN_DIR/replies``
  every SCAN_EVERY seconds (a directory listing on the shared state, no
  SLURM call) and calls ``squeue`` once per SQUEUE_EVERY seconds for the whole
  run (never one call per unit); an element gone from ``squeue`` in two
  snapshots in a row with units still unanswered is looked up with ``scontrol
  show job`` (no ``sacct`` where accounting is off) and its unanswered units
  are answered for it: the one it was running is a lost attempt
  (``worker_lost``, retried under the task's policy by the dispatcher), or a
  failure when SLURM killed it for exceeding ``--mem`` (the note quotes SLURM's
  line), and the ones behind it are handed back (not started);
- stops: ``scancel`` of every job of the run (SIGTERM, so the node stops its
  task as a local stop does), and on close waits until ``squeue`` lists none.

A resume first cancels the jobs an earlier session left in the queue
(``STATE/slurm/jobs``) and waits until they are gone: no unit starts while a
job that may run it still exists. See docs/spec/run.md ("SLURM") and
docs/run-on-a-cluster.md.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import pickle
import secrets
import shlex
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import crucible
from crucible.core import atomic
from crucible.core.errors import InputRefused, OperationalError, UsageError
from crucible.core.plan import Resources, Task
from crucible.core.structs import replace
from crucible.run._options import RunOptions
from crucible.run.executors._batched_seam import BatchedSeam
from crucible.run.executors._log_tail import LogTailer
from crucible.run.executors._pipelined import RECENT
from crucible.run.executors._unit import UnitRunner
from crucible.run.executors._workers import Reply
from crucible.run.executors.dask._batches import Batches
from crucible.run.executors.slurm._cli import Partition, SlurmCommands, extra_args
from crucible.run.executors.slurm._node import NodeSpec
from crucible.stage import StateLayout

__all__ = [
    "MARGIN",
    "RUNNER_MEMORY",
    "SCAN_EVERY",
    "SQUEUE_EVERY",
    "SlurmExecutor",
    "check_options",
]

#: the poller's look at the replies directory (seconds; no SLURM call)
SCAN_EVERY = 0.1
#: at most one squeue call per this many seconds, for the whole run
SQUEUE_EVERY = 1.0
#: added to a batch's summed timeouts for --time: the node's Python start,
#: staging and capture, which the task's own timeout does not cover
MARGIN = 120
#: added to a task's ``memory`` for --mem: the unit runner's own Python on the
#: node, which SLURM counts in the job's memory
RUNNER_MEMORY = 256 * 1024 * 1024
#: consecutive failed squeue calls (one per SQUEUE_EVERY) before the run stops, exit 3
_POLL_FAILURES = 30
#: how long close() waits for cancelled jobs to leave the queue, and a resume
#: for an earlier session's jobs
_GONE_WAIT = 60.0
#: SLURM states of an element that a run never reruns silently: a lost attempt
_LOST = ("NODE_FAIL", "PREEMPTED", "CANCELLED", "BOOT_FAIL", "DEADLINE", "TIMEOUT", "FAILED")


def _slurm_root(state: Path) -> Path:
    return state / "slurm"


def check_options(options: RunOptions) -> None:
    """At the command edge, before the state directory is touched: the flags
    agree, sbatch is there, the controller answers, the partition exists."""
    if options.scheduler:
        raise UsageError("--scheduler needs --executor dask")
    extra_args(options.slurm_extra)
    commands = SlurmCommands()
    for program in ("sbatch", "squeue", "scancel", "scontrol"):
        if shutil.which(program) is None:
            raise UsageError(
                f"--executor slurm: {program} not found on PATH (SLURM's client commands)"
            )
    _partition(commands.partitions(), options.slurm_partition)


def _partition(partitions: list[Partition], name: str | None) -> list[Partition]:
    """The node configurations jobs go to: --slurm-partition's, else the default's."""
    if name:
        chosen = [p for p in partitions if p.name == name]
        if not chosen:
            known = ", ".join(sorted({p.name for p in partitions})) or "none"
            raise UsageError(f"--slurm-partition {name}: no such partition (sinfo lists: {known})")
        return chosen
    return [p for p in partitions if p.default] or partitions


def _resource_args(name: str, task: Task, offers: list[Partition], where: str) -> list[str]:
    """A task's sbatch resource options; refuse (exit 1) what no node offers."""
    need = task.resources or Resources()
    # what a task that asks for none is given: one CPU, the node's memory, no GPU
    cpus = 1 if need.cpus is None else need.cpus
    gpus = 0 if need.gpu is None else need.gpu
    memory = need.memory
    mem_mib = None if memory is None else math.ceil((memory + RUNNER_MEMORY) / (1 << 20))
    fits = [
        p for p in offers
        if p.cpus >= cpus and (mem_mib is None or p.memory_mib >= mem_mib) and p.gpus >= gpus
    ]  # fmt: skip
    if not fits:
        short = []
        if not any(p.cpus >= cpus for p in offers):
            short.append(f"cpus={cpus} (largest node: {max((p.cpus for p in offers), default=0)})")
        if mem_mib is not None and not any(p.memory_mib >= mem_mib for p in offers):
            top = max((p.memory_mib for p in offers), default=0)
            short.append(f"memory={mem_mib} MiB with the runner's (largest node: {top} MiB)")
        if gpus and not any(p.gpus >= gpus for p in offers):
            short.append(f"gpu={gpus} (most on a node: {max((p.gpus for p in offers), default=0)})")
        which = "; ".join(short) or "that combination"
        raise InputRefused(f"task {name!r} needs resources no node of {where} offers: {which}")
    args = [f"--cpus-per-task={cpus}"]
    if mem_mib is not None:
        args.append(f"--mem={mem_mib}M")
    if gpus:
        args.append(f"--gres=gpu:{gpus}")
    return args


def time_limit(timeout: float | None, units: int) -> str | None:
    """--time for an element of ``units`` units of a task with ``timeout``:
    their timeouts summed plus MARGIN, in whole minutes (SLURM's unit)."""
    if timeout is None:
        return None
    return str(math.ceil((float(timeout) * units + MARGIN) / 60))


class SlurmExecutor(BatchedSeam):
    """The :class:`crucible.run.executors._seam.Executor` on a SLURM cluster."""

    #: the pids in "started" replies are the nodes'
    pids_are_local = False

    def __init__(self, options: RunOptions, *, jobs: int, runner: UnitRunner) -> None:
        self.commands = SlurmCommands()
        self.options = options
        self.batches = Batches(window=jobs)
        self.run_id = secrets.token_hex(6)
        self.job_name = f"crucible-{self.run_id}"
        self.root = _slurm_root(Path(os.path.abspath(options.state)))
        self.run_dir = self.root / self.run_id
        self.replies = self.run_dir / "replies"
        self.jobs_file = self.root / "jobs"
        #: token -> its element ("JOB_INDEX"; None until sent)
        self._live: dict[int, str | None] = {}
        self._requests: dict[int, tuple[Any, ...]] = {}
        #: element -> its tokens, in the order the node runs them
        self._elements: dict[str, list[int]] = {}
        #: element -> when its sbatch returned (monotonic)
        self._sent_at: dict[str, float] = {}
        #: element -> consecutive squeue snapshots without it
        self._absent: dict[str, int] = {}
        self._started: dict[int, str] = {}
        self._recent: dict[str, collections.deque[float]] = {}
        self._jobs: set[str] = set()
        self._tags = 0
        self._stopping = False
        self._closed = False
        self._cancelled = False
        self._poll_failures = 0
        self._queue: collections.deque[tuple[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._tailer: LogTailer | None = LogTailer() if options.follow else None
        self._log_path = runner.paths.log_path
        self._extra = extra_args(options.slurm_extra)
        try:
            self._settle_earlier_jobs()
            where = (
                f"SLURM partition {options.slurm_partition!r}"
                if options.slurm_partition
                else "the default SLURM partition"
            )
            offers = _partition(self.commands.partitions(), options.slurm_partition)
            self._task_args = {
                name: _resource_args(name, task, offers, where)
                for name, task in runner.tasks.items()
            }
            self._prepare(options, runner)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._poll, name="crucible-slurm", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- start-up

    def _settle_earlier_jobs(self) -> None:
        """An earlier session's jobs still queued or running (its dispatcher
        died): cancel them and wait until they are gone, before any unit starts."""
        try:
            names = set(self.jobs_file.read_text(encoding="utf-8").split())
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OperationalError(f"cannot read {self.jobs_file}: {exc.strerror}") from None
        if not names:
            return
        deadline = time.monotonic() + _GONE_WAIT
        for name in sorted(names):
            queued = self.commands.squeue(name)
            if queued:
                self.commands.scancel(sorted({e.split("_")[0] for e in queued}))
            while queued:
                if time.monotonic() > deadline:
                    raise OperationalError(
                        f"SLURM jobs {', '.join(sorted(queued))} of an earlier session"
                        f" (named {name}) are still in the queue after scancel;"
                        " resume once squeue no longer lists them"
                    )
                time.sleep(0.5)
                queued = self.commands.squeue(name)
        for name in names:  # their run directories: nothing reads them any more
            shutil.rmtree(self.root / name.removeprefix("crucible-"), ignore_errors=True)
        self.jobs_file.unlink(missing_ok=True)

    def _prepare(self, options: RunOptions, runner: UnitRunner) -> None:
        """The token the nodes read back, the run's spec and its job script."""

        (self.run_dir / "jobs").mkdir(parents=True, exist_ok=True)
        self.replies.mkdir(exist_ok=True)
        token = f"{socket.gethostname()} {os.getpid()} {self.run_id}\n"
        atomic.write_bytes(StateLayout(options.state).executor_token_path, token.encode("utf-8"))
        absolute = replace(
            options,
            state=Path(os.path.abspath(options.state)),
            cache=None if options.cache is None else Path(os.path.abspath(options.cache)),
            follow=False,
            progress=False,
        )
        self._spec = NodeSpec(
            run_id=self.run_id,
            plan=runner.plan,
            model=runner.model,
            options=absolute,
            emit_cap=runner.emit_cap,
            environ=dict(runner.environ),
            pack_dir=runner.pack_dir,
            token=token,
            version=crucible.__version__,
            python=(sys.version_info[0], sys.version_info[1]),
        )
        atomic.write_bytes(self.run_dir / "spec.pickle", pickle.dumps(self._spec, protocol=5))
        script = (
            "#!/bin/sh\n# crucible --executor slurm: one array element (crucible.run.executors.slurm._node)\n"
            f"exec {shlex.quote(sys.executable)} -m crucible.run.executors.slurm._node"
            f' {shlex.quote(str(self.run_dir))} "$1"\n'
        )
        atomic.write_bytes(self.run_dir / "job.sh", script.encode("utf-8"), mode=0o755)

    # --------------------------------------------------------- poller thread

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _scan(self) -> bool:
        """Queue every reply file there is (read, then removed)."""
        try:
            names = [e.name for e in os.scandir(self.replies)]
        except OSError:
            return False
        found = False
        for name in sorted(names):
            stem, _, kind = name.rpartition(".")
            if kind not in ("final", "started") and not name.startswith("check."):
                continue  # a file being written (atomic's temp name)
            path = self.replies / name
            try:
                with open(path, "rb") as f:
                    value = pickle.load(f)
                os.unlink(path)
            except (OSError, EOFError, pickle.UnpicklingError):
                continue
            if name.startswith("check."):
                self._queue.append(("check", value))
            else:
                self._queue.append((kind, (int(stem), value)))
            found = True
        return found

    def _poll(self) -> None:
        """The poller thread: replies every SCAN_EVERY, squeue every SQUEUE_EVERY."""
        next_squeue = time.monotonic() + SQUEUE_EVERY
        while not self._done.wait(SCAN_EVERY):
            found = self._scan()
            now = time.monotonic()
            with self._lock:
                watched = bool(self._elements)
            if watched and now >= next_squeue:
                next_squeue = now + SQUEUE_EVERY
                asked = time.monotonic()
                try:
                    present: Any = self.commands.squeue(self.job_name)
                except Exception as exc:
                    present = exc
                # replies written before an element left the queue are read first
                self._scan()
                self._queue.append(("squeue", (asked, present)))
                found = True
            if found:
                self._wake()

    # ----------------------------------------------------------- the seam

    def flush(self) -> None:
        batched = {} if self._stopping else self.batches.take()
        if not batched:
            return
        for name, groups in batched.items():
            # the task's recent durations: the element's handback threshold
            recent = list(self._recent.get(name, ()))
            self._tags += 1
            tag = f"{self._tags}"
            directory = self.run_dir / "jobs" / tag
            directory.mkdir()
            for index, group in enumerate(groups):
                with open(directory / f"{index}.units", "wb") as f:
                    pickle.dump({"units": group, "recent": recent}, f, protocol=5)
            job = self._sbatch(name, tag, groups)
            now = time.monotonic()
            with self._lock:
                for index, group in enumerate(groups):
                    element = f"{job}_{index}"
                    tokens = [token for token, _ in group]
                    self._elements[element] = tokens
                    self._sent_at[element] = now
                    self.batches.sent(element, name, tokens)
                    for token in tokens:
                        self._live[token] = element

    def _sbatch(self, name: str, tag: str, groups: list[list[tuple[int, Any]]]) -> str:
        task = self._spec.model.by_name[name]
        args = [
            f"--array=0-{len(groups) - 1}",
            f"--job-name={self.job_name}",
            f"--output={self.run_dir}/out/%A_%a.out",
            "--ntasks=1",
            *self._task_args[name],
        ]
        limit = time_limit(task.timeout, max(len(g) for g in groups))
        if limit is not None:
            args.append(f"--time={limit}")
        for flag, value in (
            ("--partition", self.options.slurm_partition),
            ("--account", self.options.slurm_account),
            ("--qos", self.options.slurm_qos),
        ):
            if value:
                args.append(f"{flag}={value}")
        (self.run_dir / "out").mkdir(exist_ok=True)
        args += [*self._extra, str(self.run_dir / "job.sh"), tag]
        job = self.commands.sbatch(args)
        self._jobs.add(job)
        self._remember_job()
        return job

    def _remember_job(self) -> None:
        """``STATE/slurm/jobs``: the job names a resume must see gone first."""

        names = set()
        with contextlib.suppress(FileNotFoundError):
            names = set(self.jobs_file.read_text(encoding="utf-8").split())
        if self.job_name not in names:
            names.add(self.job_name)
            atomic.write_bytes(self.jobs_file, "".join(f"{n}\n" for n in sorted(names)).encode())

    def read(self, fd: int) -> list[Reply]:
        self._drain_wake()
        replies: list[Reply] = []
        while self._queue:
            kind, value = self._queue.popleft()
            if kind == "check":
                raise OperationalError(str(value))
            if kind == "squeue":
                asked, present = value
                self._snapshot(asked, present, replies)
                continue
            token, payload = value
            if token not in self._live:
                continue
            if kind == "started":
                self._heard_start(token, str(payload.get("worker")), payload, replies)
                continue
            outcome, result = payload
            reply = self._cluster_stop(token, outcome, result)
            if reply is not None:
                self._settle(reply, replies)
        return replies

    def _cluster_stop(self, token: int, outcome: str, result: Any) -> Reply | None:
        """A node's answer, unless the cluster stopped its job while the run
        goes on (scancel by someone else, preemption, the walltime): then its
        running unit is a lost attempt and the units it did not start go back."""
        kind = result.get("kind") if isinstance(result, dict) else None
        if self._stopping or outcome != "ok":
            return Reply(token, outcome, result)
        if kind == "not_started":
            return Reply(token, "ok", {"kind": "handback", "staged_env": None})
        if kind == "finished" and result.get("slurm_signalled"):
            return None  # answered once its job left the queue, with SLURM's final state (_ended)
        return Reply(token, outcome, result)

    def _settle(self, reply: Reply, replies: list[Reply]) -> None:
        token = reply.token
        element = self._live.pop(token, None)
        if self._tailer is not None:
            self._tailer.finish(token)
        request = self._requests.pop(token, None)
        self._started.pop(token, None)
        payload = reply.payload
        kind = payload.get("kind") if isinstance(payload, dict) else None
        ran = payload.get("duration") if kind == "finished" else None
        if ran is not None and request is not None:
            recent = self._recent.setdefault(request[1], collections.deque(maxlen=RECENT))
            recent.append(float(ran))
        self.batches.leave(token, handed_back=kind == "handback", ran=ran)
        if element is not None:
            with self._lock:
                tokens = self._elements.get(element)
                if tokens is not None and token in tokens:
                    tokens.remove(token)
                    if not tokens:
                        self._forget(element)
        replies.append(reply)

    def _forget(self, element: str) -> None:
        del self._elements[element]
        self._sent_at.pop(element, None)
        self._absent.pop(element, None)

    def _snapshot(self, asked: float, present: Any, replies: list[Reply]) -> None:
        """One squeue answer: elements gone twice in a row answer for their units."""
        if isinstance(present, BaseException):
            self._poll_failures += 1
            if self._poll_failures >= _POLL_FAILURES:
                raise OperationalError(f"{present} ({_POLL_FAILURES} times in a row)")
            return
        self._poll_failures = 0
        with self._lock:
            watched = [e for e, at in self._sent_at.items() if at <= asked]
        for element in watched:
            if element in present:
                self._absent.pop(element, None)
                continue
            self._absent[element] = self._absent.get(element, 0) + 1
            if self._absent[element] >= 2:
                self._ended(element, replies)

    def _ended(self, element: str, replies: list[Reply]) -> None:
        """An element left the queue with units unanswered: the first is the one
        it was running (a lost attempt, or a failure past --mem), the ones
        behind it were never started."""
        with self._lock:
            tokens = list(self._elements.get(element, ()))
        if not tokens:
            return
        if self._stopping:
            for token in tokens:
                self._settle(
                    Reply(token, "ok", {"kind": "not_started", "staged_env": None}), replies
                )
            return
        shown = self.commands.show_job(element)
        state, reason = shown if shown is not None else ("VANISHED", "None")
        said = self._slurm_lines(element)
        if (
            not said
            and state == "COMPLETED"
            and not (self.run_dir / "out").joinpath(f"{element}.out").exists()
        ):
            raise OperationalError(
                f"SLURM job {element} ended without a word in {self.run_dir}: the state"
                " directory must be at the same path on every node"
            )
        first, *rest = tokens
        memory = [line for line in said if "memory limit" in line]
        detail = f" ({reason})" if reason not in ("None", "") else ""
        if memory or state == "OUT_OF_MEMORY":
            line = memory[0] if memory else "exceeded its --mem"
            note = f"SLURM job {element} {state}{detail}: {line}"
            self._settle(Reply(first, "error", note), replies)
        else:
            last = f": {said[-1]}" if said else ""
            worker = f"SLURM job {element} {state}{detail}{last}"
            self._settle(Reply(first, "ok", {"kind": "worker_lost", "worker": worker}), replies)
        for token in rest:  # never started there: the dispatcher starts them again
            self._settle(Reply(token, "ok", {"kind": "handback", "staged_env": None}), replies)

    def _slurm_lines(self, element: str) -> list[str]:
        """What SLURM (slurmstepd) and the node wrote to the element's output."""
        path = self.run_dir / "out" / f"{element}.out"
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        lines = []
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("slurmstepd"):
                line = line.split("error:", 1)[-1].strip()
            if line and not line.startswith("***"):
                lines.append(line)
        return lines

    def stop(self) -> None:
        self._stopping = True
        for token in self.batches.drain():  # never sent: not started
            self._queue.append(
                ("final", (token, ("ok", {"kind": "not_started", "staged_env": None})))
            )
        self._wake()
        self._cancel(graceful=True)

    def _cancel(self, *, kill: bool = False, graceful: bool = False) -> None:
        with self._lock:
            jobs = sorted({e.split("_")[0] for e in self._elements})
        if jobs:
            self._cancelled = True
            with contextlib.suppress(OperationalError, UsageError):
                if graceful:
                    self.commands.stop(jobs)
                else:
                    self.commands.scancel(jobs, kill=kill)

    def kill(self) -> None:
        self._cancel(kill=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            left = bool(self._elements)
        if left:  # leaving early (an error): leave no job behind
            self._cancel()
        if self._cancelled or left:
            self._wait_gone()
        else:  # every element answered for all its units
            self._cleanup()
        if self._tailer is not None:
            self._tailer.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wait_gone(self) -> None:
        """Until squeue lists none of the run's jobs (bounded); then the run's
        directory and its line in STATE/slurm/jobs go."""
        deadline = time.monotonic() + _GONE_WAIT
        while time.monotonic() < deadline:
            try:
                if not self.commands.squeue(self.job_name):
                    break
            except (OperationalError, UsageError):
                return
            time.sleep(0.25)
        else:
            return  # still queued: a resume cancels and waits for them
        self._cleanup()

    def _cleanup(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            names = set(self.jobs_file.read_text(encoding="utf-8").split()) - {self.job_name}
            if names:
                atomic.write_bytes(
                    self.jobs_file, "".join(f"{n}\n" for n in sorted(names)).encode()
                )
            else:
                self.jobs_file.unlink()
