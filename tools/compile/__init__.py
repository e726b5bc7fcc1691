"""Pack manifests (TOML + optional Starlark) → plan IR; validation.

Public API (docs/spec/plan-ir.md, docs/spec/manifest.md; the plan schemas docs/schemas/plan-v*.json):

- :func:`compile_path` — a manifest (``.toml``) → :class:`CompiledPlan`
- :func:`load_plan_path` — a plan JSON file, strictly checked
- :func:`load_any` — ``.toml`` → compile, otherwise a plan file
- :class:`CompiledPlan` — ``plan`` (dict), ``data`` (canonical bytes), ``digest``, ``warnings``
- ``crucible.compile._params.check(plan, supplied)`` resolves a run's params (dispatch calls it)

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
    from crucible.compile._diagnostics import Diagnostic, ValidationFailed
    from crucible.compile._editions import SUPPORTED_EDITIONS, SUPPORTED_VERSIONS, ir_version_for
    from crucible.compile._manifest import compile_bytes, compile_path
    from crucible.compile._plan import CompiledPlan, load_plan_bytes, load_plan_path

__all__ = [
    "SUPPORTED_EDITIONS",
    "SUPPORTED_VERSIONS",
    "CompiledPlan",
    "Diagnostic",
    "ValidationFailed",
    "compile_bytes",
    "compile_path",
    "ir_version_for",
    "load_any",
    "load_plan_bytes",
    "load_plan_path",
]

_LAZY = {
    "Diagnostic": "_diagnostics",
    "ValidationFailed": "_diagnostics",
    "SUPPORTED_EDITIONS": "_editions",
    "SUPPORTED_VERSIONS": "_editions",
    "ir_version_for": "_editions",
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
