"""``run_plan``: admit a run, dispatch it, and always close its session log with
``shutdown`` (the last event of every session, whatever happened)."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import IO, Any

from crucible.core.cli import resume_gc
from crucible.core.errors import CrucibleError, Interrupted, OperationalError, UsageError
from crucible.run._options import RunOptions
from crucible.run.engine._dispatcher import Dispatcher
from crucible.run.engine._graph import TaskGraph, build_graph
from crucible.run.engine._selection import Selection, dry_run_lines, select
from crucible.run.engine._selection import apply as selection_apply
from crucible.run.engine._units import Counts, RunOutcome
from crucible.run.session._admit import Admission, admit
from crucible.run.session._log import SessionLog, read_events
from crucible.run.session._outputs import finish_results

__all__ = ["run_plan"]


def _plan_admitted_fields(admission: Admission, options: RunOptions, jobs: int) -> dict[str, Any]:
    plan = admission.plan
    tasks = []
    for task in plan["tasks"]:
        entry: dict[str, Any] = {
            "name": task["name"],
            "kind": task["kind"],
            "needs": list(task.get("needs", [])),
        }
        if "map" in task:
            entry["map"] = task["map"]
        # Declared inputs exist in IR v2; a v1 task receives its needs' whole outputs.
        entry["inputs"] = {name: spec["from"] for name, spec in task.get("inputs", {}).items()}
        tasks.append(entry)
    return {
        "plan_version": plan["version"],
        "edition": plan.get("edition", 1),
        "workflow": plan["workflow"]["name"],
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


def run_plan(
    options: RunOptions,
    *,
    environ: Mapping[str, str] | None = None,
    on_progress: Callable[[Counts], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Run (or resume) the plan of ``options``. Raises a CrucibleError for input it
    refuses before anything runs; returns the outcome of a run that started (or
    of a dry run, or of a resume with nothing left to run, which write nothing)."""
    env = os.environ if environ is None else environ
    # Tasks run in their workspaces: every path handed to them must be absolute.
    options = dataclasses.replace(options, state=options.state.absolute())
    if options.reuse:  # a new run, as --fresh (crucible.run.cache._reuse)
        options = dataclasses.replace(options, fresh=True)
    admission = admit(options, dict(env))
    try:
        for warning in admission.warnings:
            if on_warning is not None:
                on_warning(warning)
        return _run_admitted(admission, options, env, on_progress, on_warning)
    finally:
        admission.release()


