"""An accounted run's bounds in ``report`` (docs/spec/export.md §7): the bytes, files,
instances and records its retained history uses of each bound, and its refusals,
read from ``STATE/proof/usage.json``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import IO, Any

from crucible.core import canon
from crucible.core.errors import CrucibleError
from crucible.run.report._state import read_regular

__all__ = ["accounting_line", "refused_label", "render_accounting"]

_BOUND = re.compile(r"\Arefused: (?:would exceed |a (?:case|record) would exceed )?(max_[a-z_]+)")


def refused_label(note: str | None) -> str | None:
    """``refused: max_bytes`` for a unit the accounting refused (its note says which
    bound), else None."""
    if note is None or not note.startswith("refused: "):
        return None
    m = _BOUND.match(note)
    return f"refused: {m.group(1)}" if m else "refused"


def _usage(state: Path) -> dict[str, Any] | None:
    data = read_regular(state / "proof" / "usage.json", "usage.json")
    if data is None:
        return None
    try:
        value = canon.loads(data)
    except CrucibleError:
        return None
    return value if isinstance(value, dict) and value.get("usageVersion") == 1 else None


def accounting_line(state: Path) -> dict[str, Any] | None:
    """``report --json``'s last line of an accounted run: ``{"accounting": usage}``."""
    usage = _usage(state)
    return None if usage is None else {"accounting": usage}


def render_accounting(state: Path, out: IO[str]) -> None:
    """``accounting: bytes U of L, files U of L, ...`` and one line per refusal."""
    usage = _usage(state)
    if usage is None:
        return
    used, limits = usage.get("used", {}), usage.get("limits", {})
    parts = []
    for what, limit in (
        ("bytes", "maxBytes"),
        ("files", "maxFiles"),
        ("instances", "maxInstances"),
        ("records", "maxRecords"),
    ):
        parts.append(f"{what} {used.get(what, '?')} of {limits.get(limit, '?')}")
    out.write("\naccounting: " + ", ".join(parts) + "\n")
    for r in usage.get("refusals", []):
        if not isinstance(r, dict):
            continue
        name = r.get("task", "?") if r.get("key") is None else f"{r.get('task')}[{r.get('key')}]"
        out.write(f"  {name}: {r.get('note', '')}\n")
