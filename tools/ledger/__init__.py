"""Durable steps: a content-keyed, fsync'd NDJSON ledger that survives crashes.

See docs/spec/ledger.md. Lookup order is memo, then ledger, then the work.
"""

from __future__ import annotations

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
