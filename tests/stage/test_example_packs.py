"""Stage against the compiled example packs: a minimal in-test executor runs
each task's real command between stage_inputs and capture (the real executor
is dispatch's; this checks the file contract end to end)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from crucible.core import canon
from crucible.stage import (
    StateDir,
    StateLayout,
    load_result,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAKE = {
    "string": "s",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "object": {},
    "array": [],
    "any": None,
}


def _order(plan: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = {t["name"]: t for t in plan["tasks"]}
    done: list[str] = []
    pending = [t["name"] for t in plan["tasks"] if not t["epilogue"]]
    while pending:
        for name in pending:
            if all(n in done for n in tasks[name]["needs"]):
                done.append(name)
                pending.remove(name)
                break
        else:
            raise AssertionError("cycle")
    return [tasks[n] for n in done] + [t for t in plan["tasks"] if t["epilogue"]]


def _attempt(
    plan: dict[str, Any], state: Path, t: dict[str, Any], key: str | None
) -> dict[str, Any]:
    name = t["name"]
    ws = StateLayout(state).work_dir(name, key)
    ws.mkdir(parents=True, exist_ok=True)
    staged = StateDir(plan, state).stage_inputs(name, ws, key=key)
    out = ws / "@output.json"
    if t["kind"] == "agent":
        prompt = StateDir(plan, state).render_prompt(name, ws, key=key)
        assert prompt.startswith(t.get("prompt", ""))
        out.write_bytes(canon.dumps({f: FAKE[ty] for f, ty in t["emits"].items()}))
        code = 0
    else:
        env = {**os.environ, **staged.env, "CRUCIBLE_OUTPUT": str(out)}
        run = t["run"]
        proc = subprocess.run(
            run, shell=isinstance(run, str), cwd=ws, env=env, timeout=60, capture_output=True
        )
        code = proc.returncode
    return StateDir(plan, state).capture(name, ws, output_file=out, exit_code=code, key=key)


def _run_pack(plan: dict[str, Any], state: Path) -> dict[str, str]:
    params = {k: v.get("default") for k, v in plan["workflow"]["params"].items()}
    (state / "params.json").write_bytes(canon.dumps(params))
    statuses: dict[str, str] = {}
    for t in _order(plan):
        name = t["name"]
        blocked = [n for n in t["needs"] if statuses[n] != "passed"]
        if blocked and t["join"] == "all" and not t["epilogue"]:
            statuses[name] = StateDir(plan, state).record_settled(
                name, status="skipped", note="blocked"
            )["status"]
            continue
        if "map" in t:
            keys = [k for k, _ in StateDir(plan, state).map_items(name)]
            for k in keys:
                _attempt(plan, state, t, k)
            statuses[name] = StateDir(plan, state).settle_fold(name, keys)["status"]
        else:
            statuses[name] = _attempt(plan, state, t, None)["status"]
    return statuses


def _plan(example: str) -> dict[str, Any]:
    return canon.loads((EXAMPLES / example / "golden.plan.json").read_bytes())  # type: ignore[no-any-return]


def test_legacy_v1_pack_runs_through_stage(state: Path) -> None:
    plan = _plan("legacy-v1")
    assert _run_pack(plan, state) == {
        name: "passed" for name in ("split", "count", "total", "cleanup")
    }
    # the fan-out consumer got every instance's output in item order in its v1 object
    total = (state / "files" / "total" / "total.txt").read_text()
    assert "'count': [{'words': 4}, {'words': 2}, {'words': 3}]" in total
    assert load_result(state, "count", "2")["output"] == {"words": 3}  # type: ignore[index]


def test_edition2_pack_runs_through_stage(state: Path) -> None:
    plan = _plan("edition2")
    assert set(_run_pack(plan, state).values()) == {"passed"}
    # render captured report.json; review (an agent) is handed it under inputs/render/
    assert (state / "work" / "review" / "inputs" / "render" / "report.json").exists()


def test_starlark_edition3_pack_stages_folds_for_the_agent(state: Path) -> None:
    plan = _plan("starlark")
    statuses = _run_pack(plan, state)
    assert statuses == {
        "fetch": "passed",
        "translate-en": "passed",
        "translate-fr": "passed",
        "translate-de": "passed",
        "check": "passed",
        "notify": "passed",
    }
    # the epilogue's outcome is at $CRUCIBLE_INPUTS_DIR/outcome (no extension)
    outcome = canon.loads(
        (state / "work" / "notify" / "inputs" / "@values" / "outcome").read_bytes()
    )
    assert outcome["tasks"]["check"] == {"status": "passed", "note": "", "fields": {}}
    index = canon.loads(
        (state / "work" / "check" / "inputs" / "@values" / "index.json").read_bytes()
    )
    assert [e["name"] for e in index["inputs"]] == ["de", "en", "fr"]
    assert all(
        e["fold"] and [x["key"] for x in e["entries"]] == ["0", "1"] for e in index["inputs"]
    )
    prompt = StateDir(plan, state).render_prompt("check", state / "work" / "check")
    assert (
        "- en (string, fold of 2 entries, 8 bytes, inputs/@values/en/, from translate-en.text)"
        in prompt
    )
