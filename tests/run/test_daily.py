"""crucible-dispatch in daily use (issue 13): resume, rerun and select without
friction, failures shown where people look. Real subprocesses throughout."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run.dispatchtests import (
    DISPATCH,
    Pack,
    dispatch,
    events,
    one_line,
    piped_dispatch,
    result,
)
from tests.run.dispatchtests import wait_for as _wait_for

# ------------------------------------------------------------ item 6: a typo


def test_a_typo_of_a_subcommand_is_named(tmp_path: Path) -> None:
    r = dispatch("reprot", tmp_path / "s", cwd=tmp_path)
    assert r.returncode == 2
    assert one_line(r.stderr).endswith("no such command or file: reprot")


# ------------------------------------------- items 2 and 3: resume and params

TWO_STEP = """
[workflow.params]
data_dir = { type = "string" }
n = { type = "integer", default = 1 }

[[workflow.task]]
name = "a"
run = 'echo "a $CRUCIBLE_INPUTS_DIR" >> ../ran.txt'

[[workflow.task]]
name = "b"
needs = ["a"]
run = 'echo "b $(cat $CRUCIBLE_INPUTS_DIR/params)" >> ../ran.txt'
"""


def test_resume_reuses_the_stored_params_and_refuses_a_changed_one(
    pack: Pack, tmp_path: Path
) -> None:
    plan = pack(TWO_STEP)
    state = tmp_path / "s"
    first = dispatch(plan, "--state", state, "-p", "data_dir=d1", "--target", "a")
    assert first.returncode == 0, first.stderr
    # a changed param is a different run: refused, naming it, nothing appended
    before = (state / "session.jsonl").read_bytes()
    changed = dispatch(plan, "--state", state, "--resume", "-p", "data_dir=d2")
    assert changed.returncode == 1
    line = one_line(changed.stderr)
    assert "'data_dir'" in line and '"d1"' in line and '"d2"' in line
    assert (state / "session.jsonl").read_bytes() == before
    # the same value again is accepted; no value at all reuses params.json
    same = dispatch(plan, "--state", state, "--resume", "-p", "data_dir=d1", "-p", "n=1.0")
    assert same.returncode == 0, same.stderr
    assert (state / "work" / "ran.txt").read_text().splitlines()[-1] == 'b {"data_dir":"d1","n":1}'


def test_resume_without_params_reuses_them(pack: Pack, tmp_path: Path) -> None:
    plan = pack(TWO_STEP)
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state, "-p", "data_dir=x", "--target", "a").returncode == 0
    again = dispatch(plan, "--state", state, "--resume")
    assert again.returncode == 0, again.stderr
    assert (state / "work" / "ran.txt").read_text().splitlines()[-1] == 'b {"data_dir":"x","n":1}'


def test_resume_with_nothing_left_appends_nothing_and_keeps_the_runs_code(
    pack: Pack, tmp_path: Path
) -> None:
    plan = pack('[[workflow.task]]\nname = "bad"\nrun = "exit 4"\n')
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 1
    before = (state / "session.jsonl").read_bytes()
    again = dispatch(plan, "--state", state, "--resume")
    assert again.returncode == 1
    line = one_line(again.stderr)
    assert "nothing to resume" in line and "--retry-failed" in line
    assert (state / "session.jsonl").read_bytes() == before


# ------------------------------------------------------ item 27: param values


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("1152921504606846976", "outside the integers JSON carries exactly"),
        ("NaN", "'n': nan is not a number JSON can carry"),
        ("x1", "'n' expects an integer; 'x1' is not JSON"),
        ("2.5", "must be an integer, not a number (2.5 has a fractional part)"),
        ('"3"', "must be an integer, not a string"),
    ],
)
def test_param_messages_say_what_is_wrong(
    pack: Pack, tmp_path: Path, value: str, needle: str
) -> None:
    plan = pack(
        '[workflow.params]\nn = { type = "integer" }\n\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    r = dispatch(plan, "--state", tmp_path / "s", "-p", f"n={value}")
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert needle in line and "a integer" not in line
    assert not (tmp_path / "s" / "plan.json").exists()


def test_an_integral_number_is_an_integer_param(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        '[workflow.params]\nn = { type = "integer" }\n\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    (tmp_path / "p.json").write_text('{"n": 3.0}')
    r = dispatch(plan, "--state", tmp_path / "s", "--params", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s" / "params.json").read_text() == '{"n":3}'
    r = dispatch(plan, "--state", tmp_path / "t", "-p", "n=2.0")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "t" / "params.json").read_text() == '{"n":2}'


# --------------------------------------- issue 12 item 7: one lock per state


def test_a_second_dispatcher_on_a_state_is_refused_naming_the_first(
    pack: Pack, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.write_text("closed")
    plan = pack(
        f"""
