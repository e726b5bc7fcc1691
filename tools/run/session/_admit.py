"""Admitting a run: check everything, then claim or reopen the state dir.

:func:`admit` reads and checks every input of a run — flags, plan, params,
``-j``, targets, the state dir and its lock — and writes nothing in the state
dir but its lock (docs/spec/run.md, "Admission"). A fresh run is claimed later,
by :meth:`Admission.claim`, once the session's workers and event mirror exist:
``params.json``, then ``plan.json`` (its presence marks the dir as claimed). A
refusal at any step before leaves the state dir unclaimed, so the same command
can be run again once the cause is fixed. ``--resume`` needs both files,
recompiles or reloads PLAN, and refuses with :class:`PlanChanged` when the
digest differs from the admitted one, so a run keeps its IR version and graph
for its whole life.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crucible.compile import load_any
from crucible.core import atomic, canon, contract, digest, structs
from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    OperationalError,
    ParseError,
    PlanChanged,
    UsageError,
)
from crucible.core.fsio import make_dirs
from crucible.core.plan import Plan
from crucible.core.structs import dataclass, field
from crucible.run._options import JOBS_MAX, RunOptions
from crucible.run.engine._matrix import check_fanout_params
from crucible.run.session._lock import StateLock
from crucible.run.session._params import changed_param, read_params_file, resolve_params
from crucible.run.session._preflight import check_output_flags, open_outputs_stream

if TYPE_CHECKING:
    from crucible.compile import CompiledPlan

__all__ = ["JOBS_MAX", "Admission", "admit", "emit_cap_from", "worker_count"]


def _layout(state: Path) -> Any:
    """The state's one layout (crucible.stage.StateLayout), imported when needed."""
    # lazy: stage is not loaded with this module; only _layout() needs it
    from crucible.stage import StateLayout

    return StateLayout(state)


#: the largest ``-j`` (documented in run.md): past it a dispatcher forks more
#: processes than a local machine runs usefully, and as root an unbounded -j
#: is a fork bomb


def worker_count(jobs: int) -> int:
    """Worker processes a session forks for ``jobs`` slots (docs/spec/run.md):
    one pipelined worker per slot (crucible.run.executors._unit.UnitRunner.serve)."""
    return jobs


@dataclass
class Admission:
    """A run admitted: its checked plan and params, its locked state dir."""

    plan: dict[str, Any]
    #: the plan's typed model (crucible.core.plan), as the compiler emitted it:
    #: what the run reads, never ``plan`` with ``dict.get`` and a default
    model: Plan
    data: bytes
    digest: str
    params: dict[str, Any]
    emit_cap: int
    warnings: tuple[str, ...]
    #: task slots, capped (see :func:`_jobs`)
    jobs: int = 1
    #: absolute directory of the plan or manifest given (CRUCIBLE_PACK_DIR)
    pack_dir: str = ""
    #: held from admission to the end of the session (None: a dry run)
    lock: StateLock | None = None
    #: a fresh run whose plan.json and params.json are still to be written
    unclaimed: bool = False
    #: --fresh over an earlier run: that run moves to STATE.prev at the claim
    move_aside: bool = False
    #: set once the claim moved an earlier run aside
    previous: Path | None = field(default=None)
    #: ``--outputs`` naming a FIFO: its write end, held from admission to the
    #: end of the run (crucible.run.session._preflight.open_outputs_stream)
    outputs_fd: int | None = None
    #: a fresh run's state dir was created by this admission (an undone claim
    #: removes it again: :meth:`unclaim`)
    created_state: bool = False

    def claim(self, state: Path) -> None:
        """Write what marks the state dir as this run's (fresh runs only)."""
        if not self.unclaimed:
            return
        if self.move_aside:
            self._move_aside(state)
        layout = _layout(state)
        atomic.write_json(layout.params_path, self.params)
        # plan.json last: its presence is what marks the state dir as claimed.
        atomic.write_bytes(layout.plan_path, self.data)
        self.unclaimed = False

    def _move_aside(self, state: Path) -> None:
        """--fresh: the earlier run becomes STATE.prev (replacing an older one) in
        one rename; a new empty STATE is created and locked."""
        prev = state.with_name(state.name + ".prev")
        try:
            if prev.is_symlink() or prev.is_file():
                prev.unlink()
            elif prev.exists():
                # lazy: shutil costs start-up; only _move_aside() needs it
                import shutil

                shutil.rmtree(prev)
            os.rename(state, prev)
            state.mkdir()
        except OSError as exc:
            raise OperationalError(
                f"cannot move the earlier run aside to {prev}: {exc.strerror}", where=str(state)
            ) from None
        old = self.lock
        self.lock = StateLock(state)
        if old is not None:
            old.release()
        self.previous = prev
        self.move_aside = False

    def unclaim(self, state: Path) -> None:
        """Undo the claim of a fresh run that failed before its first event (an
        unreachable scheduler, a resource no worker offers): the state dir is
        left as it was, so the same command works once the cause is fixed.
        ``plan.json`` first: its absence marks the dir unclaimed again."""

        layout = _layout(state)
        # lazy: run.cache._reuse is not loaded with this module; only unclaim() needs it
        from crucible.run.cache._reuse import ENVIRON_FILE

        for path in (layout.plan_path, layout.params_path, state / ENVIRON_FILE):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        with contextlib.suppress(OSError):
            if layout.session_path.stat().st_size == 0:  # opened, never written
                layout.session_path.unlink()
        self.unclaimed = True
        if self.created_state:
            self.release()
            with contextlib.suppress(OSError):
                layout.executor_token_path.unlink()  # the session's, if it got that far
            with contextlib.suppress(OSError):
                layout.lock_path.unlink()
                state.rmdir()  # only when nothing else is there

    def release(self) -> None:
        if self.outputs_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.outputs_fd)
            self.outputs_fd = None
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def emit_cap_from(options: RunOptions, environ: Mapping[str, str]) -> int:
    """``--emit-cap``, else ``CRUCIBLE_EMIT_CAP``, else the default: the one rule
    and message of core.contract, checked before anything is written."""
    return contract.emit_cap_from(options.emit_cap, environ)


def _load(path: Path) -> CompiledPlan:
    if str(path) != "-" and not path.exists():
        raise UsageError("no such plan or manifest", where=str(path))
    return load_any(path)


def _check_flags(options: RunOptions) -> None:
    if options.reuse and options.resume:
        raise UsageError("--reuse starts a new run and --resume continues: pass one of them")
    if options.fresh and options.resume:
        raise UsageError("--fresh starts over and --resume continues: pass one of them")
    if options.retry_failed and not options.resume:
        raise UsageError("--retry-failed reruns units of an earlier session: pass --resume too")


def _check_targets(plan: Plan, targets: tuple[str, ...]) -> None:
    for target in targets:
        if target not in plan.by_name:
            raise UsageError(f"--target {target!r}: no such task in the plan")


def _jobs(requested: int | None, plan: Plan) -> int:
    """Task slots: ``-j`` (default: the CPU count), at most JOBS_MAX, no more than
    the plan has units (a plan without fan-out: its task count), and within the
    user's process limit (checked here, before anything is written)."""
    if requested is not None and requested < 1:
        raise UsageError("-j must be at least 1", where="-j")
    if requested is not None and requested > JOBS_MAX:
        raise UsageError(f"-j {requested} is over the maximum of {JOBS_MAX}", where="-j")
    jobs = min(requested or os.cpu_count() or 1, JOBS_MAX)
    tasks = plan.tasks
    if tasks and not any(t.fans_out for t in tasks):
        jobs = min(jobs, len(tasks))
    jobs = max(1, jobs)
    _check_process_limit(jobs, requested)
    return jobs


def _check_process_limit(jobs: int, requested: int | None) -> None:
    if os.geteuid() == 0:
        return  # root is not held to RLIMIT_NPROC (and needs no resource module)
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return
    need = worker_count(jobs) + jobs  # workers, and one process per running task
    if need * 8 < soft:
        return  # far below the limit: not worth listing /proc on every run
    running = _processes_of(os.getuid())
    if running + need > soft:
        raise UsageError(
            f"-j {requested or jobs} needs {need} processes; {running} of the user's "
            f"limit of {soft} (ulimit -u) are in use: pass a smaller -j",
            where="-j",
        )


