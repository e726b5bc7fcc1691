"""``crucible.proof.reader``: the independent reader of proof-bearing bundles (RFC 0024
§7–§9, docs/spec/verify.md). It reaches its verdict from the bundle alone: it imports
``crucible.core`` and ``crucible.proof.layout``, never the writer.

    report = verify_bundle(path, VerifyOptions(expect=load_expectations(file)))

The names are loaded on first use, so ``crucible-verify --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.proof.reader._expect import (
        EXPECTATION_KEYS,
        BadExpectations,
        load_expectations,
    )
    from crucible.proof.reader._findings import CODES, Inability, Problem
    from crucible.proof.reader._report import Counts, Reading, Report
    from crucible.proof.reader._verify import VerifyOptions, verify_bundle

__all__ = [
    "CODES",
    "EXPECTATION_KEYS",
    "BadExpectations",
    "Counts",
    "Inability",
    "Problem",
    "Reading",
    "Report",
    "VerifyOptions",
    "load_expectations",
    "verify_bundle",
]

_HOME = {
    "EXPECTATION_KEYS": "_expect",
    "BadExpectations": "_expect",
    "load_expectations": "_expect",
    "CODES": "_findings",
    "Inability": "_findings",
    "Problem": "_findings",
    "Counts": "_report",
    "Reading": "_report",
    "Report": "_report",
    "VerifyOptions": "_verify",
    "verify_bundle": "_verify",
}


# independent of the writer on purpose: the same few lines as crucible.proof.writer's
# __init__; the two sides share nothing but core and layout (DESIGN.md), and a lazy
# package is no layout.
def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
