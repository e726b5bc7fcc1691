"""Reading packed result records (``STATE/results/<task>.jsonl``) in tests, by
the format's rules (docs/spec/inputs.md 5), independently of stage's reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def keyed(state: Path, task: str) -> dict[str, dict[str, Any]]:
    """Every keyed record of ``task`` by key: the last line for a key wins, a
    tombstone removes it, a torn last line is ignored."""
    path = Path(state) / "results" / f"{task}.jsonl"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        rec = json.loads(line)
        if rec.get("removed") is True:
            out.pop(rec["key"], None)
        else:
            out[rec["key"]] = rec
    return out


def keyed_record(state: Path, task: str, key: str) -> dict[str, Any]:
    """The record of one keyed unit (KeyError without one)."""
    return keyed(state, task)[key]
