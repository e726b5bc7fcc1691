"""A dispatch checks its plan once (issue 14, start-up): stage's view of a plan the
compiler accepted is built without checking each task again, so every plan
the compiler accepts must pass stage's own checks, and both views must agree.
Also the pieces start-up was cut to: the JSON string scan of canon's depth
check, and the ``which`` that replaced shutil's in a worker's first spawn."""

from __future__ import annotations

import copy
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crucible.compile import load_plan_bytes
from crucible.core import canon
from crucible.core.errors import CrucibleError
from crucible.core.fsio import which
from crucible.stage._plan import build_view

REPO = Path(__file__).resolve().parents[2]
GOLDEN = sorted((REPO / "examples").glob("*/golden.plan.json"))
PLANS = [canon.loads(p.read_bytes()) for p in GOLDEN]

#: the task members stage's view reads and checks
KEYS = ("name", "kind", "needs", "join", "emits", "emits_files", "epilogue", "map", "inputs")


def _values_seen(key: str) -> list[Any]:
    """Every value the golden plans give ``key``: mutations the compiler may accept."""
    return [t[key] for plan in PLANS for t in plan["tasks"] if key in t]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "a", "a.b", "x.y.z"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@st.composite
def mutated_plans(draw: st.DrawFn) -> dict[str, Any]:
    plan: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(PLANS)))
    for _ in range(draw(st.integers(1, 3))):
        task = draw(st.sampled_from(plan["tasks"]))
        key = draw(st.sampled_from(KEYS))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            task.pop(key, None)
        elif choice == 1 and _values_seen(key):
            task[key] = copy.deepcopy(draw(st.sampled_from(_values_seen(key))))
        elif choice == 2 and key == "inputs" and isinstance(task.get("inputs"), dict):
            for spec in task["inputs"].values():  # producer/field against from
                if isinstance(spec, dict):
                    spec[draw(st.sampled_from(["producer", "field", "from"]))] = draw(JSON)
        else:
            task[key] = draw(JSON)
    return plan


@pytest.mark.parametrize("path", GOLDEN, ids=[p.parent.name for p in GOLDEN])
def test_the_checked_view_of_every_example_is_the_checked_ones(path: Path) -> None:
    plan = load_plan_bytes(path.read_bytes(), str(path)).plan
    assert build_view(plan, checked=True) == build_view(plan)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_plans())
def test_a_plan_the_compiler_accepts_passes_stages_checks(plan: dict[str, Any]) -> None:
    try:
        data = canon.dumps(plan)
        accepted = load_plan_bytes(data, "plan.json").plan
    except CrucibleError:
        return  # refused by the compiler: stage never sees it in a dispatch
    assert build_view(accepted) == build_view(accepted, checked=True)


OLD_STRING_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"')


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b'"', b"\\", b"[", b"{", b"]", b"}", b"\n", b"a", b":", b"\xe9"])))
def test_the_unrolled_string_scan_matches_the_old_one(parts: list[bytes]) -> None:
    data = b"".join(parts)
    assert canon._STRING_TOKENS.sub(b"", data) == OLD_STRING_TOKENS.sub(b"", data)


def test_which_is_shutils(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bins = [tmp_path / n for n in ("a", "b", "c")]
    for d in bins:
        d.mkdir()
    (bins[0] / "tool").write_text("")  # not executable
    (bins[1] / "tool").mkdir()  # a directory
    (bins[2] / "tool").write_text("#!/bin/sh\n")
    (bins[2] / "tool").chmod(0o755)
    (tmp_path / "here").write_text("")
    (tmp_path / "here").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    path = os.pathsep.join(str(d) for d in [*bins, bins[2]])
    for name in ("tool", "none", "./here", "here", str(bins[2] / "tool"), "a/tool"):
        for search in (path, "", os.pathsep + path, str(bins[0])):
            assert which(name, search) == shutil.which(name, path=search), (name, search)


@settings(max_examples=500, deadline=None)
@given(
    st.text(alphabet=st.sampled_from("aZ09_-.@/\\[]\x00\x1f\x7fé"), max_size=6)
    | st.sampled_from(["params", "item", ".", "..", "x" * 249, "x" * 250, "é" * 125])
)
def test_the_plain_name_shortcut_says_what_every_rule_says(name: str) -> None:
    from crucible.core import contract

    fast = contract.task_name_problems(name)
    plain = contract._PLAIN_NAME_RE
    try:
        contract._PLAIN_NAME_RE = re.compile(r"(?!)")  # never matches: every rule runs
        assert fast == contract.task_name_problems(name)
    finally:
        contract._PLAIN_NAME_RE = plain