def _processes_of(uid: int) -> int:
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    count = 0
    for name in names:
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _pack_dir(path: Path) -> str:
    """The directory of the plan or manifest (stdin: the current directory)."""
    if str(path) == "-":
        return os.getcwd()
    return os.path.dirname(os.path.abspath(path))


def _check_state_path(state: Path) -> None:
    if state.is_symlink() and not state.exists():
        raise UsageError("the state dir is a dangling symlink", where=str(state))
    if state.exists() and not state.is_dir():
        raise UsageError("the state dir is not a directory", where=str(state))


def _check_sandbox(plan: Plan, options: RunOptions, environ: Mapping[str, str]) -> None:
    """A sandboxed run where neither Landlock nor bubblewrap can be used is
    refused before anything is written: never run unsandboxed silently."""
    if options.dry_run or not (options.sandbox or any(t.sandbox for t in plan.tasks)):
        return
    # lazy: run.executors._sandbox is not loaded with this module; only _check_sandbox() needs it
    from crucible.run.executors._sandbox import SandboxUnavailable, choose

    try:
        choose(environ)
    except SandboxUnavailable as exc:
        raise UsageError(f"cannot run sandboxed: {exc}") from None


def admit(options: RunOptions, environ: dict[str, str] | os._Environ[str]) -> Admission:
    """Check a run's whole input and lock its state dir; write nothing else."""
    _check_flags(options)
    check_output_flags(options)
    compiled = _load(options.plan)
    model = compiled.model  # the one model of the run's plan, as compile built it
    plan_digest = compiled.digest
    state = options.state
    emit_cap = emit_cap_from(options, environ)
    agents = [t.name for t in model.tasks if t.kind == "agent"]
    if agents and not options.agent_cmd:
        raise UsageError(f"the plan has agent tasks ({', '.join(agents)}): pass --agent-cmd CMD")
    _check_sandbox(model, options, environ)
    _check_targets(model, options.targets)
    if options.publish_dir is not None and model.workflow.publish:
        # lazy: run.session._publish is not loaded with this module; only admit() needs it
        from crucible.run.session._publish import check_destinations

        check_destinations(model, options.publish_dir)  # never replace a user's files
    jobs = _jobs(options.jobs, model)
    _check_state_path(state)
    given = read_params_file(options.params_file) if options.params_file else {}
    base = Admission(
        compiled.plan, model, compiled.data, plan_digest, {}, emit_cap,
        tuple(compiled.warnings), jobs=jobs, pack_dir=_pack_dir(options.plan),
    )  # fmt: skip
    if options.resume:
        if not options.dry_run:
            base.outputs_fd = open_outputs_stream(options.outputs)
        try:
            return _admit_resume(options, base, given)
        except BaseException:
            base.release()
            raise
    params = resolve_params(model, given, options.params)
    check_fanout_params(model, params)  # a param a fan-out ranges over (IR v3)
    base.params = params
    plan_file = _layout(state).plan_path
    held = plan_file.exists()
    if held and not options.fresh:
        held_bytes = _read(plan_file)
        _check_is_a_plan(plan_file, held_bytes)
        admitted_digest = digest.of_bytes(held_bytes)
        if admitted_digest != plan_digest:
            raise InputRefused(
                f"the state dir holds a run of another plan ({admitted_digest}, this plan {plan_digest}): pass --reuse to rerun only what changed, --fresh to start over, or use a fresh --state",
                where=str(state),
            )
        raise InputRefused(
            "the state dir already holds a run of this plan: pass --resume, --fresh, or use a fresh --state",
            where=str(state),
        )
    base.unclaimed = True
    base.move_aside = held
    if options.dry_run:
        return base
    base.outputs_fd = open_outputs_stream(options.outputs)  # before the state dir is made
    try:
        base.created_state = not os.path.lexists(state)
        make_dirs(state, "state dir")
        base.lock = StateLock(state)
        # Another dispatcher may have claimed it between our look and our lock.
        if not options.fresh and plan_file.exists():
            raise InputRefused(
                "the state dir was claimed by another run meanwhile", where=str(state)
            )
    except BaseException:
        base.release()
        raise
    return base


def _check_is_a_plan(path: Path, data: bytes) -> None:
    """A state's plan.json that is no plan at all (hand-edited, damaged) is said
    to be so, not reported as another plan's run (issue 12 item 32)."""
    try:
        value = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(f"not a plan: {exc.message}", where=str(path)) from None
    if not (
        isinstance(value, dict)
        and isinstance(value.get("version"), int)
        and isinstance(value.get("tasks"), list)
    ):
        raise ParseError("not a plan (no version and tasks)", where=str(path))


def _admit_resume(options: RunOptions, base: Admission, given: dict[str, Any]) -> Admission:
    state = options.state
    layout = _layout(state)
    plan_file = layout.plan_path
    if not plan_file.exists():
        raise InputRefused("nothing to resume: no plan.json in the state dir", where=str(state))
    if not options.dry_run:
        base.lock = StateLock(state)
    try:
        held_bytes = _read(plan_file)
        _check_is_a_plan(plan_file, held_bytes)
        admitted_digest = digest.of_bytes(held_bytes)
        if admitted_digest != base.digest:
            raise PlanChanged(
                f"the plan changed since the run started ({_plan_changes(held_bytes, base.model)}; "
                f"run {admitted_digest}, now {base.digest}); to rerun only what the edit "
                f"changed: crucible-dispatch {options.plan} --state {state} --reuse",
                where=str(options.plan),
            )
        stored = _read_json(layout.params_path)
        if not isinstance(stored, dict):
            raise InputRefused("params.json is not a JSON object", where=str(layout.params_path))
        if options.params_file or options.params:
            # Given params are checked on top of the stored ones: naming a param
            # again with its value is fine; a changed value is a different run.
            resolved = resolve_params(base.model, {**stored, **given}, options.params)
            name = changed_param(stored, resolved)
            if name is not None:
                was = canon.dumps_str(stored[name]) if name in stored else "unset"
                now = canon.dumps_str(resolved[name]) if name in resolved else "unset"
                raise InputRefused(
                    f"param {name!r} is {was} in this run, not {now}: a changed param is a "
                    "different run (--reuse reruns only the units it changes; or --fresh, or another --state)",
                    where=str(layout.params_path),
                )
        base.params = stored
    except BaseException:
        base.release()
        raise
    return base


def _plan_changes(held: bytes, plan: Plan) -> str:
    """What an edit changed, as a --resume refusal says it: tasks added,
    removed and changed (a description alone is said so), declared params.
    Both plans are compared as models: the held one is read strictly (a
    state file may have been edited by hand)."""
    try:
        old = Plan.from_json(canon.loads(held))
    except (canon.CanonError, CrucibleError):
        return "the earlier plan cannot be read"
    new_tasks, old_tasks = plan.by_name, old.by_name
    parts = []
    added = [n for n in new_tasks if n not in old_tasks]
    removed = [n for n in old_tasks if n not in new_tasks]
    changed = [n for n in new_tasks if n in old_tasks and new_tasks[n] != old_tasks[n]]
    described = [
        n
        for n in changed
        if structs.replace(old_tasks[n], description=new_tasks[n].description) == new_tasks[n]
    ]
    changed = [n for n in changed if n not in described]
    for what, names in (
        ("tasks added", added),
        ("tasks removed", removed),
        ("tasks changed", changed),
        ("descriptions changed", described),
    ):
        if names:
            parts.append(f"{what}: {', '.join(names)}")
    params, old_params = plan.workflow.params, old.workflow.params
    touched = sorted(n for n in {*params, *old_params} if params.get(n) != old_params.get(n))
    if touched:
        parts.append(f"params declared differently: {', '.join(touched)}")
    if not parts:
        parts.append("the workflow's other settings")
    return "; ".join(parts)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None


def _read_json(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputRefused(
            "the state dir is incomplete (no params.json)", where=str(path)
        ) from None
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    try:
        return canon.loads(data)
    except canon.CanonError as exc:
        raise InputRefused(f"not a params file: {exc.message}", where=str(path)) from None
