"""The scored loop's records ride the group commit in order (issue 14):
``STATE/loop.json`` saying the loop finished is durable BEFORE any body task's
plain record is written (a resume takes those records as the loop being over,
and a batch gives no order inside it), and inside the dispatcher's loop nothing
the loop writes is fsynced on the scheduling thread (docs/spec/run.md,
"Order between batches"); and a resume of a loop that stopped, or that never
ran, decides from loop.json as loop.md says.

The dispatcher runs with a trace of every fsync (thread, path), every batch the
session log made durable (its paths; whether loop.json said ``finished``) and
every rename onto a result record or loop.json, in the order they happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.run.dispatchtests import wait_for

TRACED = """
import json, os, sys, threading
trace = os.environ["TRACE"]
me = os.getpid()
def note(line):
    if os.getpid() != me:  # a forked worker
        return
    fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (threading.current_thread().name + " " + line + "\\n").encode())
    os.close(fd)
real_fsync, real_replace = os.fsync, os.replace
def fsync(fd):
    real_fsync(fd)
    try:
        what = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        what = "?"
    note("fsync " + what)
def replace(src, dst, **kw):
    real_replace(src, dst, **kw)
    dst = os.fspath(dst)
    if "/results/" in dst or dst.endswith("loop.json"):
        note("replace " + dst)
os.fsync, os.replace = fsync, replace
from crucible.run.session import _log as _session
real_sync = _session.SessionLog._sync_records
def sync_records(self, paths):
    real_sync(self, paths)
    for p in paths:
        if p.endswith("/loop.json"):
            with open(p, "rb") as f:
                note("durable-loop finished=" + str(json.load(f)["finished"]))
    note("durable " + " ".join(sorted(paths)))
