"""README.md's tour runs: every indented command line of the "A tour" sections
is run, section by section, in one shell per section (so `v=…`, `eval "$(…)"`
and earlier outputs carry over as they do for a reader), in a temporary copy of
examples/ (tests/vectors/ linked, read only), with the installed commands first on PATH, and
each line's exit code is checked.

Adjustments, all mechanical:
- `/tmp/…` paths are moved under the test's temporary directory (parallel test
  runs must not share /tmp/hello).
- A line that pipes into `jq` runs without the `| jq …` part when jq is not
  installed; a line calling `cc` is skipped when no C compiler is installed.
  (Both tools are outside this project; everything else must run.)
- `CORRECTIONS` holds README lines that do not work as written, with the lines
  that replace them (README is the lead's file). The tour is run with them
  applied; and as written, where it must still fail. When README is fixed, the
  entry's line is gone and `test_corrections_are_still_pending` says to delete it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
README = REPO / "README.md"

# README line (exact) -> the lines that replace it
CORRECTIONS: dict[str, list[str]] = {}

# a command (its first line, stripped) -> its documented exit code, when not 0
EXPECTED_EXIT = {
    # "a deterministic failure is recorded too": grep finds no TODO, exits 1
    "crucible-ledger run --dir .ledger --scope lint --record-exit 1 -- grep -c TODO main.c": 1,
    # the daily loop's deliberate failure (fixed by the --retry-failed that follows)
    "DAILY_FAIL_ON=south.csv crucible-dispatch examples/daily/pack.toml": 1,
    # accounted runs: a refused output and a first attempt that fails on purpose
    "crucible-dispatch examples/org-people/pack.toml --state /tmp/op-long -p ids=descriptive": 1,
    "crucible-dispatch examples/sibling-retry/pack.toml --state /tmp/sr -p mode=retry": 1,
}


def tour_sections(lines: list[str]) -> dict[str, list[str]]:
    """The indented command lines of each `###` section under `## A tour`,
    outside code fences, with backslash continuations joined (newline kept)."""
    sections: dict[str, list[str]] = {}
    in_tour = in_fence = False
    section = ""
    pending = ""
    for line in lines:
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if line.startswith("## "):
            in_tour = line == "## A tour"
            continue
        if not in_tour:
            continue
        if line.startswith("### "):
            section = line[4:]
            continue
        if pending or (line.startswith("    ") and line.strip()):
            pending += line + "\n"
            if not line.endswith("\\"):
                sections.setdefault(section, []).append(pending.rstrip("\n"))
                pending = ""
    return sections


def corrected(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.extend(CORRECTIONS.get(line, [line]))
    return out


README_LINES = README.read_text().splitlines()
AS_WRITTEN = tour_sections(README_LINES)
FIXED = tour_sections(corrected(README_LINES))


def test_the_tour_has_commands() -> None:
    assert len(FIXED) >= 5, sorted(FIXED)
    assert sum(len(c) for c in FIXED.values()) >= 20


def adjust(command: str, tmp: Path) -> str | None:
    """The command as the test runs it, or None to skip it."""
    command = command.replace("/tmp/", f"{tmp}/tmp/")
    if re.search(r"(^|[\s;&|(])cc\s", command) and shutil.which("cc") is None:
        return None
    if "| jq" in command and shutil.which("jq") is None:
        command = re.sub(r"\s*\|\s*jq\s+\S+", "", command)
    return command


def run_section(commands: list[str], tmp: Path) -> list[tuple[str, int, str]]:
    """Run the commands in one bash, each line's exit code recorded; returns
    (command, exit code, output tail) for each command run."""
    work = tmp / "repo"
    if not work.exists():
        (tmp / "tmp").mkdir()
        work.mkdir()
        shutil.copytree(REPO / "examples", work / "examples")
        # the tour only reads the vectors (11 MB): link them rather than copy
        (work / "tests").mkdir()
        (work / "tests" / "vectors").symlink_to(REPO / "tests" / "vectors")
    script = ["set -o pipefail"]
    ran: list[str] = []
    for i, command in enumerate(commands):
        adjusted = adjust(command, tmp)
        if adjusted is None:
            continue
        ran.append(command)
        script += [
            f"exec >{tmp}/out.{i} 2>&1",
            adjusted,
            f'echo "{len(ran) - 1} $?" >> {tmp}/codes',
        ]
    # `$EDITOR pack.toml` in the daily loop: an edit of one task's run (total's
    # line of output), so the `--reuse` lines that follow have something to rerun
    editor = tmp / "editor"
    editor.write_text("#!/bin/sh\nexec sed -i 's/echo \"total: /echo \"sum: /' \"$1\"\n")
    editor.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "EDITOR": str(editor),
    }
    (tmp / "codes").write_text("")
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=work, env=env, timeout=180, capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    codes = [int(x.split()[1]) for x in (tmp / "codes").read_text().splitlines()]
    assert len(codes) == len(ran)  # every line ran to its exit-code record
    outputs = [
        (tmp / f"out.{i}").read_text(errors="replace")[-800:]
        for i, c in enumerate(commands)
        if adjust(c, tmp) is not None
    ]
    return list(zip(ran, codes, outputs, strict=True))


def expected_exit(command: str) -> int:
    first = command.splitlines()[0].strip()
    return next((code for cmd, code in EXPECTED_EXIT.items() if first.startswith(cmd)), 0)


@pytest.mark.parametrize("section", sorted(FIXED))
def test_tour_section_runs(section: str, tmp_path: Path) -> None:
    failures = [
        f"{command}\n  -> exit {code}, expected {expected_exit(command)}\n{out}"
        for command, code, out in run_section(FIXED[section], tmp_path)
        if code != expected_exit(command)
    ]
    assert not failures, "\n".join(failures)


def test_corrections_are_still_pending() -> None:
    """Each corrected line is still in README as written (once README is
    fixed, delete its entry), and its section does fail as written."""
    missing = [line for line in CORRECTIONS if line not in README_LINES]
    assert not missing, f"README no longer has these lines; delete them from CORRECTIONS: {missing}"


@pytest.mark.parametrize("section", sorted(s for s in AS_WRITTEN if AS_WRITTEN[s] != FIXED.get(s)))
def test_section_as_written_fails_without_its_correction(section: str, tmp_path: Path) -> None:
    results = run_section(AS_WRITTEN[section], tmp_path)
    assert any(code != expected_exit(command) for command, code, _ in results), (
        f"{section!r} now runs as written: delete its CORRECTIONS entries"
    )


def test_ledger_make_example_runs(tmp_path: Path) -> None:
    """`cd examples/ledger-make && make && make clean all` (README, ledger
    section): the second make replays every step from the ledger."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    work = tmp_path / "ledger-make"
    shutil.copytree(REPO / "examples" / "ledger-make", work)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DELAY": "0"}
    first = subprocess.run(["make"], cwd=work, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "cached" not in first.stderr
    report = (work / "report.txt").read_text()
    again = subprocess.run(
        ["make", "clean", "all"], cwd=work, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("crucible-ledger: cached:") == 3
    assert (work / "report.txt").read_text() == report == "lines: 3\nmatches: 0\n"


def test_ledger_make_failed_step_leaves_no_truncated_target(tmp_path: Path) -> None:
    """`$(RUN) ... > $@`: the shell truncates the target before the step runs; a
    failing step must not leave that empty file looking up to date
    (.DELETE_ON_ERROR)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    work = tmp_path / "ledger-make"
    shutil.copytree(REPO / "examples" / "ledger-make", work)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "DELAY": "0"}
    failing = "RUN=crucible-ledger run --dir ledger --scope s --key-file no-such-file"
    done = subprocess.run(
        ["make", failing, "upper.txt"], cwd=work, env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "--key-file no-such-file" in done.stderr
    assert not (work / "upper.txt").exists()
    # and the next make builds it for real rather than calling it up to date
    again = subprocess.run(["make", "upper.txt"], cwd=work, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (work / "upper.txt").read_text() == (work / "input.txt").read_text().upper()


def test_the_pack_shown_in_the_tour_is_the_example_file() -> None:
    """The TOML block under "`examples/hello/pack.toml`:" is that file, less its
    header comment: the tour shows what `crucible-dispatch examples/hello/…` runs."""
    text = README.read_text()
    shown = re.search(r"`examples/hello/pack\.toml`:\n\n```toml\n(.*?)```", text, re.S)
    assert shown is not None, "the tour no longer shows examples/hello/pack.toml"
    lines = (REPO / "examples" / "hello" / "pack.toml").read_text().splitlines()
    body = "\n".join(line for line in lines if not line.startswith("#")).lstrip("\n") + "\n"
    assert shown.group(1) == body


# ---- plans and command lines shown in README.md and docs/ (issue 13 item 4) ----

DOCS = [README, *sorted((REPO / "docs").rglob("*.md"))]


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line number, info string, body) of every ``` fence in a Markdown file."""
    blocks: list[tuple[int, str, str]] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})(.*)$", lines[i])
        if fence:
            start, marker = i, fence.group(1)
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].startswith(marker):
                body.append(lines[i])
                i += 1
            blocks.append((start + 1, fence.group(2).strip(), "\n".join(body)))
        i += 1
    return blocks