def _run_admitted(
    admission: Admission,
    options: RunOptions,
    env: Mapping[str, str],
    on_progress: Callable[[Counts], None] | None,
    on_warning: Callable[[str], None] | None,
) -> RunOutcome:
    from crucible import stage

    # The compiler checked the plan (a plan file's normal form, or the manifest it
    # compiled): stage's view of it is built without checking each task again.
    stage.prepare_plan(admission.plan, checked=True)
    if options.enforce_memory:  # before anything runs: one line, exit 2
        from crucible.run.executors._usage import data_limit_problem

        problem = data_limit_problem((t["name"], t) for t in admission.plan["tasks"])
        if problem is not None:
            raise UsageError(problem)
    log_path = stage.StateLayout(options.state).session_path
    graph = build_graph(admission.plan)
    earlier = [] if admission.unclaimed else read_events(log_path)
    if options.resume and not options.dry_run and options.executor == "local":
        from crucible.run.session._leftovers import stop_leftovers

        # the reaper's lock covers a killed run; this covers a killed reaper
        stop_leftovers(options.state, earlier, options.kill_grace, on_warning)
    selection = select(
        stage,
        options.state,
        graph,
        retry_failed=options.retry_failed,
        targets=options.targets,
        events=earlier,
        fresh=admission.unclaimed,
    )
    if options.cache is not None and options.dry_run:  # a dry run creates nothing
        if not options.cache.is_dir():
            if on_warning is not None:
                on_warning(f"cache: {options.cache}: no such directory; nothing is cached")
            options = dataclasses.replace(options, cache=None)
    elif options.cache is not None:  # checked once, before the workers fork
        from crucible.run.cache._unit import usable_cache_dir

        options = dataclasses.replace(
            options, cache=usable_cache_dir(options.cache, on_warning or (lambda _w: None))
        )
    if options.dry_run:
        with ExitStack() as dry_stack:
            if options.reuse:  # what --reuse would rerun (nothing written)
                options = _reuse_for_dry_run(dry_stack, options, on_warning)
            lines = _dry_run(admission, options, graph, selection, env, on_warning)
        return RunOutcome("dry-run", 0, {}, admission.digest, 0.0, plan_lines=tuple(lines))
    if options.resume and not selection.to_run(graph):
        outcome = _nothing_to_resume(admission, graph, selection, earlier)
        if options.publish_dir is not None:  # a publish an earlier session did not finish
            finish_results(admission, options, outcome.status, on_warning)
        _copy_outputs_file(admission, options)
        return outcome
    with ExitStack() as stack:
        mirror = _open_mirror(stack, options.events)
        fresh = admission.unclaimed
        admission.claim(options.state)
        # refused before its first event: a fresh run is unclaimed again
        unclaim = stack.enter_context(_UnclaimOnError(admission, options.state, fresh))
        from crucible.run.cache._reuse import environ_record, note_environ

        record = environ_record(admission.plan, env, options.agent_cmd, admission.emit_cap)
        session = 1 + sum(1 for e in earlier if e.get("event") == "plan_admitted")
        note_environ(options.state, record, resumed=options.resume, session=session)
        if options.reuse:
            options = _reuse_previous(stack, options, admission.previous, on_warning)
        selection_apply(stage, options.state, graph, selection)
        log = SessionLog(log_path, session, mirror, on_warning)
        stack.callback(log.close)
        dispatcher = Dispatcher(
            admission,
            options,
            log,
            environ=env,
            on_progress=on_progress,
            selection=selection,
            on_warning=on_warning,
        )
        stack.callback(dispatcher.close)
        admitted = _plan_admitted_fields(admission, options, dispatcher.jobs)
        dispatcher.fanouts.annotate_admitted(admitted["tasks"])  # static fan-outs' instances
        unclaim.armed = False
        # Queued, not committed: the loop's first turn commits it with that turn's
        # events, after the turn has forked the workers if any unit needs one
        # (the session log's writer thread starts at the first commit, and the
        # workers are forked while this process has one thread: run.workers).
        log.emit("plan_admitted", **admitted)
        # the program paused the collector for its start-up (run/cli.py): the
        # plan and the modules are frozen before the workers fork
        resume_gc()
        try:
            outcome = dispatcher.run()
            # run results and published files (IR v3): crucible.run.session._outputs
            finish_results(admission, options, outcome.status, on_warning)
            if outcome.status != "interrupted":
                _copy_outputs_file(admission, options)
        except CrucibleError as exc:
            log.emit("shutdown", reason="error", note=str(exc), exit_code=exc.exit_code)
            raise
        except BaseException as exc:
            log.emit("shutdown", reason="error", note=f"{type(exc).__name__}: {exc}", exit_code=70)
            raise
        if outcome.status == "interrupted":
            signame = signal.Signals(outcome.exit_code - 128).name
            log.emit("shutdown", reason="signal", signal=signame, exit_code=outcome.exit_code)
        else:
            log.emit("shutdown", reason="completed", exit_code=outcome.exit_code)
        log.commit()
    if outcome.status == "interrupted":
        raise Interrupted(
            f"interrupted by {signal.Signals(outcome.exit_code - 128).name}; "
            f"resume with --resume ({outcome.counts['passed']} passed, "
            f"{outcome.counts['failed']} failed, {outcome.counts['skipped']} skipped so far)",
            signum=outcome.exit_code - 128,
        )
    return outcome


