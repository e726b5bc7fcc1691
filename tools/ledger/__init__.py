"""Durable steps: a content-keyed, fsync'd NDJSON ledger that survives crashes.

See docs/spec/ledger.md. Lookup order is memo, then ledger, then the work. The
names below are imported on first use, so ``crucible-ledger --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.ledger._identity import Identity, command_key, content_step
    from crucible.ledger._ledger import Ledger, OpenReport, Outcome, Reply
    from crucible.ledger._maintenance import CompactReport, compact, verify

__all__ = [
    "CompactReport",
    "Identity",
    "Ledger",
    "OpenReport",
    "Outcome",
    "Reply",
    "command_key",
    "compact",
    "content_step",
    "verify",
]

_HOME = {
    "Identity": "_identity",
    "command_key": "_identity",
    "content_step": "_identity",
    "Ledger": "_ledger",
    "OpenReport": "_ledger",
    "Outcome": "_ledger",
    "Reply": "_ledger",
    "CompactReport": "_maintenance",
    "compact": "_maintenance",
    "verify": "_maintenance",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(f"crucible.ledger.{_HOME[name]}"), name)
        # kept: a function-level ``from crucible.ledger import Ledger`` on a hot
        # path (a cache save per unit) asks again each time
        globals()[name] = value
        return value
    raise AttributeError(f"module 'crucible.ledger' has no attribute {name!r}")
