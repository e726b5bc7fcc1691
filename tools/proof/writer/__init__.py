"""``crucible.proof.writer``: apply an operation log and write a proof-bearing bundle
(docs/spec/admission-proof.md).

    result = prove(ProveOptions(workflow, operations, artifacts, out))
    result = export(ExportOptions(state, out))  # an accounted run's state dir

The pipeline is :mod:`._prove`; the decisions :mod:`._engine`. The names are loaded
on first use, so ``crucible-prove --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.proof.writer._engine import Decision, Forbidden, Unrecordable
    from crucible.proof.writer._export import ExportOptions, export
    from crucible.proof.writer._model import Workflow, parse_workflow
    from crucible.proof.writer._prove import ProveOptions, ProveResult, prove

__all__ = [
    "Decision",
    "ExportOptions",
    "Forbidden",
    "ProveOptions",
    "ProveResult",
    "Unrecordable",
    "Workflow",
    "export",
    "parse_workflow",
    "prove",
]

_HOME = {
    "Decision": "_engine",
    "Forbidden": "_engine",
    "Unrecordable": "_engine",
    "ExportOptions": "_export",
    "export": "_export",
    "Workflow": "_model",
    "parse_workflow": "_model",
    "ProveOptions": "_prove",
    "ProveResult": "_prove",
    "prove": "_prove",
}


# the reader's copy of these lines is independent of the writer on purpose: the two
# sides share nothing but core and layout (DESIGN.md), and a lazy package is no layout.
def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
