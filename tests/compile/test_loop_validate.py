"""Every refusal of the scored loop's validation list (issue 18, docs/spec/loop.md
"Validation"): one diagnostic, a stable code, the ``[loop]`` key's line; and through
the real commands, one stderr line with file:line:col and exit 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.compile._manifest import analyze_manifest

BIN = Path(sys.executable).parent
VALIDATE = str(BIN / "crucible-validate")
COMPILE = str(BIN / "crucible-compile")

# lines:     1           2            3           4
HEAD = 'edition = 4\n[workflow]\nname = "l"\n'
TASKS = """
[[workflow.task]]
name = "seed"
run = "true"
emits = { items = "array" }

[[workflow.task]]
name = "propose"
needs = ["seed"]
run = "true"
emits = { value = "number" }

[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
run = "true"
emits = { score = "number", rank = "integer", label = "string" }

[[workflow.task]]
name = "check"
kind = "evaluate"
needs = ["propose"]
run = "true"
emits = { score = "number" }

[[workflow.task]]
name = "fan"
needs = ["seed"]
map = "seed.items"
run = "true"
emits = { score = "number" }

[[workflow.task]]
name = "grid"
matrix = { os = ["a", "b"] }
run = "true"

[[workflow.task]]
name = "side"
needs = ["propose"]
run = "true"

[[workflow.task]]
name = "tweak"
needs = ["propose"]
run = "true"
emits = { score = "number" }

[[workflow.task]]
name = "judge"
kind = "evaluate"
needs = ["side"]
run = "true"
emits = { score = "number" }

[[workflow.task]]
name = "wrap"
epilogue = true
run = "true"
"""
#: the line of [loop] in HEAD + TASKS + loop text
LOOP_LINE = (HEAD + TASKS).count("\n") + 1
GOOD = {
    "body": '["propose", "evaluate"]',
    "score": '"evaluate"',
    "metric": '"score"',
    "max_revisions": "5",
}


def loop_text(**keys: str | None) -> str:
    """A [loop] table: GOOD with ``keys`` replacing (None: dropping) entries, in order."""
    table = {**GOOD, **keys}
    return "[loop]\n" + "".join(f"{k} = {v}\n" for k, v in table.items() if v is not None)


def line_of(text: str, key: str) -> int:
    """The manifest line of ``key = `` inside the [loop] table."""
    lines = text.splitlines()
    start = lines.index("[loop]")
    return next(i for i, line in enumerate(lines[start:], start + 1) if line.startswith(f"{key} "))


def found(text: str) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest(text.encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


def test_the_good_loop_validates() -> None:
    assert found(HEAD + TASKS + loop_text()) == []


# (the replaced keys, the code, the key whose line it names)
REFUSALS: list[tuple[dict[str, str | None], str, str]] = [
    # the contract's list, in its order
    ({"body": '["propose", "evaluate", "ghost"]'}, "loop-unknown-task", "body"),
    ({"score": '"ghost"'}, "loop-unknown-task", "score"),
    ({"score": '"check"'}, "loop-score-not-in-body", "score"),
    ({"body": '["propose", "tweak"]', "score": '"tweak"'}, "loop-score-not-evaluate", "score"),
    ({"metric": '"rank2"'}, "loop-metric-undeclared", "metric"),
    ({"metric": '"label"'}, "loop-metric-not-numeric", "metric"),
    ({"min_delta": "-0.5"}, "bad-value", "min_delta"),
    ({"patience": "0"}, "bad-value", "patience"),
    ({"patience": "1.5"}, "wrong-type", "patience"),
    ({"patience": "true"}, "wrong-type", "patience"),
    ({"max_revisions": "0"}, "bad-value", "max_revisions"),
    ({"max_revisions": "-3"}, "bad-value", "max_revisions"),
    ({"max_revisions": '"10"'}, "wrong-type", "max_revisions"),
    ({"max_revisions": "10001"}, "bad-value", "max_revisions"),
    ({"body": '["propose", "evaluate", "wrap"]'}, "loop-epilogue", "body"),
    ({"body": '["fan", "evaluate", "propose"]'}, "loop-mapped", "body"),
    ({"body": '["grid", "evaluate", "propose"]'}, "loop-mapped", "body"),
    ({"colour": '"red"'}, "unknown-key", "colour"),
    # the rest of the table's structure
    ({"body": "[]"}, "bad-value", "body"),
    ({"body": '"propose"'}, "wrong-type", "body"),
    ({"body": '["propose", "propose", "evaluate"]'}, "duplicate-entry", "body"),
    ({"body": '["propose", 3]'}, "wrong-type", "body"),
    ({"score": "1"}, "wrong-type", "score"),
    ({"metric": '"not a field"'}, "bad-name", "metric"),
    ({"direction": '"up"'}, "bad-value", "direction"),
    ({"target": '"high"'}, "wrong-type", "target"),
    ({"target": "nan"}, "bad-value", "target"),
    ({"min_delta": "inf"}, "bad-value", "min_delta"),
    ({"time_budget": "0"}, "bad-value", "time_budget"),
    ({"time_budget": "-1.5"}, "bad-value", "time_budget"),
    ({"history_bytes": "255"}, "bad-value", "history_bytes"),
    ({"history_bytes": "1024.0"}, "wrong-type", "history_bytes"),
]


@pytest.mark.parametrize(
    ("keys", "code", "key"), REFUSALS, ids=[f"{c}:{k}" for _, c, k in REFUSALS]
)
def test_each_refusal_is_one_diagnostic_at_its_loop_key(
    keys: dict[str, str | None], code: str, key: str
) -> None:
    text = HEAD + TASKS + loop_text(**keys)
    problems = found(text)
    assert [c for c, _, _ in problems] == [code], problems
    where = problems[0][1]
    assert where is not None and where.startswith(f"pack.toml:{line_of(text, key)}:"), problems


@pytest.mark.parametrize("key", ["body", "score", "metric", "max_revisions"])
def test_a_required_key_missing_is_named(key: str) -> None:
    problems = found(HEAD + TASKS + loop_text(**{key: None}))
    assert [c for c, _, _ in problems] == ["missing-key"]
    assert f"[loop] has no {key}" in problems[0][2]
    assert problems[0][1] == f"pack.toml:{LOOP_LINE}:2"  # the [loop] header


def test_loop_must_be_a_table() -> None:
    problems = found('edition = 4\nloop = 3\n[workflow]\nname = "l"\n' + TASKS)
    assert [(c, w) for c, w, _ in problems] == [("wrong-type", "pack.toml:2:1")]


def test_a_body_that_is_not_a_sub_dag_names_the_outside_task() -> None:
    # propose -> side -> judge: side is outside the body but between two body tasks
    text = HEAD + TASKS + loop_text(body='["propose", "judge"]', score='"judge"')
    problems = found(text)
    assert [c for c, _, _ in problems] == ["loop-not-subdag"]
    _, where, message = problems[0]
    assert "'side' is outside the body" in message
    assert "(propose -> side -> judge)" in message
    assert where is not None and where.startswith(f"pack.toml:{line_of(text, 'body')}:")


def test_a_longer_outside_path_is_printed_whole() -> None:
    tasks = TASKS + (
        '\n[[workflow.task]]\nname = "far"\nneeds = ["side"]\nrun = "true"\n'
        '\n[[workflow.task]]\nname = "back"\nkind = "evaluate"\nneeds = ["far"]\n'
        'run = "true"\nemits = { score = "number" }\n'
    )
    text = HEAD + tasks + loop_text(body='["propose", "back"]', score='"back"')
    (code, _, message), *rest = found(text)
    assert code == "loop-not-subdag" and not rest
    assert "(propose -> side -> far -> back)" in message and "'side' is outside" in message


def test_before_after_and_unrelated_tasks_are_no_refusal() -> None:
    # seed is before the loop; side and judge run after it; fan, grid and wrap beside
    text = HEAD + TASKS + loop_text(body='["propose", "evaluate", "check"]')
    assert found(text) == []


def test_several_problems_are_all_reported() -> None:
    text = HEAD + TASKS + loop_text(direction='"up"', patience="0", colour="1")
    assert sorted(c for c, _, _ in found(text)) == ["bad-value", "bad-value", "unknown-key"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pack.toml"
    path.write_text(text)
    return path


CLI_CASES = [
    (loop_text(score='"check"'), "loop-score-not-in-body", "score"),
    (loop_text(metric='"label"'), "loop-metric-not-numeric", "metric"),
    (loop_text(min_delta="-0.01"), "bad-value", "min_delta"),
    (loop_text(body='["fan", "evaluate", "propose"]'), "loop-mapped", "body"),
    (loop_text(body='["propose", "judge"]', score='"judge"'), "loop-not-subdag", "body"),
]


@pytest.mark.parametrize(("loop", "code", "key"), CLI_CASES, ids=[c for _, c, _ in CLI_CASES])
def test_validate_prints_one_line_with_the_location_and_exits_1(
    tmp_path: Path, loop: str, code: str, key: str
) -> None:
    text = HEAD + TASKS + loop
    path = write(tmp_path, text)
    proc = subprocess.run([VALIDATE, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{path}:{line_of(text, key)}:")
    assert lines[0].endswith(f"[{code}]") and "Traceback" not in proc.stderr
    as_json = subprocess.run(
        [VALIDATE, "--json", str(path)], capture_output=True, text=True, timeout=60
    )
    assert as_json.returncode == 1
    (record,) = map(json.loads, as_json.stdout.splitlines())
    assert record["code"] == code and record["line"] == line_of(text, key)
    assert record["path"].startswith(f"$.loop.{key}")


@pytest.mark.parametrize(
    ("loop", "code", "key"), CLI_CASES[:3], ids=[c for _, c, _ in CLI_CASES[:3]]
)
def test_compile_refuses_with_one_line_and_writes_nothing(
    tmp_path: Path, loop: str, code: str, key: str
) -> None:
    text = HEAD + TASKS + loop
    path = write(tmp_path, text)
    out = tmp_path / "plan.json"
    proc = subprocess.run(
        [COMPILE, str(path), "-o", str(out)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        next(
            line
            for line in proc.stderr.splitlines()
            if line.startswith(f"crucible-compile: error: {path}:{line_of(text, key)}:")
            and line.endswith(f"[{code}]")
        )
    ]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["pack.toml"]


def test_compile_of_an_edition_3_pack_with_a_loop_exits_1_naming_edition_4(tmp_path: Path) -> None:
    text = (
        HEAD.replace("edition = 4", "edition = 3")
        + TASKS.split('[[workflow.task]]\nname = "fan"')[0]
        + loop_text()
    )
    path = write(tmp_path, text)
    proc = subprocess.run([COMPILE, str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        f"crucible-compile: error: {path}:{text.splitlines().index('[loop]') + 1}:"
    )
    assert "'loop' needs edition 4 (this pack is edition 3)" in line and line.endswith(
        "[unknown-key]"
    )