_session.SessionLog._sync_records = sync_records
sys.argv[0] = "crucible-dispatch"
from crucible.run.cli import main
main()
"""

BODY = """edition = 4
[workflow]
name = "loopsync"
[[workflow.task]]
name = "seed"
run = '''{seed}'''
[[workflow.task]]
name = "propose"
needs = ["seed"]
run = '''
r=$(cat "$CRUCIBLE_INPUTS_DIR/revision")
[ -e "$CRUCIBLE_PACK_DIR/hang.$r" ] && {{ touch "$CRUCIBLE_PACK_DIR/hanging"; sleep 30; }}
printf '{{"n": %s}}' "$r" > "$CRUCIBLE_OUTPUT"
'''
emits = {{ n = "integer" }}
[[workflow.task]]
name = "never"
needs = ["propose"]
when = "needs.propose.status == 'failed'"
run = "echo '{{}}' > \\"$CRUCIBLE_OUTPUT\\""
[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
inputs = {{ n = "propose.n" }}
run = '''n=$(cat "$CRUCIBLE_INPUTS_DIR/n"); printf '{{"score": %s, "verdict": "pass"}}' "$n" > "$CRUCIBLE_OUTPUT"'''
emits = {{ score = "integer" }}
[[workflow.task]]
name = "final"
needs = ["evaluate"]
run = "echo '{{}}' > \\"$CRUCIBLE_OUTPUT\\""
[loop]
body = ["propose", "never", "evaluate"]
score = "evaluate"
metric = "score"
max_revisions = 3
"""

PASSING_SEED = "echo '{}' > \"$CRUCIBLE_OUTPUT\""
BODY_TASKS = ("propose", "never", "evaluate")


def _pack(root: Path, seed: str = PASSING_SEED) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pack = root / "pack.toml"
    pack.write_text(BODY.format(seed=seed))
    return pack


def _argv(pack: Path, state: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", TRACED, str(pack), "--state", str(state), "-j", "2", *args]


def _traced(
    pack: Path, state: Path, trace: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    done = subprocess.run(
        _argv(pack, state, *args), capture_output=True, text=True, timeout=120,
        env={**os.environ, "TRACE": str(trace)},
    )  # fmt: skip
    return done, trace.read_text().splitlines() if trace.exists() else []


def _index(lines: list[str], pred: object, what: str) -> int:
    for i, line in enumerate(lines):
        if callable(pred) and pred(line):
            return i
    raise AssertionError(f"no {what} in the trace:\n" + "\n".join(lines))


def _plain_renames(lines: list[str], state: Path) -> dict[str, int]:
    """The index of each body task's plain record rename."""
    out = {}
    for t in BODY_TASKS:
        target = f"replace {state / 'results' / (t + '.json')}"
        out[t] = _index(lines, lambda line, s=target: line.endswith(s), f"rename of {t}.json")
    return out


def _durable_after(lines: list[str], start: int, path: Path) -> bool:
    """A batch after ``start`` made ``path`` durable."""
    return any(
        " durable " in f" {line} " and str(path) in line.split(" ")[2:]
        for line in lines[start + 1 :]
    )


def _scheduler_fsyncs(lines: list[str], state: Path) -> list[str]:
    """fsyncs of loop.json or a result record on the scheduling (main) thread."""
    return [
        line
        for line in lines
        if line.startswith("MainThread fsync ")
        and (line.endswith("/loop.json") or f"{state}/results" in line)
    ]


def test_loop_json_is_durable_before_any_body_plain_record_is_written(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "pack")
    state = tmp_path / "s"
    done, lines = _traced(pack, state, tmp_path / "trace.txt")
    assert done.returncode == 0, done.stderr
    doc = json.loads((state / "loop.json").read_bytes())
    assert doc["finished"] is True and doc["kept_revision"] == 3
    finished = _index(lines, lambda line: line.endswith("durable-loop finished=True"), "loop.json")
    renames = _plain_renames(lines, state)
    assert all(i > finished for i in renames.values()), (finished, renames, lines)
    for t, i in renames.items():  # each rides a later batch, before `final` starts
        assert _durable_after(lines, i, state / "results" / f"{t}.json"), (t, lines)
    assert _scheduler_fsyncs(lines, state) == []
    final = json.loads((state / "results" / "final.json").read_bytes())
    assert final["status"] == "passed"
    plain = json.loads((state / "results" / "never.json").read_bytes())
    assert plain["status"] == "skipped" and plain["extra"]["revision"] == 3


def test_a_body_skipped_by_a_failed_before_task_settles_after_loop_json(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "pack", seed="exit 3")
    state = tmp_path / "s"
    done, lines = _traced(pack, state, tmp_path / "trace.txt")
    assert done.returncode == 1, done.stderr
    doc = json.loads((state / "loop.json").read_bytes())
    assert doc["finished"] is True and doc["revisions"] == [] and doc["stop_reason"] is None
    finished = _index(lines, lambda line: line.endswith("durable-loop finished=True"), "loop.json")
    renames = _plain_renames(lines, state)
    assert all(i > finished for i in renames.values()), (finished, renames, lines)
    for t, i in renames.items():
        assert _durable_after(lines, i, state / "results" / f"{t}.json"), (t, lines)
        rec = json.loads((state / "results" / f"{t}.json").read_bytes())
        assert rec["status"] == "skipped" and "needs 'seed'" in rec["note"]
    assert _scheduler_fsyncs(lines, state) == []


def test_a_resume_of_a_finished_loop_fsyncs_loop_json_before_the_records(
    tmp_path: Path,
) -> None:
    """A crash after loop.json said finished but before the body's plain records:
    the resume writes them, after making sure the loop.json it read is durable."""
    pack = _pack(tmp_path / "pack")
    state = tmp_path / "s"
    first, _ = _traced(pack, state, tmp_path / "first.txt")
    assert first.returncode == 0, first.stderr
    for t in BODY_TASKS:
        (state / "results" / f"{t}.json").unlink()
    (state / "results" / "final.json").unlink()
    done, lines = _traced(pack, state, tmp_path / "trace.txt", "--resume")
    assert done.returncode == 0, done.stderr
    synced = _index(lines, lambda line: line.endswith(f"fsync {state}/loop.json"), "fsync")
    renames = _plain_renames(lines, state)
    assert all(i > synced for i in renames.values()), (synced, renames, lines)
    assert json.loads((state / "results" / "evaluate.json").read_bytes())["extra"] == {
        "revision": 3
    }
    assert json.loads((state / "results" / "final.json").read_bytes())["status"] == "passed"


def test_an_interrupted_revisions_tombstones_ride_the_group_commit(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    pack = _pack(root)
    (root / "hang.2").touch()
    state = tmp_path / "s"
    proc = subprocess.Popen(
        _argv(pack, state), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "TRACE": str(tmp_path / "first.txt")},
    )  # fmt: skip
    try:
        wait_for(lambda: (root / "hanging").exists(), 60)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    # revision 2's propose unit settled interrupted: its record is removed on resume
    (root / "hang.2").unlink()
    done, lines = _traced(pack, state, tmp_path / "trace.txt", "--resume")
    assert done.returncode == 0, done.stderr
    jsonl = state / "results" / "propose.jsonl"
    assert any(line.startswith("session-log ") and str(jsonl) in line for line in lines)
    assert _scheduler_fsyncs(lines, state) == [], lines
    events = [json.loads(x) for x in (state / "session.jsonl").read_text().splitlines()]
    started = [e["revision"] for e in events if e["event"] == "revision_started"]
    assert started == [1, 2, 2, 3]
    assert json.loads((state / "loop.json").read_bytes())["kept_revision"] == 3


def test_a_resume_after_the_loop_stopped_writes_the_reserved_inputs_again(
    tmp_path: Path,
) -> None:
    """They are written without fsync when the loop stops (derived from
    loop.json): a power cut may lose them while the body's records are durable;
    the tasks after the loop that run on the resume read them."""
    pack = _pack(tmp_path / "pack")
    state = tmp_path / "s"
    first, _ = _traced(pack, state, tmp_path / "first.txt")
    assert first.returncode == 0, first.stderr
    reserved = state / "reserved"
    expected = {p.name: p.read_bytes() for p in reserved.iterdir()}
    for p in reserved.iterdir():
        p.unlink()
    (state / "results" / "final.json").unlink()
    done, _ = _traced(pack, state, tmp_path / "trace.txt", "--resume")
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_bytes() for p in reserved.iterdir()} == expected
    assert json.loads((reserved / "revision.json").read_bytes()) == 3


