"""``outcome.loop``: how the scored loop ended, for the epilogues (docs/spec/loop.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.core.errors import OperationalError, ParseError
from crucible.core.fdio import read_file
from crucible.stage._layout import StateLayout

__all__ = ["loop_outcome"]


def loop_outcome(state: Path) -> dict[str, Any]:
    """``{stop_reason, revisions, kept_revision, best_score}`` from ``STATE/loop.json``
    (the dispatcher writes it atomically after every revision); a loop that never
    started has run no revision."""
    path = StateLayout(Path(state)).loop_path
    try:
        doc = canon.loads(read_file(path))
    except FileNotFoundError:
        doc = {}
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    except canon.CanonError as exc:
        raise ParseError(exc.message, where=str(path)) from None
    doc = doc if isinstance(doc, dict) else {}
    revisions = doc.get("revisions")
    return {
        "stop_reason": doc.get("stop_reason"),
        "revisions": len(revisions) if isinstance(revisions, list) else 0,
        "kept_revision": doc.get("kept_revision"),
        "best_score": doc.get("best_score"),
    }
