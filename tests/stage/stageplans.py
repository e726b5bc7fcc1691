"""Hand-built plan dicts in the shape of docs/spec/plan-ir.md, and a way to settle
tasks through the real capture path (the compiler is built in parallel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.stage import StateDir


def task(
    name: str,
    kind: str = "command",
    *,
    needs: tuple[str, ...] | list[str] = (),
    emits: dict[str, str] | None = None,
    emits_files: tuple[str, ...] | list[str] = (),
    join: str = "all",
    map: str | None = None,
    inputs: dict[str, str] | None = None,
    epilogue: bool = False,
    prompt: str | None = None,
) -> dict[str, Any]:
    t: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "needs": list(needs),
        "join": join,
        "emits": dict(emits or {}),
        "emits_files": list(emits_files),
        "retries": 0,
        "epilogue": epilogue,
    }
    if kind != "agent":
        t["run"] = ["true"]
    if map is not None:
        t["map"] = map
    if prompt is not None:
        t["prompt"] = prompt
    if inputs:
        t["inputs"] = {}
        for input_name, ref in inputs.items():
            producer, _, fld = ref.rpartition(".")
            t["inputs"][input_name] = {
                "from": ref,
                "producer": producer,
                "field": fld,
                "type": "any",
            }
    return t


def plan(
    *tasks: dict[str, Any], version: int = 1, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    p = {
        "version": version,
        "edition": 3 if version == 2 else 1,
        "workflow": {"name": "t", "params": params or {}},
        "tasks": list(tasks),
    }
    # Declared input types come from the producer's emits, as compile does.
    by_name = {t["name"]: t for t in tasks}
    for t in tasks:
        for spec in t.get("inputs", {}).values():
            spec["type"] = by_name[spec["producer"]]["emits"].get(spec["field"], "any")
    plain: dict[str, Any] = canon.loads(canon.dumps(p))  # JSON-shaped, as tools receive
    return plain


def settle(
    p: dict[str, Any],
    state: Path,
    name: str,
    output: Any,
    *,
    key: str | None = None,
    exit_code: int = 0,
    files: dict[str, bytes] | None = None,
    emit_cap: int = 65536,
) -> dict[str, Any]:
    """Run nothing, but leave what a task would: its result file and files, then capture."""
    ws = state / "work" / name / ("k-" + str(abs(hash(key))) if key is not None else "")
    ws.mkdir(parents=True, exist_ok=True)
    for rel, data in (files or {}).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(data)
    out = ws / "@output.json"
    if output is not None:
        out.write_bytes(canon.dumps(output) if not isinstance(output, bytes) else output)
    return StateDir(p, state).capture(
        name, ws, output_file=out, exit_code=exit_code, key=key, emit_cap=emit_cap
    )


def consume(p: dict[str, Any], state: Path, name: str) -> Path:
    """Stage ``name``'s inputs into its default workspace, ``work/<name>``; the workspace."""

    ws = state / "work" / name
    StateDir(p, state).stage_inputs(name, ws)
    return ws


def finish(p: dict[str, Any], state: Path, name: str) -> dict[str, Any]:
    """Settle ``name`` (staged by :func:`consume`) as passed without a result file."""
    ws = state / "work" / name
    return StateDir(p, state).capture(name, ws, output_file=ws / "none", exit_code=0)


def loop_entry(
    n: int,
    score: Any = None,
    *,
    kept: bool = False,
    note: str = "",
    fields: dict[str, Any] | None = None,
    duration_ms: int = 5,
) -> dict[str, Any]:
    """A STATE/loop.json revision entry as the loop engine writes it: failed without
    a ``score``; ``fields`` default to the score's own."""
    if fields is None:
        fields = {} if score is None else {"score": score}
    return {
        "revision": n,
        "status": "passed" if score is not None else "failed",
        "score": score,
        "verdict": "improved" if kept else ("failed" if score is None else "not_improved"),
        "kept": kept,
        "note": note,
        "delta": None,
        "fields": fields,
        "duration_ms": duration_ms,
    }
