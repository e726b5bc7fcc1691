"""crucible-stage through click's CliRunner and through the installed script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from crucible.core import canon
from crucible.stage.cli import cli
from tests.packed import keyed

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "stage"))
from tests.stage.stageplans import plan, settle, task

SCRIPT = Path(sys.executable).parent / "crucible-stage"


def _run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop(
        "CRUCIBLE_EMIT_CAP", None
    ) if env is None or "CRUCIBLE_EMIT_CAP" not in env else None
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60
    )


def _state(tmp_path: Path, p: dict) -> Path:  # type: ignore[type-arg]
    state = tmp_path / "st"
    state.mkdir()
    (state / "plan.json").write_bytes(canon.dumps(p))
    return state


def _v2(tmp_path: Path) -> tuple[dict, Path]:  # type: ignore[type-arg]
    p = plan(
        task("src", emits={"xs": "object"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "string"}),
        task("a", emits={"x": "integer"}),
        task("c", needs=["a"], inputs={"x": "a.x"}),
        task("ag", "agent", needs=["a"], inputs={"x": "a.x"}, prompt="Count."),
        version=2,
    )
    state = _state(tmp_path, p)
    settle(p, state, "a", {"x": 41})
    settle(p, state, "src", {"xs": {"a/../../x": "i1", "..": "i2"}})
    return p, state


def _capture(state: Path, task: str, ws: Path, *more: str, key: str | None = None) -> list[str]:
    """``capture`` arguments settling ``task`` (instance ``key``) in ``ws`` with exit code 0."""
    keyed_args = ["--key", key] if key is not None else []
    return ["capture", "--state", str(state), "--task", task, *keyed_args,
            "--workspace", str(ws), "--exit-code", "0", *more]  # fmt: skip


def test_help_and_version() -> None:
    r = _run("--help")
    assert r.returncode == 0 and "inputs" in r.stdout and "capture" in r.stdout
    r = _run("--version")
    assert r.returncode == 0 and "crucible-stage" in r.stdout
    for sub in ("inputs", "capture", "prompt"):
        assert _run(sub, "--help").returncode == 0


def test_inputs_env_can_be_evaluated_by_a_shell(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    ws = tmp_path / "w o'rk"  # a quote and a space survive the shell quoting
    r = subprocess.run(
        [
            "sh",
            "-c",
            f'eval "$("{SCRIPT}" inputs --state "$1" --task c --workspace "$2")" && cat "$CRUCIBLE_INPUTS_DIR/x"',
            "sh",
            str(state),
            str(ws),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "41"


def test_inputs_json_and_default_workspace(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    r = _run("inputs", "--state", str(state), "--task", "m", "--key", "a/../../x", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    expected = state / "work" / "m" / "a%2F%2E%2E%2F%2E%2E%2Fx" / "inputs" / "@values"
    assert env == {"CRUCIBLE_INPUTS_DIR": str(expected.absolute())}
    assert (expected / "item").read_bytes() == b'"i1"'


def test_v1_inputs_env(tmp_path: Path) -> None:
    p = plan(task("a", emits={"x": "integer"}), task("c", needs=["a"]))
    state = _state(tmp_path, p)
    settle(p, state, "a", {"x": 1})
    result = CliRunner().invoke(cli, ["inputs", "--state", str(state), "--task", "c"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == """export CRUCIBLE_INPUTS='{"a":{"x":1},"params":{}}'"""
    assert lines[1].startswith("export CRUCIBLE_INPUTS_FILE=") and lines[1].endswith("@inputs.json")


def test_capture_pass_and_failure_exit_codes(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = ws / "out.json"
    out.write_text('{"v": "hello"}')
    r = _run(*_capture(state, "m", ws, key=".."), env={"CRUCIBLE_OUTPUT": str(out)})
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["status"] == "passed" and rec["key"] == ".."
    assert ".." in keyed(state, "m")

    out.write_text('{"v": 5}')
    r = _run(*_capture(state, "m", ws, "--output", str(out), key=".."))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(
        f"crucible-stage: error: {out}: m[..] failed: declared field 'v' is a JSON integer"
    )
    assert json.loads(r.stdout)["status"] == "failed"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no result file"),
        ("[1]", "is a JSON array, not an object"),
        ("{oops", "not valid JSON"),
        ('{"x": "41"}', "declared field 'x' is a JSON string, not integer"),
    ],
)
def test_capture_bad_results_one_line_exit_1(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    _, state = _v2(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = ws / "o.json"
    if content is not None:
        out.write_text(content)
    result = CliRunner().invoke(cli, _capture(state, "a", ws, "--output", str(out)))
    # CliRunner shows the exception; the command edge (core.cli.run) maps it, tested below.
    assert fragment in str(result.exception)
    r = _run(*_capture(state, "a", ws, "--output", str(out)))
    assert r.returncode == 1 and fragment in r.stderr and r.stderr.count("\n") == 1


def test_emit_cap_option_and_env(tmp_path: Path) -> None:
    p = plan(task("a", emits={"x": "string"}), version=2)
    state = _state(tmp_path, p)
    ws = tmp_path / "ws"
    ws.mkdir()
    out = ws / "o.json"
    out.write_text('{"x": "0123456789"}')  # 12 bytes of canonical JSON
    base = _capture(state, "a", ws, "--output", str(out))
    assert _run(*base, "--emit-cap", "12").returncode == 0
    r = _run(*base, "--emit-cap", "11")
    assert r.returncode == 1 and "12 bytes" in r.stderr and "cap of 11 bytes" in r.stderr
    assert _run(*base, env={"CRUCIBLE_EMIT_CAP": "11"}).returncode == 1
    assert _run(*base, env={"CRUCIBLE_EMIT_CAP": "12"}).returncode == 0
    r = _run(*base, "--emit-cap", "lots")
    assert r.returncode == 2 and "--emit-cap" in r.stderr
    r = _run(*base, env={"CRUCIBLE_EMIT_CAP": "-1"})
    assert r.returncode == 2 and "CRUCIBLE_EMIT_CAP" in r.stderr


def test_capture_needs_an_output_file(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "CRUCIBLE_OUTPUT"}
    r = subprocess.run(
        [str(SCRIPT), "capture", "--state", str(state), "--task", "a", "--exit-code", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and "CRUCIBLE_OUTPUT" in r.stderr


def test_prompt(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    r = _run("prompt", "--state", str(state), "--task", "ag")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Count.\n\n## Inputs\n") and "  value: 41" in r.stdout
    r = _run("prompt", "--state", str(state), "--task", "c")
    assert r.returncode == 1 and "not an agent" in r.stderr


def test_plan_and_state_problems(tmp_path: Path) -> None:
    p, state = _v2(tmp_path)
    other = plan(
        task("a", emits={"x": "integer"}), task("c", needs=["a"], inputs={"x": "a.x"}), version=2
    )
    (tmp_path / "other.json").write_bytes(canon.dumps(other))
    r = _run("inputs", "--plan", str(tmp_path / "other.json"), "--state", str(state), "--task", "c")
    assert r.returncode == 1 and "differs from the one the run admitted" in r.stderr
    # unparseable plan: 2; unsupported version: 1; unsafe task name: 1
    (tmp_path / "bad.json").write_text("{")
    assert (
        _run(
            "inputs", "--plan", str(tmp_path / "bad.json"), "--state", str(tmp_path), "--task", "c"
        ).returncode
        == 2
    )
    cases: tuple[tuple[Callable[[Any], object], int, str], ...] = (
        (lambda q: q.update(version=4), 1, "version 4 is not supported"),
        (lambda q: q["tasks"][0].update(name=".."), 1, "is a path of its own"),
        (lambda q: q["tasks"][0].update(name="@x"), 1, "reserved for inputs/@values"),
    )
    for mutate, code, fragment in cases:
        q = json.loads(json.dumps(p))
        mutate(q)
        (tmp_path / "q.json").write_bytes(canon.dumps(q))
        r = _run(
            "inputs", "--plan", str(tmp_path / "q.json"), "--state", str(tmp_path), "--task", "c"
        )
        assert r.returncode == code and fragment in r.stderr and "q.json" in r.stderr, r.stderr
    r = _run("inputs", "--state", str(state), "--task", "nope")
    assert r.returncode == 1 and "'nope' is not in the plan" in r.stderr
    r = _run("inputs", "--state", str(state), "--task", "m")
    assert r.returncode == 1 and "give the instance key" in r.stderr
    r = _run("inputs", "--state", str(tmp_path / "missing"), "--task", "c")
    assert r.returncode == 2 and "--state: no such directory" in r.stderr


@pytest.mark.parametrize("command", ["inputs", "capture", "prompt"])
def test_paths_named_on_the_command_line_missing_or_of_the_wrong_kind_are_exit_2(
    tmp_path: Path, command: str
) -> None:
    """cli.md: 2 is a usage error; a path the user typed that is missing or of the
    wrong kind is one, as in compile, ledger and prove (not 1, not 3)."""
    _, state = _v2(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("{}")
    extra = ["--exit-code", "0", "--output", str(a_file)] if command == "capture" else []
    task = ["--task", "ag" if command == "prompt" else "c"]
    cases = [
        (["--state", str(tmp_path / "missing")], "--state: no such directory"),
        (["--state", str(a_file)], "--state: not a directory"),
        (["--state", str(state), "--plan", str(tmp_path / "nope.json")], "--plan: no such file"),
        (["--state", str(state), "--plan", str(tmp_path)], "--plan: not a file"),
        (["--state", str(state), "--workspace", str(a_file)], "--workspace: not a directory"),
    ]
    if command == "capture":  # capture settles an existing workspace; the others create it
        cases.append(
            (["--state", str(state), "--workspace", str(tmp_path / "no-ws")], "no such directory")
        )
    for args, fragment in cases:
        r = _run(command, *args, *task, *extra)
        assert r.returncode == 2, (args, r.stderr)
        assert fragment in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (state / "results" / "c.json").exists()  # nothing was captured


def test_a_state_without_a_plan_is_refused_not_a_usage_error(tmp_path: Path) -> None:
    # STATE exists but holds no admitted plan: a state problem (1), naming the way out
    (tmp_path / "st").mkdir()
    r = _run("inputs", "--state", str(tmp_path / "st"), "--task", "c")
    assert r.returncode == 1 and "holds no admitted plan (give --plan PLAN)" in r.stderr


def test_corrupt_record_leaves_no_inputs_directory(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    (state / "results" / "a.json").write_text('"just a string"')
    ws = tmp_path / "ws"
    r = _run("inputs", "--state", str(state), "--task", "c", "--workspace", str(ws))
    assert r.returncode == 2 and "a.json" in r.stderr and "must be a JSON object" in r.stderr
    assert r.stderr.count("\n") == 1
    assert os.listdir(ws) == []


def test_io_failure_is_exit_3_and_umbrella_runs_stage(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = _run("inputs", "--state", str(state), "--task", "c", "--workspace", str(blocker / "ws"))
    assert r.returncode == 3 and "cannot create workspace" in r.stderr and r.stderr.count("\n") == 1
    umbrella = SCRIPT.parent / "crucible"
    r2 = subprocess.run(
        [str(umbrella), "stage", "inputs", "--state", str(state), "--task", "c", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["CRUCIBLE_INPUTS_DIR"].endswith("/work/c/inputs/@values")


def test_usage_errors_are_exit_2(tmp_path: Path) -> None:
    r = _run("inputs", "--task", "c")
    assert r.returncode == 2 and "--state" in r.stderr
    r = _run("capture", "--state", str(tmp_path), "--task", "c", "--exit-code", "zero")
    assert r.returncode == 2
    assert _run("nonsense").returncode == 2


def test_capture_reads_the_result_from_stdin(tmp_path: Path) -> None:
    _, state = _v2(tmp_path)
    base = ["capture", "--state", str(state), "--task", "a", "--exit-code", "0", "--output", "-"]
    r = subprocess.run(
        [str(SCRIPT), *base], input='{"x": 7}', capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["output"] == {"x": 7}
    r = subprocess.run([str(SCRIPT), *base], input="", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no result file" in r.stderr
    # the note and the error name stdin, not the removed temporary spool file
    assert json.loads(r.stdout)["note"].startswith("no result file at <stdin> ")
    assert r.stderr.startswith("crucible-stage: error: <stdin>: a failed: ")
    r = subprocess.run([str(SCRIPT), *base], input="[1]", capture_output=True, text=True)
    assert json.loads(r.stdout)["note"] == "result in <stdin> is a JSON array, not an object"
    assert "/tmp" not in r.stderr


def test_plan_and_result_cannot_both_come_from_stdin(tmp_path: Path) -> None:
    # the plan used to swallow stdin, and the attempt then failed for an "empty"
    # result it never saw (a record written, exit 1) instead of a usage error
    _, state = _v2(tmp_path)
    r = _run(
        *("capture", "--state", str(state), "--task", "c", "--exit-code", "0"),
        *("--plan", "-", "--output", "-"),
    )
    assert r.returncode == 2
    assert r.stderr == "crucible-stage: error: --plan and --output cannot both read stdin (-)\n"
    assert r.stdout == ""
    assert not (state / "results" / "c.json").exists()


def test_plan_problems_name_the_plan_file(tmp_path: Path) -> None:
    # errors raised after loading said "plan: task 'x' is not in the plan"
    _, state = _v2(tmp_path)
    r = _run("prompt", "--state", str(state), "--task", "nope")
    assert r.returncode == 1
    assert (
        r.stderr
        == f"crucible-stage: error: {state / 'plan.json'}: task 'nope' is not in the plan\n"
    )
    r = subprocess.run(
        [str(SCRIPT), "inputs", "--state", str(state), "--task", "nope", "--plan", "-"],
        input=(state / "plan.json").read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr == "crucible-stage: error: <stdin>: task 'nope' is not in the plan\n"


def _capture_base(tmp_path: Path) -> list[str]:
    p = plan(task("a", emits={"x": "string"}), version=2)
    state = _state(tmp_path, p)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "o.json").write_text('{"x": "0123456789"}')
    return ["capture", "--state", str(state), "--task", "a", "--workspace", str(ws)]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--exit-code", "9" * 30], {}, "--exit-code"),
        (["--exit-code", "0", "--emit-cap", "9" * 30], {}, "--emit-cap"),
        (["--exit-code", "0"], {"CRUCIBLE_EMIT_CAP": "9" * 30}, "CRUCIBLE_EMIT_CAP"),
        (["--exit-code", "0"], {"CRUCIBLE_EMIT_CAP": "-1"}, "CRUCIBLE_EMIT_CAP"),
        (["--exit-code", "0", "--emit-cap", "-1"], {}, "--emit-cap"),
        (["--exit-code", "0", "--emit-cap", "0"], {}, "--emit-cap"),
    ],
)
def test_out_of_range_numbers_name_their_option(
    tmp_path: Path, args: list[str], env: dict[str, str], named: str
) -> None:
    """Issue 12 item 28: these said ``$: integer … is outside ±(2^53−1)``; and
    the emit cap has one rule and one message with dispatch (at least 1 byte)."""
    base = _capture_base(tmp_path)
    r = _run(*base, *args, "--output", str(tmp_path / "ws" / "o.json"), env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"crucible-stage: error: {named}: ") and r.stderr.count("\n") == 1
    assert "$:" not in r.stderr
    if "cap" in named.lower():
        assert "the emit cap must be an integer from 1 to" in r.stderr


@pytest.mark.parametrize("kind", ["fifo", "devzero-link", "outside-link"])
def test_capture_output_that_is_not_a_regular_file_fails_without_hanging(
    tmp_path: Path, kind: str
) -> None:
    base = _capture_base(tmp_path)
    out = tmp_path / "ws" / "result"
    if kind == "fifo":
        os.mkfifo(out)
        fragment = "is a FIFO"
    elif kind == "devzero-link":
        os.mkfifo(tmp_path / "zero")  # stands in for /dev/zero: never read it
        out.symlink_to(tmp_path / "zero")
        fragment = "outside the workspace"
    else:
        (tmp_path / "secret.json").write_text('{"x": "s"}')
        out.symlink_to(tmp_path / "secret.json")
        fragment = "outside the workspace"
    r = _run(*base, "--exit-code", "0", "--output", str(out))  # timeout=60 in _run
    assert r.returncode == 1 and fragment in r.stderr and r.stderr.count("\n") == 1
