"""``crucible-stage``: a thin click layer over :mod:`crucible.stage`.

inputs   stage a task's inputs/ and print its environment (--env, default; --json)
capture  settle a task's attempt from its result file; print the record
prompt   print an agent task's prompt
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from crucible import __version__
from crucible.core import canon
from crucible.core.cli import run
from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    OperationalError,
    ParseError,
    PlanChanged,
    UsageError,
)

PROG = "crucible-stage"


@dataclass(frozen=True)
class Target:
    """What every subcommand is about: one task (or instance) of one run."""

    plan: dict[str, Any]
    state: Path
    task: str
    key: str | None
    workspace: Path
    #: the plan file as the user named it (``<stdin>`` for ``-``), for error lines
    plan_name: str = "plan"


@contextlib.contextmanager
def naming_plan(name: str) -> Iterator[None]:
    """The library locates plan problems as ``plan[:…]``; say which file that is."""
    try:
        yield
    except CrucibleError as exc:
        where = exc.where or ""
        if where == "plan" or where.startswith("plan:"):
            exc.where = name + where[4:]
        raise


def _read_plan_bytes(plan_arg: str | None, state: Path) -> tuple[bytes, str]:
    if plan_arg == "-":
        return sys.stdin.buffer.read(), "<stdin>"
    path = Path(plan_arg) if plan_arg else state / "plan.json"
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


def load_plan(plan_arg: str | None, state: Path) -> dict[str, Any]:
    """Read a plan strictly, check what stage relies on, and check it is the plan
    the run in ``state`` admitted (``STATE/plan.json``) when there is one."""
    from crucible.stage._plan import build_view

    data, name = _read_plan_bytes(plan_arg, state)
    try:
        plan = canon.loads(data)
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=name) from None
    try:
        with naming_plan(name):
            build_view(plan)
    except CrucibleError as exc:
        if not (exc.where or "").startswith(name):
            exc.where = name
        raise
    admitted = state / "plan.json"
    if plan_arg is not None and admitted.exists() and _admitted(admitted) != canon.dumps(plan):
        raise PlanChanged(f"plan differs from the one the run admitted ({admitted})", where=name)
    assert isinstance(plan, dict)
    return plan


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


def _target(
    plan: str | None,
    state: str,
    task: str,
    key: str | None,
    workspace: str | None,
    *,
    workspace_must_exist: bool = False,
) -> Target:
    from crucible.stage import StateLayout

    state_path = _directory_arg("--state", state)
    ws_arg = (
        _directory_arg("--workspace", workspace, must_exist=workspace_must_exist)
        if workspace
        else None
    )
    loaded = load_plan(plan, state_path)
    name = "<stdin>" if plan == "-" else str(Path(plan) if plan else state_path / "plan.json")
    ws = ws_arg or StateLayout(state_path).work_dir(task, key)
    return Target(loaded, state_path, task, key, ws, name)


def _common(f: Any) -> Any:
    f = click.option(
        "--workspace",
        "workspace",
        metavar="DIR",
        help="the task's workspace [default: STATE/work/TASK[/KEY]]",
    )(f)
    f = click.option(
        "--key", metavar="K", help="the fan-out instance key of a mapped task (raw, unescaped)"
    )(f)
    f = click.option("--task", required=True, metavar="T", help="the task name")(f)
    f = click.option("--state", required=True, metavar="STATE", help="the run's state directory")(f)
    f = click.option(
        "--plan", metavar="PLAN", help="plan JSON file, - for stdin [default: STATE/plan.json]"
    )(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name=PROG)
def cli() -> None:
    """Stage a task's inputs, capture its outputs, render agent prompts.

    Exit codes: 0 done; 1 refused (bad plan/state, a failed capture, unsupported
    plan version, plan changed); 2 usage (a missing --state, --plan or --workspace
    path, or one of the wrong kind) or unparseable input; 3 I/O failure.
    """


@cli.command("inputs")
@_common
@click.option(
    "--env",
    "fmt",
    flag_value="env",
    default=True,
    help="print shell-quoted `export NAME=value` lines (default)",
)
@click.option("--json", "fmt", flag_value="json", help="print the environment as one JSON object")
def inputs_cmd(
    plan: str | None, state: str, task: str, key: str | None, workspace: str | None, fmt: str
) -> None:
    """Stage TASK's inputs/ in its workspace and print the environment it gets.

    \b
    eval "$(crucible-stage inputs --state st --task report)"
    """
    from crucible.stage import stage_inputs

    t = _target(plan, state, task, key, workspace)
    with naming_plan(t.plan_name):
        staged = stage_inputs(t.plan, t.state, t.task, t.workspace, key=t.key)
    out = sys.stdout
    if fmt == "json":
        out.write(canon.dumps_str(staged.env) + "\n")
    else:
        for name in sorted(staged.env):
            out.write(f"export {name}={shlex.quote(staged.env[name])}\n")


def _emit_cap(value: str | None) -> int:
    from crucible.stage._capture import EMIT_CAP_DEFAULT, EMIT_CAP_MAX, emit_cap_problem

    text = value if value is not None else os.environ.get("CRUCIBLE_EMIT_CAP")
    if text is None or text == "":
        return EMIT_CAP_DEFAULT
    source = "--emit-cap" if value is not None else "CRUCIBLE_EMIT_CAP"
    try:
        cap = int(text)
    except ValueError:
        cap = 0
    if not 1 <= cap <= EMIT_CAP_MAX:
        raise UsageError(emit_cap_problem(repr(text)), where=source)
    return cap


def _exit_code(value: int) -> int:
    from crucible.stage._capture import EXIT_CODE_MAX, EXIT_CODE_MIN

    if not EXIT_CODE_MIN <= value <= EXIT_CODE_MAX:
        raise UsageError(
            f"must be an integer from {EXIT_CODE_MIN} to {EXIT_CODE_MAX}, not {value}",
            where="--exit-code",
        )
    return value


def _capture_stdin(t: Target, *, exit_code: int, attempt: int, emit_cap: int) -> dict[str, Any]:
    """``--output -``: the result object arrives on stdin; spool it to a private
    temp file (not in the workspace, which emits_files globs may read)."""
    import tempfile

    from crucible.stage import capture

    with tempfile.TemporaryDirectory(prefix="crucible-stage-") as tmp:
        spool = Path(tmp) / "result.json"
        data = sys.stdin.buffer.read()
        if data:
            spool.write_bytes(data)
        return capture(
            t.plan,
            t.state,
            t.task,
            t.workspace,
            output_file=spool,
            exit_code=exit_code,
            key=t.key,
            attempt=attempt,
            emit_cap=emit_cap,
            output_name="<stdin>",
        )


def _capture(
    t: Target, output_file: str, *, exit_code: int, attempt: int, emit_cap: int
) -> dict[str, Any]:
    from crucible.stage import capture

    if output_file == "-":
        return _capture_stdin(t, exit_code=exit_code, attempt=attempt, emit_cap=emit_cap)
    return capture(
        t.plan,
        t.state,
        t.task,
        t.workspace,
        output_file=Path(output_file),
        exit_code=exit_code,
        key=t.key,
        attempt=attempt,
        emit_cap=emit_cap,
    )


@cli.command("capture")
@_common
@click.option("--exit-code", "exit_code", required=True, type=int, help="the task's exit status")
@click.option(
    "--output",
    "output",
    metavar="FILE",
    help="the task's result file, - for stdin [default: $CRUCIBLE_OUTPUT]",
)
@click.option(
    "--emit-cap",
    "emit_cap",
    metavar="BYTES",
    help="cap on each declared field [default: $CRUCIBLE_EMIT_CAP or 65536]",
)
@click.option(
    "--attempt", default=1, show_default=True, type=click.IntRange(min=1), help="attempt number"
)
def capture_cmd(
    plan: str | None,
    state: str,
    task: str,
    key: str | None,
    workspace: str | None,
    exit_code: int,
    output: str | None,
    emit_cap: str | None,
    attempt: int,
) -> None:
    """Settle one attempt of TASK: check and cap its result, capture its
    emits_files, write its record and print it. Exit 1 when the attempt failed."""

    cap = _emit_cap(emit_cap)
    exit_code = _exit_code(exit_code)
    output_file = output or os.environ.get("CRUCIBLE_OUTPUT")
    if not output_file:
        raise UsageError("give --output FILE or set CRUCIBLE_OUTPUT")
    if output_file == "-" and plan == "-":
        raise UsageError("--plan and --output cannot both read stdin (-)")
    # capture reads an existing workspace (inputs and prompt create theirs)
    t = _target(plan, state, task, key, workspace, workspace_must_exist=True)
    with naming_plan(t.plan_name):
        record = _capture(t, output_file, exit_code=exit_code, attempt=attempt, emit_cap=cap)
    sys.stdout.write(canon.dumps_str(record) + "\n")
    if record["status"] != "passed":
        label = task if key is None else f"{task}[{key}]"
        where = "<stdin>" if output_file == "-" else output_file
        raise InputRefused(f"{label} failed: {record['note']}", where=where)


@cli.command("prompt")
@_common
def prompt_cmd(
    plan: str | None, state: str, task: str, key: str | None, workspace: str | None
) -> None:
    """Print agent TASK's prompt (staging its inputs first when needed)."""
    from crucible.stage import render_prompt

    t = _target(plan, state, task, key, workspace)
    with naming_plan(t.plan_name):
        prompt = render_prompt(t.plan, t.state, t.task, t.workspace, key=t.key)
    sys.stdout.write(prompt)


def main(argv: list[str] | None = None) -> NoReturn:
    run(cli, PROG, argv)
