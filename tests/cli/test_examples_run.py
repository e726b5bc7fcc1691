"""Every example pack runs as a new user runs it: through the installed
`crucible-dispatch`, with the stand-in agent command, from the repository root.

A pack passes with its default params. A pack may document an intended failure
mode behind a param (FAILURE_MODES); that run must fail exactly as documented.
Every `crucible-dispatch examples/...` command quoted in a pack's header
comment is run too, so the instructions in the packs cannot rot.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH

REPO = Path(__file__).resolve().parents[2]
STAND_IN = str(REPO / "examples" / "agent" / "stand-in.sh")
PACKS = sorted(REPO.glob("examples/*/pack.toml"))
IDS = [p.parent.name for p in PACKS]


def dispatch(
    argv: list[str], *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, *argv],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def rows(state: Path) -> dict[str, dict[str, Any]]:
    proc = dispatch(["report", str(state), "--json"])
    assert proc.returncode == 0, proc.stderr
    # task rows only: a scored loop adds a last line {"loop": ...} (loop.md, "Report")
    return {r["task"]: r for r in map(json.loads, proc.stdout.splitlines()) if "task" in r}


def result(state: Path, task: str) -> dict[str, Any]:
    return json.loads((state / "results" / f"{task}.json").read_bytes())  # type: ignore[no-any-return]


def check_large_output_inline(state: Path) -> None:
    # the over-cap field is a measured failure: one attempt despite retries = 2,
    # a note pointing at emits_files, and the consumer skipped
    report = rows(state)
    produce = result(state, "produce")
    assert produce["status"] == "failed" and produce["retryable"] is False
    assert [o["field"] for o in produce["over_cap"]] == ["blob"]
    assert "emits_files" in produce["note"]
    assert report["produce"]["attempts"] == 1
    assert report["consume"]["status"] == "skipped"


def check_fanout_fail_on(state: Path) -> None:
    # one instance fails: `total` (join all) is skipped, `audit` (settled join)
    # runs and names the failed instance, the epilogue sees everything
    report = rows(state)
    assert report["measure"]["status"] == "failed"
    assert report["measure"]["instance_status"] == {"passed": 5, "failed": 1}
    assert report["total"]["status"] == "skipped"
    assert result(state, "audit")["output"] == {
        "passed": ["0", "1", "3", "4", "5"],
        "failed": ["2"],
    }
    line = result(state, "summary")["output"]["line"]
    assert "measure=failed" in line and "total=skipped" in line
    # the epilogue's declared input from `total` is absent: total did not pass
    assert line.endswith(" sum=-")


def check_org_people_descriptive(state: Path) -> None:
    # accounted (docs/spec/export.md): under descriptive ids the fourth
    # organisation's output would exceed max_bytes, so it is refused
    report = rows(state)
    assert report["org"]["status"] == "passed"
    assert report["people"]["status"] == "failed"
    assert report["people"]["instance_status"] == {"passed": 3, "failed": 1}
    # by 552 bytes with a four-letter login name: the actor is part of every candidate
    assert re.search(r"refused: would exceed max_bytes by \d+", result(state, "people")["note"])


def check_sibling_retry(state: Path) -> None:
    # accounted: a failed its first attempt, b's output was refused for bytes
    report = rows(state)
    assert report["pick"]["status"] == "passed"
    assert report["work"]["status"] == "failed"
    assert report["work"]["instance_status"] == {"failed": 2}
    assert "refused: would exceed max_bytes" in result(state, "work")["note"] or (
        "first 'a'" in result(state, "work")["note"]
    )


#: pack -> host variables whose documented use makes the run fail on purpose
FAILURE_ENV = {"daily": ("DAILY_FAIL_ON",)}
#: packs whose header is a sequence of commands on one state dir (the accounted
#: ones' tours: tests/run/test_accounted_export.py)
TOURS = ("daily", "sibling-retry")


def check_exit_handler_break(state: Path) -> None:
    # the exit-handler DAG notifies on failure only: both channels, then cleanup
    report = rows(state)
    assert report["transform"]["status"] == "failed"
    assert report["publish"]["status"] == "skipped"
    assert report["notify"]["status"] == "passed"
    assert report["cleanup"]["status"] == "passed"


# pack -> (the -p arguments that select the documented failure, its check)
FAILURE_MODES: dict[str, tuple[list[str], Callable[[Path], None]]] = {
    "large-output": (["-p", "inline=true"], check_large_output_inline),
    "fanout": (["-p", "fail_on=gamma"], check_fanout_fail_on),
    "exit-handler": (["-p", "break_step=transform"], check_exit_handler_break),
    "org-people": (["-p", "ids=descriptive"], check_org_people_descriptive),
    "sibling-retry": (["-p", "mode=retry"], check_sibling_retry),
}


@pytest.mark.parametrize("manifest", PACKS, ids=IDS)
def test_example_pack_passes_with_defaults(manifest: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = dispatch(
        [str(manifest.relative_to(REPO)), "--state", str(state), "--agent-cmd", STAND_IN]
    )
    assert proc.returncode == 0, f"{manifest}: exit {proc.returncode}\n{proc.stderr}"
    assert proc.stdout == ""  # stdout carries only data; the summary goes to stderr
    assert "run passed" in proc.stderr
    statuses = {name: r["status"] for name, r in rows(state).items()}
    # edition 4: a task skipped by its own false condition is no failure
    by_condition = {
        name
        for name, status in statuses.items()
        if status == "skipped" and "condition" in result(state, name)["note"]
    }
    assert {s for n, s in statuses.items() if n not in by_condition} == {"passed"}, statuses
    if manifest.parent.name == "fanout":  # the epilogue read `total` through its inputs
        assert result(state, "summary")["output"]["line"].endswith(" sum=30")


@pytest.mark.parametrize("pack", sorted(FAILURE_MODES))
def test_documented_failure_mode(pack: str, tmp_path: Path) -> None:
    params, check = FAILURE_MODES[pack]
    state = tmp_path / "state"
    proc = dispatch([f"examples/{pack}/pack.toml", "--state", str(state), *params])
    assert proc.returncode == 1, proc.stderr
    assert "run failed" in proc.stderr
    check(state)


def documented_commands(manifest: Path) -> list[str]:
    """The `crucible-dispatch examples/...` commands in a pack's comments, with
    backslash continuations joined."""
    lines = [
        line.lstrip("#").strip()
        for line in manifest.read_text().splitlines()
        if line.startswith("#")
    ]
    commands, current = [], ""
    for line in lines:
        if current or "crucible-dispatch examples/" in line:
            current += line.removesuffix("\\").strip() + " "
            if not line.endswith("\\"):
                commands.append(current.strip())
                current = ""
    return commands


DOCUMENTED = [(m, c) for m in PACKS for c in documented_commands(m)]


def test_the_packs_document_their_commands() -> None:
    documented = {m.parent.name for m, _ in DOCUMENTED}
    assert {"hello", "fanout", "agent", "large-output", "edition2"} <= documented
    # every documented failure mode is spelled out in its pack's comments
    for pack, (params, _) in FAILURE_MODES.items():
        assert any(m.parent.name == pack and " ".join(params) in c for m, c in DOCUMENTED), pack


@pytest.mark.parametrize(
    ("manifest", "command"), DOCUMENTED, ids=[f"{m.parent.name}:{c}" for m, c in DOCUMENTED]
)
def test_documented_command_runs(manifest: Path, command: str, tmp_path: Path) -> None:
    words = shlex.split(command.replace("$PWD", str(REPO)))
    env: dict[str, str] = {}
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[0] == "crucible-dispatch", command
    words = words[1:]
    # the documented state dir (/tmp/...) becomes a fresh one under tmp_path
    state_at = words.index("--state") + 1
    words[state_at] = str(tmp_path / "state")
    proc = dispatch(words, env=env)
    if "--resume" in words:
        # a resume continues the run of the commands before it: the tour of
        # examples/daily runs them in order (test_daily_tour)
        assert manifest.parent.name in TOURS, command
        return
    failure = FAILURE_MODES.get(manifest.parent.name)
    expected = 1 if failure and " ".join(failure[0]) in command else 0
    if any(name in env for name in FAILURE_ENV.get(manifest.parent.name, ())):
        expected = 1
    assert proc.returncode == expected, f"{command}: exit {proc.returncode}\n{proc.stderr}"
    if env.get("REPORT_SOURCE"):  # a declared host variable reaches the task
        assert result(tmp_path / "state", "gather")["output"]["source"] == env["REPORT_SOURCE"]


def test_daily_tour(tmp_path: Path) -> None:
    """examples/daily's header, in order, on one state dir: --follow, a failure
    with its stderr in the report, a dry run, --resume --retry-failed after
    fixing the cause, and --target completed by a later --resume."""
    pack = "examples/daily/pack.toml"
    state = str(tmp_path / "daily")
    watched = dispatch([pack, "--state", state, "--follow"])
    assert watched.returncode == 0, watched.stderr
    assert "count[south.csv] south.csv: 2 rows" in watched.stderr.splitlines()
    assert "total total: 9 rows" in watched.stderr.splitlines()

    state = str(tmp_path / "broken")
    broken = dispatch([pack, "--state", state], env={"DAILY_FAIL_ON": "south.csv"})
    assert broken.returncode == 1
    last = broken.stderr.strip().splitlines()[-1]
    assert f"failed: count[south.csv] ({state}/logs/count/south%2Ecsv.log)" in last
    record = keyed(Path(state), "count")["south.csv"]
    assert record["log"] == "logs/count/south%2Ecsv.log"
    assert record["stderr_tail"].endswith("giving up (unset DAILY_FAIL_ON to fix)")
    report = dispatch(["report", state])
    assert report.returncode == 0 and "expected 2 columns" in report.stdout
    preview = dispatch([pack, "--state", state, "--resume", "--retry-failed", "-n", "--json"])
    assert preview.returncode == 0, preview.stderr
    actions = {
        (r["task"], r.get("key")): r["action"] for r in map(json.loads, preview.stdout.splitlines())
    }
    assert actions == {
        ("files", None): "keep",
        ("count", "north.csv"): "keep",
        ("count", "south.csv"): "run",
        ("count", "west.csv"): "keep",
        ("total", None): "run",
        ("wrap_up", None): "run",
    }
    fixed = dispatch([pack, "--state", state, "--resume", "--retry-failed"])
    assert fixed.returncode == 0, fixed.stderr
    assert result(Path(state), "total")["output"] == {"total": 9}

    state = str(tmp_path / "daily2")
    only = dispatch([pack, "--state", state, "--target", "files"])
    assert only.returncode == 0, only.stderr
    assert not (Path(state) / "results" / "total.json").exists()
    rest = dispatch([pack, "--state", state, "--resume"])
    assert rest.returncode == 0, rest.stderr
    assert result(Path(state), "total")["output"] == {"total": 9}
