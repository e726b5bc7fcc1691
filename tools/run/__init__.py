"""``crucible.run``: the dispatcher. Runs a plan's tasks in dependency order, up to
N at once, with inputs staged and results captured by ``crucible.stage``.

Spec: docs/spec/run.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from crucible.run._options import RunOptions
    from crucible.run.session._runner import run_plan

__all__ = ["RunOptions", "run_plan"]


def __getattr__(name: str) -> object:
    # run_plan pulls in the engine, RunOptions dataclasses and pathlib; keep
    # ``import crucible.run`` light (crucible-dispatch's start-up, run/cli.py).
    if name == "run_plan":
        # lazy: run.session._runner is not loaded with this module; only __getattr__() needs it
        from crucible.run.session._runner import run_plan

        return run_plan
    if name == "RunOptions":
        # lazy: run._options is not loaded with this module; only __getattr__() needs it
        from crucible.run._options import RunOptions

        return RunOptions
    raise AttributeError(name)
