"""One typed stage API per run (issue 31 item 4): the run builds stage's view of
its plan once (in its :class:`crucible.stage.StateDir`) and its task graph once,
and hands both to every step; no forked worker builds the view again. Every
stage function takes that view (or is a method of the StateDir): none takes the
plan's JSON object, and stage keeps no module-level plan -> view cache."""

from __future__ import annotations

import ast
import io
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused
from crucible.stage import StateDir, load_result
from crucible.stage import _plan as stage_plan
from crucible.stage.commands import (
    InputsOptions,
    PromptOptions,
    TargetOptions,
    run_inputs,
    run_prompt,
)
from tests.run.dispatchtests import Pack, result, run
from tests.stage.stageplans import plan, settle, task

FANOUT = """
[[workflow.task]]
name = "src"
emits = { items = "array" }
run = '''printf '{"items": ["a", "b", "c"]}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.items"
emits = { up = "string" }
run = '''printf '{"up": "%s"}' "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "fold"
needs = ["each"]
inputs = { ups = "each.up" }
run = '''printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str, log: Path) -> None:
    """Every loaded crucible module's ``name`` appends a line to ``log`` per call,
    in this process and in the workers it forks (O_APPEND: whole lines)."""
    for module in [m for n, m in sys.modules.items() if n.startswith("crucible.")]:
        real = getattr(module, name, None)
        if not callable(real) or getattr(real, "__module__", "").startswith("tests."):
            continue

        def counted(*args: Any, _real: Callable[..., Any] = real, **kw: Any) -> Any:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()}\n".encode())
            finally:
                os.close(fd)
            return _real(*args, **kw)

        monkeypatch.setattr(module, name, counted)


def _calls(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.parametrize("cached", [False, True], ids=["plain", "cache"])
def test_a_run_builds_the_plan_view_and_the_graph_once(
    pack: Pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: bool
) -> None:
    import crucible.run.session._runner  # noqa: F401  (loaded, so its names are patched)

    plan = pack(FANOUT)
    cache = tmp_path / "cache" if cached else None
    views, graphs = tmp_path / "views", tmp_path / "graphs"
    _count_calls(monkeypatch, "build_view", views)
    _count_calls(monkeypatch, "build_graph", graphs)
    for state in ("s1", "s2"):  # the second run hits the cache (with --cache)
        before_views, before_graphs = len(_calls(views)), len(_calls(graphs))
        outcome = run(plan, tmp_path / state, jobs=2, cache=cache)
        assert outcome.exit_code == 0  # type: ignore[attr-defined]
        assert result(tmp_path / state, "fold") is not None
        assert _calls(views)[before_views:] == [os.getpid()]  # once, here: no worker built one
        assert _calls(graphs)[before_graphs:] == [os.getpid()]
    if cached:
        assert load_result(tmp_path / "s2", "src", None)["cached"] is True  # type: ignore[index]


def _plan() -> dict[str, Any]:
    return {
        "version": 2,
        "edition": 3,
        "tasks": [
            {"name": "a", "kind": "command", "run": "true", "emits": {"x": "integer"}},
            {"name": "b", "kind": "command", "run": "true", "needs": ["a"]},
        ],
    }


def test_a_state_dir_reads_and_writes_what_the_module_functions_do(tmp_path: Path) -> None:
    plan = _plan()
    sd = StateDir(plan, tmp_path)
    assert sd.view.plan is plan and sd.view.order == ("a", "b")
    assert sd.layout.state == tmp_path
    sd.record_settled("a", status="skipped", note="why")
    assert sd.load_result("a") == load_result(tmp_path, "a")
    StateDir(plan, tmp_path).record_settled("b", status="failed", note="no")
    assert sd.load_result("b") is not None and sd.load_result("b")["status"] == "failed"  # type: ignore[index]
    sd.remove_result("b")
    assert load_result(tmp_path, "b") is None
    other = sd.over(tmp_path / "other")
    assert other.view is sd.view and other.state == tmp_path / "other"
    assert other.load_result("a") is None
    with pytest.raises(InputRefused, match="not in the plan"):
        sd.record_settled("zz", status="skipped", note="")


def test_a_state_dir_refuses_a_plan_stage_cannot_read(tmp_path: Path) -> None:
    plan = _plan()
    plan["tasks"][1]["needs"] = ["nope"]
    with pytest.raises(InputRefused, match="unknown task 'nope'"):
        StateDir(plan, tmp_path)


def test_crucible_stage_builds_the_plan_view_once_per_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage command's StateDir: the view it checks the plan with is the one
    its staging and prompt use (no second build, no module-level cache)."""
    p = plan(
        task("a", emits={"x": "integer"}),
        task("ag", "agent", needs=["a"], inputs={"x": "a.x"}, prompt="Count."),
        version=2,
    )
    state = tmp_path / "st"
    state.mkdir()
    (state / "plan.json").write_bytes(canon.dumps(p))
    settle(p, state, "a", {"x": 41})
    views = tmp_path / "views"
    _count_calls(monkeypatch, "build_view", views)
    target = TargetOptions(state=str(state), task="ag")
    assert run_inputs(InputsOptions(target, "json"), io.BytesIO(), io.StringIO()) == 0
    assert len(_calls(views)) == 1
    out = io.BytesIO()
    assert run_prompt(PromptOptions(target), out, io.StringIO()) == 0
    assert out.getvalue().startswith(b"Count.") and len(_calls(views)) == 2


#: the two places a plan's JSON object enters stage: where its view is built
_TAKES_THE_PLAN_JSON = {("_plan.py", "build_view"), ("_statedir.py", "__init__")}


def test_no_stage_function_takes_the_plan_json_or_caches_a_view() -> None:
    """Past the StateDir (and build_view), stage reads a plan only through its
    typed view: no ``plan``/``pv`` parameter is the JSON object (typed ``Any``,
    a dict, or not at all), as the one-entry module cache once let every
    function take, and no module keeps a plan -> view cache."""
    stage_dir = Path(__file__).resolve().parents[2] / "tools" / "stage"
    found = []
    for path in sorted(stage_dir.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (path.name, node.name) in _TAKES_THE_PLAN_JSON:
                continue
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                typed = ast.unparse(arg.annotation) if arg.annotation else ""
                if arg.arg in ("plan", "pv") and (
                    not typed or "Any" in typed or "dict" in typed or "Mapping" in typed
                ):
                    found.append(f"{path.name}:{node.lineno} {node.name}({arg.arg}: {typed})")
    assert found == []
    assert not hasattr(stage_plan, "view") and not hasattr(stage_plan, "_cache")


def test_no_part_of_run_takes_the_stage_package_as_a_value() -> None:
    """run/ reaches stage through the typed StateDir (or stage's typed functions),
    never a ``stage`` parameter typed Any (or untyped) or a ``stage`` attribute
    holding the package, which mypy cannot check (issue 31 item 4). (A proof
    workflow's stage, a name, is typed ``str``.)"""
    tools = Path(__file__).resolve().parents[2] / "tools" / "run"
    found = []
    for path in sorted(tools.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                found += [
                    f"{path.name}:{node.lineno}"
                    for a in args
                    if a.arg == "stage"
                    and (a.annotation is None or ast.unparse(a.annotation) == "Any")
                ]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr == "stage"
                and isinstance(node.ctx, ast.Store)
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []
