"""The library side of each ``crucible-stage`` subcommand. No click here: the CLI
builds one options dataclass and calls one ``run_<verb>(opts, out, err)``, which
writes data to ``out`` and returns the exit code; refusals raise the crucible
error the command edge turns into one line (docs/spec/inputs.md, "Command")."""

from __future__ import annotations

import contextlib
import shlex
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO

from crucible.core import canon
from crucible.core.contract import emit_cap_from
from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    OperationalError,
    ParseError,
    PlanChanged,
    UsageError,
)
from crucible.core.structs import dataclass, field
from crucible.stage import StateDir
from crucible.stage._capture import EXIT_CODE_MAX, EXIT_CODE_MIN
from crucible.stage._layout import StateLayout
from crucible.stage._plan import PLAN

__all__ = [
    "CaptureOptions",
    "InputsOptions",
    "PromptOptions",
    "Target",
    "TargetOptions",
    "emit_cap_from",
    "load_plan",
    "run_capture",
    "run_inputs",
    "run_prompt",
]


@dataclass(frozen=True)
class TargetOptions:
    """The options every subcommand takes, as given on the command line."""

    state: str
    task: str
    plan: str | None = None  # a file, ``-`` for stdin, or None: STATE/plan.json
    key: str | None = None
    workspace: str | None = None


@dataclass(frozen=True)
class InputsOptions:
    target: TargetOptions
    fmt: str = "env"  # "env" | "json"


@dataclass(frozen=True)
class CaptureOptions:
    target: TargetOptions
    exit_code: int
    output: str | None = None  # None: $CRUCIBLE_OUTPUT
    emit_cap: str | None = None  # None: $CRUCIBLE_EMIT_CAP, else the default
    attempt: int = 1
    environ: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptOptions:
    target: TargetOptions


@dataclass(frozen=True)
class Target:
    """What every subcommand is about: one task (or instance) of one run."""

    #: the run's state dir over the plan, whose view is built once
    state_dir: StateDir
    task: str
    key: str | None
    workspace: Path
    #: the plan file as the user named it (``<stdin>`` for ``-``), for error lines
    plan_name: str = "plan"


@contextlib.contextmanager
def naming_plan(name: str) -> Iterator[None]:
    """The library locates plan problems in the plan it was handed
    (:func:`crucible.stage._plan.in_plan`); say which file that is."""

    try:
        yield
    except CrucibleError as exc:
        exc.name_source(name, placeholder=PLAN)
        raise


def _read_plan_bytes(
    plan_arg: str | None, state: Path, stdin: IO[bytes] | None
) -> tuple[bytes, str]:
    if plan_arg == "-":
        if stdin is None:
            raise UsageError("--plan -: no standard input")
        return stdin.read(), "<stdin>"
    path = Path(plan_arg) if plan_arg else StateLayout(state).plan_path
    try:
        return path.read_bytes(), str(path)
    except (FileNotFoundError, IsADirectoryError) as exc:
        problem = "no such file" if isinstance(exc, FileNotFoundError) else "not a file"
        if plan_arg is not None:  # a path the user typed: usage (cli.md exit 2)
            raise UsageError(f"--plan: {problem}", where=str(path)) from None
        # the default STATE/plan.json: STATE holds no admitted run (a state problem)
        raise InputRefused(
            f"{problem}: {state} holds no admitted plan (give --plan PLAN)", where=str(path)
        ) from None
    except OSError as exc:
        raise OperationalError(f"cannot read plan: {exc.strerror}", where=str(path)) from None


def _admitted(path: Path) -> bytes:
    try:
        return canon.dumps(canon.loads(path.read_bytes()))
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None


def load_plan(plan_arg: str | None, state: Path, stdin: IO[bytes] | None = None) -> StateDir:
    """Read a plan strictly, check what stage relies on (building its view once,
    in the state dir returned), and check it is the plan the run in ``state``
    admitted (``STATE/plan.json``) when there is one."""

    data, name = _read_plan_bytes(plan_arg, state, stdin)
    try:
        plan = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=name) from None
    try:
        with naming_plan(name):
            state_dir = StateDir(plan, state)
    except CrucibleError as exc:
        if exc.location.file != name:  # a problem of the plan, wherever it was found
            exc.where = name
        raise
    admitted = StateLayout(state).plan_path
    if plan_arg is not None and admitted.exists() and _admitted(admitted) != canon.dumps(plan):
        raise PlanChanged(f"plan differs from the one the run admitted ({admitted})", where=name)
    return state_dir


def _directory_arg(option: str, value: str, *, must_exist: bool = True) -> Path:
    """A directory named on the command line: missing or not a directory is a
    usage error (exit 2, docs/spec/cli.md), as in every other crucible command."""
    path = Path(value)
    if path.is_dir():
        return path
    if path.exists() or path.is_symlink():
        raise UsageError(f"{option}: not a directory", where=value)
    if must_exist:
        raise UsageError(f"{option}: no such directory", where=value)
    return path


def resolve_target(
    opts: TargetOptions, *, workspace_must_exist: bool = False, stdin: IO[bytes] | None = None
) -> Target:
    state_path = _directory_arg("--state", opts.state)
    ws_arg = (
        _directory_arg("--workspace", opts.workspace, must_exist=workspace_must_exist)
        if opts.workspace
        else None
    )
    loaded = load_plan(opts.plan, state_path, stdin)
    if opts.plan == "-":
        name = "<stdin>"
    else:
        name = str(Path(opts.plan) if opts.plan else StateLayout(state_path).plan_path)
    ws = ws_arg or StateLayout(state_path).work_dir(opts.task, opts.key)
    return Target(loaded, opts.task, opts.key, ws, name)


# -- inputs ----------------------------------------------------------------------


def run_inputs(
    opts: InputsOptions, out: BinaryIO, err: TextIO, *, stdin: IO[bytes] | None = None
) -> int:
    """Stage the task's inputs/ and print its environment."""

    t = resolve_target(opts.target, stdin=stdin)
    with naming_plan(t.plan_name):
        staged = t.state_dir.stage_inputs(t.task, t.workspace, key=t.key)
    if opts.fmt == "json":
        out.write(canon.dumps(staged.env) + b"\n")
    else:
        lines = (f"export {name}={shlex.quote(staged.env[name])}\n" for name in sorted(staged.env))
        out.write("".join(lines).encode("utf-8"))
    return 0


# -- capture -----------------------------------------------------------------------


def _exit_code(value: int) -> int:
    if not EXIT_CODE_MIN <= value <= EXIT_CODE_MAX:
        raise UsageError(
            f"must be an integer from {EXIT_CODE_MIN} to {EXIT_CODE_MAX}, not {value}",
            where="--exit-code",
        )
    return value


def _capture(
    t: Target,
    output_file: str,
    stdin: IO[bytes] | None,
    *,
    exit_code: int,
    attempt: int,
    emit_cap: int,
) -> dict[str, Any]:
    """Capture from ``output_file``; ``-`` spools stdin to a private temp file
    first (not in the workspace, which emits_files globs may read)."""

    def settle(path: Path, name: str | None) -> dict[str, Any]:
        return t.state_dir.capture(
            t.task,
            t.workspace,
            output_file=path,
            exit_code=exit_code,
            key=t.key,
            attempt=attempt,
            emit_cap=emit_cap,
            output_name=name,
        )

    if output_file != "-":
        return settle(Path(output_file), None)
    if stdin is None:
        raise UsageError("--output -: no standard input")
    with tempfile.TemporaryDirectory(prefix="crucible-stage-") as tmp:
        spool = Path(tmp) / "result.json"
        data = stdin.read()
        if data:
            spool.write_bytes(data)
        return settle(spool, "<stdin>")


def run_capture(
    opts: CaptureOptions, out: BinaryIO, err: TextIO, *, stdin: IO[bytes] | None = None
) -> int:
    """Settle one attempt: print the record; a failed attempt is refused (exit 1)."""
    cap = emit_cap_from(opts.emit_cap, opts.environ)
    exit_code = _exit_code(opts.exit_code)
    output_file = opts.output or opts.environ.get("CRUCIBLE_OUTPUT")
    if not output_file:
        raise UsageError("give --output FILE or set CRUCIBLE_OUTPUT")
    if output_file == "-" and opts.target.plan == "-":
        raise UsageError("--plan and --output cannot both read stdin (-)")
    # capture reads an existing workspace (inputs and prompt create theirs)
    t = resolve_target(opts.target, workspace_must_exist=True, stdin=stdin)
    with naming_plan(t.plan_name):
        record = _capture(
            t, output_file, stdin, exit_code=exit_code, attempt=opts.attempt, emit_cap=cap
        )
    out.write(canon.dumps(record) + b"\n")
    if record["status"] != "passed":
        label = t.task if t.key is None else f"{t.task}[{t.key}]"
        where = "<stdin>" if output_file == "-" else output_file
        raise InputRefused(f"{label} failed: {record['note']}", where=where)
    return 0


# -- prompt ---------------------------------------------------------------------------


def run_prompt(
    opts: PromptOptions, out: BinaryIO, err: TextIO, *, stdin: IO[bytes] | None = None
) -> int:
    """Print an agent task's prompt (staging its inputs first when needed)."""

    t = resolve_target(opts.target, stdin=stdin)
    with naming_plan(t.plan_name):
        prompt = t.state_dir.render_prompt(t.task, t.workspace, key=t.key)
    out.write(prompt.encode("utf-8"))
    return 0
