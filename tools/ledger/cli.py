"""``crucible-ledger``: a thin click layer over :mod:`crucible.ledger.commands`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from crucible import __version__

if TYPE_CHECKING:
    from crucible.ledger.commands import KeySpec

PROG = "crucible-ledger"
_RUN_CONTEXT = {"ignore_unknown_options": True, "allow_interspersed_args": False}

dir_option = click.option(
    "--dir",
    "directory",
    required=True,
    metavar="DIR",
    help="Ledger directory (created when a step is recorded).",
)
scope_option = click.option("--scope", required=True, help="Scope of the step identity.")
key_option = click.option(
    "--key", "keys", multiple=True, metavar="NAME=VALUE", help="A key part (repeatable)."
)
key_file_option = click.option(
    "--key-file",
    "key_files",
    multiple=True,
    metavar="PATH",
    help="A file whose content (sha256) is part of the key (repeatable).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name=PROG)
def cli() -> None:
    """Durable, content-keyed steps recorded in DIR/steps.jsonl (fsync'd NDJSON).

    Exit codes: 0 done; 1 miss (get) or damage (verify); 2 usage (bad --dir, bad
    --key, a command that cannot start); 3 I/O failure. `run` exits with the
    command's own status (or 128+signal).
    """


@cli.command(context_settings=_RUN_CONTEXT)
@dir_option
@scope_option
@key_option
@key_file_option
@click.option(
    "--record-exit",
    "record_exits",
    multiple=True,
    type=int,
    metavar="N",
    help="A nonzero exit code that is a deterministic fact, recorded like success.",
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
def run(
    directory: str,
    scope: str,
    keys: tuple[str, ...],
    key_files: tuple[str, ...],
    record_exits: tuple[int, ...],
    argv: tuple[str, ...],
) -> int:
    """Replay CMD's recorded result, or run it (output live) and record it.

    The step key covers the argv, every --key and the sha256 of every --key-file.
    Recorded on exit 0 or a listed --record-exit code; never when killed.
    """
    # lazy: ledger.commands is not loaded with this module; only run() needs it
    from crucible.ledger.commands import StepRunOptions, run_run

    options = StepRunOptions(directory, scope, keys, key_files, record_exits, argv)
    return run_run(options, sys.stdout.buffer, sys.stderr)


def _reader_went_away() -> int:
    """A closed stdout (``ls | head``) ends quietly with exit 0. Handled here
    because click's ``main`` turns EPIPE into exit 1 before crucible.core.cli
    sees it."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def _step_options(func: Callable[..., int]) -> Callable[..., int]:
    """--dir, --scope, --key, --key-file, --step and ``-- CMD``: how get and put
    name a step, handed to the command as ``(directory, scope, spec)``."""

    @functools.wraps(func)
    def with_spec(
        directory: str,
        scope: str,
        keys: tuple[str, ...],
        key_files: tuple[str, ...],
        step: str | None,
        argv: tuple[str, ...],
        **rest: Any,
    ) -> int:
        # lazy: ledger.commands is not loaded with this module; only _step_options() needs it
        from crucible.ledger.commands import KeySpec

        return func(directory, scope, KeySpec(step, keys, key_files, argv), **rest)

    wrapped: Any = click.option("--step", default=None, help="The step, verbatim.")(with_spec)
    wrapped = key_file_option(wrapped)
    wrapped = key_option(wrapped)
    wrapped = scope_option(wrapped)
    wrapped = dir_option(wrapped)
    argument = click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ARGS...]")
    return argument(wrapped)  # type: ignore[no-any-return]


@cli.command(context_settings=_RUN_CONTEXT)
@_step_options
def get(directory: str, scope: str, spec: KeySpec) -> int:
    """Print a recorded reply as JSON (with "cached": true); exit 1 on a miss.

    Name the step with --step, or with the same --key/--key-file/-- CMD as `run`.
    """
    # lazy: ledger.commands is not loaded with this module; only get() needs it
    from crucible.ledger.commands import GetOptions, run_get

    return run_get(GetOptions(directory, scope, spec), sys.stdout.buffer, sys.stderr)


@cli.command(context_settings=_RUN_CONTEXT)
@_step_options
@click.option("--failed", is_flag=True, help="Record a deterministic failure, not a success.")
def put(directory: str, scope: str, spec: KeySpec, failed: bool) -> int:
    """Record the JSON value on stdin as the step's settled result."""
    # lazy: ledger.commands is not loaded with this module; only put() needs it
    from crucible.ledger.commands import PutOptions, run_put

    options = PutOptions(directory, scope, spec, failed, sys.stdin.buffer)
    return run_put(options, sys.stdout.buffer, sys.stderr)


@cli.command()
@dir_option
@click.option("--scope", default=None, help="Only records of this scope.")
def ls(directory: str, scope: str | None) -> int:
    """The latest record of each identity, as NDJSON, in file order."""
    # lazy: ledger.commands is not loaded with this module; only ls() needs it
    from crucible.ledger.commands import LsOptions, run_ls

    try:
        return run_ls(LsOptions(directory, scope), sys.stdout.buffer, sys.stderr)
    except BrokenPipeError:
        return _reader_went_away()


@cli.command()
@dir_option
def verify(directory: str) -> int:
    """Report records, duplicates, bad lines, torn tail (JSON); exit 1 on damage."""
    # lazy: ledger.commands is not loaded with this module; only verify() needs it
    from crucible.ledger.commands import VerifyOptions, run_verify

    return run_verify(VerifyOptions(directory), sys.stdout.buffer, sys.stderr)


@cli.command()
@dir_option
def compact(directory: str) -> int:
    """Atomically rewrite keeping the latest record per identity."""
    # lazy: ledger.commands is not loaded with this module; only compact() needs it
    from crucible.ledger.commands import CompactOptions, run_compact

    return run_compact(CompactOptions(directory), sys.stdout.buffer, sys.stderr)


def main(argv: list[str] | None = None) -> NoReturn:
    # lazy: core.cli is not loaded with this module; only main() needs it
    from crucible.core.cli import run as run_edge

    run_edge(cli, PROG, argv)