def _dry_run(
    admission: Admission,
    options: RunOptions,
    graph: TaskGraph,
    selection: Selection,
    env: Mapping[str, str],
    on_warning: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    from crucible import stage

    lines = dry_run_lines(stage, options.state, admission.plan, graph, selection, admission.params)
    if options.cache is not None:  # hit, or miss and why (crucible.run.cache._explain)
        from crucible.run.cache._explain import explain_lines

        lines = explain_lines(
            lines,
            admission=admission,
            options=options,
            environ=env,
            warn=on_warning or (lambda _w: None),
        )
    return lines


def _reuse_previous(
    stack: ExitStack,
    options: RunOptions,
    previous: Any,
    on_warning: Callable[[str], None] | None,
) -> RunOptions:
    """--reuse: the earlier run's passed units recorded in the cache (--cache, or
    a temporary one beside the state dir, removed after the run), so that each
    unit whose key did not change is restored from it (crucible.run.cache._reuse)."""
    import shutil

    from crucible.run.cache._reuse import import_previous, reuse_dir

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
    return dataclasses.replace(options, cache=cache)


def _reuse_for_dry_run(
    stack: ExitStack, options: RunOptions, on_warning: Callable[[str], None] | None
) -> RunOptions:
    """-n --reuse: the state's run recorded in a temporary cache (never in
    --cache: a dry run writes nothing), against which -n keys the units."""
    import shutil
    import tempfile
    from pathlib import Path

    from crucible.run.cache._reuse import import_previous

    warn = on_warning or (lambda _w: None)
    try:
        cache = Path(tempfile.mkdtemp(prefix="crucible-reuse-"))
    except OSError as exc:
        warn(f"--reuse: cannot make a temporary cache: {exc}; nothing is reused")
        return options
    stack.callback(shutil.rmtree, cache, ignore_errors=True)
    if (options.state / "plan.json").is_file():
        import_previous(options.state, cache, warn=warn)
    return dataclasses.replace(options, cache=cache)


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


def _copy_outputs_file(admission: Admission, options: RunOptions) -> None:
    """``--outputs FILE``: STATE/outputs.json copied there (through the FIFO held
    since admission, if it is one). ``--outputs -`` is the command's (stdout)."""
    if options.outputs is None or options.outputs == "-":
        return
    from crucible.run.session._outputs import copy_outputs

    copy_outputs(options.state, options.outputs, None, fd=admission.outputs_fd)


def _nothing_to_resume(
    admission: Admission, graph: TaskGraph, selection: Selection, earlier: list[dict[str, Any]]
) -> RunOutcome:
    """--resume when every selected task has settled: nothing runs and nothing is
    written (no empty session); the exit code is the run's, as recorded: the
    dispatcher's rule (crucible.run.engine._dispatcher), so an IR v3 run that passed with
    tolerated failures or skips exits 0 again (issue 27 item 14)."""
    expected = [n for n in graph.order if selection.selected is None or n in selection.selected]
    records = [selection.kept[n] for n in expected]
    statuses = [r.get("status") for r in records]
    counts = {
        "tasks": len(graph.order),
        "units": len(graph.order),
        "passed": statuses.count("passed"),
        "failed": statuses.count("failed"),
        "skipped": statuses.count("skipped"),
    }
    tolerated = sum(
        1 for r in records if r.get("status") == "failed" and r.get("tolerated") is True
    )
    if tolerated:
        counts["tolerated"] = tolerated
    passed = all(s == "passed" for s in statuses) or (
        admission.plan["version"] >= 3
        and all(
            r.get("status") == "skipped"
            or r.get("status") == "passed"
            or r.get("tolerated") is True
            for r in records
        )
        and not _loop_failed(admission, earlier)
    )
    hint = "" if passed else "; pass --retry-failed to run the failed and skipped again"
    return RunOutcome(
        "passed" if passed else "failed",
        0 if passed else 1,
        counts,
        admission.digest,
        0.0,
        message=f"nothing to resume: every task has settled{hint}",
    )


def _loop_failed(admission: Admission, earlier: list[dict[str, Any]]) -> bool:
    """A scored loop whose body failed fails its run (loop.md) whatever its records
    say: the last session's recorded status decides then."""
    if admission.plan.get("loop") is None:
        return False
    finished = [e for e in earlier if e.get("event") == "run_finished"]
    return bool(finished) and finished[-1].get("status") != "passed"