def shown_plans() -> list[tuple[str, dict[str, object]]]:
    """Every JSON block in the docs that parses and has a plan's top members."""
    import json

    plans = []
    for path in DOCS:
        for line, info, body in fenced_blocks(path):
            if info != "json":
                continue
            try:
                value = json.loads(body)
            except ValueError:
                continue  # a schematic example ("sha256:…", <epoch 1>, …)
            if isinstance(value, dict) and {"version", "tasks"} <= value.keys():
                plans.append((f"{path.relative_to(REPO)}:{line}", value))
    return plans


def test_the_plan_in_plan_ir_is_what_hello_compiles_to() -> None:
    # the example used to read $CRUCIBLE_INPUTS_DIR/@values/greeting, name the input
    # greeting (the pack's is text), show run as ["sh","-c",…] and resolved_from
    from crucible.compile import compile_path

    compiled = compile_path(REPO / "examples" / "hello" / "pack.toml")
    shown = [plan for where, plan in shown_plans() if where.startswith("docs/spec/plan-ir.md:")]
    assert shown == [compiled.plan]


@pytest.mark.parametrize(
    ("where", "plan"), shown_plans(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_plan_shown_is_valid(where: str, plan: dict[str, object]) -> None:
    from crucible.compile import load_plan_bytes
    from crucible.core import canon

    load_plan_bytes(canon.dumps(plan), where)  # raises with the diagnostics if not


TOOLS = [
    "crucible-compile",
    "crucible-validate",
    "crucible-stage",
    "crucible-dispatch",
    "crucible-ledger",
    "crucible-prove",
    "crucible-verify",
]


def shown_command_lines() -> list[tuple[str, str]]:
    """(where, line) of every line in a fence that starts with a crucible command,
    and every indented command line of README's tour."""
    found: list[tuple[str, str]] = []
    for path in DOCS:
        for line, _info, body in fenced_blocks(path):
            for offset, text in enumerate(body.splitlines(), start=1):
                stripped = text.strip().removeprefix("$ ")
                if stripped.split(" ", 1)[0] in TOOLS:
                    found.append((f"{path.relative_to(REPO)}:{line + offset}", stripped))
    for commands in FIXED.values():
        for command in commands:
            for text in command.splitlines():
                stripped = text.strip()
                if stripped.split(" ", 1)[0] in TOOLS:
                    found.append(("README.md (tour)", stripped))
    return found


_HELP: dict[tuple[str, ...], str] = {}


def _help(argv: tuple[str, ...]) -> str:
    if argv not in _HELP:
        proc = subprocess.run([BIN / argv[0], *argv[1:], "--help"], capture_output=True, text=True)
        _HELP[argv] = proc.stdout if proc.returncode == 0 else ""
    return _HELP[argv]


def test_the_docs_show_commands() -> None:
    assert len(shown_command_lines()) >= 20


@pytest.mark.parametrize(("where", "line"), shown_command_lines())
def test_every_option_shown_is_an_option_of_the_command(where: str, line: str) -> None:
    """Each ``--option`` on a command line shown in README or docs/ is one the
    command (or its subcommand) takes: a renamed option cannot linger in the docs."""
    words = line.split()
    command: tuple[str, ...] = (words[0],)
    if len(words) > 1 and re.fullmatch(r"[a-z]+", words[1]) and _help((words[0], words[1])):
        command = (words[0], words[1])
    elif "Commands:" in _help(command) and _help((words[0], "run")):
        command = (words[0], "run")  # crucible-dispatch PLAN ... is `run PLAN ...`
    text = _help(command)
    assert text, f"{where}: {' '.join(command)} --help failed"
    # options before a `--` (what follows is the child's argv)
    shown = line.split(" -- ", 1)[0]
    for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", shown):
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (
            f"{where}: {option} is not an option of {' '.join(command)}: {line}"
        )
