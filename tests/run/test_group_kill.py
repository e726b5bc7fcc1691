"""A SIGKILL of the dispatcher's whole process group (``timeout -s KILL``: the
dispatcher and its workers) leaves no task running, and a ``--resume`` right
after never starts a unit whose previous attempt may still run (issue 27
item 3): the local executor's reaper kills the tasks' groups, and holds the
state lock until they are dead."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

#: a first attempt that takes 1 s to honour SIGTERM (so a resume that did not
#: wait would start while it still runs); a second attempt that passes at once.
#: Each step appends to ../../marks.txt.
TASK = """\
M="$CRUCIBLE_WORKSPACE/../../marks.txt"
if [ -f "$M" ]; then echo "start again" >> "$M"; exit 0; fi
echo "start $$" >> "$M"
trap 'echo term >> "$M"; sleep 1; echo end >> "$M"; exit 1' TERM
sleep 120 &
wait
"""


def _pack(tmp_path: Path) -> Path:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "groupkill"\n'
        f"[[workflow.task]]\nname = \"long\"\nrun = '''{TASK}'''\n"
    )
    return pack


def _cleanup(marks: Path) -> None:
    """Kill what a failed test left (the first attempt's group)."""
    import contextlib

    with contextlib.suppress(OSError, ValueError, IndexError):
        os.killpg(int(marks.read_text().split()[1]), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2][:2] != b" Z"
    except OSError:
        return False


def test_a_process_group_sigkill_leaves_no_task_and_resume_waits(tmp_path: Path) -> None:
    pack = _pack(tmp_path)
    state = tmp_path / "state"
    marks = state / "marks.txt"
    # its own process group, as `timeout` gives the command it runs
    proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(state)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marks.exists() and marks.read_text().startswith("start ")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        task = int(marks.read_text().split()[1])
        os.killpg(proc.pid, signal.SIGKILL)  # dispatcher and workers at once
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        # at once: the old attempt is still honouring its SIGTERM
        resumed = subprocess.run(
            [DISPATCH, str(pack), "--state", str(state), "--resume"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resumed.returncode == 0, resumed.stderr
        assert marks.read_text().splitlines() == [f"start {task}", "term", "end", "start again"]
        assert not _alive(task)
    finally:
        _cleanup(marks)


def test_the_killed_run_tasks_die_without_a_resume(tmp_path: Path) -> None:
    pack = _pack(tmp_path)
    state = tmp_path / "state"
    marks = state / "marks.txt"
    proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(state)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marks.exists() and marks.read_text().startswith("start ")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        task = int(marks.read_text().split()[1])
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        deadline = time.monotonic() + 15
        while _alive(task) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(task), "the task outlived its dispatcher and workers"
        assert marks.read_text().splitlines()[-1] == "end"
    finally:
        _cleanup(marks)


#: a first attempt that ignores SIGTERM (only SIGKILL ends it)
STUBBORN = """\
M="$CRUCIBLE_WORKSPACE/../../marks.txt"
if [ -f "$M" ]; then echo "start again" >> "$M"; exit 0; fi
echo "start $$" >> "$M"
trap '' TERM
while :; do sleep 0.1; done
"""


def _lock_holders(lock: Path) -> list[int]:
    """The processes holding ``lock`` open (after the group kill: the reaper)."""
    holders = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == str(lock):
                    holders.append(int(name))
                    break
            except OSError:
                continue
    return holders


def test_resume_stops_an_earlier_attempt_even_when_the_reaper_was_killed(tmp_path: Path) -> None:
    pack = tmp_path / "pack.toml"
    pack.write_text(
        'edition = 4\n[workflow]\nname = "stubborn"\n'
        f"[[workflow.task]]\nname = \"long\"\nrun = '''{STUBBORN}'''\n"
    )
    state = tmp_path / "state"
    marks = state / "marks.txt"
    proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(state)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marks.exists() and marks.read_text().startswith("start ")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        task = int(marks.read_text().split()[1])
        time.sleep(0.1)  # its task_started is in the log (announced after 2 ms)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        # the reaper too, inside its kill grace (the task ignores its SIGTERM)
        for pid in _lock_holders((state / "lock").resolve()):
            os.kill(pid, signal.SIGKILL)
        assert _alive(task)
        resumed = subprocess.run(
            [DISPATCH, str(pack), "--state", str(state), "--resume"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resumed.returncode == 0, resumed.stderr
        assert "still runs" in resumed.stderr and "'long'" in resumed.stderr
        assert not _alive(task)
        assert marks.read_text().splitlines() == [f"start {task}", "start again"]
    finally:
        _cleanup(marks)
