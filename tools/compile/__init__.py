"""Pack manifests (TOML + optional Starlark) → plan IR; validation.

Public API (docs/spec/plan-ir.md, /CONTRACT):

- :func:`compile_path` — a manifest (``.toml``) → :class:`CompiledPlan`
- :func:`load_plan_path` — a plan JSON file, strictly checked
- :func:`load_any` — ``.toml`` → compile, otherwise a plan file
- :class:`CompiledPlan` — ``plan`` (dict), ``data`` (canonical bytes), ``digest``, ``warnings``

Errors are :mod:`crucible.core.errors` subclasses with ``where`` set;
:class:`ValidationFailed` carries every diagnostic.
"""

from __future__ import annotations

from pathlib import Path

from crucible.compile.diagnostics import Diagnostic, ValidationFailed
from crucible.compile.editions import (
    SUPPORTED_EDITIONS,
    SUPPORTED_VERSIONS,
    ir_version_for,
)
from crucible.compile.manifest import compile_bytes, compile_path
from crucible.compile.plan import CompiledPlan, load_plan_bytes, load_plan_path

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


def load_any(path: Path) -> CompiledPlan:
    """A ``.toml`` manifest is compiled; anything else is read as a plan file."""
    if Path(path).suffix == ".toml":
        return compile_path(Path(path))
    return load_plan_path(Path(path))
