"""``crucible.run``: the dispatcher. Runs a plan's tasks in dependency order, up to
N at once, with inputs staged and results captured by ``crucible.stage``.

Spec: docs/spec/run.md.
"""

from __future__ import annotations

from crucible.run._options import RunOptions

__all__ = ["RunOptions", "run_plan"]


def __getattr__(name: str) -> object:
    # run_plan pulls in the engine; keep ``import crucible.run`` light.
    if name == "run_plan":
        from crucible.run._runner import run_plan

        return run_plan
    raise AttributeError(name)
