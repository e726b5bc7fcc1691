"""Byte-exact outputs against golden files. Regenerate with CRUCIBLE_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.stage import StateDir
from tests.stage.stageplans import plan, settle, task

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1"


def _golden(name: str, data: bytes) -> None:
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(data)
        return
    if not path.exists():
        pytest.fail(f"missing golden file {path}; run with CRUCIBLE_UPDATE_GOLDEN=1")
    assert data == path.read_bytes(), f"{name} differs from its golden file"


def _scenario(state: Path, version: int) -> dict:  # type: ignore[type-arg]
    inputs = {"score": "judge.score", "words": "split.words", "counts": "count.n"}
    p = plan(
        task("split", emits={"words": "array"}, emits_files=["text.txt"]),
        task("count", needs=["split"], map="split.words", emits={"n": "integer"}),
        task("judge", emits={"score": "number", "verdict": "string"}),
        task(
            "writer",
            "agent",
            needs=["split", "count", "judge"],
            join="settled",
            inputs=inputs if version == 2 else None,
            prompt="Write a summary of the words.",
        ),
        version=version,
        params={"lang": {"type": "string", "default": "en"}},
    )
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_bytes(canon.dumps([{"turn": 1, "said": "hello"}]))
    settle(
        p,
        state,
        "split",
        {"words": ["a", "b/../c", "."], "raw": "a b/../c ."},
        files={"text.txt": b"a b/../c ."},
    )
    for k, _ in enumerate(["a", "b/../c", "."]):
        settle(p, state, "count", {"n": k + 1} if k != 1 else {"n": "x"}, key=str(k))
    StateDir(p, state).settle_fold("count", ["0", "1", "2"])
    settle(p, state, "judge", {"score": 0.75, "verdict": "v" * 3000})
    return p


def test_v2_index_and_prompt_are_byte_exact(state: Path, ws: Path) -> None:
    p = _scenario(state, 2)
    StateDir(p, state).stage_inputs("writer", ws)
    _golden("v2-index.json", (ws / "inputs" / "@values" / "index.json").read_bytes())
    _golden("v2-prompt.txt", StateDir(p, state).render_prompt("writer", ws).encode())
    # an instance's record is one line of results/count.jsonl, the same bytes
    lines = (state / "results" / "count.jsonl").read_bytes().splitlines()
    _golden("v2-record-count-1.json", next(ln for ln in lines if b'"key":"1"' in ln))
    _golden("v2-record-count.json", (state / "results" / "count.json").read_bytes())


def test_v1_object_and_prompt_are_byte_exact(state: Path, ws: Path) -> None:
    p = _scenario(state, 1)
    StateDir(p, state).stage_inputs("writer", ws)
    _golden("v1-inputs.json", (ws / "inputs" / "@inputs.json").read_bytes())
    _golden("v1-prompt.txt", StateDir(p, state).render_prompt("writer", ws).encode())