[[workflow.task]]
name = "wait"
run = 'touch ../up; while [ -e {gate} ]; do sleep 0.05; done'

[[workflow.task]]
name = "other"
run = 'echo other >> ../other.txt'
needs = ["wait"]
"""
    )
    state = tmp_path / "s"
    first = piped_dispatch(plan, state)
    try:
        _wait_for(lambda: (state / "work" / "up").exists())
        second = dispatch(plan, "--state", state, "--resume")
        assert second.returncode == 1
        assert f"another dispatcher (pid {first.pid}) is running" in one_line(second.stderr)
        fresh = dispatch(plan, "--state", state, "--fresh")
        assert fresh.returncode == 1 and f"pid {first.pid}" in fresh.stderr
    finally:
        gate.unlink()
        first.communicate(timeout=30)
    assert first.returncode == 0
    assert (state / "work" / "other.txt").read_text() == "other\n"  # ran once
    assert sum(1 for e in events(state) if e["event"] == "plan_admitted") == 1


# ------------------- issue 12 items 22 and 25: check first, -j within bounds


def test_a_bad_events_path_leaves_the_state_unclaimed(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "a"\nrun = "true"\n')
    state = tmp_path / "s"
    (tmp_path / "adir").mkdir()
    for where in (tmp_path / "adir", tmp_path / "no" / "such" / "file"):
        r = dispatch(plan, "--state", state, "--events", where)
        assert r.returncode == 2
        assert str(where) in one_line(r.stderr)
        assert not (state / "plan.json").exists() and not (state / "params.json").exists()
    assert dispatch(plan, "--state", state).returncode == 0  # not "already holds a run"


def test_jobs_are_capped_by_the_units_and_a_maximum(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "a"\nrun = "true"\n')
    r = dispatch(plan, "--state", tmp_path / "s", "-j", "200")
    assert r.returncode == 0, r.stderr
    admitted = events(tmp_path / "s")[0]
    assert admitted["event"] == "plan_admitted" and admitted["jobs"] == 1
    big = dispatch(plan, "--state", tmp_path / "t", "-j", "100000")
    assert big.returncode == 2 and "256" in one_line(big.stderr)
    assert not (tmp_path / "t").exists()


def test_jobs_over_the_process_limit_are_refused_before_anything_is_written(
    pack: Pack, tmp_path: Path
) -> None:
    if os.geteuid() == 0:
        pytest.skip("root is not held to RLIMIT_NPROC")
    plan = pack("".join(f'[[workflow.task]]\nname = "t{i}"\nrun = "true"\n' for i in range(50)))
    script = (
        "import resource, sys, os; "
        "resource.setrlimit(resource.RLIMIT_NPROC, (40, 40)); "
        f"os.execv({DISPATCH!r}, sys.argv)"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            DISPATCH,
            str(plan),
            "--state",
            str(tmp_path / "s"),
            "-j",
            "40",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "ulimit -u" in one_line(r.stderr)
    assert not (tmp_path / "s" / "plan.json").exists()


# ---------------------------------------- issue 12 item 5: a broken mirror


def _full_device(tmp_path: Path) -> Path:
    dev = tmp_path / "full"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        pytest.skip("cannot create a device node here (not root)")
    return dev


def test_events_to_a_full_device_keep_the_log_complete(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "a"\nrun = "echo hi"\n')
    full = _full_device(tmp_path)
    for i, args in enumerate((["--events", str(full)], ["--events", "-"])):
        state = tmp_path / f"s{i}"
        with open(full, "wb") as out:
            r = subprocess.run(
                [DISPATCH, str(plan), "--state", str(state), *args],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
            )
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        warnings = [line for line in r.stderr.splitlines() if "warning" in line]
        assert len(warnings) == 1 and "events mirror" in warnings[0], r.stderr
        evs = events(state)
        assert [e["event"] for e in evs][-2:] == ["run_finished", "shutdown"]


# ---------------------------------------- issue 12 item 13: a key with NUL


def test_a_fanout_key_with_nul_runs_with_the_escaped_key(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "src"
emits = { m = "object" }
run = '''printf '{"m": {"a\\\\u0000b": 1, "c": 2}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.m"
run = '''printf '%s' "$CRUCIBLE_KEY" > key.txt'''
"""
    )
    state = tmp_path / "s"
    r = dispatch(plan, "--state", state)
    assert r.returncode == 0, r.stderr
    from crucible.stage import escape_key

    key = "a\x00b"
    rec = result(state, "each", key)
    assert rec is not None and rec["status"] == "passed" and rec["key"] == key
    assert (state / "work" / "each" / escape_key(key) / "key.txt").read_text() == escape_key(key)
    assert (state / "work" / "each" / "c" / "key.txt").read_text() == "c"


