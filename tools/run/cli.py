"""``crucible-dispatch``: run a plan, or report on a state dir.

The commands are click's (:mod:`crucible.run._click_cli`, loaded on first use:
``from crucible.run.cli import cli`` still works). A plain run's command line
(``PLAN --state DIR -j N ...``) is read without loading click
(:mod:`crucible.run._argv`, which declines everything else to click), and the
program ends without the interpreter's teardown (core.cli's ``fast_exit``):
together ~35 ms of a one-task run's ~110 ms (run.md, "Start-up").

``crucible-dispatch PLAN --state DIR ...`` and ``crucible-dispatch run PLAN ...``
are the same command: a first argument that is not a subcommand name is taken
as the PLAN of ``run``. (A plan file literally named ``report`` or ``run``:
write ``./report``.)
"""

from __future__ import annotations

import gc

# The modules below (and the dataclasses, pathlib and typing they load) live
# until exit: no collection while they load (~2 ms), whoever imports this.
_collecting = gc.isenabled()
gc.disable()
try:
    import sys
    from collections.abc import Callable
    from typing import Any

    from crucible.core.cli import pause_gc
    from crucible.core.cli import run as run_command
finally:
    if _collecting:
        gc.enable()

__all__ = ["main"]  # and, loaded on first use, the click group `cli`

PROG = "crucible-dispatch"


def __getattr__(name: str) -> Any:
    # the click group and its commands, for tests and the umbrella's help
    if name in ("cli", "run_cmd", "report_cmd", "cache_group", "cache_forget", "cache_gc"):
        # lazy: run._click_cli is not loaded with this module; only __getattr__() needs it
        from crucible.run import _click_cli

        return getattr(_click_cli, name)
    raise AttributeError(name)


def _click_group() -> Any:
    # lazy: run._click_cli is not loaded with this module; only _click_group() needs it
    from crucible.run._click_cli import cli

    return cli


def _fast(args: list[str]) -> Callable[[], int] | None:
    """The run a plain command line asks for, or None (click parses it)."""
    # lazy: run._argv is not loaded with this module; only _fast() needs it
    from crucible.run._argv import parse

    values = parse(args)
    if values is None:
        return None
    pause_gc()  # until the run starts (run/session/_runner.py resumes it)

    def call() -> int:
        # lazy: run.commands is not loaded with this module; only _fast() needs it
        from crucible.run.commands import dispatch_options, run_run

        return run_run(dispatch_options(**values), sys.stdout.buffer, sys.stderr)

    return call


def main() -> None:
    run_command(_click_group, PROG, fast=_fast, fast_exit=True)
