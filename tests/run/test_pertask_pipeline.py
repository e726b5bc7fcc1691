"""Per-task cost of the dispatcher (issue 14): pipelined workers and the session
log's hand-overs (docs/spec/run.md, "Running a plan" and "Session log").

A local worker holds one slot from one unit to the next: it stages the next
request while its task runs and hands the slot straight to it once the task
exited and what it held was checked; a unit staged behind a task that runs
past HANDBACK_AFTER is handed back to start elsewhere. The scheduling loop
hands a turn's events to the session log's writer at once only when something
waits for them to be durable, else at least every COMMIT_HOLD."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from crucible.run.engine import _dispatcher as engine
from crucible.run.executors._pipelined import HANDBACK_AFTER
from crucible.run.executors._recycle import FREE_PREFIX, WorkspacePool
from crucible.run.executors._workers import Inbox, _frame
from tests.run.dispatchtests import Pack, dispatch, events, result

# ------------------------------------------------------------- the inbox


def test_the_inbox_takes_a_request_only_once_it_is_whole(tmp_path: Path) -> None:
    r, w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:
        inbox = Inbox(r, rep_w)
        frame = _frame((7, ("unit", "t", None, 1, {"X": "y" * 1000})))
        os.write(w, frame[:10])
        assert inbox.take(block=False) is None  # seen readable, not whole yet
        assert not inbox.buffered()
        os.write(w, frame[10:] + _frame((8, ("unit", "u", None, 1, None))))
        assert inbox.take(block=False) == (7, ("unit", "t", None, 1, {"X": "y" * 1000}))
        # the second came with the first's tail: taken without a read (poll
        # would not say so), which is why the worker asks buffered() first
        assert inbox.buffered()
        assert inbox.take(block=False) == (8, ("unit", "u", None, 1, None))
        os.close(w)
        w = -1
        assert inbox.take(block=True) is None and inbox.closed
        inbox.reply(7, {"kind": "finished"})
        body = os.read(rep_r, 1 << 16)[4:]
        assert pickle.loads(body) == (7, "ok", {"kind": "finished"})
    finally:
        for fd in (r, w, rep_r, rep_w):
            if fd >= 0:
                os.close(fd)


def test_deferred_replies_go_out_before_the_next_reply_in_one_write(tmp_path: Path) -> None:
    """A passed unit nothing waits for is answered with its worker's next reply
    (or a flush): one write, one wake-up of the dispatcher, for several."""
    from crucible.run.executors._workers import WorkerPool

    r, w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:
        inbox = Inbox(r, rep_w)
        inbox.defer(1, {"kind": "finished", "n": 1})
        inbox.defer(2, {"kind": "finished", "n": 2})
        assert inbox.deferred == 2
        os.set_blocking(rep_r, False)
        with pytest.raises(BlockingIOError):
            os.read(rep_r, 1)  # nothing sent yet
        inbox.channel(3).send({"kind": "started", "pid": 9})  # an interim reply flushes too
        data = os.read(rep_r, 1 << 16)
        frames = []
        while data:
            n = int.from_bytes(data[:4], "little")
            frames.append(pickle.loads(data[4 : 4 + n]))
            data = data[4 + n :]
        assert frames == [
            (1, "ok", {"kind": "finished", "n": 1}),
            (2, "ok", {"kind": "finished", "n": 2}),
            (3, "interim", {"kind": "started", "pid": 9}),
        ]
        assert inbox.deferred == 0
        inbox.flush()  # nothing deferred: nothing written
        with pytest.raises(BlockingIOError):
            os.read(rep_r, 1)
    finally:
        for fd in (r, w, rep_r, rep_w):
            os.close(fd)
    assert WorkerPool(1, lambda *_: None, lazy=True, inbox_loop=lambda _i: None).depth == 4


# ---------------------------------------------------------- the pipeline

TAMPER = """edition = 3

[workflow]
name = "pipeline"

[[workflow.task]]
name = "p"
# many files: checking a holder takes a while (the window the order closes)
run = "mkdir out && cd out && seq 1500 | xargs touch && printf captured > f"
emits_files = ["out"]

[[workflow.task]]
name = "a"
needs = ["p"]
run = "chmod u+w inputs/p/out/f && printf EVIL > inputs/p/out/f"

