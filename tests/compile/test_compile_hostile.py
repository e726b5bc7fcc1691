"""Hostile and broken packs: a located diagnostic or a one-line error with its
exit code, never a crash, a hang or a pass that the run then refuses
(issue 12 items 11, 12, 15, 19, 23, 32; issue 13 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.compile import _star as star
from crucible.compile._starbound import MAX_NESTING, nesting_problem

BIN = Path(sys.executable).parent
MANIFEST = 'edition = 3\n[workflow]\nsource = "pack.star"\n'
TAIL = 'workflow(name = "w", tasks = [task(name = "a", run = "true")])\n'


def _tool(
    name: str, *args: str | Path, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN / name, *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL if stdin is None else None,
    )


def _star_pack(tmp_path: Path, source: str) -> Path:
    (tmp_path / "pack.star").write_text(source)
    manifest = tmp_path / "pack.toml"
    manifest.write_text(MANIFEST)
    return manifest


DEEP = {
    "lists": "x = " + "[" * 3000 + "]" * 3000 + "\n",
    "unary": "x = " + "-" * 50000 + "1\n",
    "sum": "x = 1" + "+1" * 100000 + "\n",
    "calls": "def f(a):\n    return a\nx = " + "f(" * 3000 + "1" + ")" * 3000 + "\n",
    "blocks": "def f():\n"
    + "".join(" " * (i + 1) + "if True:\n" for i in range(400))
    + " " * 401
    + "pass\n",
}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_deep_starlark_is_exit_2_with_a_location(tmp_path: Path, kind: str) -> None:
    # these ended validate, compile and dispatch by SIGSEGV (exit 139), no message
    manifest = _star_pack(tmp_path, DEEP[kind] + TAIL)
    for tool, args in (
        ("crucible-validate", [manifest]),
        ("crucible-compile", [manifest]),
        ("crucible-validate", [tmp_path / "pack.star", "--edition", "3"]),
    ):
        proc = _tool(tool, *args)
        assert proc.returncode == 2, (tool, proc.returncode, proc.stderr[-300:])
        (line,) = proc.stderr.splitlines()
        assert "nested deeper than" in line and "pack.star:" in line


def test_deep_starlark_from_stdin(tmp_path: Path) -> None:
    _star_pack(tmp_path, DEEP["lists"] + TAIL)
    with (tmp_path / "pack.toml").open("rb") as manifest:
        proc = subprocess.run(
            [BIN / "crucible-compile"],
            stdin=manifest,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
        )
    assert proc.returncode == 2 and "pack.star:1:" in proc.stderr, proc.stderr


def test_nesting_bound_keeps_ordinary_sources() -> None:
    flat = "x = [" + ", ".join(f"-{i}.5" for i in range(5000)) + "]\n"
    assert nesting_problem(flat) is None
    deep = MAX_NESTING - 1  # the assignment is one level
    assert nesting_problem("x = " + "[" * deep + "]" * deep + "\n") is None
    assert nesting_problem('s = "((((("  # [[[[\n' * 500) is None
    assert nesting_problem('s = """\n' + "(" * 1000 + '\n"""\n') is None
    located = nesting_problem("a = 1\nx = " + "[" * 500 + "]" * 500 + "\n")
    assert located is not None and located[0].line == 2


def test_growing_string_is_a_starlark_error_diagnostic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a Rust panic (PanicException, a BaseException) escaped with two tracebacks,
    # and without a limit memory grew unbounded
    monkeypatch.setattr(star, "MAX_EVAL_MEMORY", 64 << 20)
    source = 'x = "ab"\n' + "x = x + x\n" * 40 + TAIL
    result = star.evaluate_source(source, "grow.star", 3)
    (d,) = result.diagnostics
    assert d.code == "starlark-error" and d.location.file == "grow.star"
    assert result.workflow is None


def test_growing_string_through_the_cli(tmp_path: Path) -> None:
    source = 'x = "ab"\n' + "x = x + x\n" * 40 + TAIL
    proc = _tool("crucible-validate", _star_pack(tmp_path, source))
    assert proc.returncode == 1, proc.stderr[-500:]
    (line,) = proc.stderr.splitlines()
    assert "[starlark-error]" in line and "Traceback" not in proc.stderr


def test_a_crashing_evaluator_is_a_diagnostic(monkeypatch: pytest.MonkeyPatch) -> None:
    # whatever the scan does not foresee: the child dies, the parent reports it
    def crash(*args: object) -> object:
        os.kill(os.getpid(), 11)
        raise AssertionError

    monkeypatch.setattr(star, "_evaluate_here", crash)
    (d,) = star.evaluate_source(TAIL, "crash.star", 3).diagnostics
    assert d.code == "starlark-error" and "SIGSEGV" in d.message


def test_source_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    manifest = tmp_path / "pack.toml"
    manifest.write_text(MANIFEST)
    os.mkfifo(tmp_path / "pack.star")
    for tool in ("crucible-validate", "crucible-compile"):
        proc = _tool(tool, manifest)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f"{manifest}:3:1" in line and "not a regular file" in line


def test_source_that_is_a_directory_is_exit_2(tmp_path: Path) -> None:
    manifest = tmp_path / "pack.toml"
    manifest.write_text(MANIFEST)
    (tmp_path / "pack.star").mkdir()
    proc = _tool("crucible-validate", manifest)
    assert proc.returncode == 2 and "is a directory" in proc.stderr


def _pack(task: str) -> str:
    return (
        'edition = 3\n[workflow]\nname = "w"\n'
        '[[workflow.task]]\nname = "a"\nrun = "true"\nemits = { f = "string" }\n'
        f'[[workflow.task]]\nname = "b"\nneeds = ["a"]\n{task}'
    )


@pytest.mark.parametrize(
    ("task", "code", "fragment"),
    [
        ('run = "true"\nemits_files = ["[!]"]\n', "bad-path", "bad character class"),
        ('run = "true"\nemits_files = ["[z-a]"]\n', "bad-path", "bad character class"),
        ("run = \"true\"\nemits_files = ['a\\b']\n", "bad-path", "backslash"),
        ('run = [""]\n', "bad-value", "program must not be empty"),
        ('run = ["", "x"]\n', "bad-value", "program must not be empty"),
        ('run = "true"\nenv = ["CRUCIBLE_X"]\n', "bad-name", "reserved"),
        (f'run = "true"\ninputs = {{ {"i" * 300} = "a.f" }}\n', "bad-name", "longer than 250"),
    ],
)
def test_validate_refuses_what_the_run_would(
    tmp_path: Path, task: str, code: str, fragment: str
) -> None:
    # these passed validate, then capture, staging or the dispatcher refused them
    manifest = tmp_path / "pack.toml"
    manifest.write_text(_pack(task))
    proc = _tool("crucible-validate", "--json", manifest)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stdout.splitlines()
    import json

    record = json.loads(line)
    assert record["code"] == code and fragment in record["message"]
    assert record["file"] == str(manifest) and record["line"] >= 9


def test_ordinary_globs_still_pass(tmp_path: Path) -> None:
    manifest = tmp_path / "pack.toml"
    manifest.write_text(
        _pack('run = "true"\nemits_files = ["out/*.txt", "[a-c]?.csv", "[!x]*", "**/*.log"]\n')
    )
    assert _tool("crucible-validate", manifest).returncode == 0


def test_non_utf8_and_junk_plans_say_what_they_are(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff"}')
    proc = _tool("crucible-validate", bad)
    assert proc.returncode == 2 and "not UTF-8 (byte 7)" in proc.stderr
    for text in ("[1, 2]", '{"a": 1}'):
        junk = tmp_path / "junk.json"
        junk.write_text(text)
        proc = _tool("crucible-validate", junk)
        assert proc.returncode == 1 and "not a plan" in proc.stderr, proc.stderr


def test_validate_star_skips_a_fifo_beside_it(tmp_path: Path) -> None:
    # the manifests beside a .star are read to find its edition: a FIFO there hung
    (tmp_path / "pack.star").write_text(TAIL)
    (tmp_path / "pack.toml").write_text(MANIFEST)
    os.mkfifo(tmp_path / "a.toml")
    proc = _tool("crucible-validate", tmp_path / "pack.star")
    assert proc.returncode == 0, proc.stderr


def test_the_evaluating_child_ends_with_its_parent(tmp_path: Path) -> None:
    import signal
    import time

    script = (
        "from crucible.compile._star import evaluate_source\n"
        "spin = 'def spin():\\n    for i in range(1000000000):\\n        pass\\nspin()\\n'\n"
        "evaluate_source(spin, 'spin.star', 3)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
    deadline = time.monotonic() + 30
    pids: list[str] = []
    while not pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = children.read_text().split()
    assert pids, "the evaluation never forked"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    child = Path(f"/proc/{pids[0]}")
    while child.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not child.exists() or "Z" in (child / "stat").read_text().split()[2]


DEEP_WHEN = "-" * 4000 + "1 == 1"  # within the 4,096-character cap


def test_a_deep_when_is_when_syntax_with_its_location(tmp_path: Path) -> None:
    # issue 27 item 9: a RecursionError in validate and compile (exit 70)
    manifest = tmp_path / "pack.toml"
    manifest.write_text(
        'edition = 4\n[workflow]\nname = "w"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
        f'when = "{DEEP_WHEN}"\n'
    )
    for tool in ("crucible-validate", "crucible-compile"):
        proc = _tool(tool, manifest)
        assert proc.returncode == 1, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f"{manifest}:7:1:" in line and "[when-syntax]" in line, line
        assert f"nested deeper than {MAX_NESTING} levels (at 1:201)" in line
        assert len(line) < 300  # the condition is quoted by its start


def test_a_deep_when_through_starlark_is_when_syntax(tmp_path: Path) -> None:
    manifest = tmp_path / "pack.toml"
    manifest.write_text('edition = 4\n[workflow]\nsource = "pack.star"\n')
    source = (
        f'workflow(name = "w", tasks = [task(name = "a", run = "true", when = "{DEEP_WHEN}")])\n'
    )
    (tmp_path / "pack.star").write_text(source)
    proc = _tool("crucible-validate", manifest)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "[when-syntax]" in line and "pack.star:1:" in line, line
    assert "RecursionError" not in line and "recursion" not in line
