"""crucible-dispatch as a command: CliRunner for the click layer, the installed
script for signals, pipes, resume and the 10,000-instance fan-out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from crucible.core.cli import run as run_edge
from crucible.run.cli import cli
from tests.packed import keyed
from tests.run.dispatchtests import (
    DISPATCH,
    events,
    parent_pid,
    piped_dispatch,
    process_alive,
    result,
    start_dispatch,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]


def pack(root: Path, body: str, *, edition: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "pack.toml"
    path.write_text(f'edition = {edition}\n\n[workflow]\nname = "t"\n\n{body}')
    return path


HELLO = REPO / "examples" / "hello" / "pack.toml"


def edge(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command through the real command edge (exit codes, one-line errors)."""
    with pytest.raises(SystemExit) as exit_info:
        run_edge(cli, "crucible-dispatch", argv)
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return int(code) if isinstance(code, int) else 0, out, err


def test_help_and_version() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0 and "report STATE" in result.output
    assert runner.invoke(cli, ["--version"]).output.startswith("crucible-dispatch, version")
    assert "--agent-cmd" in runner.invoke(cli, ["run", "--help"]).output


def test_positional_plan_and_run_subcommand_are_the_same(tmp_path: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, [str(HELLO), "--state", str(tmp_path / "a"), "-p", "who=cli"])
    assert first.exit_code == 0, first.output
    second = runner.invoke(
        cli, ["run", str(HELLO), "--state", str(tmp_path / "b"), "-p", "who=cli"]
    )
    assert second.exit_code == 0, second.output
    third = runner.invoke(cli, ["--state", str(tmp_path / "c"), str(HELLO)])
    assert third.exit_code == 0, third.output
    for s in "abc":
        assert (tmp_path / s / "results" / "shout.json").exists()