[[workflow.task]]
name = "b"
needs = ["p"]
emits = { found = "boolean", seen = "string" }
run = '''
if [ -e "$CRUCIBLE_WORKSPACE/../../shared/@tampered/p" ]; then found=true; else found=false; fi
printf '{"found": %s, "seen": "%s"}' "$found" "$(cat inputs/p/out/f)" > "$CRUCIBLE_OUTPUT"
'''
"""


def test_a_unit_started_on_a_writers_slot_sees_the_captured_bytes(tmp_path: Path) -> None:
    """At -j 1 the one worker runs a and stages b behind it (both consumers of
    p's files, submitted together); a writes its staged copy. The slot passes
    to b once a's holding was checked (the published copy restored, a named);
    b's own refresh just before its start would catch it too, so b sees the
    tampered list and the captured bytes either way: this pins the outcome,
    not the order."""
    pack = tmp_path / "pack.toml"
    pack.write_text(TAMPER)
    for i in range(3):
        state = tmp_path / f"s{i}"
        r = dispatch(pack, "--state", state, "-j", "1")
        assert r.returncode == 1, r.stderr  # a failed: it changed what it held
        a = result(state, "a")
        assert a is not None and "changed while a held it" in a["note"]
        b = result(state, "b")
        assert b is not None and b["status"] == "passed", b
        assert b["output"] == {"found": True, "seen": "captured"}, state
        started = [e["task"] for e in events(state) if e["event"] == "task_started"]
        assert started.index("a") < started.index("b")


def _long_and_short(pack: Pack, n: int) -> Path:
    body = '[[workflow.task]]\nname = "long"\nrun = "sleep 1.5"\n'
    for i in range(n):
        body += f'[[workflow.task]]\nname = "s{i}"\nrun = "true"\n'
    return pack(body)


def test_a_unit_staged_behind_a_long_task_is_handed_back_and_starts_elsewhere(
    pack: Pack, tmp_path: Path
) -> None:
    """-j 2: the first turn gives `long` and s0 each a worker and queues s1
    behind `long` (its start is not announced yet). Once `long` has run
    HANDBACK_AFTER, s1 goes back and the other worker runs it: every short
    task settles long before `long` ends, not after it."""
    assert HANDBACK_AFTER < 0.5
    state = tmp_path / "s"
    r = dispatch(_long_and_short(pack, 12), "--state", state, "-j", "2")
    assert r.returncode == 0, r.stderr
    log = events(state)
    finished = {e["task"]: e["time"] for e in log if e["event"] == "task_finished"}
    started = [e["task"] for e in log if e["event"] == "task_started"]
    assert started.count("s1") == 1  # handed back before it started: one attempt
    assert all(finished[f"s{i}"] < finished["long"] for i in range(12)), finished
    assert all(e.get("attempt", 1) == 1 for e in log if e["event"] == "task_started")


def test_an_interrupt_leaves_the_unit_queued_behind_a_running_one_unsettled(
    pack: Pack, tmp_path: Path
) -> None:
    """-j 1: y is queued behind x (the first turn submits both to the one
    worker); SIGTERM while x runs: x is recorded interrupted, y never starts
    (staged behind x, or handed back and held by the dispatcher), and a resume
    runs both."""
    import signal
    import time

    from tests.run.dispatchtests import start_dispatch, wait_for

    plan = pack(
        '[[workflow.task]]\nname = "x"\n'
        "run = 'if [ -e ../../go ]; then true; else sleep 30; fi'\n"
        '[[workflow.task]]\nname = "y"\nrun = "true"\n'
    )
    state = tmp_path / "s"
    proc = start_dispatch(plan, state, "-j", "1")
    try:
        wait_for(
            lambda: (state / "session.jsonl").exists()
            and any(e["event"] == "task_started" for e in events(state))
        )
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    log = events(state)
    assert [e["task"] for e in log if e["event"] == "task_started"] == ["x"]
    x = [e for e in log if e["event"] == "task_finished" and e["task"] == "x"]
    assert x and x[-1]["status"] == "interrupted"
    assert result(state, "y") is None and result(state, "x") is None
    (state / "go").touch()
    done = dispatch(plan, "--state", state, "--resume", "-j", "1")
    assert done.returncode == 0, done.stderr
    for name in ("x", "y"):
        rec = result(state, name)
        assert rec is not None and rec["status"] == "passed"


# ------------------------------------------------------- commit hand-overs


def test_a_turn_hands_its_events_over_only_when_something_waits_or_the_hold_ran_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 independent quick tasks: their settles wait for nothing, so the
    loop hands events to the log's writer at most once per COMMIT_HOLD (and at
    the end), not once per turn (about once per unit)."""
    from crucible.compile import compile_path
    from crucible.run import RunOptions
    from crucible.run.session._log import SessionLog
    from crucible.run.session._runner import run_plan

    n = 100
    text = 'edition = 3\n\n[workflow]\nname = "hold"\n' + "".join(
        f'[[workflow.task]]\nname = "t{i}"\nrun = "true"\n' for i in range(n)
    )
    (tmp_path / "pack.toml").write_text(text)
    plan = tmp_path / "plan.json"
    plan.write_bytes(compile_path(tmp_path / "pack.toml").data)
    handed: list[float] = []
    real = SessionLog.commit

    def counting(self: SessionLog, *, urgent: bool = False) -> int:
        before = self._seq
        seq = real(self, urgent=urgent)
        if seq != before:
            import time

            handed.append(time.monotonic())
        return seq

    monkeypatch.setattr(SessionLog, "commit", counting)
    outcome = run_plan(
        RunOptions(plan=plan, state=tmp_path / "s", jobs=2, kill_grace=1.0),
        environ={"PATH": os.environ["PATH"]},
    )
    assert outcome.status == "passed"
    assert len(handed) <= outcome.duration / engine.COMMIT_HOLD + 4, (len(handed), outcome)
    assert len(handed) < n / 2


def test_a_dependant_is_not_held_back_by_the_hold(pack: Pack, tmp_path: Path) -> None:
    """A chain of 30 quick tasks: each settle has a dependant, so its batch is
    handed over at once; holding it COMMIT_HOLD each would take 30 holds."""
    body = '[[workflow.task]]\nname = "c0"\nrun = "true"\n'
    for i in range(1, 30):
        body += f'[[workflow.task]]\nname = "c{i}"\nneeds = ["c{i - 1}"]\nrun = "true"\n'
    state = tmp_path / "s"
    r = dispatch(pack(body), "--state", state, "-j", "2")
    assert r.returncode == 0, r.stderr
    (done,) = [e for e in events(state) if e["event"] == "run_finished"]
    # each link costs a spawn, a capture and a group-commit fsync: well under
    # the hold; 30 holds would be 0.6 s on their own (generous for a loaded CI)
    assert done["duration"] < 30 * engine.COMMIT_HOLD + 3.0


# --------------------------------------------------- workspace pools


def test_a_worker_with_no_free_workspace_left_finds_one_another_worker_freed(
    tmp_path: Path,
) -> None:
    """A handed-back unit is started (and freed) by another worker than the one
    that staged it: the first one, finding its own list empty, lists the pool
    again (within its time share) and takes the other's entry, instead of
    making a new workspace that would stay in the pool after the run."""
    import time

    from crucible.run.executors import _recycle

    pool_dir = tmp_path / "work" / "each"
    pool_dir.mkdir(parents=True)
    one, two = WorkspacePool(keep=False), WorkspacePool(keep=False)
    assert not one.acquire("0", pool_dir / "0")  # listed: nothing free yet
    (pool_dir / "1").mkdir()
    assert two.release("1", pool_dir / "1")
    time.sleep(_recycle.RELIST_AFTER * 2)
    assert one.acquire("2", pool_dir / "2")  # listed again: two's entry
    assert not [n for n in os.listdir(pool_dir) if n.startswith(FREE_PREFIX)]


def test_listing_a_pool_again_is_held_to_a_share_of_the_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every unit of a task keeps its workspace (all failed): each acquire
    misses, and the pool is listed again only once the last listing's cost
    times RELIST_SHARE has passed."""
    pool_dir = tmp_path / "work" / "each"
    pool_dir.mkdir(parents=True)
    calls: list[Any] = []
    real = os.listdir

    def counting(path: Any) -> list[str]:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(os, "listdir", counting)
    pool = WorkspacePool(keep=False)
    for i in range(200):
        assert not pool.acquire(str(i), pool_dir / str(i))
        (pool_dir / str(i)).mkdir()  # kept by a failure
    assert 1 <= len(calls) < 200


def test_a_pipelined_units_bug_is_answered_with_its_traceback() -> None:
    """Inbox.fail on an exception outside the error tree sends a "bug" reply
    carrying the traceback (it raised NameError once: traceback is imported
    lazily and this path had lost its import)."""
    r, w = os.pipe()
    rep_r, rep_w = os.pipe()
    try:
        inbox = Inbox(r, rep_w)
        try:
            raise ValueError("boom")
        except ValueError as exc:
            inbox.fail(9, exc)
        token, kind, payload = pickle.loads(os.read(rep_r, 1 << 16)[4:])
        assert (token, kind) == (9, "bug")
        assert "ValueError: boom" in payload and "Traceback" in payload
    finally:
        for fd in (r, w, rep_r, rep_w):
            os.close(fd)