SEED_UNTIL_OK = '[ -e "$CRUCIBLE_PACK_DIR/ok" ] || exit 3; echo \'{}\' > "$CRUCIBLE_OUTPUT"'


def test_a_loop_that_never_ran_is_decided_again_on_a_resume(tmp_path: Path) -> None:
    """A before task it needs failed, so the body was skipped (loop.json: finished,
    no revisions, no stop_reason). A crash before the skipped records were
    written: the resume skips the body again (not "loop kept no revision")."""
    pack = _pack(tmp_path / "pack", seed=SEED_UNTIL_OK)
    state = tmp_path / "s"
    first, _ = _traced(pack, state, tmp_path / "first.txt")
    assert first.returncode == 1, first.stderr
    for t in BODY_TASKS:
        (state / "results" / f"{t}.json").unlink()
    done, _ = _traced(pack, state, tmp_path / "trace.txt", "--resume")
    assert done.returncode == 1, done.stderr
    for t in BODY_TASKS:
        rec = json.loads((state / "results" / f"{t}.json").read_bytes())
        assert rec["status"] == "skipped" and "needs 'seed'" in rec["note"], rec


def test_retry_failed_runs_a_loop_its_failed_before_task_kept_from_running(
    tmp_path: Path,
) -> None:
    root = tmp_path / "pack"
    pack = _pack(root, seed=SEED_UNTIL_OK)
    state = tmp_path / "s"
    first, _ = _traced(pack, state, tmp_path / "first.txt")
    assert first.returncode == 1, first.stderr
    (root / "ok").touch()
    done, _ = _traced(pack, state, tmp_path / "trace.txt", "--resume", "--retry-failed")
    assert done.returncode == 0, done.stderr
    doc = json.loads((state / "loop.json").read_bytes())
    assert doc["finished"] is True and doc["stop_reason"] == "max_revisions"
    assert doc["kept_revision"] == 3 and len(doc["revisions"]) == 3
    assert json.loads((state / "results" / "final.json").read_bytes())["status"] == "passed"
