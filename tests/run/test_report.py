"""``crucible-dispatch report`` on real runs: what a mapped task, an interrupt, a
resume, a signal, a long or hostile key and a failed unit's log look like in the
table and in ``--json`` (issue 13 items 7 and 9, issue 12 item 26)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH, events, fanout_run, piped_dispatch

Pack = Callable[..., Path]
REPO = Path(__file__).resolve().parents[2]


def dispatch(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISPATCH, *argv], capture_output=True, text=True, timeout=timeout)


def report(state: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    done = dispatch("report", str(state), *argv, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def json_rows(state: Path, *argv: str) -> list[dict[str, Any]]:
    done = report(state, *argv, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def table_rows(text: str) -> list[str]:
    """The table's rows (detail lines under a failed unit are indented)."""
    return [line for line in text.splitlines()[1:] if not line.startswith(" ")]


def wait_for(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def _finished(state: Path, status: str) -> int:
    try:
        evs = events(state)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    return sum(
        1 for e in evs if e["event"] == "task_finished" and e.get("status") == status and "key" in e
    )


def _started(state: Path) -> set[str]:
    try:
        evs = events(state)
    except (FileNotFoundError, json.JSONDecodeError):
        return set()
    return {e["key"] for e in evs if e["event"] == "task_started" and "key" in e}


def test_interrupted_mapped_task_then_resume(pack: Pack, tmp_path: Path) -> None:
    """Interrupted: the task is `interrupted`, not `running`; its note counts the
    instances that never started; rows come in item order. Resumed after an idle
    gap: its duration is its busy time, without the gap."""
    flag = tmp_path / "hold"
    flag.touch()
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    plan = pack(
        f"""
[[workflow.task]]
name = "items"
emits = {{ items = "array" }}
run = '''printf '{{"items": [0, 1, 2, 3, 4, 5]}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = '''
for t in 1 2; do mkdir {tickets}/$t 2>/dev/null && break; t=; done
if [ -z "$t" ] && [ -e {flag} ]; then sleep 30; fi
printf '{{}}' > "$CRUCIBLE_OUTPUT"
'''
"""
    )
    state = tmp_path / "s"
    proc = piped_dispatch(plan, state, "-j", "2", stdout=subprocess.DEVNULL)
    try:
        # the first two instances to take a ticket pass; the next two hold both slots
        wait_for(lambda: _finished(state, "passed") == 2 and len(_started(state)) == 4)
        live = json_rows(state, "each")  # while the run is on: running
        assert live[0]["status"] == "running"
        assert (
            sorted(r["status"] for r in live[1:])
            == ["passed"] * 2 + ["pending"] * 2 + ["running"] * 2
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()

    done = report(state)
    assert done.returncode == 0, done.stderr
    (each,) = [line for line in table_rows(done.stdout) if line.startswith("each ")]
    assert each.split()[1] == "interrupted"
    assert "6 instances: 2 passed, 2 interrupted, 2 not started" in each
    assert "running" not in done.stdout

    rows = json_rows(state, "each")
    assert [r.get("key") for r in rows] == [None, "0", "1", "2", "3", "4", "5"]
    assert rows[0]["status"] == "interrupted"
    assert sorted((r["status"], r["attempts"]) for r in rows[1:]) == [
        ("interrupted", 1),
        ("interrupted", 1),
        ("passed", 1),
        ("passed", 1),
        ("pending", 0),
        ("pending", 0),
    ]
    assert rows[0]["instance_status"] == {"passed": 2, "interrupted": 2, "pending": 2}
    interrupted = [r["key"] for r in rows if r["status"] == "interrupted" and "key" in r]

    flag.unlink()
    time.sleep(1.5)  # the idle gap between the sessions
    resumed = dispatch(str(plan), "--state", str(state), "--resume", "-j", "2")
    assert resumed.returncode == 0, resumed.stderr
    rows = json_rows(state, "each")
    assert [r["status"] for r in rows] == ["passed"] * 7
    assert rows[0]["attempts"] == 8
    assert [r["key"] for r in rows[1:] if r["attempts"] == 2] == interrupted
    # table and --json agree on a mapped task's attempts (its instances' sum)
    (each,) = [line for line in table_rows(report(state).stdout) if line.startswith("each ")]
    assert each.split()[2] == "8"
    times = [
        e for e in events(state) if e["event"] in ("task_started", "task_finished") and "key" in e
    ]
    from datetime import datetime

    first = datetime.fromisoformat(times[0]["time"]).timestamp()
    last = datetime.fromisoformat(times[-1]["time"]).timestamp()
    assert rows[0]["duration"] < (last - first) - 1.4


def test_instance_rows_follow_item_order_not_log_order(pack: Pack, tmp_path: Path) -> None:
    """The log may name instances in another order than their items (a quick
    task is announced with its end, after a slower one started later)."""
    plan = pack(
        """
[[workflow.task]]
name = "src"
emits = { m = "object" }
run = '''printf '{"m": {"b": 1, "a": 2, "c": 3}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.m"
run = '''printf '{}' > "$CRUCIBLE_OUTPUT"'''
"""
    )
    state = tmp_path / "s"
    assert dispatch(str(plan), "--state", str(state), "-j", "1").returncode == 0
    log = state / "session.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    mine = [i for i, line in enumerate(lines) if b'"task":"each"' in line and b'"key"' in line]
    # move the instances' events to the reverse of item order
    moved = [lines[i] for i in mine]
    pairs = [moved[k : k + 2] for k in range(0, len(moved), 2)][::-1]
    reordered = [line for pair in pairs for line in pair]
    for i, line in zip(mine, reordered, strict=True):
        lines[i] = line
    log.write_bytes(b"".join(lines))
    assert [r.get("key") for r in json_rows(state, "each")] == [None, "a", "b", "c"]
    assert [line.split()[0] for line in table_rows(report(state, "each").stdout)] == [
        "each",
        "each[a]",
        "each[b]",
        "each[c]",
    ]


def test_long_and_hostile_keys_and_notes_are_escaped_and_cut(pack: Pack, tmp_path: Path) -> None:
    long_key = "k" * 300
    hostile = ["a\x1b]0;PWNED\x07b", "c\rd", "e\nf", "g\x1b[2Jh", "i\u202ej"]
    src = tmp_path / "src.py"
    src.write_text(
        "import json, os\n"
        f"json.dump({{'m': dict.fromkeys({[long_key, *hostile]!r}, 1)}}, "
        "open(os.environ['CRUCIBLE_OUTPUT'], 'w'))\n"
    )
    judge = tmp_path / "judge.py"
    judge.write_text(
        "import json, os\n"
        "json.dump({'verdict': 'fail', 'reason': 'x\\x1b]0;PWNED\\x07y\\r\\nz'}, "
        "open(os.environ['CRUCIBLE_OUTPUT'], 'w'))\n"
    )
    plan = pack(
        f"""
[[workflow.task]]
name = "src"
emits = {{ m = "object" }}
run = ["python3", "{src}"]

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.m"
run = '''case "$CRUCIBLE_KEY" in e*) exit 3;; esac; printf '{{}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "judge"
kind = "evaluate"
run = ["python3", "{judge}"]
"""
    )
    state = tmp_path / "s"
    ran = dispatch(str(plan), "--state", str(state))
    assert ran.returncode == 1, ran.stderr
    for argv in ((), ("each",)):
        out = report(state, *argv).stdout
        for raw in ("\x1b", "\x07", "\r", "\u202e"):
            assert raw not in out
    out = report(state, "each").stdout
    rows = table_rows(out)
    assert len(rows) == 1 + 6  # no row split by a newline in a key
    assert "each[a\\x1b]0;PWNED\\x07b]" in out and "each[c\\rd]" in out and "each[e\\nf]" in out
    assert "each[i\\u202ej]" in out
    (long_row,) = [r for r in rows if r.startswith("each[kkk")]
    name = long_row.split()[0]
    assert name == "each[" + "k" * 39 + "\u2026]"
    judged = report(state).stdout
    assert "verdict: fail: x\\x1b]0;PWNED\\x07y\\r\\nz" in judged
    # --json keeps keys and notes whole and raw (JSON escapes them)
    by_key = {r.get("key"): r for r in json_rows(state, "each")}
    assert long_key in by_key and all(k in by_key for k in hostile)
    page = tmp_path / "t.html"
    assert report(state, "--html", str(page)).returncode == 0
    text = page.read_text()
    for raw in ("\x1b", "\x07", "\r", "\u202e"):
        assert raw not in text


def test_killed_by_a_signal_is_named(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "victim"\nrun = "kill -9 $$"\n')
    state = tmp_path / "s"
    assert dispatch(str(plan), "--state", str(state)).returncode == 1
    out = report(state).stdout
    assert "killed by SIGKILL" in out and "status -9" not in out
    (row,) = json_rows(state)
    assert row["exit_code"] == -9 and row["signal"] == "SIGKILL"
    assert "killed by SIGKILL" in row["note"]


def _amend(state: Path, task: str, key: str | None = None, **fields: Any) -> None:
    from crucible.stage import StateLayout

    path = StateLayout(state).result_path(task, key)
    if key is not None:  # a later line of the packed file wins
        record = keyed(state, task)[key]
        record.update(fields)
        with path.open("ab") as f:
            f.write(canon.dumps(record) + b"\n")
        return
    record = json.loads(path.read_bytes())
    record.update(fields)
    path.write_bytes(canon.dumps(record))


@pytest.fixture(scope="module")
def fanout_failed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/fanout with its `beta` instance failing (a real run)."""
    return fanout_run(tmp_path_factory.mktemp("fanout") / "s", fail_on="beta")


def test_failed_unit_shows_its_log_and_stderr_tail(fanout_failed: Path, tmp_path: Path) -> None:
    import shutil

    # As the dispatcher records them: under the unit, its log and output tail;
    # the note cell does not repeat them.
    for argv in ((), ("measure",)):
        lines = report(fanout_failed, *argv).stdout.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip() == "log: logs/measure/1.log")
        assert lines[at - 1].rstrip().endswith("exited with status 1")
        assert "refusing to measure 'beta' (fail_on)" in lines[at + 1]
        assert lines[at + 1].lstrip().startswith("| ")
    state = tmp_path / "s"
    shutil.copytree(fanout_failed, state, symlinks=True)
    # Without the fields (a record written before they existed): nothing shown
    path = state / "results/measure.jsonl"
    record = keyed(state, "measure")["1"]
    for name in ("log", "stderr_tail"):
        record.pop(name, None)
    record["note"] = "exited with status 1"
    with path.open("ab") as f:  # a later line for the key wins
        f.write(canon.dumps(record) + b"\n")
    plain = [line.strip() for line in report(state).stdout.splitlines()]
    assert not [line for line in plain if line.startswith(("log: ", "| "))]
    tail = "Traceback (most recent call last):\nSystemExit: refusing 'beta'\x1b[2J"
    _amend(
        state,
        "measure",
        "1",
        log="logs/measure/1.log",
        stderr_tail=tail,
        note=f"exited with status 1 (log: logs/measure/1.log)\n{tail}",
    )
    for argv in ((), ("measure",)):
        out = report(state, *argv).stdout
        lines = out.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip() == "log: logs/measure/1.log")
        assert lines[at - 1].rstrip().endswith(": exited with status 1") or argv
        assert lines[at + 1].strip() == "| Traceback (most recent call last):"
        assert lines[at + 2].strip() == "| SystemExit: refusing 'beta'\\x1b[2J"
        assert "\x1b" not in out
    row = next(r for r in json_rows(state, "measure") if r.get("key") == "1")
    assert row["log"] == "logs/measure/1.log"
    assert row["stderr_tail"] == tail and row["note"].endswith(tail)  # whole in --json
    page = tmp_path / "t.html"
    assert report(state, "--html", str(page)).returncode == 0
    text = page.read_text()
    assert "logs/measure/1.log" in text and "SystemExit: refusing" in text and "\x1b" not in text


def test_cached_and_tolerated_are_shown(fanout_failed: Path, tmp_path: Path) -> None:
    import shutil

    state = tmp_path / "s"
    shutil.copytree(fanout_failed, state, symlinks=True)
    _amend(state, "list", cached=True)
    _amend(state, "measure", "1", tolerated=True)
    out = report(state, "measure").stdout
    assert "failed (tolerated)" in out
    assert "passed (cached)" in report(state).stdout
    rows = {(r["task"], r.get("key")): r for r in json_rows(state, "measure")}
    assert rows[("measure", "1")]["tolerated"] is True
    assert json_rows(state)[0]["cached"] is True
    page = tmp_path / "t.html"
    assert report(state, "--html", str(page)).returncode == 0
    text = page.read_text()
    assert "data-s=t" in text and "data-c" in text and "(tolerated)" in text


def test_report_rows_match_their_schema(fanout_failed: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs/schemas/report-row.json").read_text())
    rows = json_rows(fanout_failed) + json_rows(fanout_failed, "measure")
    for row in rows:
        jsonschema.validate(row, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**rows[0], "attempts": "-"}, schema)


def test_escape_is_injective_and_inert() -> None:
    from crucible.run._display import escape

    samples = ["a\nb", "a\\nb", "\x1b[2J", "\\x1b[2J", "plain", "tab\there", "\x85", "\u2028"]
    escaped = [escape(s) for s in samples]
    assert len(set(escaped)) == len(samples)
    for e in escaped:
        assert e.isprintable()
    assert escape("plain ünïcode ✓") == "plain ünïcode ✓"


def test_signal_names_in_notes() -> None:
    from crucible.run._display import name_signals

    assert name_signals("exited with status -9", -9) == "killed by SIGKILL"
    assert name_signals(
        "1 of 2 instances did not pass; first '1': failed: exited with status -15"
    ) == ("1 of 2 instances did not pass; first '1': failed: killed by SIGTERM")
    assert name_signals("", -6) == "killed by SIGABRT"
    assert name_signals("exited with status 1", 1) == "exited with status 1"


def test_a_unit_stopped_while_its_retry_waited_is_interrupted(tmp_path: Path) -> None:
    """The failed attempt's record is removed while the retry waits: a run
    stopped then leaves the unit unsettled, which the report calls interrupted
    (its last event says failed, with retry: true)."""
    state = tmp_path / "s"
    assert dispatch(str(REPO / "examples/hello/pack.toml"), "--state", str(state)).returncode == 0
    lines = [json.loads(x) for x in (state / "session.jsonl").read_bytes().splitlines()]
    for line in lines:
        if line["event"] == "task_finished" and line["task"] == "greet":
            line.update(status="failed", note="exited with status 1", exit_code=1, retry=True)
    (state / "session.jsonl").write_bytes(b"".join(canon.dumps(x) + b"\n" for x in lines))
    (state / "results" / "greet.json").unlink()
    (row, _) = json_rows(state)
    assert row["task"] == "greet" and row["status"] == "interrupted"


def test_not_selected_units_are_shown_as_such(tmp_path: Path) -> None:
    state = tmp_path / "s"
    ran = dispatch(
        str(REPO / "examples/hello/pack.toml"), "--state", str(state), "--target", "greet"
    )
    assert ran.returncode == 0, ran.stderr
    rows = {r["task"]: r for r in json_rows(state)}
    assert rows["greet"]["status"] == "passed" and rows["shout"]["status"] == "not_selected"
    (shout,) = [line for line in table_rows(report(state).stdout) if line.startswith("shout")]
    assert shout.split()[1:3] == ["not", "selected"]
    page = tmp_path / "t.html"
    assert report(state, "--html", str(page)).returncode == 0
    assert "not selected" in page.read_text()


def test_a_tolerated_failure_in_a_real_run(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        '[[workflow.task]]\nname = "flaky"\non_failure = "continue"\n'
        'run = "echo oops >&2; exit 3"\n',
        edition=4,
    )
    state = tmp_path / "s"
    assert dispatch(str(plan), "--state", str(state)).returncode == 0
    out = report(state).stdout
    assert table_rows(out)[0].split()[1:3] == ["failed", "(tolerated)"]
    assert "    | oops" in out.splitlines()
    (row,) = json_rows(state)
    assert row["status"] == "failed" and row["tolerated"] is True
    page = tmp_path / "t.html"
    assert report(state, "--html", str(page)).returncode == 0
    text = page.read_text()
    assert "data-s=t" in text and "(tolerated)" in text
