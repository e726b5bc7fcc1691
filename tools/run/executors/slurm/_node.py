"""One SLURM array element of ``--executor slurm``: a batch of a task's units,
run on the node through the same unit code as the local and Dask workers.

``python -m crucible.run.executors.slurm._node RUN_DIR TAG`` (the run's job script,
crucible.run.executors.slurm._executor) reads the run's spec (``RUN_DIR/spec.pickle``:
plan, options, environment, pack dir, what the node must match) and the units
of element ``$SLURM_ARRAY_TASK_ID`` with their task's recent durations
(``RUN_DIR/jobs/TAG/<index>.units``), then

1. checks the node sees the dispatcher's state (its ``executor-token``), runs
   the same crucible and Python version, and sees the pack directory; if not,
   it writes ``RUN_DIR/replies/check.<element>`` (the run stops, exit 3) and
   runs nothing;
2. runs each unit with :class:`crucible.run.executors._unit.UnitRunner` (stage, start,
   wait, capture), writing ``<token>.started`` once its task runs for a moment
   and ``<token>.final`` (the unit's answer, as a local worker's reply) to
   ``RUN_DIR/replies``, each atomically; the units behind one whose task runs
   long are answered ``handback`` at once, as a Dask batch's are.

SIGTERM/SIGINT (``scancel``, or SLURM's own end of the job) stop the running
task as a dispatcher's stop does: its group is terminated, SIGKILL after the
kill grace, and what was not started is answered ``not_started``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import crucible
from crucible.core.structs import dataclass
from crucible.run.executors._runner_spec import RunnerSpec

if TYPE_CHECKING:
    from crucible.run.executors._slots import Slots

__all__ = ["NodeSpec", "check_node", "main"]


@dataclass(frozen=True)
class NodeSpec(RunnerSpec):
    """What an array element needs to build the run's UnitRunner (pickled once
    per run into ``RUN_DIR/spec.pickle``), and to check it may run them."""

    #: what the node must read back at STATE/executor-token
    token: str
    #: crucible's version and Python's (major, minor) on the dispatcher
    version: str
    python: tuple[int, int]


def check_node(spec: NodeSpec) -> str | None:
    """None if this node may run the spec's units, else why not (one line)."""
    # lazy: stage is not loaded with this module; only check_node() needs it
    from crucible.stage import StateLayout

    here = socket.gethostname()
    if crucible.__version__ != spec.version or tuple(sys.version_info[:2]) != spec.python:
        return (
            f"node {here} runs crucible {crucible.__version__} on Python"
            f" {sys.version_info[0]}.{sys.version_info[1]}; the dispatcher runs crucible"
            f" {spec.version} on Python {spec.python[0]}.{spec.python[1]}"
        )
    path = StateLayout(spec.options.state).executor_token_path
    try:
        with open(path, encoding="utf-8") as f:
            found = f.read()
    except OSError as exc:
        return f"{path}: node {here} cannot read it ({exc.strerror}); the state directory must be at the same path on every node"
    if found != spec.token:
        return f"{path}: node {here} reads another run's token; the state directory must be at the same path on every node"
    if spec.pack_dir and not os.path.isdir(spec.pack_dir):
        return f"{spec.pack_dir}: node {here} does not see the pack directory; it must be at the same path on every node"
    return None


class _NodeSlots:
    """The node's stand-in for :class:`crucible.run.executors._unit.Slots`: the element
    holds its allocation, so a unit's slot is always free; stop and kill are
    pipes the unit's wait polls, written by the signal handlers."""

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

    def stopping(self) -> bool:
        return self.stopped or bool(select.select([self.stop_r], [], [], 0)[0])

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(BlockingIOError):
            os.write(self.stop_w, b"s")

    def kill(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.kill_w, b"k")


