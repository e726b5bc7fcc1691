"""``crucible-stage``: a thin click layer over :mod:`crucible.stage`.

inputs   stage a task's inputs/ and print its environment (--env, default; --json)
capture  settle a task's attempt from its result file; print the record
prompt   print an agent task's prompt
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from crucible import __version__
from crucible.core.cli import run

if TYPE_CHECKING:
    from crucible.stage.commands import TargetOptions

PROG = "crucible-stage"


def _target(
    plan: str | None, state: str, task: str, key: str | None, workspace: str | None
) -> TargetOptions:
    # lazy: stage.commands is not loaded with this module; only _target() needs it
    from crucible.stage import commands

    return commands.TargetOptions(state=state, task=task, plan=plan, key=key, workspace=workspace)


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
) -> int:
    """Stage TASK's inputs/ in its workspace and print the environment it gets.

    \b
    eval "$(crucible-stage inputs --state st --task report)"
    """
    # lazy: stage.commands is not loaded with this module; only inputs_cmd() needs it
    from crucible.stage.commands import InputsOptions, run_inputs

    opts = InputsOptions(_target(plan, state, task, key, workspace), fmt)
    return run_inputs(opts, sys.stdout.buffer, sys.stderr, stdin=sys.stdin.buffer)


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
) -> int:
    """Settle one attempt of TASK: check and cap its result, capture its
    emits_files, write its record and print it. Exit 1 when the attempt failed."""
    # lazy: stage.commands is not loaded with this module; only capture_cmd() needs it
    from crucible.stage.commands import CaptureOptions, run_capture

    opts = CaptureOptions(
        _target(plan, state, task, key, workspace),
        exit_code=exit_code,
        output=output,
        emit_cap=emit_cap,
        attempt=attempt,
        environ=dict(os.environ),
    )
    return run_capture(opts, sys.stdout.buffer, sys.stderr, stdin=sys.stdin.buffer)


@cli.command("prompt")
@_common
def prompt_cmd(
    plan: str | None, state: str, task: str, key: str | None, workspace: str | None
) -> int:
    """Print agent TASK's prompt (staging its inputs first when needed)."""
    # lazy: stage.commands is not loaded with this module; only prompt_cmd() needs it
    from crucible.stage.commands import PromptOptions, run_prompt

    opts = PromptOptions(_target(plan, state, task, key, workspace))
    return run_prompt(opts, sys.stdout.buffer, sys.stderr, stdin=sys.stdin.buffer)


def main(argv: list[str] | None = None) -> NoReturn:
    run(cli, PROG, argv)
