"""One dispatcher session as a context manager.

Entering claims the state dir, opens the ``--events`` mirror and the session
log, records the environment, builds the dispatcher and queues
``plan_admitted``; an error meanwhile unclaims a fresh run's state dir as it
unwinds (issue 27 item 12). Leaving writes ``shutdown``, the last event of
every session whatever happened (docs/spec/run.md, "Session log"), then
closes the dispatcher and the log.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from crucible.core import structs
from crucible.core.cli import resume_gc
from crucible.core.errors import CrucibleError, OperationalError, UsageError
from crucible.core.plan import source_json
from crucible.run._options import RunOptions
from crucible.run.cache._reuse import environ_record, import_previous, note_environ, reuse_dir
from crucible.run.engine._dispatcher import Dispatcher
from crucible.run.engine._graph import TaskGraph
from crucible.run.engine._selection import Selection
from crucible.run.engine._selection import apply as selection_apply
from crucible.run.engine._units import Counts, RunOutcome
from crucible.run.session import events
from crucible.run.session._admit import Admission
from crucible.run.session._earlier import EarlierSessions
from crucible.run.session._log import SessionLog
from crucible.run.session._outputs import copy_outputs, finish_results

if TYPE_CHECKING:  # built by the run (crucible.run.session._runner)
    from crucible.stage import StateDir

__all__ = ["Session", "copy_outputs_file"]

Warn = Callable[[str], None]


class Session:
    def __init__(
        self,
        admission: Admission,
        options: RunOptions,
        *,
        state_dir: StateDir,
        graph: TaskGraph,
        selection: Selection,
        earlier: EarlierSessions,
        environ: Mapping[str, str],
        on_progress: Callable[[Counts], None] | None,
        on_warning: Warn | None,
    ) -> None:
        self.admission = admission
        self.options = options
        self.state_dir = state_dir
        self.graph = graph
        self.selection = selection
        self.earlier = earlier
        self.environ = environ
        self.on_progress = on_progress
        self.on_warning = on_warning
        self._stack = ExitStack()
        self.outcome: RunOutcome | None = None
        self.log: SessionLog
        self.dispatcher: Dispatcher

    def __enter__(self) -> Session:
        with ExitStack() as stack:
            self._open(stack)
            self._stack = stack.pop_all()  # set up: closed by __exit__
        return self

    def _open(self, stack: ExitStack) -> None:

        admission, options = self.admission, self.options
        mirror = _open_mirror(stack, options.events)
        fresh = admission.unclaimed
        admission.claim(options.state)
        # refused before its first event: a fresh run is unclaimed again
        unclaim = stack.enter_context(_UnclaimOnError(admission, options.state, fresh))
        record = environ_record(
            admission.model, self.environ, options.agent_cmd, admission.emit_cap
        )
        session = 1 + self.earlier.sessions
        note_environ(options.state, record, resumed=options.resume, session=session)
        if options.reuse:
            self.options = options = _reuse_previous(
                stack, options, admission.previous, self.on_warning
            )
        selection_apply(self.state_dir, self.graph, self.selection)
        log_path = self.state_dir.layout.session_path
        self.log = log = SessionLog(log_path, session, mirror, self.on_warning)
        stack.callback(log.close)
        self.dispatcher = Dispatcher(
            admission,
            options,
            log,
            state_dir=self.state_dir,
            graph=self.graph,
            environ=self.environ,
            on_progress=self.on_progress,
            selection=self.selection,
            on_warning=self.on_warning,
        )
        stack.callback(self.dispatcher.close)
        admitted = _plan_admitted_fields(admission, options, self.dispatcher.jobs)
        self.dispatcher.fanouts.annotate_admitted(admitted["tasks"])  # static fan-outs' instances
        unclaim.armed = False
        # Queued, not committed: the loop's first turn commits it with that turn's
        # events, after the turn has forked the workers if any unit needs one
        # (the session log's writer thread starts at the first commit, and the
        # workers are forked while this process has one thread: run.workers).
        log.emit(events.plan_admitted(**admitted))

    def run(self) -> RunOutcome:
        """Dispatch, then the run's results and published files (IR v3:
        crucible.run.session._outputs)."""
        # the program paused the collector for its start-up (run/cli.py): the
        # plan and the modules are frozen before the workers fork
        resume_gc()
        outcome = self.dispatcher.run()
        finish_results(self.admission, self.options, outcome.status, self.on_warning)
        if outcome.status != "interrupted":
            copy_outputs_file(self.admission, self.options)
        self.outcome = outcome
        return outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        with self._stack:
            if isinstance(exc, CrucibleError):
                self.log.emit(
                    events.shutdown(reason="error", note=str(exc), exit_code=exc.exit_code)
                )
            elif exc is not None:
                note = f"{type(exc).__name__}: {exc}"
                self.log.emit(events.shutdown(reason="error", note=note, exit_code=70))
            elif self.outcome is None:  # left without running: nothing to say
                pass
            elif self.outcome.status == "interrupted":
                signame = signal.Signals(self.outcome.exit_code - 128).name
                code = self.outcome.exit_code
                self.log.emit(events.shutdown(reason="signal", signal=signame, exit_code=code))
                self.log.commit()
            else:
                code = self.outcome.exit_code
                self.log.emit(events.shutdown(reason="completed", exit_code=code))
                self.log.commit()
        return None


def _plan_admitted_fields(admission: Admission, options: RunOptions, jobs: int) -> dict[str, Any]:
    plan = admission.model
    tasks = []
    for task in plan.tasks:
        entry: dict[str, Any] = {"name": task.name, "kind": task.kind, "needs": list(task.needs)}
        if task.map is not None:
            entry["map"] = source_json(task.map)
        # Declared inputs exist in IR v2; a v1 task receives its needs' whole outputs.
        entry["inputs"] = {name: spec.ref.text for name, spec in task.inputs.items()}
        tasks.append(entry)
    return {
        "plan_version": plan.version,
        "edition": plan.edition,
        "workflow": plan.workflow.name,
        "digest": admission.digest,
        "resume": options.resume,
        "jobs": jobs,
        "emit_cap": admission.emit_cap,
        "tasks": tasks,
    }


def _open_mirror(stack: ExitStack, events: str | None) -> IO[bytes] | None:
    """The --events stream, unbuffered (a failed write is seen at once, never
    again at exit). A path that cannot be a file is a usage error (exit 2)."""
    if events is None:
        return None
    try:
        if events == "-":
            return stack.enter_context(open(sys.stdout.fileno(), "wb", buffering=0, closefd=False))
        return stack.enter_context(open(events, "ab", buffering=0))
    except (IsADirectoryError, FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(f"cannot open the events file: {exc.strerror}", where=events) from None
    except OSError as exc:
        raise OperationalError(
            f"cannot open the events file: {exc.strerror}", where=events
        ) from None


def _reuse_previous(
    stack: ExitStack,
    options: RunOptions,
    previous: Any,
    on_warning: Callable[[str], None] | None,
) -> RunOptions:
    """--reuse: the earlier run's passed units recorded in the cache (--cache, or
    a temporary one beside the state dir, removed after the run), so that each
    unit whose key did not change is restored from it (crucible.run.cache._reuse)."""
    # lazy: shutil costs start-up; only _reuse_previous() needs it
    import shutil

    warn = on_warning or (lambda _w: None)
    cache = options.cache
    if cache is None:
        try:
            cache = reuse_dir(options.state)
        except OSError as exc:
            warn(f"--reuse: cannot make a cache beside {options.state}: {exc}; nothing is reused")
            return options
        stack.callback(shutil.rmtree, cache, ignore_errors=True)
    if previous is not None:
        import_previous(previous, cache, warn=warn)
    return structs.replace(options, cache=cache)


class _UnclaimOnError:
    """Entered right after a fresh run's claim, disarmed once the session is set
    up: an error meanwhile (an unreachable scheduler, a resource no worker
    offers) unclaims the state dir as it unwinds, after the session log and the
    dispatcher were closed, so the same command works once the cause is fixed
    (issue 27 item 12)."""

    def __init__(self, admission: Admission, state: Any, armed: bool) -> None:
        self.admission = admission
        self.state = state
        #: only a fresh run's claim is undone (a resume's state stays as it was)
        self.armed = armed

    def __enter__(self) -> _UnclaimOnError:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None and self.armed:
            self.admission.unclaim(self.state)


def copy_outputs_file(admission: Admission, options: RunOptions) -> None:
    """``--outputs FILE``: STATE/outputs.json copied there (through the FIFO held
    since admission, if it is one). ``--outputs -`` is the command's (stdout)."""
    if options.outputs is None or options.outputs == "-":
        return

    copy_outputs(options.state, options.outputs, None, fd=admission.outputs_fd)
