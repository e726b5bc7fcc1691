"""Helpers shared by the dispatcher tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_bytes().splitlines()]


def result(state: Path, task: str, key: str | None = None) -> dict[str, Any] | None:
    from crucible import stage

    return stage.load_result(state, task, key)