def test_report_table_json_and_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s"
    assert edge([str(HELLO), "--state", str(state)], capsys)[0] == 0
    code, out, _ = edge(["report", str(state)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["TASK", "STATUS", "ATTEMPTS", "DURATION"]
    assert [line.split()[:2] for line in lines[1:]] == [["greet", "passed"], ["shout", "passed"]]
    code, out, _ = edge(["report", str(state), "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["task"], r["status"], r["attempts"]) for r in rows] == [
        ("greet", "passed", 1),
        ("shout", "passed", 1),
    ]
    code, out, _ = edge(["report", str(state), "shout"], capsys)
    assert code == 0 and out.splitlines()[1].startswith("shout")


@pytest.mark.parametrize(
    ("argv", "code", "needle"),
    [
        (["report", "{state}", "nosuch"], 1, "no task 'nosuch'"),
        (["report", "{tmp}/nowhere"], 1, "no such state dir"),
        (["report", "{tmp}"], 1, "not a crucible state dir"),
        (["{tmp}/missing.toml", "--state", "{tmp}/x"], 2, "no such command or file"),
        (["--state", "{tmp}/x", "{tmp}/missing.toml"], 2, "no such plan"),
        (["{hello}", "--state", "{tmp}/x", "-p", "nope=1"], 1, "unknown param 'nope'"),
        (["{hello}", "--state", "{tmp}/x", "-p", "novalue"], 2, "NAME=VALUE"),
        (["{hello}", "--state", "{tmp}/x", "--params", "{tmp}/bad.json"], 2, "bad.json"),
        (["{hello}", "--state", "{tmp}/x", "-j", "0"], 2, "-j"),
        (["{other}", "--state", "{state}"], 1, "another plan"),
        (["{hello}", "--state", "{state}"], 1, "--resume"),
        (["{hello}"], 2, "--state"),
    ],
)
def test_bad_input_gives_one_line_and_the_documented_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, needle: str
) -> None:
    state = tmp_path / "s"
    assert edge([str(HELLO), "--state", str(state)], capsys)[0] == 0
    (tmp_path / "bad.json").write_text("{not json")
    other = pack(tmp_path / "other", '[[workflow.task]]\nname = "x"\nrun = "true"\n')
    subst = {"state": str(state), "tmp": str(tmp_path), "hello": str(HELLO), "other": str(other)}
    got, out, err = edge([a.format(**subst) for a in argv], capsys)
    assert got == code, err
    assert needle in err
    assert out == ""
    assert len(err.strip().splitlines()) == 1 or "Usage:" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "x" / "plan.json").exists()


def test_plan_changed_refuses_with_both_digests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = pack(tmp_path / "p", '[[workflow.task]]\nname = "a"\nrun = "true"\n')
    state = tmp_path / "s"
    assert edge([str(manifest), "--state", str(state)], capsys)[0] == 0
    manifest.write_text(manifest.read_text() + '\n[[workflow.task]]\nname = "b"\nrun = "true"\n')
    code, _, err = edge([str(manifest), "--state", str(state), "--resume"], capsys)
    assert code == 1
    assert "changed" in err and err.count("sha256:") == 2
    assert len(err.strip().splitlines()) == 1


def test_sigterm_mid_run_then_resume_reruns_only_the_unsettled(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("closed")
    body = f"""
[[workflow.task]]
name = "fast"
emits = {{ items = "array" }}
run = '''echo '{{"items": ["quick", "slow", "quick2"]}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["fast"]
map = "fast.items"
run = '''echo "$CRUCIBLE_KEY" >> {tmp_path}/ran.txt; if [ "$(cat $CRUCIBLE_INPUTS_DIR/item)" = '"slow"' ]; then while [ -e {gate} ]; do sleep 0.05; done; fi'''

[[workflow.task]]
name = "side"
run = '''echo side >> {tmp_path}/ran.txt; while [ -e {gate} ]; do sleep 0.05; done'''

[[workflow.task]]
name = "last"
needs = ["each"]
run = '''echo last >> {tmp_path}/ran.txt'''
"""
    manifest = pack(tmp_path / "p", body)
    state = tmp_path / "s"
    proc = piped_dispatch(manifest, state, "-j", "4")

    def both_blocked() -> bool:
        ran = (tmp_path / "ran.txt").read_text().split() if (tmp_path / "ran.txt").exists() else []
        done = {"0", "2"} <= set(keyed(state, "each"))
        return "side" in ran and "1" in ran and done

    wait_for(both_blocked)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert b"SIGTERM" in err and len(err.strip().splitlines()) <= 2
    evs = events(state)
    assert (
        evs[-1]["event"] == "shutdown"
        and evs[-1]["signal"] == "SIGTERM"
        and evs[-1]["exit_code"] == 143
    )
    interrupted = {
        (e["task"], e.get("key"))
        for e in evs
        if e["event"] == "task_finished" and e["status"] == "interrupted"
    }
    assert interrupted == {("each", "1"), ("side", None)}
    assert not (state / "results" / "side.json").exists()
    assert "1" not in keyed(state, "each")
    assert not (state / "results" / "each.json").exists()
    # nothing half-written: every record is complete JSON, no temp files left in results/
    for path in (state / "results").rglob("*"):
        if path.is_file():
            assert not path.name.startswith("@tmp"), path
            for line in path.read_bytes().splitlines():  # a packed file: every line whole
                json.loads(line)
    # resume, with the gate open: only the interrupted units (and what waited for them) run
    gate.unlink()
    (tmp_path / "ran.txt").write_text("")
    done = subprocess.run(
        [DISPATCH, str(manifest), "--state", str(state), "--resume"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert sorted((tmp_path / "ran.txt").read_text().split()) == ["1", "last", "side"]
    evs = events(state)
    second = [e for e in evs if e["session"] == 2 and e["event"] == "task_started"]
    assert sorted((e["task"], e.get("key", "")) for e in second) == [
        ("each", "1"),
        ("last", ""),
        ("side", ""),
    ]
    assert evs[-1]["event"] == "shutdown" and evs[-1]["reason"] == "completed"


def test_events_stream_to_stdout_equals_the_log_and_no_progress_on_a_pipe(tmp_path: Path) -> None:
    state = tmp_path / "s"
    done = subprocess.run(
        [DISPATCH, str(HELLO), "--state", str(state), "--events", "-"],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (state / "session.jsonl").read_bytes()
    kinds = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    assert kinds[0] == "plan_admitted" and kinds[-2:] == ["run_finished", "shutdown"]
    # stderr on a pipe: the one summary line, no progress display
    assert done.stderr.decode().splitlines() == [done.stderr.decode().splitlines()[-1]]
    assert b"\x1b[" not in done.stderr


def test_report_html_is_a_self_contained_timeline(tmp_path: Path) -> None:
    state = tmp_path / "s"
    fanout = REPO / "examples" / "fanout" / "pack.toml"
    done = subprocess.run(
        [DISPATCH, str(fanout), "--state", str(state), "-p", "fail_on=beta"],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    page = tmp_path / "timeline.html"
    rep = subprocess.run(
        [DISPATCH, "report", str(state), "--html", str(page)], capture_output=True, timeout=60
    )
    assert rep.returncode == 0, rep.stderr
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "http://" not in html and "https://" not in html and "<script src" not in html
    # list, six instances of measure, audit, summary; total was skipped: no bar
    assert html.count('class="bar"') == 9
    assert "measure[1]" in html and "#d1422f" in html  # the failed instance, in red
    assert "total" in html and "skipped" in html


@pytest.mark.slow
def test_ten_thousand_instance_fanout_completes(tmp_path: Path) -> None:
    n = 10_000
    manifest = pack(
        tmp_path / "p",
        f"""
[[workflow.task]]
name = "items"
emits = {{ items = "array" }}
run = '''printf '{{"items": [' > "$CRUCIBLE_OUTPUT"; seq -s, 1 {n} >> "$CRUCIBLE_OUTPUT"; printf ']}}' >> "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = ["true"]

[[workflow.task]]
name = "count"
needs = ["each"]
emits = {{ n = "integer" }}
run = '''printf '{{"n": %s}}' "$(ls "$CRUCIBLE_INPUTS_DIR/../each" 2>/dev/null | wc -l)" > "$CRUCIBLE_OUTPUT"'''
""",
    )
    state = tmp_path / "s"
    done = subprocess.run(
        [DISPATCH, str(manifest), "--state", str(state), "-j", "4"],
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    agg = json.loads((state / "results" / "each.json").read_bytes())
    assert agg["status"] == "passed" and len(agg["keys"]) == n and agg["counts"]["passed"] == n
    assert len(keyed(state, "each")) == n and not (state / "results" / "each").exists()
    finished = [json.loads(line) for line in (state / "session.jsonl").read_bytes().splitlines()][
        -2
    ]
    assert finished["event"] == "run_finished" and finished["counts"]["passed"] == n + 2
    assert finished["max_rss_kib"] < 300 * 1024


def test_progress_display_on_a_tty(tmp_path: Path) -> None:
    import pty

    master, slave = pty.openpty()
    state = tmp_path / "s"
    manifest = pack(
        tmp_path / "p",
        "".join(f'[[workflow.task]]\nname = "t{i}"\nrun = "sleep 0.3"\n\n' for i in range(4)),
    )
    proc = subprocess.Popen(
        [DISPATCH, str(manifest), "--state", str(state), "-j", "2"],
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "TERM": "xterm", "COLUMNS": "120"},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0
    assert "remaining" in shown and "ETA" in shown and "done 4" in shown
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.read() == b""  # progress never goes to stdout


def test_resume_of_a_finished_fanout_runs_nothing_and_appends_no_session(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "crucible-dispatch"
    pack = REPO / "examples" / "fanout" / "pack.toml"
    state = tmp_path / "state"
    first = subprocess.run([exe, pack, "--state", state, "-j", "2"], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(
        [exe, pack, "--state", state, "-j", "2", "--resume"], capture_output=True, text=True
    )
    # Nothing left to run: the run's own exit code, one line, and no empty
    # session appended to the log (run.md, "Resume").
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("\n") == 1 and "nothing to resume" in again.stderr
    log = (state / "session.jsonl").read_text()
    finished = [json.loads(line) for line in log.splitlines() if '"run_finished"' in line]
    assert len(finished) == 1 and log.count('"plan_admitted"') == 1
    assert finished[0]["counts"]["units"] == finished[0]["counts"]["passed"] > 5


def test_sigkill_of_the_dispatcher_takes_its_workers_and_tasks_along(tmp_path: Path) -> None:
    """A dispatcher killed outright cannot clean up; its workers see their request
    pipe hang up, kill their tasks' groups and exit: nothing is left running, and
    a resume runs the unsettled task again."""
    gate = tmp_path / "gate"
    gate.write_text("closed")
    body = f"""
[[workflow.task]]
name = "long"
run = '''
if [ -e {gate} ]; then echo $$ > {tmp_path}/long.pid; sleep 30 & echo $! > {tmp_path}/child.pid; wait; fi
echo '{{}}' > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "short"
run = '''echo '{{}}' > "$CRUCIBLE_OUTPUT"'''
"""
    manifest = pack(tmp_path / "p", body)
    state = tmp_path / "s"
    proc = start_dispatch(manifest, state, "-j", "2")
    child_pid = tmp_path / "child.pid"
    wait_for(lambda: child_pid.exists() and child_pid.read_text().strip() != "")
    leader = int((tmp_path / "long.pid").read_text())
    child = int(child_pid.read_text())
    workers = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and parent_pid(int(p)) == proc.pid and int(p) != leader
    ]
    assert workers, "no worker processes found"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(process_alive(p) for p in (leader, child, *workers)))
    assert not (state / "results" / "long.json").exists()
    gate.unlink()
    done = subprocess.run(
        [DISPATCH, str(manifest), "--state", str(state), "--resume"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rec = result(state, "long")
    assert rec is not None and rec["status"] == "passed"


def _started_pid(state: Path, task: str) -> int | None:
    """The pid the session log's task_started gives ``task`` (complete lines only)."""
    log = state / "session.jsonl"
    if not log.exists():
        return None
    for line in log.read_bytes().split(b"\n")[:-1]:
        event = json.loads(line)
        if event.get("event") == "task_started" and event.get("task") == task:
            return int(event["pid"])
    return None


def test_a_worker_killed_mid_task_stops_the_run_and_its_task(tmp_path: Path) -> None:
    """A worker that dies holding a unit (OOM killer, kill -9) ends the run with
    one clear line; the dispatcher kills the orphaned task's group."""
    gate = tmp_path / "gate"
    gate.write_text("closed")
    body = f"""
[[workflow.task]]
name = "long"
run = \'\'\'echo $$ > {tmp_path}/long.pid; while [ -e {gate} ]; do sleep 0.05; done\'\'\'
"""
    manifest = pack(tmp_path / "p", body)
    state = tmp_path / "s"
    proc = piped_dispatch(manifest, state, "-j", "1", stdout=subprocess.DEVNULL)
    pid_file = tmp_path / "long.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    leader = int(pid_file.read_text())
    # The dispatcher kills the group of a task it knows started: wait until it
    # has heard the start (the task can write its pid before its worker has
    # reported it; a worker killed in between leaves the dispatcher nothing to
    # kill, which under load made this test fail).
    wait_for(lambda: _started_pid(state, "long") == leader, timeout=60)
    worker = parent_pid(leader)
    assert parent_pid(worker) == proc.pid
    os.kill(worker, signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "worker" in lines[0] and "died" in lines[0], lines
    wait_for(lambda: not process_alive(leader))
    assert events(state)[-1]["event"] == "shutdown"