class _Replies:
    """The element's answers, each an atomic file in ``RUN_DIR/replies`` that
    the dispatcher's poller reads and removes."""

    def __init__(self, directory: Path, worker: str) -> None:
        self.directory = directory
        self.worker = worker

    def write(self, name: str, value: Any) -> None:
        # lazy: core.atomic is not loaded with this module; only write() needs it
        from crucible.core import atomic

        # durable: the dispatcher may read it over another host's mount
        atomic.write_bytes(self.directory / name, pickle.dumps(value, protocol=5))

    def final(self, token: int, answer: tuple[str, Any]) -> None:
        self.write(f"{token}.final", answer)


class _Channel:
    """The unit's channel: its "started" reply is a file."""

    def __init__(self, replies: _Replies, token: int, requests_fd: int) -> None:
        self._replies = replies
        self.token = token
        self.requests_fd = requests_fd
        self.pipeline: Any = None

    def send(self, payload: Any) -> None:
        self._replies.write(f"{self.token}.started", {**payload, "worker": self._replies.worker})


def _not_started() -> tuple[str, dict[str, Any]]:
    return ("ok", {"kind": "not_started", "staged_env": None})


def run_element(run_dir: Path, tag: str, index: str, element: str) -> int:
    """The element's units, one after another (see module doc)."""
    # lazy: only run_element() needs it (start-up)
    from crucible.core.errors import CrucibleError
    from crucible.run.executors._pipelined import Pipeline, handback_after
    from crucible.run.executors._unit import UnitRunner

    with open(run_dir / "spec.pickle", "rb") as f:
        spec = cast(NodeSpec, pickle.load(f))
    with open(run_dir / "jobs" / tag / f"{index}.units", "rb") as f:
        batch = cast(dict[str, Any], pickle.load(f))
    units = cast(list[tuple[int, tuple[Any, ...]]], batch["units"])
    replies = _Replies(run_dir / "replies", f"{socket.gethostname()} (slurm job {element})")
    problem = check_node(spec)
    if problem is not None:
        replies.write(f"check.{element}", problem)
        return 3
    slots = _NodeSlots()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: slots.stop())

    runner = spec.runner(UnitRunner, cast("Slots", slots))
    # the node may share STATE over another host's mount: it fsyncs its records
    runner.durable_records = True
    # the task's recent durations (the dispatcher's): the handback threshold
    recent: deque[float] = deque(batch["recent"], maxlen=31)
    handed: list[bool] = []
    for position, (token, request) in enumerate(units):
        rest = units[position + 1 :]
        if slots.stopping():
            for left, _ in units[position:]:
                replies.final(left, _not_started())
            break
        channel = _Channel(replies, token, slots.hold_r)

        def hand_back(rest: list[tuple[int, tuple[Any, ...]]] = rest) -> None:
            if not handed:  # the task runs long: the units behind it go elsewhere
                handed.append(True)
                for left, _ in rest:
                    replies.final(left, ("ok", {"kind": "handback", "staged_env": None}))

        if rest:
            channel.pipeline = Pipeline(lambda: None, [], hand_back, handback_after(recent))
        began = time.monotonic()
        answer: tuple[str, Any]
        try:
            result = runner.run(request, cast(Any, channel))
            if isinstance(result, dict):
                result["worker"] = replies.worker
                if slots.stopped and result.get("kind") == "finished":
                    # SLURM's SIGTERM (scancel, preemption, the walltime) reached
                    # it: the dispatcher tells its own stop from the cluster's
                    result["slurm_signalled"] = True
            answer = ("ok", result)
        except CrucibleError as exc:
            answer = ("error", str(exc))
        except BaseException:
            answer = ("bug", traceback.format_exc())
        recent.append(time.monotonic() - began)
        replies.final(token, answer)
        if handed:
            break
    return 0


def main(argv: list[str]) -> int:
    run_dir, tag = Path(argv[1]), argv[2]
    index = os.environ["SLURM_ARRAY_TASK_ID"]
    element = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{index}"
    return run_element(run_dir, tag, index, element)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
