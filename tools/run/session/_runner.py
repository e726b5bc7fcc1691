"""``run_plan``: a run as named steps: admit → select → prepare the cache →
dry run | nothing to resume | dispatch (a session: crucible.run.session._session,
which always closes its log with ``shutdown``) → the run's results."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from crucible.core import structs
from crucible.core.errors import Interrupted, UsageError
from crucible.core.plan import Plan
from crucible.run._options import RunOptions
from crucible.run.cache._reuse import import_previous
from crucible.run.cache._unit import usable_cache_dir
from crucible.run.engine._graph import TaskGraph, build_graph
from crucible.run.engine._selection import Selection, dry_run_lines, select
from crucible.run.engine._units import Counts, RunOutcome
from crucible.run.executors._usage import data_limit_problem
from crucible.run.session._admit import Admission, admit
from crucible.run.session._earlier import EarlierSessions, read_earlier
from crucible.run.session._outputs import finish_results
from crucible.run.session._session import Session, copy_outputs_file
from crucible.stage import StateDir

__all__ = ["run_plan"]

Warn = Callable[[str], None]


def run_plan(
    options: RunOptions,
    *,
    environ: Mapping[str, str] | None = None,
    on_progress: Callable[[Counts], None] | None = None,
    on_warning: Warn | None = None,
) -> RunOutcome:
    """Run (or resume) the plan of ``options``. Raises a CrucibleError for input it
    refuses before anything runs; returns the outcome of a run that started (or
    of a dry run, or of a resume with nothing left to run, which write nothing)."""
    env = os.environ if environ is None else environ
    # Tasks run in their workspaces: every path handed to them must be absolute.
    options = structs.replace(options, state=options.state.absolute())
    if options.reuse:  # a new run, as --fresh (crucible.run.cache._reuse)
        options = structs.replace(options, fresh=True)
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
    on_warning: Warn | None,
) -> RunOutcome:
    """The steps of a run, once admitted. The plan's view (in its state dir's
    records and staging) and its task graph are built here, once per run, and
    handed to every step that needs them."""
    state_dir = _prepare(admission, options)
    graph = build_graph(admission.model)
    earlier = _earlier_events(admission, options, state_dir, on_warning)
    selection = _select(admission, options, state_dir, graph, earlier)
    options = _prepare_cache(options, on_warning)
    if options.dry_run:
        return _dry_run_outcome(admission, options, state_dir, graph, selection, env, on_warning)
    if options.resume and not selection.to_run(graph):
        _finish_freeing(admission.model, options, graph, selection)
        return _resume_nothing(admission, options, graph, selection, earlier, on_warning)
    with Session(
        admission, options, state_dir=state_dir, graph=graph, selection=selection,
        earlier=earlier, environ=env, on_progress=on_progress, on_warning=on_warning,
    ) as session:  # fmt: skip
        outcome = session.run()
    if outcome.status == "interrupted":
        raise Interrupted(
            f"interrupted by {signal.Signals(outcome.exit_code - 128).name}; "
            f"resume with --resume ({outcome.counts['passed']} passed, "
            f"{outcome.counts['failed']} failed, {outcome.counts['skipped']} skipped so far)",
            signum=outcome.exit_code - 128,
        )
    return outcome


def _finish_freeing(
    plan: Plan, options: RunOptions, graph: TaskGraph, selection: Selection
) -> None:
    """Nothing runs: still finish what an earlier session marked freed and did
    not delete (killed between the two), and free what nothing needs any more
    (docs/spec/run.md, "Temporary files"; no session, so no event)."""
    if not any(t.temp_files for t in graph.tasks.values()):
        return
    from crucible.run.engine._temps import TempFreer  # lazy: plans with temp_files only

    status = {n: str(r.get("status")) for n, r in selection.kept.items()}
    loop = frozenset(plan.loop.body) if plan.loop is not None else frozenset()
    TempFreer(
        options.state, graph.tasks, status, lambda: selection.selected, lambda *_: None, loop,
    ).start()  # fmt: skip


def _prepare(admission: Admission, options: RunOptions) -> StateDir:
    """The state dir's records and staging over the plan's view (built once, before
    any worker forks: they inherit it), and the checks needed before anything runs."""
    # The compiler checked the plan (a plan file's normal form, or the manifest it
    # compiled): stage's view of it is built without checking each task again.
    state_dir = StateDir(admission.plan, options.state, checked=True, model=admission.model)
    if options.enforce_memory:  # before anything runs: one line, exit 2
        problem = data_limit_problem(admission.model.tasks)
        if problem is not None:
            raise UsageError(problem)
    if options.cache is not None and admission.model.workflow.accounted:
        raise UsageError(
            "--cache does not go with an accounted plan ([workflow.limits]): a cache hit "
            "is an attempt that never ran (docs/spec/export.md §2)"
        )
    return state_dir


def _earlier_events(
    admission: Admission, options: RunOptions, state_dir: StateDir, on_warning: Warn | None
) -> EarlierSessions:
    """The state's earlier sessions (none for a fresh run); a resume first
    stops what a killed run left running."""
    log_path = state_dir.layout.session_path
    earlier = EarlierSessions() if admission.unclaimed else read_earlier(log_path)
    if options.resume and not options.dry_run and options.executor == "local":
        # lazy: only _earlier_events() needs it (start-up)
        from crucible.run.session._leftovers import stop_leftovers

        # the reaper's lock covers a killed run; this covers a killed reaper
        stop_leftovers(options.state, earlier.unfinished, options.kill_grace, on_warning)
    return earlier


def _select(
    admission: Admission,
    options: RunOptions,
    state_dir: StateDir,
    graph: TaskGraph,
    earlier: EarlierSessions,
) -> Selection:
    """What this session runs: --target, --retry-failed, and what a resume keeps."""
    return select(
        state_dir,
        graph,
        retry_failed=options.retry_failed,
        targets=options.targets,
        started=earlier.started,
        fresh=admission.unclaimed,
    )


def _prepare_cache(options: RunOptions, on_warning: Warn | None) -> RunOptions:
    """--cache: checked once, before the workers fork; a dry run creates nothing."""
    if options.cache is None:
        return options
    if options.dry_run:
        if options.cache.is_dir():
            return options
        if on_warning is not None:
            on_warning(f"cache: {options.cache}: no such directory; nothing is cached")
        return structs.replace(options, cache=None)

    return structs.replace(
        options, cache=usable_cache_dir(options.cache, on_warning or (lambda _w: None))
    )


def _dry_run_outcome(
    admission: Admission,
    options: RunOptions,
    state_dir: StateDir,
    graph: TaskGraph,
    selection: Selection,
    env: Mapping[str, str],
    on_warning: Warn | None,
) -> RunOutcome:
    """-n: one line per unit, nothing written."""
    with ExitStack() as dry_stack:
        if options.reuse:  # what --reuse would rerun (nothing written)
            options = _reuse_for_dry_run(dry_stack, options, on_warning)
        lines = _dry_run(admission, options, state_dir, graph, selection, env, on_warning)
    return RunOutcome("dry-run", 0, {}, admission.digest, 0.0, plan_lines=tuple(lines))


def _resume_nothing(
    admission: Admission,
    options: RunOptions,
    graph: TaskGraph,
    selection: Selection,
    earlier: EarlierSessions,
    on_warning: Warn | None,
) -> RunOutcome:
    """--resume with every selected task settled: no session, the recorded outcome."""
    outcome = _nothing_to_resume(admission, graph, selection, earlier)
    if options.publish_dir is not None:  # a publish an earlier session did not finish
        finish_results(admission, options, outcome.status, on_warning)
    copy_outputs_file(admission, options)
    return outcome


def _dry_run(
    admission: Admission,
    options: RunOptions,
    state_dir: StateDir,
    graph: TaskGraph,
    selection: Selection,
    env: Mapping[str, str],
    on_warning: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    lines = dry_run_lines(state_dir, graph, selection, admission.params)
    if options.cache is not None:  # hit, or miss and why (crucible.run.cache._explain)
        # lazy: only a dry run with --cache explains its hits
        from crucible.run.cache._explain import explain_lines

        lines = explain_lines(
            lines,
            state_dir=state_dir,
            admission=admission,
            options=options,
            environ=env,
            warn=on_warning or (lambda _w: None),
        )
    return lines


def _reuse_for_dry_run(
    stack: ExitStack, options: RunOptions, on_warning: Callable[[str], None] | None
) -> RunOptions:
    """-n --reuse: the state's run recorded in a temporary cache (never in
    --cache: a dry run writes nothing), against which -n keys the units."""
    # lazy: shutil, tempfile cost start-up; only _reuse_for_dry_run() needs it
    import shutil
    import tempfile

    warn = on_warning or (lambda _w: None)
    try:
        cache = Path(tempfile.mkdtemp(prefix="crucible-reuse-"))
    except OSError as exc:
        warn(f"--reuse: cannot make a temporary cache: {exc}; nothing is reused")
        return options
    stack.callback(shutil.rmtree, cache, ignore_errors=True)
    if (options.state / "plan.json").is_file():
        import_previous(options.state, cache, warn=warn)
    return structs.replace(options, cache=cache)


def _nothing_to_resume(
    admission: Admission, graph: TaskGraph, selection: Selection, earlier: EarlierSessions
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
        admission.model.version >= 3
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


def _loop_failed(admission: Admission, earlier: EarlierSessions) -> bool:
    """A scored loop whose body failed fails its run (loop.md) whatever its records
    say: the last session's recorded status decides then."""
    if admission.model.loop is None:
        return False
    finished = earlier.last_run_finished
    return finished is not None and finished.get("status") != "passed"
