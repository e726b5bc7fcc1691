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
from crucible.run._admit import Admission, admit
from crucible.run._engine import Counts, Dispatcher, RunOutcome
from crucible.run._graph import TaskGraph, build_graph
from crucible.run._options import RunOptions
from crucible.run._outputs import finish_results
from crucible.run._selection import Selection, dry_run_lines, select
from crucible.run._selection import apply as selection_apply
from crucible.run._session import SessionLog, read_events

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
        from crucible.run._usage import data_limit_problem

        problem = data_limit_problem((t["name"], t) for t in admission.plan["tasks"])
        if problem is not None:
            raise UsageError(problem)
    log_path = stage.StateLayout(options.state).session_path
    graph = build_graph(admission.plan)
    earlier = [] if admission.unclaimed else read_events(log_path)
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
        from crucible.run._unit_cache import usable_cache_dir

        options = dataclasses.replace(
            options, cache=usable_cache_dir(options.cache, on_warning or (lambda _w: None))
        )
    if options.dry_run:
        lines = dry_run_lines(stage, options.state, admission.plan, graph, selection)
        if options.cache is not None:  # hit, or miss and why (crucible.run._cache_explain)
            from crucible.run._cache_explain import explain_lines

            lines = explain_lines(
                lines,
                admission=admission,
                options=options,
                environ=env,
                warn=on_warning or (lambda _w: None),
            )
        return RunOutcome("dry-run", 0, {}, admission.digest, 0.0, plan_lines=tuple(lines))
    if options.resume and not selection.to_run(graph):
        outcome = _nothing_to_resume(admission, graph, selection)
        if options.publish_dir is not None:  # a publish an earlier session did not finish
            finish_results(admission, options, outcome.status, on_warning)
        return outcome
    with ExitStack() as stack:
        mirror = _open_mirror(stack, options.events)
        admission.claim(options.state)
        selection_apply(stage, options.state, graph, selection)
        session = 1 + sum(1 for e in earlier if e.get("event") == "plan_admitted")
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
            # run results and published files (IR v3): crucible.run._outputs
            finish_results(admission, options, outcome.status, on_warning)
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


def _nothing_to_resume(admission: Admission, graph: TaskGraph, selection: Selection) -> RunOutcome:
    """--resume when every selected task has settled: nothing runs and nothing is
    written (no empty session); the exit code is the run's, as recorded."""
    expected = [n for n in graph.order if selection.selected is None or n in selection.selected]
    statuses = [selection.kept[n].get("status") for n in expected]
    counts = {
        "tasks": len(graph.order),
        "units": len(graph.order),
        "passed": statuses.count("passed"),
        "failed": statuses.count("failed"),
        "skipped": statuses.count("skipped"),
    }
    passed = all(s == "passed" for s in statuses)
    hint = "" if passed else "; pass --retry-failed to run the failed and skipped again"
    return RunOutcome(
        "passed" if passed else "failed",
        0 if passed else 1,
        counts,
        admission.digest,
        0.0,
        message=f"nothing to resume: every task has settled{hint}",
    )
