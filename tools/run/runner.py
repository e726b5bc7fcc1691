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

from crucible.core.errors import CrucibleError, Interrupted
from crucible.run.admit import Admission, admit
from crucible.run.engine import Counts, Dispatcher, RunOutcome
from crucible.run.options import RunOptions
from crucible.run.outputs import finish_results
from crucible.run.session import SessionLog, read_events

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
    if events is None:
        return None
    if events == "-":
        return sys.stdout.buffer
    try:
        return stack.enter_context(open(events, "ab"))
    except OSError as exc:
        from crucible.core.errors import OperationalError

        raise OperationalError(f"cannot open events file: {exc.strerror}", where=events) from None


def run_plan(
    options: RunOptions,
    *,
    environ: Mapping[str, str] | None = None,
    on_progress: Callable[[Counts], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Run (or resume) the plan of ``options``. Raises a CrucibleError for input it
    refuses before anything runs; returns the outcome of a run that started."""
    env = os.environ if environ is None else environ
    # Tasks run in their workspaces: every path handed to them must be absolute.
    options = dataclasses.replace(options, state=options.state.absolute())
    admission = admit(options, dict(env))
    for warning in admission.warnings:
        if on_warning is not None:
            on_warning(warning)
    log_path = options.state / "session.jsonl"
    session = 1 + sum(1 for e in read_events(log_path) if e.get("event") == "plan_admitted")
    with ExitStack() as stack:
        mirror = _open_mirror(stack, options.events)
        log = SessionLog(log_path, session, mirror)
        stack.callback(log.close)
        dispatcher = Dispatcher(admission, options, log, environ=env, on_progress=on_progress)
        stack.callback(dispatcher.close)
        admitted = _plan_admitted_fields(admission, options, dispatcher.jobs)
        dispatcher.fanouts.annotate_admitted(admitted["tasks"])  # static fan-outs' instances
        log.emit("plan_admitted", **admitted)
        log.commit()
        try:
            outcome = dispatcher.run()
            # run results and published files (IR v3): crucible.run.outputs
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