# ------------------------------------------ item 9: failures where people look


def test_a_failure_names_its_log_and_carries_its_last_lines(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "bad"
emits = { x = "string" }
run = 'for i in $(seq 1 15); do echo "line $i" >&2; done; exit 3'

[[workflow.task]]
name = "slow"
timeout = 0.5
run = 'trap "" TERM; echo waiting; sleep 30'

[[workflow.task]]
name = "audit"
needs = ["bad"]
join = "settled"
inputs = { x = "bad.x" }
run = 'cat "$CRUCIBLE_INPUTS_DIR/index.json" > ../index.json'

[[workflow.task]]
name = "finally"
epilogue = true
run = 'cat "$CRUCIBLE_INPUTS_DIR/outcome" > ../outcome.json'
"""
    )
    state = tmp_path / "s"
    r = subprocess.run(
        [DISPATCH, str(plan), "--state", str(state), "-j", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    rec = result(state, "bad")
    assert rec is not None and rec["status"] == "failed"
    assert rec["log"] == "logs/bad.log"
    assert rec["stderr_tail"] == "\n".join(f"line {i}" for i in range(6, 16))
    assert rec["note"].startswith("exited with status 3 (see logs/bad.log)\nline 6\n")
    slow = result(state, "slow")
    assert slow is not None
    assert slow["note"].startswith("killed by SIGKILL after timeout 0.5s (see logs/slow.log)")
    assert slow["exit_code"] == -9 and slow["stderr_tail"] == "waiting"
    last = r.stderr.strip().splitlines()[-1]
    assert f"failed: bad ({state}/logs/bad.log), slow ({state}/logs/slow.log)" in last
    # the settled join's index and the epilogue's outcome carry the note: how the
    # producer ended (status or signal) and its log
    index = json.loads((state / "work" / "index.json").read_text())
    (bad,) = [i for i in index["inputs"] if i.get("producer") == "bad"]
    assert bad["status"] == "failed" and "(see logs/bad.log)" in bad["note"]
    outcome = json.loads((state / "work" / "outcome.json").read_text())
    assert outcome["tasks"]["bad"]["status"] == "failed"
    assert "(see logs/bad.log)" in outcome["tasks"]["bad"]["note"]
    assert "killed by SIGKILL" in outcome["tasks"]["slow"]["note"]


def test_the_tail_is_bounded_in_bytes(pack: Pack, tmp_path: Path) -> None:
    from crucible.run.engine._failures import TAIL_BYTES, tail_text

    assert tail_text(b"") == ""
    assert tail_text(b"a\nb\n") == "a\nb"
    long = ("é" * 3000).encode()
    text = tail_text(long)
    assert len(text.encode()) <= TAIL_BYTES and set(text) == {"é"}


# --------------------------------------------------- item 11: the pack's dir


def test_tasks_know_the_packs_directory(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        '[[workflow.task]]\nname = "a"\nrun = \'printf "%s" "$CRUCIBLE_PACK_DIR" > ../dir.txt\'\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state = tmp_path / "s"
    rel = os.path.relpath(plan, elsewhere)
    assert dispatch(rel, "--state", state, cwd=elsewhere).returncode == 0
    assert (state / "work" / "dir.txt").read_text() == str(plan.parent)
    assert str(plan.parent).encode() not in (state / "plan.json").read_bytes()


# ------------------------------------------------------- item 10: --follow


def test_follow_streams_whole_lines_prefixed(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "items"
emits = { items = "array" }
run = '''printf '{"items": ["x", "y"]}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = '''for i in 1 2 3; do printf 'part-'; sleep 0.05; printf '%s-%s\\n' "$CRUCIBLE_KEY" $i; done; printf 'no newline'; echo err >&2'''
"""
    )
    quiet = dispatch(plan, "--state", tmp_path / "q")
    assert quiet.returncode == 0 and "part-" not in quiet.stderr
    r = dispatch(plan, "--state", tmp_path / "s", "--follow", "-j", "2")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    for key in ("0", "1"):
        mine = [line for line in lines if line.startswith(f"each[{key}] ")]
        assert mine[:3] == [f"each[{key}] part-{key}-{i}" for i in (1, 2, 3)], lines
        assert f"each[{key}] no newlineerr" in mine or {
            f"each[{key}] no newline",
            f"each[{key}] err",
        } <= set(mine), mine


