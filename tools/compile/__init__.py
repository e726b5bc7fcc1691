"""Pack manifests (TOML + optional Starlark) → plan IR; validation.

Public API (docs/spec/plan-ir.md, docs/spec/manifest.md; the plan schemas docs/schemas/plan-v*.json):

- :func:`compile_path` — a manifest (``.toml``) → :class:`CompiledPlan`
- :func:`load_plan_path` — a plan JSON file, strictly checked
- :func:`load_any` — ``.toml`` → compile, otherwise a plan file
- :class:`CompiledPlan` — ``model`` (the typed plan, crucible.core.plan.Plan), ``plan``
  (its JSON object), ``data`` (canonical bytes), ``digest``, ``warnings``
- :func:`check_params` — ``check_params(plan, supplied)`` resolves a run's params
  (dispatch calls it; crucible.compile._params)
- what the dispatcher shares with the compiler's rules: fan-out bounds and keys
  (``MAX_INSTANCES``, ``keyed_items``, ``describe_source``), sequences
  (``sequence_values``, ``check_sequence_param_values``), matrix combinations
  (``matrix_combinations``), the bounded expression evaluator
  (``evaluate_expression``, ``expression_reads``), ``MAX_WAIT_S``,
  ``camel_limits``: run imports them from here, never a private module

Errors are :mod:`crucible.core.errors` subclasses with ``where`` set;
:class:`ValidationFailed` carries every diagnostic.

Names are loaded on first use, so ``crucible-compile --help`` (which imports this
package) pays for none of it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.compile._accounted import camel_limits
    from crucible.compile._bounded import evaluate_expression
    from crucible.compile._diagnostics import Diagnostic, ValidationFailed
    from crucible.compile._durations import MAX_WAIT_S
    from crucible.compile._editions import SUPPORTED_EDITIONS, SUPPORTED_VERSIONS, ir_version_for
    from crucible.compile._fanout import MAX_INSTANCES, KeyProblem, describe_source, keyed_items
    from crucible.compile._manifest import compile_bytes, compile_path
    from crucible.compile._matrix_rules import TooManyCombinations, matrix_combinations
    from crucible.compile._params import check_params
    from crucible.compile._plan import CompiledPlan, load_plan_bytes, load_plan_path
    from crucible.compile._results import expression_reads
    from crucible.compile._sequences import (
        SequenceProblem,
        check_sequence_param_values,
        sequence_values,
    )

__all__ = [
    "MAX_INSTANCES",
    "MAX_WAIT_S",
    "SUPPORTED_EDITIONS",
    "SUPPORTED_VERSIONS",
    "CompiledPlan",
    "Diagnostic",
    "KeyProblem",
    "SequenceProblem",
    "TooManyCombinations",
    "ValidationFailed",
    "camel_limits",
    "check_params",
    "check_sequence_param_values",
    "compile_bytes",
    "compile_path",
    "describe_source",
    "evaluate_expression",
    "expression_reads",
    "ir_version_for",
    "keyed_items",
    "load_any",
    "load_plan_bytes",
    "load_plan_path",
    "matrix_combinations",
    "sequence_values",
]

_LAZY = {
    "MAX_INSTANCES": "_fanout",
    "KeyProblem": "_fanout",
    "keyed_items": "_fanout",
    "describe_source": "_fanout",
    "SequenceProblem": "_sequences",
    "check_sequence_param_values": "_sequences",
    "sequence_values": "_sequences",
    "TooManyCombinations": "_matrix_rules",
    "matrix_combinations": "_matrix_rules",
    "evaluate_expression": "_bounded",
    "MAX_WAIT_S": "_durations",
    "camel_limits": "_accounted",
    "expression_reads": "_results",
    "Diagnostic": "_diagnostics",
    "ValidationFailed": "_diagnostics",
    "SUPPORTED_EDITIONS": "_editions",
    "SUPPORTED_VERSIONS": "_editions",
    "ir_version_for": "_editions",
    "check_params": "_params",
    "compile_bytes": "_manifest",
    "compile_path": "_manifest",
    "CompiledPlan": "_plan",
    "load_plan_bytes": "_plan",
    "load_plan_path": "_plan",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def load_any(path: Path) -> CompiledPlan:
    """A ``.toml`` manifest is compiled; anything else is read as a plan file
    (without importing the manifest compiler and tomllib: ~7 ms of a dispatch)."""
    if Path(path).suffix == ".toml":
        # lazy: compile._manifest is not loaded with this module; only load_any() needs it
        from crucible.compile._manifest import compile_path

        return compile_path(Path(path))
    # lazy: compile._plan is not loaded with this module; only load_any() needs it
    from crucible.compile._plan import load_plan_path

    return load_plan_path(Path(path))
