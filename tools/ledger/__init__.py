"""Durable steps: a content-keyed, fsync'd NDJSON ledger that survives crashes.

See docs/spec/ledger.md. Lookup order is memo, then ledger, then the work. The
names below are imported on first use, so ``crucible-ledger --help`` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crucible.ledger.identity import Identity, command_key, content_step
    from crucible.ledger.ledger import Ledger, OpenReport, Outcome, Reply
    from crucible.ledger.maintenance import CompactReport, compact, verify

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
    "Identity": "identity",
    "command_key": "identity",
    "content_step": "identity",
    "Ledger": "ledger",
    "OpenReport": "ledger",
    "Outcome": "ledger",
    "Reply": "ledger",
    "CompactReport": "maintenance",
    "compact": "maintenance",
    "verify": "maintenance",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"crucible.ledger.{_HOME[name]}"), name)
    raise AttributeError(f"module 'crucible.ledger' has no attribute {name!r}")
