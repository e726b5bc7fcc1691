"""A reader that stops reading never holds the dispatcher (issue 27 item 2): a
stalled ``--events`` FIFO or pipe, or a ``--follow`` stderr pipe nobody reads, is
dropped with one warning, and SIGINT/SIGTERM still stop the run and kill its
running task. Real FIFOs and pipes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.run.dispatchtests import DISPATCH

#: tasks whose events (and plan_admitted) fill a pipe's 64 KiB many times over
MANY = 300


def _pack(tmp_path: Path, last: str) -> Path:
    lines = ["edition = 4", "[workflow]", 'name = "stall"']
    for i in range(MANY):
        lines += ["[[workflow.task]]", f'name = "t{i:03d}"', 'run = "true"']
    lines += [
        "[[workflow.task]]",
        'name = "last"',
        f"run = '''{last}'''",
        "needs = [" + ", ".join(f'"t{i:03d}"' for i in range(MANY)) + "]",
    ]
    pack = tmp_path / "pack.toml"
    pack.write_text("\n".join(lines) + "\n")
    return pack


#: the last task writes its pid where the test can look, then runs long
SLEEPER = 'echo $$ > "$CRUCIBLE_WORKSPACE/../../last.pid"; exec sleep 120'


def _wait_for(path: Path, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text().strip():
        assert proc.poll() is None, "the dispatcher ended early"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stalled_events_fifo_is_dropped_and_signals_stop_the_run(
    tmp_path: Path, signum: int
) -> None:
    pack = _pack(tmp_path, SLEEPER)
    state = tmp_path / "state"
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    err = tmp_path / "err.txt"
    try:
        with err.open("wb") as errf:
            proc = subprocess.Popen(
                [DISPATCH, str(pack), "--state", str(state), "--events", str(fifo), "-j", "2"],
                stdout=subprocess.DEVNULL,
                stderr=errf,
            )
        try:
            pid_file = tmp_path / "state" / "last.pid"
            _wait_for(pid_file, proc)
            task = int(pid_file.read_text())
            proc.send_signal(signum)
            code = proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(reader)
    assert code == 128 + signum, err.read_text()
    assert _gone(task, 10), "the running task outlived the run"
    text = err.read_text()
    assert text.count("--events: cannot write the events mirror") == 1, text
    assert "Traceback" not in text
    events = (state / "session.jsonl").read_bytes().splitlines()
    assert b'"shutdown"' in events[-1]


def test_a_stalled_events_pipe_on_stdout_lets_the_run_finish(tmp_path: Path) -> None:
    pack = _pack(tmp_path, "true")
    state = tmp_path / "state"
    read_end, write_end = os.pipe()  # `--events - | sleep 30`: nobody reads
    try:
        proc = subprocess.run(
            [DISPATCH, str(pack), "--state", str(state), "--events", "-", "-j", "2"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
        os.close(read_end)
    text = proc.stderr.decode()
    assert proc.returncode == 0, text
    assert text.count("--events: cannot write the events mirror") == 1, text
    assert "run passed: 301 passed" in text


def test_follow_to_a_stderr_nobody_reads_still_stops_on_sigterm(tmp_path: Path) -> None:
    # the task floods --follow (far past a pipe's 64 KiB), then runs long
    flood = (
        'i=0; while [ $i -lt 4000 ]; do echo "line $i of a flood that fills the pipe"; i=$((i+1)); done; '
        + SLEEPER
    )
    pack = _pack(tmp_path, flood)
    state = tmp_path / "state"
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [DISPATCH, str(pack), "--state", str(state), "--follow", "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=write_end,
    )
    os.close(write_end)
    try:
        pid_file = tmp_path / "state" / "last.pid"
        _wait_for(pid_file, proc)
        task = int(pid_file.read_text())
        time.sleep(0.5)  # the flood has filled the pipe: the worker is writing
        proc.send_signal(signal.SIGTERM)
        # the run stops and its task dies while stderr is still unread
        assert _gone(task, 15), "SIGTERM left the running task alive"
        with os.fdopen(read_end, "rb") as err:  # now drain: the last lines come out
            text = err.read().decode()
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 143, text[-2000:]
    assert text.count("--follow: stderr's reader took nothing") == 1, text[-2000:]
    assert "Traceback" not in text