# ------------------------------------- items 8 and 12: rerun, select, preview


RERUN = """
[[workflow.task]]
name = "ok"
run = 'echo ok >> ../ran.txt'

[[workflow.task]]
name = "flaky"
run = 'echo flaky >> ../ran.txt; test -e {fixed}'

[[workflow.task]]
name = "after"
needs = ["flaky"]
run = 'echo after >> ../ran.txt'

[[workflow.task]]
name = "side"
needs = ["ok"]
run = 'echo side >> ../ran.txt'
"""


def test_retry_failed_reruns_failed_skipped_and_downstream_only(pack: Pack, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"
    plan = pack(RERUN.format(fixed=fixed))
    state = tmp_path / "s"
    first = dispatch(plan, "--state", state)
    assert first.returncode == 1
    assert result(state, "after")["status"] == "skipped"  # type: ignore[index]
    ran = state / "work" / "ran.txt"
    ran.write_text("")
    fixed.write_text("")
    # a plain resume keeps the failure
    assert dispatch(plan, "--state", state, "--resume").returncode == 1
    assert ran.read_text() == ""
    preview = dispatch(plan, "--state", state, "--resume", "--retry-failed", "-n", "--json")
    assert preview.returncode == 0, preview.stderr
    rows = {row["task"]: row for row in map(json.loads, preview.stdout.splitlines())}
    assert {t: r["action"] for t, r in rows.items()} == {
        "ok": "keep",
        "flaky": "run",
        "after": "run",
        "side": "keep",
    }
    assert "failed before" in rows["flaky"]["reason"]
    assert ran.read_text() == ""  # a dry run runs nothing
    again = dispatch(plan, "--state", state, "--resume", "--retry-failed")
    assert again.returncode == 0, again.stderr
    assert sorted(ran.read_text().split()) == ["after", "flaky"]


def test_retry_failed_reruns_only_the_failed_instances(pack: Pack, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"
    plan = pack(
        f"""
[[workflow.task]]
name = "items"
emits = {{ items = "array" }}
run = '''printf '{{"items": [1, 2, 3]}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["items"]
map = "items.items"
run = '''echo "$CRUCIBLE_KEY" >> ../../ran.txt; test "$CRUCIBLE_KEY" != 1 || test -e {fixed}'''
"""
    )
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 1
    (state / "work" / "ran.txt").write_text("")
    fixed.write_text("")
    again = dispatch(plan, "--state", state, "--resume", "--retry-failed")
    assert again.returncode == 0, again.stderr
    assert (state / "work" / "ran.txt").read_text().split() == ["1"]


def test_bad_flag_combinations_are_usage_errors(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "a"\nrun = "true"\n')
    state = tmp_path / "s"
    for args, needle in (
        (["--retry-failed"], "--retry-failed"),
        (["--fresh", "--resume"], "--fresh"),
        (["--target", "nope"], "'nope'"),
        (["--json"], "--dry-run"),
    ):
        r = dispatch(plan, "--state", state, *args)
        assert r.returncode == 2, r.stderr
        assert needle in one_line(r.stderr)
        assert not state.exists()


def test_fresh_moves_the_old_run_aside_and_never_loses_it(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        '[workflow.params]\nn = { type = "integer", default = 1 }\n\n[[workflow.task]]\nname = "a"\nrun = "echo $CRUCIBLE_ATTEMPT >> ../ran.txt"\n'
    )
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 0
    old_log = (state / "session.jsonl").read_bytes()
    refused = dispatch(plan, "--state", state, "--fresh", "-p", "n=x")
    assert refused.returncode == 1
    assert (state / "session.jsonl").read_bytes() == old_log
    assert not (tmp_path / "s.prev").exists()
    again = dispatch(plan, "--state", state, "--fresh")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "s.prev" / "session.jsonl").read_bytes() == old_log
    assert next(e["session"] for e in events(state)) == 1
    assert (state / "work" / "ran.txt").read_text() == "1\n"
    assert dispatch(plan, "--state", state, "--fresh").returncode == 0  # replaces s.prev


def test_target_runs_ancestors_only_and_resume_completes(pack: Pack, tmp_path: Path) -> None:
    plan = pack(RERUN.format(fixed=tmp_path))  # every task passes
    state = tmp_path / "s"
    dry = dispatch(plan, "--state", state, "--target", "after", "--dry-run", "--all")
    assert dry.returncode == 0 and not state.exists()
    head, *rows = dry.stdout.splitlines()
    assert head == "4 units: 2 run, 0 cached, 0 kept, 0 skipped, 2 not selected"
    assert [line.split()[0] for line in rows] == ["not", "run", "run", "not"]
    r = dispatch(plan, "--state", state, "--target", "after")
    assert r.returncode == 0, r.stderr
    assert sorted((state / "work" / "ran.txt").read_text().split()) == ["after", "flaky"]
    skipped = {e["task"]: e["status"] for e in events(state) if e["event"] == "task_finished"}
    assert skipped == {
        "flaky": "passed",
        "after": "passed",
        "ok": "not_selected",
        "side": "not_selected",
    }
    assert result(state, "ok") is None
    rest = dispatch(plan, "--state", state, "--resume")
    assert rest.returncode == 0, rest.stderr
    assert sorted((state / "work" / "ran.txt").read_text().split()) == [
        "after",
        "flaky",
        "ok",
        "side",
    ]


def test_dry_run_text_lists_every_unit_with_a_reason(pack: Pack, tmp_path: Path) -> None:
    plan = pack(RERUN.format(fixed=tmp_path / "never"))
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 1
    before = (state / "session.jsonl").read_bytes()
    r = dispatch(plan, "--state", state, "--resume", "-n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "4 units: 0 run, 0 cached, 3 kept, 1 skipped\n"  # nothing runs
    r = dispatch(plan, "--state", state, "--resume", "-n", "--all")
    assert r.returncode == 0, r.stderr
    text = r.stdout.splitlines()[1:]
    assert [line.split()[:2] for line in text] == [
        ["keep", "ok"],
        ["keep", "flaky"],
        ["keep", "after"],
        ["keep", "side"],
    ]
    assert re.search(r"flaky\s+failed in an earlier session", r.stdout)
    assert (state / "session.jsonl").read_bytes() == before


def test_fail_fast_stops_the_run_at_the_first_failure(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "long"
run = 'sleep 30'

[[workflow.task]]
name = "bad"
run = 'sleep 0.3; exit 1'

[[workflow.task]]
name = "later"
needs = ["long"]
run = 'true'
"""
    )
    state = tmp_path / "s"
    started = time.monotonic()
    r = dispatch(plan, "--state", state, "--fail-fast", "-j", "2")
    assert r.returncode == 1, r.stderr
    assert time.monotonic() - started < 15
    finished = {e["task"]: e for e in events(state) if e["event"] == "task_finished"}
    assert finished["bad"]["status"] == "failed"
    assert finished["long"]["status"] == "interrupted"
    assert "--fail-fast after 'bad' failed" in finished["long"]["note"]
    assert "later" not in finished
    assert signal.SIGTERM  # the long task was stopped by its group's SIGTERM


def test_the_process_limit_check_counts_workers_and_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """-j against the user's process limit (RLIMIT_NPROC), checked before
    anything is written: as a non-root user near the limit it is refused."""
    import resource

    from crucible.core.errors import UsageError
    from crucible.core.plan import Plan
    from crucible.run.session import _admit as admit

    tasks = [{"name": f"t{i}", "kind": "command"} for i in range(50)]
    plan = Plan.from_json({"version": 1, "tasks": tasks})
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (100, 100))
    monkeypatch.setattr(admit, "_processes_of", lambda _uid: 60)
    # -j 8: 8 workers and 8 tasks = 16 processes, 60 in use, limit 100
    assert admit._jobs(8, plan) == 8
    with pytest.raises(UsageError, match=r"-j 21 needs 42 processes; 60 .* limit of 100"):
        admit._jobs(21, plan)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # root is not held to it
    assert admit._jobs(20, plan) == 20


@pytest.mark.parametrize("junk", [b'{"junk": 1}\n', b"garbage\n", b"[]"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_junk_plan_json_in_the_state_is_said_to_be_no_plan(
    tmp_path: Path, junk: bytes, resume: bool
) -> None:
    # issue 12 item 32: it used to read "holds a run of another plan (sha256:...)"
    state = tmp_path / "s"
    state.mkdir()
    (state / "plan.json").write_bytes(junk)
    hello = Path(__file__).resolve().parents[2] / "examples" / "hello" / "pack.toml"
    proc = dispatch(hello, "--state", state, *(["--resume"] if resume else []))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"{state / 'plan.json'}: not a plan" in line
    assert (state / "plan.json").read_bytes() == junk  # nothing overwritten
